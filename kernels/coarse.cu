/*
 * coarse.cu: thread coarsening (granularity): four outputs per thread.
 *
 * Idea: a block of TILE x TILE threads computes a BLOCK_EDGE x BLOCK_EDGE
 * block of C (BLOCK_EDGE = 2 * TILE), so each thread owns a 2 x 2 set of
 * outputs and every value it reads from shared memory feeds two products
 * instead of one. K is walked in steps of BLOCK_EDGE: at each step the block
 * loads a BLOCK_EDGE x BLOCK_EDGE tile of A and one of B into shared memory,
 * four values of each per thread, synchronises, and runs a fully unrolled
 * loop of 4 multiply-adds per k.
 *
 * Thread layout: thread (ty, tx) owns outputs at block rows {ty, ty + TILE}
 * and block columns {tx, tx + TILE}, kept in registers acc[2][2]. It loads
 * tile elements (ty + i*TILE, tx + j*TILE) for i, j in {0, 1} of both A's and
 * B's tiles. threadIdx.x runs along the contiguous dimension of every global
 * access (each warp row touches TILE consecutive floats twice), so loads and
 * stores are coalesced; in the inner loop the A reads are broadcasts and the
 * B reads hit consecutive banks.
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field, T is the tile (-DTILE=T).
 *
 * mmd:
 *   rung: 4
 *   description: tiled, four outputs (2×2) per thread
 *   entry: mmd_coarse
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: TILE
 *   block: [T, T]
 *   block_tile: [2*T, 2*T, 2*T]  # BLOCK_EDGE = 2*TILE
 *   thread_tile: [2, 2]
 *   grid: [columns, rows]
 *   shared_bytes: 2*(2*T)*(2*T)*4  # a_tile and b_tile, BLOCK_EDGE squared each
 *
 * Shapes: any M, K, N >= 1; out-of-range loads give zeros, out-of-range
 * stores are skipped. Row-major with row strides lda, ldb, ldc in elements.
 */
#ifndef TILE
#error "compile with -DTILE=<tile edge>, e.g. -DTILE=32"
#endif

/* Outputs per thread along each edge, and the edge of the block's C tile. */
#define COARSE 2
#define BLOCK_EDGE (COARSE * TILE)

extern "C" __global__ void mmd_coarse(const float* __restrict__ A,
                                      const float* __restrict__ B,
                                      float* __restrict__ C,
                                      int M, int K, int N,
                                      int lda, int ldb, int ldc)
{
    __shared__ float a_tile[BLOCK_EDGE][BLOCK_EDGE];
    __shared__ float b_tile[BLOCK_EDGE][BLOCK_EDGE];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row0 = blockIdx.y * BLOCK_EDGE + ty;
    const int col0 = blockIdx.x * BLOCK_EDGE + tx;

    float acc[COARSE][COARSE] = {};

    for (int k0 = 0; k0 < K; k0 += BLOCK_EDGE) {
#pragma unroll
        for (int i = 0; i < COARSE; ++i) {
#pragma unroll
            for (int j = 0; j < COARSE; ++j) {
                const int r = ty + i * TILE;
                const int c = tx + j * TILE;
                const int a_row = row0 + i * TILE;
                const int a_col = k0 + c;
                const int b_row = k0 + r;
                const int b_col = col0 + j * TILE;
                a_tile[r][c] = (a_row < M && a_col < K) ? A[(size_t)a_row * lda + a_col] : 0.0f;
                b_tile[r][c] = (b_row < K && b_col < N) ? B[(size_t)b_row * ldb + b_col] : 0.0f;
            }
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BLOCK_EDGE; ++k) {
            const float a0 = a_tile[ty][k];
            const float a1 = a_tile[ty + TILE][k];
            const float b0 = b_tile[k][tx];
            const float b1 = b_tile[k][tx + TILE];
            acc[0][0] += a0 * b0;
            acc[0][1] += a0 * b1;
            acc[1][0] += a1 * b0;
            acc[1][1] += a1 * b1;
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < COARSE; ++i) {
#pragma unroll
        for (int j = 0; j < COARSE; ++j) {
            const int row = row0 + i * TILE;
            const int col = col0 + j * TILE;
            if (row < M && col < N) {
                C[(size_t)row * ldc + col] = acc[i][j];
            }
        }
    }
}
