/*
 * tc3.cu: 3xTF32 tensor-core SGEMM: fp32-class accuracy from TF32 tensor cores.
 *
 * Idea: TF32 keeps 11 significant bits of fp32's 24. Split each operand
 * x into big = tf32(x) (cvt.rna: to nearest, ties away from zero) and small
 * = tf32(x - big): x - big is exact in fp32, and big + small carries 22 of
 * x's 24 bits (the rest is below 2^-22 |x|). Then
 *   a*b = a_big*b_big + a_big*b_small + a_small*b_big + a_small*b_small,
 * and the last term (~2^-22 relative) is dropped. Three TF32 tensor-core
 * products per k step, accumulated in fp32 (the small terms first, so that
 * they are not lost below the big one's rounding), give about fp32's
 * accuracy at three times tc1's tensor-core work; the tensor cores are fast
 * enough that this still beats fp32 FMA (the idea of CUTLASS's 3xTF32 GEMM;
 * this is an independent implementation).
 *
 * Data path: as tc1.cu, one BK = 32 deep k-slab at a time:
 *   1. Global -> registers with 16-byte loads (scalar and bounds-checked
 *      where misaligned or at an edge; zeros outside the matrix); the loads
 *      for slab t+2 are issued while slab t is being multiplied.
 *   2. Registers -> shared: split into big and small (cvt.rna, fsub,
 *      cvt.rna), each part stored in its own K-major tile with the 128-byte
 *      swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)); B is
 *      transposed on the way (TF32 wgmma takes K-major operands only). A
 *      stage holds A big, A small, B big, B small.
 *   3. Multiply:
 *      - USE_WGMMA = 1 (default on sm_90a): warpgroup w owns rows 64w ..
 *        64w+63 of the C tile; per slab and per 8-deep k step it issues
 *        wgmma.mma_async.m64n256k8.f32.tf32.tf32 three times (A small x B
 *        big, A big x B small, A big x B big) into the same 128 fp32
 *        accumulators per thread, all operands from shared memory. The
 *        wgmmas run while the threads split and store the next slab
 *        (STAGES = 2: two barriers per slab; STAGES >= 3: one).
 *      - USE_WGMMA = 0 (sm_80, plain sm_90, or forced): warp (warp / 4,
 *        warp % 4) owns a 64 x 64 tile of C; per k step 3 x 4 x 8
 *        mma.sync.m16n8k8 (tf32) on fragments read from the same layout.
 *   4. Epilogue: float2 stores, guarded at the edges.
 *
 * Launch geometry (the same for both paths; mmd/kernels.py owns it):
 *   block = (THREADS, 1, 1)        THREADS = 2 * BM  (256 at the defaults)
 *   grid  = (ceil(N / BN), ceil(M / BM), 1)
 *   registry block_tile = (BM, BN, TM, TN) = (128, 256, 8, 16): (128/8)*(256/16)
 *     = 256 threads; each thread owns 128 = 8 * 16 outputs.
 *   static shared memory  = 0
 *   dynamic shared memory = STAGES * 2 * (BM + BN) * BK * 4 + 1024 bytes
 *     (big and small tiles of A and B per stage; the 1024 align the tiles
 *     to 1024 bytes for the 128-byte swizzle) = 197632 bytes at the defaults
 *     (STAGES 2, BM 128, BN 256, BK 32): the launcher must raise
 *     CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it and pass it.
 *   arch: -gencode=arch=compute_90a,code=sm_90a for the wgmma path (Hopper);
 *     -arch=sm_80 .. sm_90 build the mma.sync path (same launch). Minimum
 *     compute capability 8.0.
 *
 * Shapes: any M, K, N >= 1; any lda >= K, ldb >= N, ldc >= N; any float
 * alignment of A, B, C. Row-major, C = A * B. TILE, if given, is ignored.
 *
 * ptxas (nvcc 13.0, -O3 -Xptxas -v, default macros):
 *   sm_90a (wgmma):   PTXAS90A
 *   sm_90 (mma.sync): PTXAS90
 *   sm_80 (mma.sync): PTXAS80
 */
#include <stdint.h>

#ifndef BM
#define BM 128 /* rows of C per block: 64 per warpgroup */
#endif
#ifndef BN
#define BN 256 /* columns of C per block: the N of one wgmma */
#endif
#ifndef BK
#define BK 32 /* depth of one k-slab: 32 tf32 = one 128-byte swizzled row */
#endif
#ifndef STAGES
#define STAGES 2 /* shared-memory stages (>= 2); each holds big and small parts */
#endif
#ifndef GROUP_M
#define GROUP_M 8 /* block-rows walked before moving one block-column right */
#endif
#ifndef USE_WGMMA
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define USE_WGMMA 1 /* sm_90a: wgmma */
#else
#define USE_WGMMA 0 /* anything else: mma.sync */
#endif
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "tc3 needs TF32 tensor cores: compute capability 8.0 or newer (-arch=sm_80 and up)"
#endif
#if USE_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "USE_WGMMA=1 needs the sm_90a target: -gencode=arch=compute_90a,code=sm_90a"
#endif

#define WARP 32
#define VEC 4                                        /* floats in one 16-byte access */
#define THREADS (2 * BM)                             /* BM / 64 warpgroups of 128 threads */
#define WARPS (THREADS / WARP)
#define ROW_BYTES (BK * 4)                           /* one K-major tile row: 128 bytes */
#define A_TILE_FLOATS (BM * BK)                      /* one part (big or small) of A's tile */
#define B_TILE_FLOATS (BN * BK)
#define STAGE_FLOATS (2 * (A_TILE_FLOATS + B_TILE_FLOATS)) /* A big, A small, B big, B small */
#define STAGE_BYTES (STAGE_FLOATS * 4)
#define SMEM_BYTES (STAGES * STAGE_BYTES + 1024)     /* the dynamic shared memory to launch with */
#define A_ROW_STEP (THREADS / (BK / VEC))            /* A rows between one thread's loads */
#define A_LOADS (BM / A_ROW_STEP)                    /* float4 of A per thread per slab */
#define B_BLOCKS ((BK / 4) * (BN / 4) / THREADS)     /* 4 x 4 blocks of B per thread per slab */

static_assert(BK == 32, "BK must be 32: a slab row of 32 tf32 values is exactly one 128-byte swizzled row");
static_assert(BN == 256, "BN must be 256: a warpgroup issues wgmma m64n256k8, and the mma.sync path gives each of 4 warps 64 columns");
static_assert(BM == 64 || BM == 128,
              "BM must be 64 or 128: one or two warpgroups of 64 rows (three would need more registers than an SM has)");
static_assert(STAGES >= 2, "the pipeline needs at least 2 shared-memory stages");
static_assert(SMEM_BYTES <= 227 * 1024, "the stages must fit in the 227 KiB of shared memory a block may use");
static_assert(A_LOADS * A_ROW_STEP == BM, "A's BM x BK slab must split into whole float4s per thread");
static_assert(B_BLOCKS * THREADS * 16 == BK * BN && (B_BLOCKS * WARPS) % 16 == 0,
              "B's slab must split into whole 4 x 4 blocks, whole 16-block warp tiles per warp");
static_assert(GROUP_M >= 1, "GROUP_M must be at least 1");
static_assert(A_LOADS % 2 == 0 && B_BLOCKS % 2 == 0, "a slab's loads must split into two equal halves");

/* ---- small helpers ------------------------------------------------------ */

/* x rounded to TF32 (to nearest, ties away from zero), as an fp32 bit pattern. */
__device__ __forceinline__ float to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

/* 3xTF32 split: x = big + small + (x - big - small), big = tf32(x),
 * small = tf32(x - big); the remainder is below 2^-22 |x|. An infinite big
 * (x infinite, or within half a TF32 step of FLT_MAX) gets small = 0, not
 * inf - inf = NaN, so that infinities propagate as they would in fp32. */
__device__ __forceinline__ void split_tf32(float x, float& big, float& small)
{
    big = to_tf32(x);
    small = isinf(big) ? 0.0f : to_tf32(x - big);
}

/* Split v and store its big part at big_dst, its small part at small_dst. */
__device__ __forceinline__ void split_store(float* big_dst, float* small_dst, float4 v)
{
    float4 b, s;
    split_tf32(v.x, b.x, s.x);
    split_tf32(v.y, b.y, s.y);
    split_tf32(v.z, b.z, s.z);
    split_tf32(v.w, b.w, s.w);
    *reinterpret_cast<float4*>(big_dst) = b;
    *reinterpret_cast<float4*>(small_dst) = s;
}

/* Whether float4 accesses at multiples of 4 columns of P are 16-byte aligned. */
__device__ __forceinline__ bool vector_ok(const float* P, int ld)
{
    return ((reinterpret_cast<uintptr_t>(P) % (VEC * sizeof(float))) == 0) && (ld % VEC == 0);
}

/* P[row][col .. col+3] (row-major, stride ld) as a float4; elements at or past
 * column `cols` read as 0. vec: the float4 may be loaded in one piece. */
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int col, int cols, bool vec)
{
    if (vec && col + VEC <= cols) return __ldg(reinterpret_cast<const float4*>(p));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (col + 0 < cols) v.x = __ldg(p + 0);
    if (col + 1 < cols) v.y = __ldg(p + 1);
    if (col + 2 < cols) v.z = __ldg(p + 2);
    if (col + 3 < cols) v.w = __ldg(p + 3);
    return v;
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

/* Float offset of element (r, k) in a K-major tile with the 128-byte swizzle:
 * row r is 32 floats; its 16-byte chunk k/4 sits at chunk (k/4) ^ (r%8). */
__device__ __forceinline__ int swz(int r, int k)
{
    return r * BK + ((((k >> 2) ^ (r & 7))) << 2) + (k & 3);
}

/* The first row and column of this block's C tile. Blocks walk GROUP_M
 * block-rows before moving one block-column right. The block index is read
 * through volatile asm, so that the epilogue can call this again instead of
 * keeping the results in registers through the main loop. */
__device__ __forceinline__ void block_origin(int& row0, int& col0)
{
    unsigned bx, by, gx, gy;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bx));
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(by));
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(gx));
    asm volatile("mov.u32 %0, %%nctaid.y;" : "=r"(gy));
    const int pid = by * gx + bx;
    const int per_group = GROUP_M * gx;
    const int first_m = (pid / per_group) * GROUP_M;
    const int group_rows = min((int)gy - first_m, GROUP_M);
    row0 = (first_m + (pid % per_group) % group_rows) * BM;
    col0 = ((pid % per_group) / group_rows) * BN;
}

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
__device__ __forceinline__ void fence_acc(float (&d)[128])
{
#pragma unroll
    for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                   "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

/* d(64 x 256, this warpgroup) += A(64 x 8) * B(8 x 256), both from shared memory. */
__device__ __forceinline__ void wgmma_m64n256k8(float (&d)[128], uint64_t desc_a, uint64_t desc_b)
{
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, 1, 1, 1;\n"
        "}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56),
          WG_ACC8(64), WG_ACC8(72), WG_ACC8(80), WG_ACC8(88), WG_ACC8(96), WG_ACC8(104), WG_ACC8(112), WG_ACC8(120)
        : "l"(desc_a), "l"(desc_b));
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
#endif

/* ---- the kernel ------------------------------------------------------- */

extern "C" __global__ void __launch_bounds__(THREADS, 1)
mmd_tc3(const float* __restrict__ A,
        const float* __restrict__ B,
        float* __restrict__ C,
        int M, int K, int N,
        int lda, int ldb, int ldc)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* Stage s: A's big tile (BM rows x 32 k), A's small tile, then B's big
     * (BN rows x 32 k) and small tiles, all K-major and swizzled, starting
     * on a 1024-byte boundary. */
    const uint32_t raw_saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    float* const smem = reinterpret_cast<float*>(smem_raw + (((raw_saddr + 1023u) & ~1023u) - raw_saddr));
    auto a_tile = [&](int s) { return smem + s * STAGE_FLOATS; };                     /* big; small follows */
    auto b_tile = [&](int s) { return smem + s * STAGE_FLOATS + 2 * A_TILE_FLOATS; }; /* big; small follows */

    int row0, col0;
    block_origin(row0, col0);
    const int tid = threadIdx.x;
    const int warp = tid / WARP, lane = tid % WARP;

    const bool vec_a = vector_ok(A, lda);
    const bool vec_b = vector_ok(B, ldb);
    const bool vec_c = ((reinterpret_cast<uintptr_t>(C) % (2 * sizeof(float))) == 0) && (ldc % 2 == 0);

    /* Who loads what. A: thread t reads rows a_row + l*A_ROW_STEP, k columns
     * 4*a_kc .. +3 of the slab; 8 lanes cover one 128-byte row. B: 4 x 4
     * blocks (k block kb: rows 4kb..4kb+3 of the slab; n block nb: columns
     * 4nb..4nb+3). A warp takes a 4 (kb) x 8 (nb) warp tile per round: lane
     * bits 1-2 pick kb, bit 0 and bits 3-4 pick nb, so the lanes reading one
     * k row read 8 consecutive float4 (128 bytes) and each 8-lane store phase
     * writes 8 different swizzle chunks. Warp tile u (0..15) covers kb
     * 4*(u/8) .. +3 and nb 8*(u%8) .. +7. */
    const int a_row = tid / (BK / VEC), a_kc = tid % (BK / VEC);
    const unsigned b_kl = (lane >> 1) & 3, b_nl = 2 * (lane >> 3) + (lane & 1);
    int b_kb[B_BLOCKS], b_nb[B_BLOCKS];
#pragma unroll
    for (int b = 0; b < B_BLOCKS; ++b) {
        const unsigned u = warp + b * WARPS;
        b_kb[b] = 4 * (u >> 3) + b_kl;
        b_nb[b] = 8 * (u & 7) + b_nl;
    }

    /* Each thread's load pointers at k = 0 and the bounds tests that do not
     * depend on k, made once. */
    const float* const a_src = A + (size_t)(row0 + a_row) * lda + a_kc * VEC;
    const size_t a_step = (size_t)A_ROW_STEP * lda;
    unsigned a_rows_in = 0; /* bit l: row a_row + l*A_ROW_STEP of the tile is inside A */
#pragma unroll
    for (int l = 0; l < A_LOADS; ++l) a_rows_in |= (row0 + a_row + l * A_ROW_STEP < M) ? (1u << l) : 0u;
    const float* b_src[B_BLOCKS];
#pragma unroll
    for (int b = 0; b < B_BLOCKS; ++b) b_src[b] = B + (size_t)(b_kb[b] * 4) * ldb + col0 + b_nb[b] * 4;

    /* The loads of a slab come in parts: A's loads l0 .. l0+NL-1 (fetch_a),
     * or B's block b (fetch_b, 16 floats). The kernel keeps only part of a
     * slab in registers at a time: splitting doubles what a value needs while
     * it is being stored, and a whole slab in flight beside the 128
     * accumulators would not fit in 255 registers. */
    /* Global -> registers: A's loads l0 .. l0+NL-1 of the slab at k0. */
    auto fetch_a = [&](int k0, int l0, auto& dst) {
        constexpr int NL = sizeof(dst) / sizeof(dst[0]);
        const int k = k0 + a_kc * VEC;
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int l = l0 + i;
            dst[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (a_rows_in & (1u << l)) dst[i] = load4(a_src + l * a_step + k0, k, K, vec_a);
        }
    };
    /* Global -> registers: B's block b of the slab at k0 (4 rows of float4). */
    auto fetch_b = [&](int k0, int b, float4 (&dst)[4]) {
        const int n = col0 + b_nb[b] * 4;
        const int kr = k0 + b_kb[b] * 4;
        const float* p = b_src[b] + (size_t)k0 * ldb;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            dst[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (kr + j < K) dst[j] = load4(p + j * (size_t)ldb, n, N, vec_b);
        }
    };
    /* Registers -> shared stage s, split into big and small TF32 parts. */
    auto stash_a = [&](int s, int l0, const auto& src) {
        constexpr int NL = sizeof(src) / sizeof(src[0]);
        float* as = a_tile(s);
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int o = swz(a_row + (l0 + i) * A_ROW_STEP, a_kc * VEC);
            split_store(as + o, as + A_TILE_FLOATS + o, src[i]);
        }
    };
    /* B's block b, transposed: row n + e of the tile gets column e of the block. */
    auto stash_b = [&](int s, int b, const float4 (&v)[4]) {
        float* bs = b_tile(s);
        const int n = b_nb[b] * 4, k = b_kb[b] * 4;
        int o = swz(n + 0, k);
        split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].x, v[1].x, v[2].x, v[3].x));
        o = swz(n + 1, k);
        split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].y, v[1].y, v[2].y, v[3].y));
        o = swz(n + 2, k);
        split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].z, v[1].z, v[2].z, v[3].z));
        o = swz(n + 3, k);
        split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].w, v[1].w, v[2].w, v[3].w));
    };

    const int slabs = (K + BK - 1) / BK;

#if USE_WGMMA
    /* ---- wgmma path: warpgroup wg owns rows 64*wg .. +63 of the C tile ---- */
    const int wg = warp / 4;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;

    /* Descriptors of stage 0's big tiles; stage s is s * STAGE_BYTES further,
     * each small tile one tile further (>> 4 in the address field). */
    const uint32_t tiles_saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint64_t desc_a0 = smem_desc(tiles_saddr + wg * 64 * ROW_BYTES);
    const uint64_t desc_b0 = smem_desc(tiles_saddr + 2 * A_TILE_FLOATS * 4);
    constexpr uint64_t A_SMALL = (A_TILE_FLOATS * 4) >> 4, B_SMALL = (B_TILE_FLOATS * 4) >> 4;
    /* All 3 x 4 products of stage s, queued on the tensor cores as one group:
     * per k8 step, the two small terms first, then big x big. */
    auto issue = [&](int s) {
        const uint64_t da = desc_a0 + s * (STAGE_BYTES >> 4), db = desc_b0 + s * (STAGE_BYTES >> 4);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) { /* k8 step kk starts 32 bytes further into each row */
            wgmma_m64n256k8(d, da + A_SMALL + 2 * kk, db + 2 * kk); /* A small x B big */
            wgmma_m64n256k8(d, da + 2 * kk, db + B_SMALL + 2 * kk); /* A big x B small */
            wgmma_m64n256k8(d, da + 2 * kk, db + 2 * kk);           /* A big x B big */
        }
        wgmma_commit();
    };

    /* Half h of a slab: A's loads h*A_LOADS/2 .. and B's blocks h*B_BLOCKS/2 .. */
    float4 a_next[A_LOADS / 2], b_next[B_BLOCKS / 2][4];
    auto fetch = [&](int k0, int h) {
        fetch_a(k0, h * (A_LOADS / 2), a_next);
#pragma unroll
        for (int i = 0; i < B_BLOCKS / 2; ++i) fetch_b(k0, h * (B_BLOCKS / 2) + i, b_next[i]);
    };
    auto stash = [&](int s, int h) {
        stash_a(s, h * (A_LOADS / 2), a_next);
#pragma unroll
        for (int i = 0; i < B_BLOCKS / 2; ++i) stash_b(s, h * (B_BLOCKS / 2) + i, b_next[i]);
    };

    fetch(0, 0);
    stash(0, 0);
    fetch(0, 1);
    stash(0, 1);
    if (slabs > 1) fetch(BK, 0);
    fence_async_shared();
    __syncthreads();
    int s = 0, s_next = 1 % STAGES; /* stage of slab t, of slab t+1 */
    for (int t = 0; t < slabs; ++t) {
        issue(s);
#if STAGES < 3
        wgmma_wait<1>(); /* this warpgroup's slab t-1 is done ... */
        __syncthreads(); /* ... and every warpgroup's: its stage may be overwritten */
#endif
        /* With STAGES >= 3, stage s_next was last read by slab t+1-STAGES <=
         * t-2, whose wgmmas every warpgroup waited for before the last barrier.
         * Half 1's loads are waited for right away: the tensor cores are busy
         * with slab t (and t-1) meanwhile. */
        if (t + 1 < slabs) {
            stash(s_next, 0);
            fetch((t + 1) * BK, 1);
            stash(s_next, 1);
        }
        if (t + 2 < slabs) fetch((t + 2) * BK, 0); /* in flight until the next slab's stash */
#if STAGES >= 3
        wgmma_wait<1>(); /* slab t-1's wgmmas are done; slab t's may run on */
#endif
        fence_async_shared();
        __syncthreads();
        s = s_next;
        s_next = (s_next + 1 == STAGES) ? 0 : s_next + 1;
    }
    wgmma_wait<0>();
    fence_acc(d);

    /* Accumulator layout of m64nNk8 (f32): warp w4 = warp % 4 of the
     * warpgroup holds rows 16*w4 + g and 16*w4 + g + 8 (g = lane / 4);
     * d[4j + e] is column 8j + 2*(lane % 4) + (e % 2), row + 8 for e >= 2. */
    {
        block_origin(row0, col0); /* again: cheaper than holding it through the loop */
        const int r = row0 + wg * 64 + (warp % 4) * 16 + lane / 4;
        const int c = col0 + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            store2(C, ldc, r, c + 8 * j, M, N, vec_c, d[4 * j + 0], d[4 * j + 1]);
            store2(C, ldc, r + 8, c + 8 * j, M, N, vec_c, d[4 * j + 2], d[4 * j + 3]);
        }
    }
#else
    /* ---- mma.sync path: warp (wm, wn) owns a 64 x 64 tile of C ---- */
    const int wm = warp / 4, wn = warp % 4;
    const int g = lane / 4, q = lane % 4;
    float d[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[i][j][e] = 0.0f;

    /* Fragments of m16n8k8 (tf32), g = lane / 4, q = lane % 4:
     *   A (16 x 8): a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4)
     *   B (8 x 8):  b0 (k q, n g), b1 (k q+4, n g)
     *   C (16 x 8): c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1)
     * Rows g and g+8 of a tile starting at a multiple of 8 share r % 8 = g. */
    auto multiply = [&](int s, int kk0, int kk1) { /* k8 steps kk0 .. kk1-1 */
        const float* as = a_tile(s) + (wm * 64 + g) * BK + q;
        const float* bs = b_tile(s) + (wn * 64 + g) * BK + q;
#pragma unroll 1
        for (int kk = kk0; kk < kk1; ++kk) {
            const int lo = ((2 * kk) ^ g) << 2, hi = ((2 * kk + 1) ^ g) << 2;
            /* One 16-row tile of A at a time (big and small fragments), B's
             * fragments read again for each: few registers live beside the
             * accumulators. Per output and k step: small terms first. */
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                uint32_t ab[4], asm_[4];
                const float* pa = as + (16 * i) * BK;
                ab[0] = __float_as_uint(pa[lo]);
                ab[1] = __float_as_uint(pa[8 * BK + lo]);
                ab[2] = __float_as_uint(pa[hi]);
                ab[3] = __float_as_uint(pa[8 * BK + hi]);
                asm_[0] = __float_as_uint(pa[A_TILE_FLOATS + lo]);
                asm_[1] = __float_as_uint(pa[A_TILE_FLOATS + 8 * BK + lo]);
                asm_[2] = __float_as_uint(pa[A_TILE_FLOATS + hi]);
                asm_[3] = __float_as_uint(pa[A_TILE_FLOATS + 8 * BK + hi]);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float* pb = bs + (8 * j) * BK;
                    const uint32_t bb[2] = {__float_as_uint(pb[lo]), __float_as_uint(pb[hi])};
                    const uint32_t bsm[2] = {__float_as_uint(pb[B_TILE_FLOATS + lo]),
                                             __float_as_uint(pb[B_TILE_FLOATS + hi])};
                    mma_m16n8k8(d[i][j], asm_, bb); /* A small x B big */
                    mma_m16n8k8(d[i][j], ab, bsm);  /* A big x B small */
                    mma_m16n8k8(d[i][j], ab, bb);   /* A big x B big */
                }
            }
        }
    };

    /* The slab's loads in 1 + B_BLOCKS parts of 16 floats: A's, then B's
     * blocks. Phase p of a slab stores part p of the next slab (fetched in
     * phase p-1, or during the previous slab for p = 0), fetches part p+1
     * (A's part of the slab after next, for the last phase), then multiplies
     * k8 steps PHASE_KK(p) .. PHASE_KK(p+1)-1, which hide the loads. */
#define PHASE_KK(p) (((p) * (BK / 8)) / (B_BLOCKS + 1))
    float4 a_next[A_LOADS], b_next[4];
    fetch_a(0, 0, a_next);
    stash_a(0, 0, a_next);
#pragma unroll
    for (int b = 0; b < B_BLOCKS; ++b) {
        fetch_b(0, b, b_next);
        stash_b(0, b, b_next);
    }
    if (slabs > 1) fetch_a(BK, 0, a_next);
    __syncthreads();
    int s = 0, s_next = 1 % STAGES; /* stage of slab t, of slab t+1 */
    for (int t = 0; t < slabs; ++t) {
        /* Stage s_next was last read by slab t+1-STAGES <= t-1, before the last barrier. */
        const bool more = t + 1 < slabs;
#pragma unroll
        for (int p = 0; p <= B_BLOCKS; ++p) {
            if (more) {
                if (p == 0) stash_a(s_next, 0, a_next);
                else stash_b(s_next, p - 1, b_next);
                if (p < B_BLOCKS) fetch_b((t + 1) * BK, p, b_next);
            }
            if (p == B_BLOCKS && t + 2 < slabs) fetch_a((t + 2) * BK, 0, a_next);
            multiply(s, PHASE_KK(p), PHASE_KK(p + 1));
        }
        __syncthreads();
        s = s_next;
        s_next = (s_next + 1 == STAGES) ? 0 : s_next + 1;
    }
#undef PHASE_KK

    {
        block_origin(row0, col0); /* again: cheaper than holding it through the loop */
        const int r = row0 + wm * 64 + g;
        const int c = col0 + wn * 64 + 2 * q;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                store2(C, ldc, r + 16 * i, c + 8 * j, M, N, vec_c, d[i][j][0], d[i][j][1]);
                store2(C, ldc, r + 16 * i + 8, c + 8 * j, M, N, vec_c, d[i][j][2], d[i][j][3]);
            }
    }
#endif
}
