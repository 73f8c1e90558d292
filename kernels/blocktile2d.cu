/*
 * blocktile2d.cu: 2D block tiling, an 8 x 8 register tile per thread.
 *
 * Idea: `tiled` does one multiply-add per two shared-memory reads (a_tile
 * and b_tile), so shared memory, not the FMA units, sets its pace. Here a
 * block of THREADS threads computes a BM x BN block of C and each thread a
 * TM x TN sub-block of it. At each k of the BK-wide slab in shared memory a
 * thread reads TM values of A's column and TN values of B's row into
 * registers and does TM * TN multiply-adds with them: 64 FMAs for 16 reads
 * at 8 x 8 instead of 1 for 2. A block also reads each global element once
 * per BM (or BN) outputs instead of once per TILE.
 *
 * Thread layout: THREADS = (BM / TM) * (BN / TN) threads in a 1-D block.
 * Thread t owns rows (t / (BN/TN)) * TM + [0, TM) and columns
 * (t % (BN/TN)) * TN + [0, TN) of the block's C tile, with TM * TN
 * accumulators in registers. Loading: the block copies A's BM x BK slab and
 * B's BK x BN slab with one float per thread per pass, consecutive threads
 * on consecutive addresses (coalesced); A's slab is stored as it is,
 * a_tile[m][k], B's as b_tile[k][n].
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field.
 *
 * mmd:
 *   rung: 6
 *   description: "2-D block tiling: 128×128 C per block, 8×8 outputs per thread (tile ignored)"
 *   entry: mmd_blocktile2d
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: null
 *   block: [256]  # THREADS = (BM / TM) * (BN / TN) at the defaults below
 *   block_tile: [128, 128, 8]  # BM, BN, BK
 *   thread_tile: [8, 8]  # TM, TN
 *   grid: [columns, rows]
 *   shared_bytes: (128*8 + 8*128)*4  # (BM * BK + BK * BN) floats: 8 KiB
 *
 * Shapes: any M, K, N >= 1. Loads past the edge of A or B put zeros into the
 * slab (they add nothing), stores past the edge of C are skipped.
 * Layout: row-major with row strides lda, ldb, ldc in elements (any value
 * >= the row length; no alignment needed: every access is one float).
 * TILE, if given, is ignored: the block is fixed by BM, BN, TM, TN.
 */
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

#define THREADS_N (BN / TN)
#define THREADS ((BM / TM) * THREADS_N)

static_assert(BM % TM == 0 && BN % TN == 0, "BM must be a multiple of TM and BN of TN");
static_assert((BM * BK) % THREADS == 0, "A's BM x BK slab must split evenly over the threads");
static_assert((BK * BN) % THREADS == 0, "B's BK x BN slab must split evenly over the threads");

extern "C" __global__ void __launch_bounds__(THREADS)
mmd_blocktile2d(const float* __restrict__ A,
                const float* __restrict__ B,
                float* __restrict__ C,
                int M, int K, int N,
                int lda, int ldb, int ldc)
{
    __shared__ float a_tile[BM][BK];
    __shared__ float b_tile[BK][BN];

    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM; /* first row of C in this block */
    const int col0 = blockIdx.x * BN; /* first column of C in this block */
    const int t_row = (tid / THREADS_N) * TM;
    const int t_col = (tid % THREADS_N) * TN;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int idx = tid; idx < BM * BK; idx += THREADS) {
            const int m = idx / BK, k = idx % BK;
            const int row = row0 + m, col = k0 + k;
            a_tile[m][k] = (row < M && col < K) ? A[(size_t)row * lda + col] : 0.0f;
        }
#pragma unroll
        for (int idx = tid; idx < BK * BN; idx += THREADS) {
            const int k = idx / BN, n = idx % BN;
            const int row = k0 + k, col = col0 + n;
            b_tile[k][n] = (row < K && col < N) ? B[(size_t)row * ldb + col] : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a_frag[TM], b_frag[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a_frag[i] = a_tile[t_row + i][k];
#pragma unroll
            for (int j = 0; j < TN; ++j) b_frag[j] = b_tile[k][t_col + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a_frag[i] * b_frag[j];
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + t_row + i;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = col0 + t_col + j;
            if (row < M && col < N) C[(size_t)row * ldc + col] = acc[i][j];
        }
    }
}
