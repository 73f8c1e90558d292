/*
 * tc_common.cuh: what the TF32 tensor-core kernels tc1.cu and tc3.cu share.
 *
 * Both compute C^T = B^T A^T through the same data path (tc1.cu's header
 * describes it): BK = 32 deep k-slabs in STAGES shared-memory stages, A's slab
 * K-major with the 128-byte swizzle, B's as it lies with padded rows, copied
 * global -> shared with cp.async by all 256 threads in the same split; the
 * same block order (GROUP_M), the same fragment and accumulator layouts and
 * the same epilogue. Kept here once so that a fix to the copies, the edges or
 * the layouts reaches both; what differs (one TF32 product or three, the
 * pipeline's schedule, the tile height) stays in each kernel's file.
 *
 * Not a kernel and not compiled alone: a .cu includes it after defining its
 * parameters BM, BN, BK, STAGES, GROUP_M and A_PARTS (copies of A's slab in a
 * stage: tc1 1, tc3 2 for its big and small parts); USE_WGMMA and PREFETCH_A
 * are optional. mmd's kernel cache keys every build on the headers beside the
 * sources (mmd/cuda/compiler.py), so a change here rebuilds both kernels.
 */
#ifndef MMD_TC_COMMON_CUH
#define MMD_TC_COMMON_CUH

#include <stdint.h>

#ifndef USE_WGMMA
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define USE_WGMMA 1 /* sm_90a: wgmma */
#else
#define USE_WGMMA 0 /* anything else: mma.sync */
#endif
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "tc1 and tc3 need TF32 tensor cores and cp.async: compute capability 8.0 or newer (-arch=sm_80 and up)"
#endif
#if USE_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "USE_WGMMA=1 needs the sm_90a target: -gencode=arch=compute_90a,code=sm_90a"
#endif

#define WARP 32
#define THREADS 256                                  /* two warpgroups */
#define WARPS (THREADS / WARP)
#define B_LD (BN + 8)                                /* floats per row of B's slab in shared memory */
#define A_TILE_BYTES (BM * BK * 4)                   /* one copy of A's slab */
#define B_TILE_BYTES (BK * B_LD * 4)
#define STAGE_BYTES (A_PARTS * A_TILE_BYTES + B_TILE_BYTES) /* A's tile(s), then B's */
#define SMEM_BYTES (STAGES * STAGE_BYTES + 1024)     /* the dynamic shared memory to launch with */
#define A_CHUNKS ((BM * BK / 4) / THREADS)           /* 16-byte chunks of A per thread per slab */
#define B_CHUNKS ((BK * BN / 4) / THREADS)           /* 16-byte chunks of B per thread per slab */
#define A_ROW_STEP (THREADS / (BK / 4))              /* rows of A between one thread's chunks */
#define B_ROW_STEP (THREADS / (BN / 4))              /* rows (k) of B between one thread's chunks */

static_assert(BK == 32, "BK must be 32: a slab row of A (32 tf32) is exactly one 128-byte swizzled row");
static_assert(BN == 128, "BN must be 128: two warpgroups of 64 columns");
static_assert(STAGES >= 3, "the pipeline needs at least 3 shared-memory stages");
static_assert(SMEM_BYTES <= 227 * 1024, "the stages must fit in the 227 KiB of shared memory a block may use");
static_assert(STAGE_BYTES % 1024 == 0 && A_TILE_BYTES % 1024 == 0,
              "A's tiles must start on 1024-byte boundaries (128-byte swizzle)");
static_assert(A_CHUNKS * THREADS * 4 == BM * BK && B_CHUNKS * THREADS * 4 == BK * BN,
              "A's and B's slabs must split into whole 16-byte chunks per thread");
static_assert((B_LD % 32) == 8, "B's padded rows must shift the banks by 8 per k row (conflict-free 64-bit loads)");
static_assert(GROUP_M >= 1, "GROUP_M must be at least 1");

/* ---- small helpers ------------------------------------------------------ */

/* x rounded to TF32 (to nearest, ties away from zero), as an fp32 bit pattern. */
__device__ __forceinline__ uint32_t tf32_bits(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

/* 16 bytes global -> shared, of which the first `bytes` are read and the rest
 * zero-filled (bytes = 0: nothing is read, 16 zero bytes land). dst and src
 * must be 16-byte aligned. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const float* src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

/* 16 bytes of A global -> shared, all read (the fast path); PREFETCH_A (tc1's
 * option): with an L2 prefetch-size hint. */
__device__ __forceinline__ void cp_async16_a(uint32_t dst, const float* src)
{
#if defined(PREFETCH_A) && PREFETCH_A
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#endif
}

/* One float global -> shared; ok = 0 lands a zero and reads nothing. */
__device__ __forceinline__ void cp_async4(uint32_t dst, const float* src, bool ok)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Wait until at most N of this thread's cp.async groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Whether 16-byte accesses at multiples of 4 columns of P are aligned. */
__device__ __forceinline__ bool vector_ok(const float* P, int ld)
{
    return ((reinterpret_cast<uintptr_t>(P) % 16) == 0) && (ld % 4 == 0);
}

/* Four floats p[0..3] (columns col .. col+3 of a row with `cols` columns) ->
 * shared memory at dst; columns at or past `cols`, or all four where !row_ok,
 * land as 0. vec: p is 16-byte aligned. */
__device__ __forceinline__ void copy4(uint32_t dst, const float* p, const float* any, int col, int cols,
                                      bool row_ok, bool vec)
{
    const int left = row_ok ? cols - col : 0; /* floats of the chunk inside the matrix */
    if (vec) {
        const int bytes = left >= 4 ? 16 : (left > 0 ? 4 * left : 0);
        cp_async16(dst, bytes ? p : any, bytes);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) cp_async4(dst + 4 * e, e < left ? p + e : any, e < left);
    }
}

/* C[row][col], C[row][col+1] = x, y where inside rows x cols. */
__device__ __forceinline__ void store2(float* __restrict__ C, int ldc, int row, int col, int rows, int cols,
                                       bool vec, float x, float y)
{
    if (row >= rows) return;
    float* p = C + (size_t)row * ldc + col;
    if (vec && col + 2 <= cols) {
        *reinterpret_cast<float2*>(p) = make_float2(x, y);
    } else {
        if (col + 0 < cols) p[0] = x;
        if (col + 1 < cols) p[1] = y;
    }
}

/* Byte offset of the 16-byte chunk c (k = 4c .. 4c+3) of row r in a K-major
 * tile with the 128-byte swizzle: rows of 128 bytes, chunk c at c ^ (r % 8). */
__device__ __forceinline__ uint32_t swz_chunk(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

#ifndef CLUSTER_N
#define CLUSTER_N 1 /* blocks of a thread-block cluster along x (tc1's TMA build); they share a block-row */
#endif

/* The first row and column of this block's C tile. Blocks walk GROUP_M
 * block-rows before moving one block-column right; with CLUSTER_N > 1 the
 * walk is over clusters (BM x CLUSTER_N*BN of C each: the grid's x is a
 * multiple of CLUSTER_N) and block r of a cluster takes its r-th column
 * block. The block index is read through volatile asm, so that the epilogue
 * can call this again instead of keeping the results in registers through
 * the main loop. */
__device__ __forceinline__ void block_origin(int& row0, int& col0)
{
    unsigned bx, by, gx, gy;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bx));
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(by));
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(gx));
    asm volatile("mov.u32 %0, %%nctaid.y;" : "=r"(gy));
    const int pid = by * (gx / CLUSTER_N) + bx / CLUSTER_N;
    const int per_group = GROUP_M * (gx / CLUSTER_N);
    const int first_m = (pid / per_group) * GROUP_M;
    const int group_rows = min((int)gy - first_m, GROUP_M);
    row0 = (first_m + (pid % per_group) % group_rows) * BM;
    col0 = (((pid % per_group) / group_rows) * CLUSTER_N + bx % CLUSTER_N) * BN;
}

/* ---- the pipeline's shared memory and copies ---------------------------- */

/* The dynamic shared memory as STAGES stages, each A's tile(s) (BM rows x 32 k,
 * K-major, swizzled; A_PARTS of them) then B's (32 rows of k x BN, padded to
 * B_LD), starting on a 1024-byte boundary as the 128-byte swizzle requires. */
struct Stages {
    uint32_t tiles;      /* shared address of stage 0 */
    unsigned char* smem; /* the same, as a generic pointer */

    __device__ __forceinline__ explicit Stages(unsigned char* raw)
    {
        const uint32_t raw_saddr = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
        tiles = (raw_saddr + 1023u) & ~1023u;
        smem = raw + (tiles - raw_saddr);
    }
    __device__ __forceinline__ uint32_t a_tile(int s) const { return tiles + s * STAGE_BYTES; }
    __device__ __forceinline__ uint32_t b_tile(int s) const { return tiles + s * STAGE_BYTES + A_PARTS * A_TILE_BYTES; }
    __device__ __forceinline__ float* a_ptr(int s) const { return reinterpret_cast<float*>(smem + s * STAGE_BYTES); }
    __device__ __forceinline__ const float* b_ptr(int s) const
    {
        return reinterpret_cast<const float*>(smem + s * STAGE_BYTES + A_PARTS * A_TILE_BYTES);
    }
};

/* This thread's share of every slab's copy global -> shared. A: thread t
 * copies chunk a_c = t % 8 (k 4a_c .. +3) of rows a_r + l * A_ROW_STEP: 8
 * lanes cover one 128-byte row, each 8-lane phase writes 8 different swizzle
 * chunks. B: chunk b_c = t % 32 (columns 4b_c .. +3) of k rows b_r + l *
 * B_ROW_STEP: a warp copies one 512-byte row. */
struct SlabCopy {
    const float* A;
    const float* B;
    int K, N, lda, ldb, col0;
    int a_c, b_r, b_c;
    unsigned a_rows_in; /* bit l: row a_r + l * A_ROW_STEP of the tile is inside A */
    const float* a_src;
    const float* b_src;
    uint32_t a_dst; /* chunk l lands at a_dst + l * A_ROW_STEP * 128: a_r % 8 does not change with l */
    uint32_t b_dst;
    bool vec_a, vec_b;

    __device__ __forceinline__ SlabCopy(const float* A_, const float* B_, int M, int K_, int N_, int lda_, int ldb_,
                                        int row0, int col0_, int tid, bool vec_a_, bool vec_b_)
    {
        /* Computed in locals and stored last: computed from members, the
         * kernels compiled to other SASS. */
        const int a_r = tid / (BK / 4), a_c_ = tid % (BK / 4);
        const int b_r_ = tid / (BN / 4), b_c_ = tid % (BN / 4);
        unsigned rows_in = 0;
#pragma unroll
        for (int l = 0; l < A_CHUNKS; ++l) rows_in |= (row0 + a_r + l * A_ROW_STEP < M) ? (1u << l) : 0u;
        const float* const a_src_ = A_ + (size_t)(row0 + a_r) * lda_ + a_c_ * 4;
        const float* const b_src_ = B_ + (size_t)b_r_ * ldb_ + col0_ + b_c_ * 4;
        const uint32_t a_dst_ = swz_chunk(a_r, a_c_);
        const uint32_t b_dst_ = (b_r_ * B_LD + b_c_ * 4) * 4;
        A = A_; B = B_; K = K_; N = N_; lda = lda_; ldb = ldb_; col0 = col0_;
        a_c = a_c_; b_r = b_r_; b_c = b_c_; a_rows_in = rows_in; a_src = a_src_; b_src = b_src_;
        a_dst = a_dst_; b_dst = b_dst_; vec_a = vec_a_; vec_b = vec_b_;
    }

    /* The slab at k0 into stage s (cp.async; the caller commits). inner: this
     * block's tile lies wholly inside A, B and C, and A and B are 16-byte
     * aligned, so every slab but a ragged last one is copied without tests.
     * The kernels compute it themselves and hand it in: kept as a member, or
     * computed by a helper function, it made nvcc's code for sm_100 and
     * sm_120 differ from what the kernels compiled to before this header. */
    __device__ __forceinline__ void load(const Stages& st, int k0, int s, bool inner) const
    {
        if (inner && k0 + BK <= K) {
#pragma unroll
            for (int l = 0; l < A_CHUNKS; ++l)
                cp_async16_a(st.a_tile(s) + a_dst + l * A_ROW_STEP * 128,
                             a_src + (size_t)l * A_ROW_STEP * lda + k0);
#pragma unroll
            for (int l = 0; l < B_CHUNKS; ++l)
                cp_async16(st.b_tile(s) + b_dst + l * B_ROW_STEP * B_LD * 4,
                           b_src + (size_t)(k0 + l * B_ROW_STEP) * ldb, 16);
            return;
        }
#pragma unroll
        for (int l = 0; l < A_CHUNKS; ++l)
            copy4(st.a_tile(s) + a_dst + l * A_ROW_STEP * 128, a_src + (size_t)l * A_ROW_STEP * lda + k0, A,
                  k0 + a_c * 4, K, (a_rows_in >> l) & 1u, vec_a);
#pragma unroll
        for (int l = 0; l < B_CHUNKS; ++l) {
            const int k = k0 + b_r + l * B_ROW_STEP;
            copy4(st.b_tile(s) + b_dst + l * B_ROW_STEP * B_LD * 4, b_src + (size_t)(k0 + l * B_ROW_STEP) * ldb, B,
                  col0 + b_c * 4, N, k < K, vec_b);
        }
    }

    /* The copies of slab t + AHEAD into its stage where there is such a slab,
     * then one commit group whether or not: so that "slab t has landed" is
     * always the same cp.async.wait_group count, to the end of K. AHEAD is a
     * template argument and the sum is taken here because the kernels' loops
     * compiled to other SASS when they passed t + LOOKAHEAD in. */
    template <int AHEAD>
    __device__ __forceinline__ void issue(const Stages& st, int t, int slabs, bool inner) const
    {
        if (t + AHEAD < slabs) load(st, (t + AHEAD) * BK, (t + AHEAD) % STAGES, inner);
        cp_async_commit();
    }
};

/* ---- tensor-core operations and the epilogue ---------------------------- */

#if USE_WGMMA
/* Shared-memory matrix descriptor for wgmma: a K-major tile with the 128-byte
 * swizzle, rows of 128 bytes, groups of 8 rows 1024 bytes apart. Fields:
 * start address >> 4 (bits 0-13), leading byte offset >> 4 (16-29; unused
 * for swizzled K-major, 1 by convention), stride byte offset >> 4 (32-45:
 * 1024 bytes between 8-row groups), base offset 0 (49-51: tiles are
 * 1024-aligned), swizzle mode 1 = 128 bytes (62-63). */
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory"); }
/* Generic-proxy shared stores -> visible to the tensor cores (async proxy). */
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Pin the accumulators: no read or write of them moves across this point. */
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/* Eight accumulators d[i .. i+7] as read-write asm operands (a wgmma's D). */
#define WG_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                   "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

/* Store a warpgroup's m64nNk8 (f32) accumulators, N = BM: d[4j + e] is
 * logical row 16*(warp%4) + g + 8*(e/2) of the transposed product (= column
 * frag_col + e/2 of C) and its column 8j + 2q + e%2 (= row of C). */
__device__ __forceinline__ void store_wgmma_acc(float* __restrict__ C, int ldc, int M, int N, bool vec_c,
                                                int frag_col, int q, const float (&d)[BM / 2])
{
    int row0, col0;
    block_origin(row0, col0); /* again: cheaper than holding it through the loop */
    const int n = col0 + frag_col;
    const int m = row0 + 2 * q;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
        store2(C, ldc, m + 8 * j, n, M, N, vec_c, d[4 * j + 0], d[4 * j + 2]);
        store2(C, ldc, m + 8 * j + 1, n, M, N, vec_c, d[4 * j + 1], d[4 * j + 3]);
    }
}
#else
/* d(16 x 8) += a(16 x 8, row) * b(8 x 8, col), TF32 operands, fp32 accumulators. */
__device__ __forceinline__ void mma_m16n8k8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Store warp (wm, wn)'s m16n8k8 accumulators: tiles (i, j) of 16 columns x 8
 * rows of C, the warp's rows 8J*wm .. +8J-1 and columns 64*wn .. +63;
 * c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1) of the transposed
 * product, its rows g, g+8 being columns 2g, 2g+1 of C. */
template <int J>
__device__ __forceinline__ void store_mma_acc(float* __restrict__ C, int ldc, int M, int N, bool vec_c,
                                              int wm, int wn, int g, int q, const float (&d)[4][J][4])
{
    int row0, col0;
    block_origin(row0, col0); /* again: cheaper than holding it through the loop */
    const int n = col0 + 64 * wn + 2 * g;
    const int m = row0 + 8 * J * wm + 2 * q;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < J; ++j) {
            store2(C, ldc, m + 8 * j, n + 16 * i, M, N, vec_c, d[i][j][0], d[i][j][2]);
            store2(C, ldc, m + 8 * j + 1, n + 16 * i, M, N, vec_c, d[i][j][1], d[i][j][3]);
        }
}
#endif

#if defined(TMA) && TMA
/* ---- the TMA builds' copies and barriers (tc1's and tc3's) ---------------- */

#include <cuda.h> /* CUtensorMap */

__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* The producer's arrival on a full barrier, announcing the bytes the copies will deliver. */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

/* Wait until the barrier's phase of this parity has completed. Cluster: acquire at cluster scope (remote
 * arrivals; it invalidates L1); else at the block's. */
template <bool Cluster>
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity)
{
    uint32_t done;
    do {
        if constexpr (Cluster)
            asm volatile("{\n .reg .pred p;\n"
                         " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done)
                         : "r"(bar), "r"(parity)
                         : "memory");
        else
            asm volatile("{\n .reg .pred p;\n"
                         " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done)
                         : "r"(bar), "r"(parity)
                         : "memory");
    } while (!done);
}

/* An arrival on this block's barrier. */
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* One box of a 2-D tensor map -> shared memory at dst, completing on bar; x the column, y the row. */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
#define TMA_B_BOX_COLS 32                         /* B's slab as boxes of 32 columns: one 128-byte swizzled row each */
#define TMA_B_BOX_BYTES (BK * TMA_B_BOX_COLS * 4) /* 4096 */

/* Where a thread's B^T fragments lie in B's slab as the copy engine leaves it: BN / 32 boxes of
 * 32 columns, each 32 rows of k x 128 bytes with the 128-byte swizzle (16-byte chunk c of row k
 * at chunk c ^ (k % 8)). Warp w4 = warp % 4 of the multiplying warpgroup wg takes half of box
 * 2wg + w4/2: lane (g, q) the columns 4c + 2h, +1 of the box with c = 2(w4 % 2) + g/4 +
 * 4((g % 4) / 2), h = g % 2. Over a half-warp (g 0..3, q 0..3, the rows k % 8 = q or q + 4)
 * the chunks c ^ (k % 8) and halves h are all different: the 64-bit fragment loads are free of
 * bank conflicts without padding the rows (the copy engine cannot pad). Logical rows g, g+8 of
 * the warp's 16 are those two columns (frag_col, frag_col + 1 of the block's C tile). */
struct TmaBFrag {
    int chunk, q, frag_col;
    uint32_t frag_box;

    __device__ __forceinline__ TmaBFrag(int wg, int warp, int lane)
    {
        const int g = lane / 4, gi = g % 4, w4 = warp % 4;
        const int box = 2 * wg + w4 / 2;
        chunk = 2 * (w4 % 2) + g / 4 + 4 * (gi / 2);
        q = lane % 4;
        frag_col = box * TMA_B_BOX_COLS + 4 * chunk + 2 * (gi % 2);
        frag_box = box * TMA_B_BOX_BYTES + 8 * (gi % 2);
    }

    /* k step kk's fragment values from the slab at b_tile: lo = (k 8kk+q), hi = (k 8kk+q+4), each
     * the thread's two columns. */
    __device__ __forceinline__ void load(uint32_t b_tile, int kk, float2& lo, float2& hi) const
    {
        const uint32_t base = b_tile + frag_box;
        const int k = 8 * kk + q; /* k % 8 = q; k + 4: q + 4 */
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                     : "=f"(lo.x), "=f"(lo.y)
                     : "r"(base + k * 128 + ((chunk ^ q) << 4)));
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                     : "=f"(hi.x), "=f"(hi.y)
                     : "r"(base + (k + 4) * 128 + ((chunk ^ (q + 4)) << 4)));
    }
};
#endif /* TMA */

#endif /* MMD_TC_COMMON_CUH */
