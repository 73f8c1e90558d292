/*
 * tc3.cu: 3xTF32 tensor-core SGEMM: fp32-class accuracy from TF32 tensor cores.
 *
 * Idea: TF32 keeps 11 significant bits of fp32's 24. Split each operand x
 * into big = tf32(x) (cvt.rna: to nearest, ties away from zero) and small =
 * tf32(x - big): x - big is exact in fp32, and big + small carries 22 of x's
 * 24 bits (the rest is below 2^-22 |x|). Then
 *   a*b = a_big*b_big + a_big*b_small + a_small*b_big + a_small*b_small,
 * and the last term (~2^-22 relative) is dropped: three TF32 tensor-core
 * products per k step (the small terms first), three times tc1's tensor
 * work, which the tensor cores still do faster than the FMA units do one
 * fp32 product (CUTLASS's 3xTF32 idea; this is an independent implementation).
 *
 * Promotion. That alone is not enough: the tensor cores add into their fp32
 * accumulators with truncation, not round-to-nearest, and the bias grows
 * with the number of additions. Measured on an H100 with one accumulator over
 * all of K (128 x 256 tiles, the first version of this file), the error vs
 * float64 grew linearly with K: rms 1.9e-6 at K = 257, 2.9e-5 at 4096 (cuBLAS
 * SGEMM: 1.5e-7, 1.1e-6); an emulation of round-toward-zero accumulation in
 * numpy reproduced the size. So each PROMOTE-slab chunk of K (32 * PROMOTE
 * deep) is multiplied into a fresh tensor-core accumulator, and the chunk's
 * sum is then added into a second set of fp32 accumulators with FADD (round
 * to nearest): the truncation bias now grows with the chunk, not with K. Two
 * accumulator sets need twice the registers, hence 128 x 128 tiles here
 * (64 + 64 accumulators per thread) where tc1 has 128 x 256.
 *
 * Data path, one BK = 32 deep k-slab at a time:
 *   1. Global -> registers: each thread loads its share of A's BM x 32 slab
 *      (4 float4 along k) and of B's 32 x BN slab (one 4 x 4 block: 4 float4
 *      along n from 4 consecutive k rows) with 16-byte loads; a float4 that
 *      is misaligned (base or ld not a multiple of 4 floats) or crosses the
 *      matrix edge is read one float at a time with bounds checks, and
 *      everything outside the matrix reads as 0. The loads for slab t+2 are
 *      issued while slab t is being multiplied.
 *   2. Registers -> shared: split into big and small (cvt.rna, fsub,
 *      cvt.rna), each part stored in its own K-major tile with the 128-byte
 *      swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)); B is
 *      transposed on the way (TF32 wgmma takes K-major operands only). A
 *      stage holds A big, A small, B big, B small. Each 8-lane store phase
 *      writes 8 different chunks: no bank conflicts.
 *   3. Multiply:
 *      - USE_WGMMA = 1 (default on sm_90a): warpgroup w owns rows 64w ..
 *        64w+63 of the C tile; per slab and per 8-deep k step it issues
 *        wgmma.mma_async.m64n128k8.f32.tf32.tf32 three times (A small x B
 *        big, A big x B small, A big x B big), operands from shared memory,
 *        into 64 chunk accumulators per thread (the first wgmma of a chunk
 *        with scale-d = 0, which discards what they held). The wgmmas run
 *        while the threads split and store the next slab; at a chunk's end
 *        the thread waits for them and adds the chunk into its 64 fp32
 *        accumulators (with PROMOTE >= 2 the two warpgroups' chunks are
 *        offset by half a chunk, so that one computes while the other adds).
 *      - USE_WGMMA = 0 (sm_80, plain sm_90, or forced): warp (warp / 4,
 *        warp % 4) owns a 64 x 32 tile of C; per k step 3 x 4 x 4
 *        mma.sync.m16n8k8 (tf32) on fragments read from the same layout,
 *        into chunk accumulators promoted the same way.
 *   4. Epilogue: float2 stores, guarded at the edges, scalar where C or ldc
 *      is not 8-byte aligned.
 * Blocks walk GROUP_M block-rows before moving one block-column right.
 *
 * Launch geometry (the same for both paths; mmd/kernels.py owns it):
 *   block = (THREADS, 1, 1)        THREADS = 2 * BM  (256 at the defaults)
 *   grid  = (ceil(N / BN), ceil(M / BM), 1)
 *   registry block_tile = (BM, BN, TM, TN) = (128, 128, 8, 8): (128/8)*(128/8)
 *     = 256 threads; each thread owns 64 = 8 * 8 outputs (not a contiguous
 *     8 x 8 patch: see the fragment layouts).
 *   static shared memory  = 0
 *   dynamic shared memory = STAGES * 2 * (BM + BN) * BK * 4 + 1024 bytes
 *     (big and small tiles of A and B per stage; the 1024 let the kernel
 *     align its tiles to 1024 bytes for the 128-byte swizzle) = 197632 bytes
 *     at the defaults (STAGES 3, BM 128, BN 128, BK 32): the launcher must
 *     raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it and pass it.
 *   arch: -gencode=arch=compute_90a,code=sm_90a for the wgmma path (Hopper);
 *     -arch=sm_80 .. sm_90 build the mma.sync path (same launch). Minimum
 *     compute capability 8.0.
 *
 * Shapes: any M, K, N >= 1; any lda >= K, ldb >= N, ldc >= N; any float
 * alignment of A, B, C. Row-major, C = A * B. TILE, if given, is ignored.
 *
 * ptxas (nvcc 13.0, -cubin -O3 -Xptxas -v, default macros), 1 barrier each:
 *   -gencode=arch=compute_90a,code=sm_90a (wgmma):  255 registers, 0 bytes stack frame, 0 spill stores/loads
 *   -arch=sm_90 (mma.sync):                         244 registers, 0 bytes stack frame, 0 spill stores/loads
 *   -arch=sm_80 (mma.sync):                         242 registers, 0 bytes stack frame, 0 spill stores/loads
 * Measured (one H100 80GB HBM3, benchmarks/tc_ladder.py run 2, docs/tensorcores.md): 4096^3 in
 * 2.233 ms (61.6 TFLOP/s, 1.17x cuBLAS SGEMM), max rel error vs float64 7.3e-7 (cuBLAS SGEMM 3.3e-6).
 */
#include <stdint.h>

#ifndef BM
#define BM 128 /* rows of C per block: 64 per warpgroup */
#endif
#ifndef BN
#define BN 128 /* columns of C per block: the N of one wgmma */
#endif
#ifndef BK
#define BK 32 /* depth of one k-slab: 32 tf32 = one 128-byte swizzled row */
#endif
#ifndef STAGES
#define STAGES 3 /* shared-memory stages (>= 3) */
#endif
#ifndef PROMOTE
#define PROMOTE 1 /* slabs per tensor-core chunk before it is added into the fp32 accumulators */
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
#define NB_GROUPS (BN / 32)                          /* warp tiles of B along n (8 blocks of 4 columns) */
#define B_WARP_TILES (NB_GROUPS * (BK / 16))         /* 4 (kb) x 8 (nb) blocks each */
#define B_BLOCKS (B_WARP_TILES / WARPS)              /* 4 x 4 blocks of B per thread per slab */
#define WN (BN / 4)                                  /* columns of C per warp on the mma.sync path */

static_assert(BK == 32, "BK must be 32: a slab row of 32 tf32 values is exactly one 128-byte swizzled row");
static_assert(BN == 128, "BN must be 128: a warpgroup issues wgmma m64n128k8 (two accumulator sets of 64 registers)");
static_assert(BM == 64 || BM == 128,
              "BM must be 64 or 128: one or two warpgroups of 64 rows (three would need more registers than an SM has)");
static_assert(STAGES >= 3, "the pipeline needs at least 3 shared-memory stages (one barrier per slab)");
static_assert(PROMOTE >= 1, "PROMOTE must be at least 1 slab");
static_assert(SMEM_BYTES <= 227 * 1024, "the stages must fit in the 227 KiB of shared memory a block may use");
static_assert(A_LOADS * A_ROW_STEP == BM, "A's BM x BK slab must split into whole float4s per thread");
static_assert(B_BLOCKS >= 1 && B_BLOCKS * WARPS == B_WARP_TILES,
              "B's slab must split into whole 4 x 8-block warp tiles, the same number per warp");
static_assert(WN % 8 == 0, "each warp's columns must be whole n8 tiles on the mma.sync path");
static_assert(GROUP_M >= 1, "GROUP_M must be at least 1");

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

/* Split v; store its big part at big_dst, its small part at small_dst. */
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
__device__ __forceinline__ void fence_acc(float (&d)[64])
{
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}


#define WG_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                   "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

/* d(64 x 128, this warpgroup) = A(64 x 8) * B(8 x 128) + (accumulate ? d : 0),
 * both operands from shared memory. */
__device__ __forceinline__ void wgmma_m64n128k8(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n"
        "}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
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
     * 4nb..4nb+3). A warp takes a 4 (kb) x 8 (nb) warp tile: lane bits 1-2
     * pick kb, bit 0 and bits 3-4 pick nb, so the lanes reading one k row
     * read 8 consecutive float4 (128 bytes) and each 8-lane store phase
     * writes 8 different swizzle chunks. Warp tile u covers kb
     * 4*(u / NB_GROUPS) .. +3 and nb 8*(u % NB_GROUPS) .. +7. */
    const int a_row = tid / (BK / VEC), a_kc = tid % (BK / VEC);
    const unsigned b_kl = (lane >> 1) & 3, b_nl = 2 * (lane >> 3) + (lane & 1);
    int b_kb[B_BLOCKS], b_nb[B_BLOCKS];
#pragma unroll
    for (int b = 0; b < B_BLOCKS; ++b) {
        const unsigned u = warp + b * WARPS;
        b_kb[b] = 4 * (u / NB_GROUPS) + b_kl;
        b_nb[b] = 8 * (u % NB_GROUPS) + b_nl;
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
    /* Registers -> shared stage s, split into big and small TF32 parts; B
     * transposed to K-major (row n + e of the tile gets column e of a block). */
    auto stash = [&](int s) {
        float* as = a_tile(s);
        float* bs = b_tile(s);
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int o = swz(a_row + l * A_ROW_STEP, a_kc * VEC);
            split_store(as + o, as + A_TILE_FLOATS + o, a_next[l]);
        }
#pragma unroll
        for (int b = 0; b < B_BLOCKS; ++b) {
            const float4* v = b_next[b];
            const int n = b_nb[b] * 4, k = b_kb[b] * 4;
            int o = swz(n + 0, k);
            split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].x, v[1].x, v[2].x, v[3].x));
            o = swz(n + 1, k);
            split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].y, v[1].y, v[2].y, v[3].y));
            o = swz(n + 2, k);
            split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].z, v[1].z, v[2].z, v[3].z));
            o = swz(n + 3, k);
            split_store(bs + o, bs + B_TILE_FLOATS + o, make_float4(v[0].w, v[1].w, v[2].w, v[3].w));
        }
    };

    const int slabs = (K + BK - 1) / BK;

#if USE_WGMMA
    /* ---- wgmma path: warpgroup wg owns rows 64*wg .. +63 of the C tile ---- */
    const int wg = warp / 4;
    float d[64];  /* fp32 accumulators (FADD, round to nearest) */
    float dc[64]; /* the tensor cores' accumulators of the current chunk */
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = dc[i] = 0.0f;

    /* Descriptors of stage 0's big tiles; stage s is s * STAGE_BYTES further,
     * each small tile one tile further (>> 4 in the address field). */
    const uint32_t tiles_saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint64_t desc_a0 = smem_desc(tiles_saddr + wg * 64 * ROW_BYTES);
    const uint64_t desc_b0 = smem_desc(tiles_saddr + 2 * A_TILE_FLOATS * 4);
    constexpr uint64_t A_SMALL = (A_TILE_FLOATS * 4) >> 4, B_SMALL = (B_TILE_FLOATS * 4) >> 4;
    /* All 3 x 4 products of stage s, queued on the tensor cores as one group:
     * per k8 step the two small terms first, then big x big. fresh: the
     * slab starts a chunk, and its first product overwrites dc. */
    auto issue = [&](int s, bool fresh) {
        const uint64_t da = desc_a0 + s * (STAGE_BYTES >> 4), db = desc_b0 + s * (STAGE_BYTES >> 4);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) { /* k8 step kk starts 32 bytes further into each row */
            wgmma_m64n128k8(dc, da + A_SMALL + 2 * kk, db + 2 * kk, kk > 0 || !fresh); /* A small x B big */
            wgmma_m64n128k8(dc, da + 2 * kk, db + B_SMALL + 2 * kk, 1);                /* A big x B small */
            wgmma_m64n128k8(dc, da + 2 * kk, db + 2 * kk, 1);                          /* A big x B big */
        }
        wgmma_commit();
    };

    fetch(0);
    stash(0);
    fence_async_shared();
    if (slabs > 1) fetch(BK);
    __syncthreads();
    /* Chunk boundaries of warpgroup 1 are offset by half a chunk (PROMOTE >=
     * 2), so that while one warpgroup waits for its chunk and adds it in, the
     * other's products keep the tensor cores busy. */
    const int phase = (wg * PROMOTE) / 2;
    int s = 0, s_next = 1 % STAGES; /* stage of slab t, of slab t+1 */
    for (int t = 0; t < slabs; ++t) {
        issue(s, (t + phase) % PROMOTE == 0);
        /* Stage s_next was last read by slab t+1-STAGES <= t-2, whose wgmmas
         * every warpgroup waited for before the last barrier. */
        if (t + 1 < slabs) stash(s_next);
        /* The proxy fence (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S in SASS) waits
         * for this thread's outstanding memory operations: before the next
         * slab's loads are issued, not after. */
        fence_async_shared();
        if (t + 2 < slabs) fetch((t + 2) * BK);
        if ((t + 1 + phase) % PROMOTE == 0 || t + 1 == slabs) {
            wgmma_wait<0>(); /* the chunk is done: add it in, round to nearest */
            fence_acc(dc);
#pragma unroll
            for (int i = 0; i < 64; ++i) d[i] += dc[i];
        } else {
            wgmma_wait<1>(); /* slab t-1's wgmmas are done; slab t's may run on */
        }
        __syncthreads();
        s = s_next;
        s_next = (s_next + 1 == STAGES) ? 0 : s_next + 1;
    }

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
    /* ---- mma.sync path: warp (wm, wn) owns a 64 x WN tile of C ---- */
    const int wm = warp / 4, wn = warp % 4;
    const int g = lane / 4, q = lane % 4;
    constexpr int NJ = WN / 8; /* n8 tiles per warp */
    float d[4][NJ][4];  /* fp32 accumulators (FADD, round to nearest) */
    float dc[4][NJ][4]; /* the tensor cores' accumulators of the current chunk */
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[i][j][e] = dc[i][j][e] = 0.0f;

    /* Fragments of m16n8k8 (tf32), g = lane / 4, q = lane % 4:
     *   A (16 x 8): a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4)
     *   B (8 x 8):  b0 (k q, n g), b1 (k q+4, n g)
     *   C (16 x 8): c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1)
     * Rows g and g+8 of a tile starting at a multiple of 8 share r % 8 = g. */
    auto multiply = [&](int s) {
        const float* as = a_tile(s) + (wm * 64 + g) * BK + q;
        const float* bs = b_tile(s) + (wn * WN + g) * BK + q;
#pragma unroll 1
        for (int kk = 0; kk < BK / 8; ++kk) {
            const int lo = ((2 * kk) ^ g) << 2, hi = ((2 * kk + 1) ^ g) << 2;
            /* One 16-row tile of A at a time (big and small fragments); B's
             * fragments are read again for each. Per output and k step: the
             * small terms first, big x big last. */
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
                for (int j = 0; j < NJ; ++j) {
                    const float* pb = bs + (8 * j) * BK;
                    const uint32_t bb[2] = {__float_as_uint(pb[lo]), __float_as_uint(pb[hi])};
                    const uint32_t bsm[2] = {__float_as_uint(pb[B_TILE_FLOATS + lo]),
                                             __float_as_uint(pb[B_TILE_FLOATS + hi])};
                    mma_m16n8k8(dc[i][j], asm_, bb); /* A small x B big */
                    mma_m16n8k8(dc[i][j], ab, bsm);  /* A big x B small */
                    mma_m16n8k8(dc[i][j], ab, bb);   /* A big x B big */
                }
            }
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
        if ((t + 1) % PROMOTE == 0 || t + 1 == slabs) { /* the chunk is done: add it in */
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        d[i][j][e] += dc[i][j][e];
                        dc[i][j][e] = 0.0f;
                    }
        }
        __syncthreads();
        s = s_next;
        s_next = (s_next + 1 == STAGES) ? 0 : s_next + 1;
    }

    {
        block_origin(row0, col0); /* again: cheaper than holding it through the loop */
        const int r = row0 + wm * 64 + g;
        const int c = col0 + wn * WN + 2 * q;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                store2(C, ldc, r + 16 * i, c + 8 * j, M, N, vec_c, d[i][j][0], d[i][j][1]);
                store2(C, ldc, r + 16 * i + 8, c + 8 * j, M, N, vec_c, d[i][j][2], d[i][j][3]);
            }
    }
#endif
}
