/*
 * tiled.cu: shared-memory tiling.
 *
 * Idea: a block computes one TILE x TILE block of C. It walks K in steps of
 * TILE; at each step every thread copies one element of A's tile and one of
 * B's tile into shared memory, the block synchronises, and each thread adds
 * the TILE products of its row of A's tile and column of B's tile. Each
 * global element is then read by the block once instead of TILE times.
 *
 * Thread layout: block of TILE x TILE threads; thread (ty, tx) owns output
 * C[by*TILE + ty][bx*TILE + tx], loads A[row][k0 + tx] and B[k0 + ty][col].
 * threadIdx.x runs along the contiguous dimension of every access, so the
 * global loads and the store are coalesced; in the inner loop a_tile[ty][k]
 * is a broadcast and b_tile[k][tx] hits consecutive banks.
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field, T is the tile (-DTILE=T).
 *
 * mmd:
 *   rung: 2
 *   description: shared-memory tiles of A and B, one output per thread
 *   entry: mmd_tiled
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: TILE
 *   block: [T, T]
 *   block_tile: [T, T, T]
 *   grid: [columns, rows]
 *   shared_bytes: 2*T*T*4  # a_tile and b_tile
 *
 * Shapes: any M, K, N >= 1. Loads past the edge of A or B put zeros into
 * the tile (they add nothing), stores past the edge of C are skipped.
 * Layout: row-major with row strides lda, ldb, ldc in elements.
 */
#ifndef TILE
#error "compile with -DTILE=<tile edge>, e.g. -DTILE=32"
#endif

extern "C" __global__ void mmd_tiled(const float* __restrict__ A,
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

    float sum = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const int a_col = k0 + tx;
        const int b_row = k0 + ty;
        a_tile[ty][tx] = (row < M && a_col < K) ? A[(size_t)row * lda + a_col] : 0.0f;
        b_tile[ty][tx] = (b_row < K && col < N) ? B[(size_t)b_row * ldb + col] : 0.0f;
        __syncthreads();

#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            sum += a_tile[ty][k] * b_tile[k][tx];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        C[(size_t)row * ldc + col] = sum;
    }
}
