/*
 * fast.cu: warp-tiled, double-buffered fp32 SGEMM (FFMA, fp32 accumulation).
 *
 * Idea: vectorized already does 64 FMAs per 4 shared loads per thread. What
 * is left between it and cuBLAS is latency and conflicts, not arithmetic:
 *   1. Warp tiling with interleaved 4 x 4 sub-tiles. A warp owns a WM x WN
 *      piece of the block's C tile; its 32 lanes form a WTM x WTN grid and
 *      each lane owns (TM/4) x (TN/4) sub-tiles of 4 x 4 outputs, spaced
 *      4*WTM rows and 4*WTN columns apart. At one k the lanes of a warp
 *      then read WTN consecutive float4 of B's row (512 bytes, no bank
 *      conflict) and WTM float4 of A's column (each a broadcast to WTN
 *      lanes), where vectorized's contiguous 8 x 8 thread tiles made lanes
 *      hit the same banks two by two.
 *   2. Shared-memory double buffering with a register prefetch. Two slabs
 *      of A and B live in shared memory. While the block multiplies slab s,
 *      each thread's global loads for slab s+1 are already in flight into
 *      registers; after the multiply it stores them into the other buffer.
 *      One __syncthreads per slab instead of two, and the global latency
 *      hides behind BK * TM * TN FMAs. (DOUBLE_BUFFER=0 gives the same
 *      kernel with one buffer and two barriers per slab: the step between.)
 *   3. Grouped block order (GROUP_M): consecutive blocks walk down GROUP_M
 *      block-rows before moving right, so the blocks resident at one time
 *      share panels of A and B in L2.
 *   4. __launch_bounds__(THREADS, MIN_BLOCKS) caps registers so that
 *      MIN_BLOCKS blocks fit on one SM (128 registers at 256 x 2).
 * Loads and stores are 16 bytes (LDG.E.128, LDS.128, STS.128, STG.E.128)
 * with the same guarded fallback as vectorized: a float4 that is misaligned
 * (base pointer or ld not a multiple of 4 floats) or crosses the matrix
 * edge is moved one float at a time with bounds checks.
 *
 * Thread layout: THREADS = (BM/WM) * (BN/WN) warps of 32. Warp w sits at
 * warp row w / (BN/WN), warp column w % (BN/WN); lane l at lane row
 * l / WTN, lane column l % WTN. Lane (lr, lc) of warp (wr, wc) owns C rows
 *   wr*WM + i*4*WTM + lr*4 + [0,4)   for i in [0, TM/4)
 * and columns
 *   wc*WN + j*4*WTN + lc*4 + [0,4)   for j in [0, TN/4)
 * of the block's tile: TM x TN accumulators. A's slab is stored transposed,
 * a_tile[k][m] (rows padded by A_PAD floats against bank conflicts of the
 * transposing stores), B's slab as it is, b_tile[k][n].
 *
 * Launch geometry: the declaration below, which the registry (mmd/kernels.py)
 * reads from here; docs/kernels.md ("Writing a kernel mmd can run") has each
 * field.
 *
 * mmd:
 *   rung: 8
 *   description: warp-tiled, double-buffered SGEMM with 16-byte accesses (tile ignored)
 *   entry: mmd_fast
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   tile_macro: null
 *   # the #defines below, spelled out in every build; a variant changes some of them
 *   defines: {BM: 256, BN: 128, BK: 8, TM: 16, TN: 8, WTM: 8, MIN_BLOCKS: 1, GROUP_M: 8, DOUBLE_BUFFER: 1,
 *             ASYNC: 0, STAGES_ASYNC: 2, A_PAD: 4, FRAG_PIPE: 0, INTERIOR: 1, A_SWIZZLE: 0}
 *   block: [(BM/TM) * (BN/TN)]  # THREADS: 256 at the defaults, 8 warps of 64 x 64
 *   block_tile: [BM, BN, BK]
 *   thread_tile: [TM, TN]
 *   grid: [columns, rows]
 *   # STAGES slabs of A (rows padded by A_PAD) and B: 24.25 KiB at the defaults; 48 KiB is the static limit
 *   shared_bytes: (STAGES_ASYNC if ASYNC else 2 if DOUBLE_BUFFER else 1) * BK*(BM + A_PAD + BN)*4
 *   # by shape class (mmd.kernels.shape_class), unless kernels/fast.tune.yaml chooses for the GPU
 *   variants:
 *     - {label: 256x128x8_reg_t16x8_w8, classes: [medium, large]}
 *     - {label: 64x64x16_t4x8_reg, classes: [small], defines: {BM: 64, BN: 64, BK: 16, TM: 4, TN: 8, WTM: 4}}
 *
 * Defaults: the autotune's best set for large shapes on the H200
 * (BM 256, BN 128, BK 8, 16 x 8 per thread in warps of 64 x 64, register
 * prefetch, INTERIOR, 1 block per SM); kernels/fast.tune.yaml has the sets
 * per shape class, docs/fast.md what each macro measured.
 *
 * Shapes: any M, K, N >= 1; any lda >= K, ldb >= N, ldc >= N; any float
 * alignment of A, B, C. Out-of-range loads give zeros, out-of-range stores
 * are skipped. Row-major. TILE, if given, is ignored.
 */
#include <stdint.h>

#ifndef BM
#define BM 256 /* rows of C per block */
#endif
#ifndef BN
#define BN 128 /* columns of C per block */
#endif
#ifndef BK
#define BK 8 /* depth of one shared-memory slab */
#endif
#ifndef TM
#define TM 16 /* rows of C per thread (a multiple of 4) */
#endif
#ifndef TN
#define TN 8 /* columns of C per thread (a multiple of 4) */
#endif
#ifndef WTM
#define WTM 8 /* lanes of a warp along M; 32 / WTM along N */
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1 /* blocks per SM that __launch_bounds__ must allow */
#endif
#ifndef GROUP_M
#define GROUP_M 8 /* block-rows walked before moving one block-column right */
#endif
#ifndef DOUBLE_BUFFER
#define DOUBLE_BUFFER 1 /* 1: two shared buffers, register prefetch; 0: one buffer */
#endif
#ifndef ASYNC
#define ASYNC 0 /* 1: cp.async straight into shared memory, STAGES_ASYNC buffers */
#endif
#ifndef STAGES_ASYNC
#define STAGES_ASYNC 2 /* shared-memory stages of the cp.async pipeline (>= 2) */
#endif
#ifndef FRAG_PIPE
#define FRAG_PIPE 0 /* 1: fragments double-buffered in registers, across the slab boundary too */
#endif
#ifndef A_SWIZZLE
#define A_SWIZZLE 0 /* 1: a_tile's columns XOR-swizzled per k group: conflict-free transposing stores */
#endif
#ifndef INTERIOR
#define INTERIOR 1 /* 1: blocks wholly inside (K a multiple of BK, 16-byte aligned) load unchecked;
                     the register-prefetch loops only (DOUBLE_BUFFER) */
#endif

#define WARP 32
#define VEC 4   /* floats in one 16-byte access */
#ifndef A_PAD
#define A_PAD 4 /* floats of padding after each row of a_tile[k][.] (a multiple of 4) */
#endif
/* Where column m of a_tile[.][k] lives. Without padding (BM a multiple of 32)
 * column m sits in bank m % 32 at every k, and the transposing stores of one
 * warp (BK/4 threads per row of A, each writing 4 k of one m) hit each bank
 * BK/4 times. XOR-ing m with the k group times 32/(BK/4) spreads the groups
 * over all 32 banks; the XOR is a multiple of 4, so float4 reads stay whole. */
#define A_SWZ(k) (A_SWIZZLE ? ((k) / VEC) * (WARP / (BK / VEC)) : 0)
#define WTN (WARP / WTM)
#define WM (TM * WTM) /* rows of C per warp */
#define WN (TN * WTN) /* columns of C per warp */
#define WARPS_N (BN / WN)
#define THREADS ((BM / WM) * WARPS_N * WARP)
#define SUB_M (TM / VEC) /* 4 x 4 sub-tiles per thread along M */
#define SUB_N (TN / VEC)
#define A_LOADS ((BM * BK) / (VEC * THREADS))
#define B_LOADS ((BK * BN) / (VEC * THREADS))
#if ASYNC
#define STAGES STAGES_ASYNC
#elif DOUBLE_BUFFER
#define STAGES 2
#else
#define STAGES 1
#endif

static_assert(WARP % WTM == 0, "WTM must divide the warp size (32)");
static_assert(TM % VEC == 0 && TN % VEC == 0 && BK % VEC == 0,
              "TM, TN and BK must be multiples of 4 (one float4)");
static_assert(BM % WM == 0 && BN % WN == 0,
              "BM must be a multiple of TM*WTM and BN of TN*(32/WTM): whole warp tiles");
static_assert(A_LOADS >= 1 && (BM * BK) % (VEC * THREADS) == 0,
              "A's BM x BK slab must split into whole float4s per thread");
static_assert(B_LOADS >= 1 && (BK * BN) % (VEC * THREADS) == 0,
              "B's BK x BN slab must split into whole float4s per thread");
static_assert(GROUP_M >= 1, "GROUP_M must be at least 1");
static_assert(!A_SWIZZLE || (A_PAD == 0 && BM % WARP == 0 && BK / VEC <= 8),
              "A_SWIZZLE needs A_PAD 0, BM a multiple of 32 and BK at most 32");
static_assert(!ASYNC || STAGES_ASYNC >= 2, "the cp.async pipeline needs at least 2 stages");
static_assert(!FRAG_PIPE || (DOUBLE_BUFFER || ASYNC), "FRAG_PIPE needs two shared buffers (DOUBLE_BUFFER or ASYNC)");
static_assert(!FRAG_PIPE || BK % 2 == 0, "FRAG_PIPE alternates two fragment buffers: BK must be even");

/* cp.async (sm_80+): copy `bytes` (4 or 16) from global to shared memory
 * without passing through registers; only the first src_bytes are read, the
 * rest of the destination is zero-filled (src_bytes = 0: all zeros, nothing
 * read). 16-byte copies bypass L1 (.cg), 4-byte ones may not (.ca). */
__device__ __forceinline__ void cp_async4(float* smem, const float* gmem, bool valid)
{
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool valid)
{
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING)); }

/* A compile-time flag passed to the loads: Checked<false> drops every bounds and alignment test. */
template <bool B>
struct Checked {
    static constexpr bool value = B;
};

/* Run a block's main loop, compiled with every load tested (Checked<true>) and, with INTERIOR, once
 * more without tests: ``interior`` is uniform per block, and a block wholly inside the matrices (most of
 * them at large sizes) runs the one without tests. */
template <typename Loop>
__device__ __forceinline__ void run_main_loop(Loop& loop, bool interior)
{
#if INTERIOR
    if (interior) {
        loop(Checked<false>{});
        return;
    }
#endif
    loop(Checked<true>{});
}

/* Whether float4 accesses at multiples of 4 columns of P are 16-byte aligned. */
__device__ __forceinline__ bool vector_ok(const float* P, int ld)
{
    return ((reinterpret_cast<uintptr_t>(P) % (VEC * sizeof(float))) == 0) && (ld % VEC == 0);
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

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
mmd_fast(const float* __restrict__ A,
         const float* __restrict__ B,
         float* __restrict__ C,
         int M, int K, int N,
         int lda, int ldb, int ldc)
{
    __shared__ __align__(16) float a_tile[STAGES][BK][BM + A_PAD]; /* transposed: [k][m] */
    __shared__ __align__(16) float b_tile[STAGES][BK][BN];

    /* Grouped order: block id -> (block row, block column), GROUP_M rows at a time. */
    const int grid_m = gridDim.y, grid_n = gridDim.x;
    const int pid = blockIdx.y * grid_n + blockIdx.x;
    const int per_group = GROUP_M * grid_n;
    const int first_m = (pid / per_group) * GROUP_M;
    const int group_rows = min(grid_m - first_m, GROUP_M);
    const int block_m = first_m + (pid % per_group) % group_rows;
    const int block_n = (pid % per_group) / group_rows;
    const int row0 = block_m * BM;
    const int col0 = block_n * BN;

    const int tid = threadIdx.x;
    const int warp = tid / WARP, lane = tid % WARP;
    const int t_row = (warp / WARPS_N) * WM + (lane / WTN) * VEC; /* first row of sub-tile 0 */
    const int t_col = (warp % WARPS_N) * WN + (lane % WTN) * VEC; /* first column of sub-tile 0 */

    const bool vec_a = vector_ok(A, lda);
    const bool vec_b = vector_ok(B, ldb);
    const bool vec_c = vector_ok(C, ldc);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;


    /* Each thread's fixed place in the slabs it loads, worked out once. Load l
     * of A reads row a_m + l*A_ROW_STEP, columns k0 + a_k + [0,4); load l of B
     * reads row k0 + b_k + l*B_ROW_STEP, columns col0 + b_n + [0,4). The
     * pointers move along K by BK each slab; the bounds tests that do not
     * depend on k0 are made here, once. */
    constexpr int A_ROW_STEP = THREADS / (BK / VEC); /* rows of A between loads l and l+1 */
    constexpr int B_ROW_STEP = THREADS / (BN / VEC); /* rows of B between loads l and l+1 */
    static_assert(THREADS % (BK / VEC) == 0 && THREADS % (BN / VEC) == 0,
                  "THREADS must be a multiple of BK/4 and BN/4");
    const int a_m = tid / (BK / VEC), a_k = (tid % (BK / VEC)) * VEC;
    const int b_k = tid / (BN / VEC), b_n = (tid % (BN / VEC)) * VEC;
    const float* a_src = A + (size_t)(row0 + a_m) * lda + a_k;
    const float* b_src = B + (size_t)b_k * ldb + col0 + b_n;
    const size_t a_load_step = (size_t)A_ROW_STEP * lda;
    const size_t b_load_step = (size_t)B_ROW_STEP * ldb;
    const size_t b_slab_step = (size_t)BK * ldb;
    const int b_col = col0 + b_n;
    const bool b_vec = vec_b && b_col + VEC <= N; /* B's float4 never crosses the right edge */

#if !ASYNC
    float4 a_next[A_LOADS], b_next[B_LOADS]; /* the next slab, on its way from global memory */

    /* Global -> registers for the slab at k0; a_src and b_src point at it. With
     * Checked<false> (a block wholly inside, see INTERIOR) every test is known
     * true and compiles away: no branches in the main loop's loads. */
    auto fetch = [&](int k0, auto checked) {
        constexpr bool CHECK = decltype(checked)::value;
        const int a_col = k0 + a_k;
        const bool a_vec = !CHECK || (vec_a && a_col + VEC <= K);
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const float* p = a_src + l * a_load_step;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (!CHECK || row0 + a_m + l * A_ROW_STEP < M) {
                if (a_vec) {
                    v = __ldg(reinterpret_cast<const float4*>(p));
                } else {
                    if (a_col + 0 < K) v.x = __ldg(p + 0);
                    if (a_col + 1 < K) v.y = __ldg(p + 1);
                    if (a_col + 2 < K) v.z = __ldg(p + 2);
                    if (a_col + 3 < K) v.w = __ldg(p + 3);
                }
            }
            a_next[l] = v;
        }
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const float* p = b_src + l * b_load_step;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (!CHECK || k0 + b_k + l * B_ROW_STEP < K) {
                if (!CHECK || b_vec) {
                    v = __ldg(reinterpret_cast<const float4*>(p));
                } else {
                    if (b_col + 0 < N) v.x = __ldg(p + 0);
                    if (b_col + 1 < N) v.y = __ldg(p + 1);
                    if (b_col + 2 < N) v.z = __ldg(p + 2);
                    if (b_col + 3 < N) v.w = __ldg(p + 3);
                }
            }
            b_next[l] = v;
        }
        a_src += BK;
        b_src += b_slab_step;
    };
    /* Registers -> shared buffer s (A transposed). */
    auto stash = [&](int s) {
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int idx = tid + l * THREADS;
            const int m = idx / (BK / VEC), k = (idx % (BK / VEC)) * VEC;
            const int mm = m ^ A_SWZ(k); /* k is a multiple of 4: one group for all four */
            a_tile[s][k + 0][mm] = a_next[l].x;
            a_tile[s][k + 1][mm] = a_next[l].y;
            a_tile[s][k + 2][mm] = a_next[l].z;
            a_tile[s][k + 3][mm] = a_next[l].w;
        }
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const int idx = tid + l * THREADS;
            const int k = idx / (BN / VEC), n = (idx % (BN / VEC)) * VEC;
            *reinterpret_cast<float4*>(&b_tile[s][k][n]) = b_next[l];
        }
    };
#endif
#if !FRAG_PIPE
    /* acc += the slab in shared buffer s. */
    auto multiply = [&](int s) {
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a_frag[TM], b_frag[TN];
#pragma unroll
            for (int i = 0; i < SUB_M; ++i)
                *reinterpret_cast<float4*>(&a_frag[i * VEC]) =
                    *reinterpret_cast<const float4*>(&a_tile[s][k][(t_row + i * VEC * WTM) ^ A_SWZ(k)]);
#pragma unroll
            for (int j = 0; j < SUB_N; ++j)
                *reinterpret_cast<float4*>(&b_frag[j * VEC]) =
                    *reinterpret_cast<const float4*>(&b_tile[s][k][t_col + j * VEC * WTN]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a_frag[i] * b_frag[j];
        }
    };
#else
    /* Fragments in two register buffers: the loads of step k+1 are issued
     * before the FMAs of step k. At a slab's last step the next slab's first
     * fragments come after the barrier, so the barrier's wait and their
     * shared-load latency overlap that step's TM * TN FMAs instead of
     * emptying the pipeline once per slab. Buffer f is a compile-time
     * constant once the step loop is unrolled (BK is even: step 0 is always
     * buffer 0). */
    float a_pipe[2][TM], b_pipe[2][TN];
    auto load_frags = [&](int s, int k, int f) {
#pragma unroll
        for (int i = 0; i < SUB_M; ++i)
            *reinterpret_cast<float4*>(&a_pipe[f][i * VEC]) =
                *reinterpret_cast<const float4*>(&a_tile[s][k][(t_row + i * VEC * WTM) ^ A_SWZ(k)]);
#pragma unroll
        for (int j = 0; j < SUB_N; ++j)
            *reinterpret_cast<float4*>(&b_pipe[f][j * VEC]) =
                *reinterpret_cast<const float4*>(&b_tile[s][k][t_col + j * VEC * WTN]);
    };
    auto fma_frags = [&](int f) {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j)
                acc[i][j] += a_pipe[f][i] * b_pipe[f][j];
    };
#endif

#if ASYNC
    /* Global -> shared buffer s for the slab at k0, without registers. B's
     * float4 go as 16-byte copies; A's are transposed, so each float goes
     * as its own 4-byte copy to its place in a_tile[s][k][m]. Out-of-range
     * elements are zero-filled (the source pointer is then A or B itself,
     * always valid, and nothing is read). */
    auto issue = [&](int k0, int s) {
        const int a_col = k0 + a_k;
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const float* p = a_src + l * a_load_step;
            const bool row_in = row0 + a_m + l * A_ROW_STEP < M;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const bool in = row_in && a_col + e < K;
                cp_async4(&a_tile[s][a_k + e][(a_m + l * A_ROW_STEP) ^ A_SWZ(a_k)], in ? p + e : A, in);
            }
        }
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const float* p = b_src + l * b_load_step;
            const bool row_in = k0 + b_k + l * B_ROW_STEP < K;
            float* dst = &b_tile[s][b_k + l * B_ROW_STEP][b_n];
            if (b_vec) {
                cp_async16(dst, row_in ? p : B, row_in);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const bool in = row_in && b_col + e < N;
                    cp_async4(dst + e, in ? p + e : B, in);
                }
            }
        }
        a_src += BK;
        b_src += b_slab_step;
    };
    const int slabs = (K + BK - 1) / BK;
    /* Prologue: slabs 0 .. STAGES-2 in flight. One commit group per slab,
     * empty ones too, so that "all but the newest STAGES-2 groups done"
     * always means "slab t has landed". */
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < slabs) issue(t * BK, t);
        cp_async_commit();
    }
#if FRAG_PIPE
    /* Group j holds slab j. Slab 0 lands; slab STAGES-1 goes into the last,
     * never used buffer. Then, at the last step of slab t, once slab t+1 has
     * landed and every thread has read all of slab t (its fragments are all
     * loaded by then), slab t+STAGES goes into slab t's buffer. Before that
     * barrier STAGES+t groups are committed, so "all but the newest
     * STAGES-2 pending" means slab t+1 is in. */
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (STAGES - 1 < slabs) issue((STAGES - 1) * BK, STAGES - 1);
    cp_async_commit();
    load_frags(0, 0, 0);
    for (int t = 0; t < slabs; ++t) {
        const int s = t % STAGES;
        const bool more = t + 1 < slabs;
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            if (k < BK - 1) {
                load_frags(s, k + 1, (k + 1) & 1);
            } else if (more) {
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                if (t + STAGES < slabs) issue((t + STAGES) * BK, s);
                cp_async_commit();
                load_frags((t + 1) % STAGES, 0, 0);
            }
            fma_frags(k & 1);
        }
    }
#else
    for (int t = 0; t < slabs; ++t) {
        cp_async_wait<STAGES - 2>(); /* this thread's copies of slab t are done */
        __syncthreads();             /* everyone's are; and everyone finished slab t-1 */
        const int next = t + STAGES - 1;
        /* Into the buffer slab t-1 used: free since the barrier above. */
        if (next < slabs) issue(next * BK, next % STAGES);
        cp_async_commit();
        multiply(t % STAGES);
    }
#endif
#elif DOUBLE_BUFFER && FRAG_PIPE
    auto main_loop = [&](auto checked) {
        fetch(0, checked);
        stash(0);
        __syncthreads();
        load_frags(0, 0, 0);
        int s = 0;
        for (int k0 = 0; k0 < K; k0 += BK) {
            const bool more = k0 + BK < K;     /* uniform across the block */
            if (more) fetch(k0 + BK, checked); /* in flight during this slab's FMAs */
#pragma unroll
            for (int k = 0; k < BK; ++k) {
                if (k < BK - 1) {
                    load_frags(s, k + 1, (k + 1) & 1);
                } else if (more) {
                    /* Buffer s^1 was last read in the previous slab, before its barrier;
                     * every read of buffer s is done (step BK-1's fragments are loaded). */
                    stash(s ^ 1);
                    __syncthreads();
                    s ^= 1;
                    load_frags(s, 0, 0);
                }
                fma_frags(k & 1);
            }
        }
    };
    run_main_loop(main_loop, row0 + BM <= M && col0 + BN <= N && K % BK == 0 && vec_a && vec_b);
#elif DOUBLE_BUFFER
    auto main_loop = [&](auto checked) {
        fetch(0, checked);
        stash(0);
        __syncthreads();
        int s = 0;
        for (int k0 = 0; k0 < K; k0 += BK) {
            const bool more = k0 + BK < K;
            if (more) fetch(k0 + BK, checked); /* in flight during the multiply */
            multiply(s);
            /* Buffer s^1 was last read in the previous step, before its barrier. */
            if (more) stash(s ^ 1);
            __syncthreads();
            s ^= 1;
        }
    };
    run_main_loop(main_loop, row0 + BM <= M && col0 + BN <= N && K % BK == 0 && vec_a && vec_b);
#else
    for (int k0 = 0; k0 < K; k0 += BK) {
        fetch(k0, Checked<true>{});
        stash(0);
        __syncthreads();
        multiply(0);
        __syncthreads();
    }
#endif

#pragma unroll
    for (int i = 0; i < SUB_M; ++i)
#pragma unroll
        for (int r = 0; r < VEC; ++r)
#pragma unroll
            for (int j = 0; j < SUB_N; ++j) {
                const int ai = i * VEC + r, aj = j * VEC;
                store4(C, ldc, row0 + t_row + i * VEC * WTM + r, col0 + t_col + j * VEC * WTN, M, N,
                       vec_c, make_float4(acc[ai][aj], acc[ai][aj + 1], acc[ai][aj + 2], acc[ai][aj + 3]));
            }
}
