/*
 * vectorized.cu: blocktile2d with 16-byte loads and A's slab transposed.
 *
 * Idea: blocktile2d moves every float with its own instruction. Here
 *   - global loads are 16 bytes (float4, LDG.E.128): each thread fetches
 *     four consecutive floats of a row of A or B per load;
 *   - A's slab is stored transposed in shared memory, a_tile[k][m], so the
 *     TM values of A a thread needs at one k are consecutive and come in
 *     TM / 4 16-byte shared loads (LDS.128), like B's TN values;
 *   - a_tile's rows are padded by A_PAD floats so that the transposing
 *     stores (one float each) of the two k-quads a warp loads land in
 *     different banks;
 *   - C is written with 16-byte stores.
 * Per k a thread now issues (TM + TN) / 4 = 4 shared loads for 64 FMAs.
 *
 * 16-byte accesses need the address 16-byte aligned. A row's float4 at
 * column c (a multiple of 4) is aligned when the base pointer is and the
 * row stride is a multiple of 4 floats. The kernel checks this once per
 * matrix (a uniform branch); when it fails, or when a float4 would cross
 * the edge of the matrix, that float4 is read or written one float at a
 * time with bounds checks. So pitched memory (ld != K) and odd widths work,
 * and only the edges and misaligned layouts pay for the scalar path.
 *
 * Thread layout: THREADS = (BM / TM) * (BN / TN) threads in a 1-D block.
 * Thread t owns rows (t / (BN/TN)) * TM + [0, TM) and columns
 * (t % (BN/TN)) * TN + [0, TN) of the block's C tile. Loading: A's
 * BM x BK slab as BM * BK / 4 float4 (row m = idx / (BK/4), k = 4*(idx %
 * (BK/4))), B's BK x BN slab as BK * BN / 4 float4 along a row of B.
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field.
 *
 * mmd:
 *   rung: 7
 *   description: "blocktile2d with 16-byte loads and stores and A's slab transposed (tile ignored)"
 *   entry: mmd_vectorized
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: null
 *   block: [256]  # THREADS = (BM / TM) * (BN / TN) at the defaults below
 *   block_tile: [128, 128, 8]  # BM, BN, BK
 *   thread_tile: [8, 8]  # TM, TN
 *   grid: [columns, rows]
 *   shared_bytes: (8*(128 + 4) + 8*128)*4  # (BK * (BM + A_PAD) + BK * BN) floats: 8.3 KiB
 *
 * Shapes: any M, K, N >= 1; any lda >= K, ldb >= N, ldc >= N; any float
 * alignment of A, B, C. Out-of-range loads give zeros, out-of-range stores
 * are skipped. Row-major. TILE, if given, is ignored.
 */
#include <stdint.h>

#ifndef BM
#define BM 128 /* rows of C per block */
#endif
#ifndef BN
#define BN 128 /* columns of C per block */
#endif
#ifndef BK
#define BK 8 /* depth of one shared-memory slab */
#endif
#ifndef TM
#define TM 8 /* rows of C per thread */
#endif
#ifndef TN
#define TN 8 /* columns of C per thread */
#endif

#define VEC 4   /* floats in one 16-byte access */
#define A_PAD 4 /* floats of padding after each row of a_tile[k][.] */
#define THREADS_N (BN / TN)
#define THREADS ((BM / TM) * THREADS_N)
#define A_LOADS ((BM * BK) / (VEC * THREADS)) /* float4 of A per thread per slab */
#define B_LOADS ((BK * BN) / (VEC * THREADS)) /* float4 of B per thread per slab */

static_assert(BM % TM == 0 && BN % TN == 0, "BM must be a multiple of TM and BN of TN");
static_assert(TM % VEC == 0 && TN % VEC == 0 && BK % VEC == 0,
              "TM, TN and BK must be multiples of 4 (one float4)");
static_assert(A_LOADS >= 1 && (BM * BK) % (VEC * THREADS) == 0,
              "A's slab must split into whole float4s per thread");
static_assert(B_LOADS >= 1 && (BK * BN) % (VEC * THREADS) == 0,
              "B's slab must split into whole float4s per thread");

/* Whether float4 accesses at multiples of 4 columns of P are 16-byte aligned. */
__device__ __forceinline__ bool vector_ok(const float* P, int ld)
{
    return ((reinterpret_cast<uintptr_t>(P) % (VEC * sizeof(float))) == 0) && (ld % VEC == 0);
}

/* P[row][col .. col+3], zeros outside rows x cols; 16-byte load when allowed. */
__device__ __forceinline__ float4 load4(const float* __restrict__ P, int ld, int row, int col,
                                        int rows, int cols, bool vec)
{
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < rows) {
        const float* p = P + (size_t)row * ld + col;
        if (vec && col + VEC <= cols) {
            v = *reinterpret_cast<const float4*>(p);
        } else {
            if (col + 0 < cols) v.x = p[0];
            if (col + 1 < cols) v.y = p[1];
            if (col + 2 < cols) v.z = p[2];
            if (col + 3 < cols) v.w = p[3];
        }
    }
    return v;
}

/* P[row][col .. col+3] = v where inside rows x cols; 16-byte store when allowed. */
__device__ __forceinline__ void store4(float* __restrict__ P, int ld, int row, int col,
                                       int rows, int cols, bool vec, float4 v)
{
    if (row >= rows) return;
    float* p = P + (size_t)row * ld + col;
    if (vec && col + VEC <= cols) {
        *reinterpret_cast<float4*>(p) = v;
    } else {
        if (col + 0 < cols) p[0] = v.x;
        if (col + 1 < cols) p[1] = v.y;
        if (col + 2 < cols) p[2] = v.z;
        if (col + 3 < cols) p[3] = v.w;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
mmd_vectorized(const float* __restrict__ A,
               const float* __restrict__ B,
               float* __restrict__ C,
               int M, int K, int N,
               int lda, int ldb, int ldc)
{
    __shared__ __align__(16) float a_tile[BK][BM + A_PAD]; /* transposed: [k][m] */
    __shared__ __align__(16) float b_tile[BK][BN];

    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;
    const int t_row = (tid / THREADS_N) * TM;
    const int t_col = (tid % THREADS_N) * TN;
    const bool vec_a = vector_ok(A, lda);
    const bool vec_b = vector_ok(B, ldb);
    const bool vec_c = vector_ok(C, ldc);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int idx = tid + l * THREADS;
            const int m = idx / (BK / VEC), k = (idx % (BK / VEC)) * VEC;
            const float4 v = load4(A, lda, row0 + m, k0 + k, M, K, vec_a);
            a_tile[k + 0][m] = v.x;
            a_tile[k + 1][m] = v.y;
            a_tile[k + 2][m] = v.z;
            a_tile[k + 3][m] = v.w;
        }
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const int idx = tid + l * THREADS;
            const int k = idx / (BN / VEC), n = (idx % (BN / VEC)) * VEC;
            *reinterpret_cast<float4*>(&b_tile[k][n]) = load4(B, ldb, k0 + k, col0 + n, K, N, vec_b);
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a_frag[TM], b_frag[TN];
#pragma unroll
            for (int i = 0; i < TM; i += VEC)
                *reinterpret_cast<float4*>(&a_frag[i]) = *reinterpret_cast<const float4*>(&a_tile[k][t_row + i]);
#pragma unroll
            for (int j = 0; j < TN; j += VEC)
                *reinterpret_cast<float4*>(&b_frag[j]) = *reinterpret_cast<const float4*>(&b_tile[k][t_col + j]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a_frag[i] * b_frag[j];
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; j += VEC)
            store4(C, ldc, row0 + t_row + i, col0 + t_col + j, M, N, vec_c,
                   make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]));
}
