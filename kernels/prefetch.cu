/*
 * prefetch.cu: shared-memory tiling with register double buffering.
 *
 * Idea: the tiled kernel stalls at each step while its tile arrives from
 * global memory. Here each thread keeps the NEXT step's two values (one of
 * A's tile, one of B's) in registers: at the top of a step it moves the
 * registers into shared memory and synchronises, then issues the global
 * loads for the following step into the registers, and only then multiplies
 * the tile in shared memory. The loads are in flight while the tile is being
 * multiplied, so their latency hides behind the arithmetic.
 *
 *   registers <- step 0
 *   for each step s:
 *       shared <- registers; sync
 *       registers <- step s + 1          (skipped after the last step)
 *       sum += the tile in shared memory; sync
 *
 * Thread layout: block of TILE x TILE threads; thread (ty, tx) owns output
 * C[by*TILE + ty][bx*TILE + tx] and loads A[row][k0 + tx], B[k0 + ty][col]
 * (threadIdx.x along the contiguous dimension: coalesced).
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field, T is the tile (-DTILE=T).
 *
 * mmd:
 *   rung: 3
 *   description: tiled, with the next tile prefetched into registers
 *   entry: mmd_prefetch
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: TILE
 *   block: [T, T]
 *   block_tile: [T, T, T]
 *   grid: [columns, rows]
 *   shared_bytes: 2*T*T*4  # a_tile and b_tile
 *
 * Shapes: any M, K, N >= 1; out-of-range loads give zeros, out-of-range
 * stores are skipped. Row-major with row strides lda, ldb, ldc in elements.
 */
#ifndef TILE
#error "compile with -DTILE=<tile edge>, e.g. -DTILE=32"
#endif

extern "C" __global__ void mmd_prefetch(const float* __restrict__ A,
                                        const float* __restrict__ B,
                                        float* __restrict__ C,
                                        int M, int K, int N,
                                        int lda, int ldb, int ldc)
{
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    const bool row_in = row < M;
    const bool col_in = col < N;

    /* Prefetch step 0 into registers. */
    float a_next = (row_in && tx < K) ? A[(size_t)row * lda + tx] : 0.0f;
    float b_next = (ty < K && col_in) ? B[(size_t)ty * ldb + col] : 0.0f;

    float sum = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        a_tile[ty][tx] = a_next;
        b_tile[ty][tx] = b_next;
        __syncthreads();

        /* Fetch the next step while this one is multiplied. */
        const int k_next = k0 + TILE;
        if (k_next < K) {
            const int a_col = k_next + tx;
            const int b_row = k_next + ty;
            a_next = (row_in && a_col < K) ? A[(size_t)row * lda + a_col] : 0.0f;
            b_next = (b_row < K && col_in) ? B[(size_t)b_row * ldb + col] : 0.0f;
        }

#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            sum += a_tile[ty][k] * b_tile[k][tx];
        }
        __syncthreads();
    }
    if (row_in && col_in) {
        C[(size_t)row * ldc + col] = sum;
    }
}
