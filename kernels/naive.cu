/*
 * naive.cu: one thread per output element, global memory only.
 *
 * Idea: thread (row, col) walks row `row` of A and column `col` of B and
 * writes their dot product to C[row][col]. Every operand comes straight from
 * global memory (through the caches); this is the baseline the other kernels
 * are measured against.
 *
 * Thread layout: a block of TILE x TILE threads; threadIdx.x runs along the
 * columns of C (and of B), so a warp reads consecutive B elements and writes
 * consecutive C elements: coalesced. The A element is the same for all the
 * threads of a warp row (a broadcast).
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field, T is the tile (-DTILE=T).
 *
 * mmd:
 *   rung: 1
 *   description: one thread per output, operands from global memory
 *   entry: mmd_naive
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: TILE
 *   block: [T, T]
 *   block_tile: [T, T, 1]
 *   grid: [columns, rows]
 *   shared_bytes: 0
 *
 * Shapes: any M, K, N >= 1; threads past the edge of C do nothing.
 * Layout: row-major; lda, ldb, ldc are row strides in elements (>= the row
 * length), so pitched allocations work unchanged.
 */
#ifndef TILE
#error "compile with -DTILE=<block edge>, e.g. -DTILE=32"
#endif

extern "C" __global__ void mmd_naive(const float* __restrict__ A,
                                     const float* __restrict__ B,
                                     float* __restrict__ C,
                                     int M, int K, int N,
                                     int lda, int ldb, int ldc)
{
    const int row = blockIdx.y * TILE + threadIdx.y;
    const int col = blockIdx.x * TILE + threadIdx.x;
    if (row >= M || col >= N) {
        return;
    }
    const float* a_row = A + (size_t)row * lda;
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
        sum += a_row[k] * B[(size_t)k * ldb + col];
    }
    C[(size_t)row * ldc + col] = sum;
}
