/*
 * tc1.cu: TF32 tensor-core SGEMM, one pass (fp32 in, TF32 products, fp32 accumulation).
 *
 * Idea: the tensor cores multiply TF32 numbers (fp32's 8-bit exponent, 10 of
 * its 23 mantissa bits) about eight times faster than the FMA units multiply
 * fp32. Each operand is rounded to TF32 (cvt.rna.tf32.f32: to nearest, ties
 * away from zero) on its way into shared memory; the products are exact and
 * summed in fp32. The result carries TF32's input rounding, a relative error
 * near 2^-11 per operand (max error vs float64 ~1e-3 of max|C|), instead of
 * fp32's 2^-24. tc3.cu recovers fp32 accuracy with three such products.
 *
 * Data path, one BK = 32 deep k-slab at a time:
 *   1. Global -> registers: each thread loads its share of A's BM x 32 slab
 *      (4 float4 along k) and of B's 32 x BN slab (two 4 x 4 blocks: 4 float4
 *      along n from 4 consecutive k rows) with 16-byte loads; a float4 that is
 *      misaligned (base or ld not a multiple of 4 floats) or crosses the
 *      matrix edge is read one float at a time with bounds checks, and
 *      everything outside the matrix reads as 0. The loads for slab t+2 are
 *      issued while slab t is being multiplied.
 *   2. Registers -> shared: rounded to TF32, stored K-major (each row of the
 *      tile, an m of A or an n of B, holds its 32 k values = 128 bytes),
 *      with the 128-byte swizzle of the Hopper tensor cores: 16-byte chunk c
 *      of row r lives at chunk c ^ (r % 8). B is transposed on the way (the
 *      4 x 4 block is written as 4 float4 along k), because TF32 wgmma takes
 *      both operands K-major only. The lanes of each 8-lane store phase hit 8
 *      different chunks, so the 16-byte stores are free of bank conflicts.
 *   3. Multiply, one of two paths chosen at compile time:
 *      - USE_WGMMA = 1 (default where the target is sm_90a): warpgroup w
 *        (threads 128w .. 128w+127) owns rows 64w .. 64w+63 of the block's C
 *        tile and issues per slab 4 x wgmma.mma_async.m64n256k8.f32.tf32.tf32,
 *        both operands read by the tensor cores straight from the swizzled
 *        shared memory through matrix descriptors; 128 fp32 accumulators per
 *        thread. The wgmmas run asynchronously while the same threads store
 *        the next slab and issue the loads of the one after (STAGES >= 3:
 *        one barrier per slab; STAGES = 2: two).
 *      - USE_WGMMA = 0 (sm_80, sm_90 without the a-suffix, or forced): warp
 *        (wm, wn) = (warp / 4, warp % 4) owns a 64 x 64 tile of C and issues
 *        per 8-deep k step 4 x 8 mma.sync.m16n8k8 (tf32) on fragments read
 *        with 32-bit shared loads from the same swizzled layout (the XOR
 *        makes those reads conflict-free too); 128 accumulators per thread.
 *   4. Epilogue: each thread writes its accumulators as float2 (two adjacent
 *      columns), guarded at the edges, scalar where C or ldc is not 8-byte
 *      aligned.
 * Blocks walk GROUP_M block-rows before moving one block-column right, as in
 * fast.cu, so that resident blocks share panels of A and B in L2.
 *
 * Launch geometry (the same for both paths; mmd/kernels.py owns it):
 *   block = (THREADS, 1, 1)        THREADS = 2 * BM  (256 at the defaults)
 *   grid  = (ceil(N / BN), ceil(M / BM), 1)
 *   registry block_tile = (BM, BN, TM, TN) = (128, 256, 8, 16): (128/8)*(256/16)
 *     = 256 threads; each thread owns 128 = 8 * 16 outputs (not a contiguous
 *     8 x 16 patch: see the fragment layouts above).
 *   static shared memory  = 0
 *   dynamic shared memory = STAGES * (BM + BN) * BK * 4 + 1024 bytes
 *     (the 1024 let the kernel align its tiles to 1024 bytes, as the 128-byte
 *     swizzle requires) = 148480 bytes at the defaults (STAGES 3, BM 128,
 *     BN 256, BK 32): the launcher must raise
 *     CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it and pass it.
 *   arch: compile with -gencode=arch=compute_90a,code=sm_90a for the wgmma
 *     path (Hopper only); -arch=sm_80 / sm_86 / sm_89 / sm_90 build the
 *     mma.sync path (same launch). Minimum compute capability 8.0.
 *
 * Shapes: any M, K, N >= 1; any lda >= K, ldb >= N, ldc >= N; any float
 * alignment of A, B, C. Row-major, C = A * B. TILE, if given, is ignored.
 *
 * ptxas (nvcc 13.0, -cubin -O3 -Xptxas -v, default macros), 1 barrier each:
 *   -gencode=arch=compute_90a,code=sm_90a (wgmma):  255 registers, 0 bytes stack frame, 0 spill stores/loads
 *   -arch=sm_90 (mma.sync):                         255 registers, 0 bytes stack frame, 0 spill stores/loads
 *   -arch=sm_80 (mma.sync):                         255 registers, 0 bytes stack frame, 0 spill stores/loads
 * (BM 64 spills 12 bytes on sm_90a: only the defaults are spill-free.)
 * Measured (one H100 80GB HBM3, benchmarks/tc_ladder.py run 2, docs/tensorcores.md): 4096^3 in
 * 0.940 ms (146 TFLOP/s; cuBLAS TF32 0.343 ms), max rel error vs float64 2.8e-4 (cuBLAS TF32's too).
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
#define STAGES 3 /* shared-memory stages (>= 2) */
#endif
#ifndef GROUP_M
#define GROUP_M 8 /* block-rows walked before moving one block-column right */
#endif
#ifndef ROUND_RNA
#define ROUND_RNA 1 /* 1: round operands with cvt.rna.tf32.f32; 0 (an experiment, to measure what
                       the rounding costs): store fp32 as it is and let the tensor cores ignore the
                       low 13 bits (truncation, twice the representation error) */
#endif
#ifndef USE_WGMMA
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define USE_WGMMA 1 /* sm_90a: wgmma */
#else
#define USE_WGMMA 0 /* anything else: mma.sync */
#endif
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "tc1 needs TF32 tensor cores: compute capability 8.0 or newer (-arch=sm_80 and up)"
#endif
#if USE_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "USE_WGMMA=1 needs the sm_90a target: -gencode=arch=compute_90a,code=sm_90a"
#endif

#define WARP 32
#define VEC 4                                        /* floats in one 16-byte access */
#define THREADS (2 * BM)                             /* BM / 64 warpgroups of 128 threads */
#define WARPS (THREADS / WARP)
#define ROW_BYTES (BK * 4)                           /* one K-major tile row: 128 bytes */
#define A_TILE_FLOATS (BM * BK)
#define B_TILE_FLOATS (BN * BK)
#define STAGE_FLOATS (A_TILE_FLOATS + B_TILE_FLOATS)
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

/* ---- small helpers ------------------------------------------------------ */

/* x rounded to TF32 (to nearest, ties away from zero), as an fp32 bit pattern. */
__device__ __forceinline__ float to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

__device__ __forceinline__ float4 to_tf32(float4 v)
{
#if ROUND_RNA
    return make_float4(to_tf32(v.x), to_tf32(v.y), to_tf32(v.z), to_tf32(v.w));
#else
    return v;
#endif
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
mmd_tc1(const float* __restrict__ A,
        const float* __restrict__ B,
        float* __restrict__ C,
        int M, int K, int N,
        int lda, int ldb, int ldc)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* Stage s: A's tile (BM rows x 32 k), then B's (BN rows x 32 k), both
     * K-major and swizzled, starting on a 1024-byte boundary. */
    const uint32_t raw_saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    float* const smem = reinterpret_cast<float*>(smem_raw + (((raw_saddr + 1023u) & ~1023u) - raw_saddr));
    auto a_tile = [&](int s) { return smem + s * STAGE_FLOATS; };
    auto b_tile = [&](int s) { return smem + s * STAGE_FLOATS + A_TILE_FLOATS; };

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

    /* Each thread's load pointers, moved along K by one slab per fetch; the
     * bounds tests that do not depend on k are made once. */
    const float* a_src = A + (size_t)(row0 + a_row) * lda + a_kc * VEC;
    const size_t a_step = (size_t)A_ROW_STEP * lda;
    unsigned a_rows_in = 0; /* bit l: row a_row + l*A_ROW_STEP of the tile is inside A */
#pragma unroll
    for (int l = 0; l < A_LOADS; ++l) a_rows_in |= (row0 + a_row + l * A_ROW_STEP < M) ? (1u << l) : 0u;
    const float* b_src[B_BLOCKS];
#pragma unroll
    for (int b = 0; b < B_BLOCKS; ++b) b_src[b] = B + (size_t)(b_kb[b] * 4) * ldb + col0 + b_nb[b] * 4;

    float4 a_next[A_LOADS], b_next[B_BLOCKS][4]; /* the next slab, on its way from global memory */

    /* Global -> registers for the slab at k0 (the next one: pointers advance). */
    auto fetch = [&](int k0) {
        const int k = k0 + a_kc * VEC;
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            a_next[l] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (a_rows_in & (1u << l)) a_next[l] = load4(a_src + l * a_step, k, K, vec_a);
        }
        a_src += BK;
#pragma unroll
        for (int b = 0; b < B_BLOCKS; ++b) {
            const int n = col0 + b_nb[b] * 4;
            const int kr = k0 + b_kb[b] * 4;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                b_next[b][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (kr + j < K) b_next[b][j] = load4(b_src[b] + j * (size_t)ldb, n, N, vec_b);
            }
            b_src[b] += (size_t)BK * ldb;
        }
    };
    /* Registers -> shared stage s, rounded to TF32; B transposed to K-major. */
    auto stash = [&](int s) {
        float* as = a_tile(s);
        float* bs = b_tile(s);
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int r = a_row + l * A_ROW_STEP;
            *reinterpret_cast<float4*>(as + swz(r, a_kc * VEC)) = to_tf32(a_next[l]);
        }
#pragma unroll
        for (int b = 0; b < B_BLOCKS; ++b) {
            const float4* v = b_next[b];
            const int n = b_nb[b] * 4, k = b_kb[b] * 4;
            *reinterpret_cast<float4*>(bs + swz(n + 0, k)) = to_tf32(make_float4(v[0].x, v[1].x, v[2].x, v[3].x));
            *reinterpret_cast<float4*>(bs + swz(n + 1, k)) = to_tf32(make_float4(v[0].y, v[1].y, v[2].y, v[3].y));
            *reinterpret_cast<float4*>(bs + swz(n + 2, k)) = to_tf32(make_float4(v[0].z, v[1].z, v[2].z, v[3].z));
            *reinterpret_cast<float4*>(bs + swz(n + 3, k)) = to_tf32(make_float4(v[0].w, v[1].w, v[2].w, v[3].w));
        }
    };

    const int slabs = (K + BK - 1) / BK;

#if USE_WGMMA
    /* ---- wgmma path: warpgroup wg owns rows 64*wg .. +63 of the C tile ---- */
    const int wg = warp / 4;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;

    /* Descriptors of stage 0; stage s is s * STAGE_BYTES further (>> 4 in the address field). */
    const uint32_t tiles_saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint64_t desc_a0 = smem_desc(tiles_saddr + wg * 64 * ROW_BYTES);
    const uint64_t desc_b0 = smem_desc(tiles_saddr + A_TILE_FLOATS * 4);
    /* All four k8 steps of stage s, queued on the tensor cores as one group. */
    auto issue = [&](int s) {
        const uint64_t da = desc_a0 + s * (STAGE_BYTES >> 4), db = desc_b0 + s * (STAGE_BYTES >> 4);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) /* k8 step kk starts 32 bytes further into each row */
            wgmma_m64n256k8(d, da + 2 * kk, db + 2 * kk);
        wgmma_commit();
    };

    fetch(0);
    stash(0);
    fence_async_shared();
    if (slabs > 1) fetch(BK);
    __syncthreads();
    int s = 0, s_next = 1 % STAGES; /* stage of slab t, of slab t+1 */
    for (int t = 0; t < slabs; ++t) {
        issue(s);
#if STAGES < 3
        wgmma_wait<1>(); /* this warpgroup's slab t-1 is done ... */
        __syncthreads(); /* ... and every warpgroup's: its stage may be overwritten */
#endif
        /* With STAGES >= 3, stage s_next was last read by slab t+1-STAGES <=
         * t-2, whose wgmmas every warpgroup waited for before the last barrier. */
        if (t + 1 < slabs) stash(s_next);
        /* The proxy fence (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S in SASS) waits
         * for this thread's outstanding memory operations: it goes before the
         * next slab's loads are issued, not after, or every slab would wait
         * out a full global-memory latency here. */
        fence_async_shared();
        if (t + 2 < slabs) fetch((t + 2) * BK);
#if STAGES >= 3
        wgmma_wait<1>(); /* slab t-1's wgmmas are done; slab t's may run on */
#endif
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
    auto multiply = [&](int s) {
        const float* as = a_tile(s) + (wm * 64 + g) * BK + q;
        const float* bs = b_tile(s) + (wn * 64 + g) * BK + q;
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            const int lo = ((2 * kk) ^ g) << 2, hi = ((2 * kk + 1) ^ g) << 2;
            uint32_t af[4][4], bf[8][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                af[i][0] = __float_as_uint(as[(16 * i) * BK + lo]);
                af[i][1] = __float_as_uint(as[(16 * i + 8) * BK + lo]);
                af[i][2] = __float_as_uint(as[(16 * i) * BK + hi]);
                af[i][3] = __float_as_uint(as[(16 * i + 8) * BK + hi]);
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                bf[j][0] = __float_as_uint(bs[(8 * j) * BK + lo]);
                bf[j][1] = __float_as_uint(bs[(8 * j) * BK + hi]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) mma_m16n8k8(d[i][j], af[i], bf[j]);
        }
    };

    fetch(0);
    stash(0);
    if (slabs > 1) fetch(BK);
    __syncthreads();
    int s = 0, s_next = 1 % STAGES; /* stage of slab t, of slab t+1 */
    for (int t = 0; t < slabs; ++t) {
        /* Stage s_next was last read by slab t+1-STAGES <= t-1, before the last barrier. */
        if (t + 1 < slabs) stash(s_next);
        if (t + 2 < slabs) fetch((t + 2) * BK); /* in flight during the multiply */
        multiply(s);
        __syncthreads();
        s = s_next;
        s_next = (s_next + 1 == STAGES) ? 0 : s_next + 1;
    }

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
