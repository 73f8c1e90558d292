/*
 * aplus.cu: the course's A+ scheme: four outputs per thread (granularity)
 * plus register prefetching, with the data movement interleaved between the
 * partial products.
 *
 * Names (the course's picture). A block computes a BLOCK_EDGE x BLOCK_EDGE
 * block of C (BLOCK_EDGE = 2 * TILE), split into four TILE x TILE quarters,
 * and walks K in steps of BLOCK_EDGE. At each step A's tile (the block's rows,
 * BLOCK_EDGE columns of K) is split into quarters A B / C D and B's tile
 * (BLOCK_EDGE rows of K, the block's columns) into quarters 1 2 / 3 4:
 *
 *      A's tile      B's tile      C's block
 *      | A | B |     | 1 | 2 |     | W | X |
 *      | C | D |     | 3 | 4 |     | Y | Z |
 *
 *   W = A.1 + B.3    X = A.2 + B.4    Y = C.1 + D.3    Z = C.2 + D.4
 *
 * Threads and registers. The block has TILE x TILE threads. Thread (ty, tx)
 * owns one element of every quarter, the one at (ty, tx) inside it:
 *   W -> C[r][c], X -> C[r][c + TILE], Y -> C[r + TILE][c],
 *   Z -> C[r + TILE][c + TILE], with r = blockIdx.y*BLOCK_EDGE + ty and
 *   c = blockIdx.x*BLOCK_EDGE + tx;
 * these four sums live in registers w, x, y, z. Likewise it moves element
 * (ty, tx) of each of the eight input quarters, through one prefetch
 * register per quarter (pf_a, pf_b, pf_c, pf_d, pf_1, pf_2, pf_3, pf_4), into
 * that quarter's own TILE x TILE array in shared memory (sh_a ... sh_4).
 * threadIdx.x runs along the contiguous dimension of every global access, so
 * each load and store is coalesced.
 *
 * One step (k0 = step * BLOCK_EDGE); "fetch" = global -> registers,
 * "move" = registers -> shared:
 *   move A, 1, 2; fetch C; sync
 *   w += A.1; x += A.2
 *   move C; fetch B, 3, 4; sync
 *   y += C.1; z += C.2
 *   move B, 3, 4; fetch D; sync
 *   w += B.3; x += B.4
 *   move D; fetch the next step's A, 1, 2 (none after the last); sync
 *   y += D.3; z += D.4
 * Four barriers per step, each one just before the first product that reads
 * what was just moved. A move never overwrites a quarter some thread may
 * still be reading: A, 1, 2 were last read before the barrier ahead of
 * "w += B.3"; C before the one ahead of "w += B.3"; B, 3, 4 and D in the
 * previous step, before this step's first barrier.
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field, T is the tile (-DTILE=T).
 *
 * mmd:
 *   rung: 5
 *   description: "A+: four outputs per thread, prefetch interleaved with the partial products"
 *   entry: mmd_aplus
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: TILE
 *   block: [T, T]
 *   block_tile: [2*T, 2*T, 2*T]  # BLOCK_EDGE = 2*TILE
 *   thread_tile: [2, 2]
 *   grid: [columns, rows]
 *   shared_bytes: 8*T*T*4  # the eight TILE x TILE quarters sh_a ... sh_4
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

/* Element (row, col) of a row-major matrix, or zero outside rows x cols. */
__device__ __forceinline__ float load_or_zero(const float* __restrict__ P, int row, int col,
                                              int rows, int cols, int ld)
{
    return (row < rows && col < cols) ? P[(size_t)row * ld + col] : 0.0f;
}

/* sum += the TILE-long dot product of row ty of `left` and column tx of `right`. */
__device__ __forceinline__ float partial(float sum, const float (*left)[TILE],
                                         const float (*right)[TILE], int ty, int tx)
{
#pragma unroll
    for (int k = 0; k < TILE; ++k) {
        sum += left[ty][k] * right[k][tx];
    }
    return sum;
}

extern "C" __global__ void mmd_aplus(const float* __restrict__ A,
                                     const float* __restrict__ B,
                                     float* __restrict__ C,
                                     int M, int K, int N,
                                     int lda, int ldb, int ldc)
{
    /* Quarters of A's tile (a, b, c, d) and of B's tile (1, 2, 3, 4). */
    __shared__ float sh_a[TILE][TILE], sh_b[TILE][TILE], sh_c[TILE][TILE], sh_d[TILE][TILE];
    __shared__ float sh_1[TILE][TILE], sh_2[TILE][TILE], sh_3[TILE][TILE], sh_4[TILE][TILE];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int top = blockIdx.y * BLOCK_EDGE + ty;     /* this thread's row in W and X */
    const int bottom = top + TILE;                    /* its row in Y and Z */
    const int left = blockIdx.x * BLOCK_EDGE + tx;    /* its column in W and Y */
    const int right = left + TILE;                    /* its column in X and Z */

    float w = 0.0f, x = 0.0f, y = 0.0f, z = 0.0f;

    /* Prefetch step 0's A, 1, 2. */
    float pf_a = load_or_zero(A, top, tx, M, K, lda);
    float pf_1 = load_or_zero(B, ty, left, K, N, ldb);
    float pf_2 = load_or_zero(B, ty, right, K, N, ldb);
    float pf_b, pf_c, pf_d, pf_3, pf_4;

    for (int k0 = 0; k0 < K; k0 += BLOCK_EDGE) {
        const int k_first = k0 + tx;          /* A column of quarters A and C */
        const int k_second = k0 + TILE + tx;  /* A column of quarters B and D */
        const int k_lower = k0 + TILE + ty;   /* B row of quarters 3 and 4 */

        sh_a[ty][tx] = pf_a;
        sh_1[ty][tx] = pf_1;
        sh_2[ty][tx] = pf_2;
        pf_c = load_or_zero(A, bottom, k_first, M, K, lda);
        __syncthreads();
        w = partial(w, sh_a, sh_1, ty, tx);
        x = partial(x, sh_a, sh_2, ty, tx);

        sh_c[ty][tx] = pf_c;
        pf_b = load_or_zero(A, top, k_second, M, K, lda);
        pf_3 = load_or_zero(B, k_lower, left, K, N, ldb);
        pf_4 = load_or_zero(B, k_lower, right, K, N, ldb);
        __syncthreads();
        y = partial(y, sh_c, sh_1, ty, tx);
        z = partial(z, sh_c, sh_2, ty, tx);

        sh_b[ty][tx] = pf_b;
        sh_3[ty][tx] = pf_3;
        sh_4[ty][tx] = pf_4;
        pf_d = load_or_zero(A, bottom, k_second, M, K, lda);
        __syncthreads();
        w = partial(w, sh_b, sh_3, ty, tx);
        x = partial(x, sh_b, sh_4, ty, tx);

        sh_d[ty][tx] = pf_d;
        const int k_next = k0 + BLOCK_EDGE;
        if (k_next < K) {
            pf_a = load_or_zero(A, top, k_next + tx, M, K, lda);
            pf_1 = load_or_zero(B, k_next + ty, left, K, N, ldb);
            pf_2 = load_or_zero(B, k_next + ty, right, K, N, ldb);
        }
        __syncthreads();
        y = partial(y, sh_d, sh_3, ty, tx);
        z = partial(z, sh_d, sh_4, ty, tx);
    }

    if (top < M && left < N) C[(size_t)top * ldc + left] = w;
    if (top < M && right < N) C[(size_t)top * ldc + right] = x;
    if (bottom < M && left < N) C[(size_t)bottom * ldc + left] = y;
    if (bottom < M && right < N) C[(size_t)bottom * ldc + right] = z;
}
