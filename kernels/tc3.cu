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
 * all of K (the first version of this file), the error vs float64 grew
 * linearly with K: rms 1.9e-6 at K = 257, 2.9e-5 at 4096 (cuBLAS SGEMM:
 * 1.5e-7, 1.1e-6); an emulation of round-toward-zero accumulation in numpy
 * reproduced the size. So each PROMOTE-slab chunk of K (32 * PROMOTE deep) is
 * multiplied into a fresh tensor-core accumulator, and the chunk's sum is
 * then added into a second set of fp32 accumulators with FADD (round to
 * nearest): the truncation bias now grows with the chunk, not with K. Two
 * accumulator sets need twice the registers, hence 128 x 128 tiles here
 * (64 + 64 accumulators per thread) where tc1 has 256 x 128.
 *
 * The product is computed transposed, C^T = B^T A^T, as in tc1.cu: A is
 * K-major as it lies in memory and feeds the tensor cores from shared memory,
 * B^T is loaded into registers, where it is split for free. A is split in
 * shared memory: it arrives raw (cp.async), each thread splits the chunks it
 * copied, writing big in place and small into a second tile, and a proxy
 * fence makes those stores visible to the tensor cores.
 *
 * Data path, one BK = 32 deep k-slab at a time, STAGES slabs in shared memory:
 *   1. Global -> shared: cp.async, 16 bytes at a time, LOOKAHEAD slabs ahead
 *      (STAGES - 1 with PROMOTE 1, else STAGES - 2). A's BM x 32 slab lands
 *      K-major with the 128-byte swizzle (row r = 128 bytes, 16-byte chunk c
 *      at chunk c ^ (r % 8)); B's 32 x BN slab lands as it is, rows padded to
 *      BN + 8 floats (conflict-free fragment loads). Chunks that cross an edge
 *      are copied with a shorter source size (the rest zero-filled); where A
 *      or B is not 16-byte aligned each float is copied alone. What lies
 *      outside the matrix is never read and lands as 0: any M, K, N works.
 *   2. Multiply, one of two paths chosen at compile time:
 *      - USE_WGMMA = 1 (default on sm_90a): warpgroup w owns columns 64w ..
 *        64w+63 of the C tile and all BM = 128 rows. Per slab it loads its
 *        64 x 32 part of B^T into registers (8 x 64-bit loads per thread),
 *        splits it, and issues per 8-deep k step 3 x
 *        wgmma.mma_async.m64n128k8.f32.tf32.tf32 (B^T small x A big, B^T big
 *        x A small, B^T big x A big; A's tiles read from shared memory through
 *        matrix descriptors) into 64 chunk accumulators per thread (the first
 *        wgmma of a chunk with scale-d = 0, which discards what they held).
 *        While they run, the threads wait for their copies of the next slab,
 *        split them, and issue the loads of a later one; at a chunk's end
 *        they wait for the wgmmas and add the chunk into their 64 fp32
 *        accumulators. One barrier per slab.
 *      - USE_WGMMA = 0 (sm_80, plain sm_90, or forced): warp (wm, wn) =
 *        (warp % 4, warp / 4) owns a 32 x 64 tile of C; per k step 3 x 4 x 4
 *        mma.sync.m16n8k8 (tf32) on fragments read from the same layout,
 *        into chunk accumulators promoted the same way.
 *   3. Epilogue: float2 stores, guarded at the edges, scalar where C or ldc
 *      is not 8-byte aligned.
 * The fragment trick of tc1.cu (logical rows g and g+8 of the transposed
 * product are columns 2g and 2g+1 of C) gives 64-bit fragment loads and
 * float2 stores here too. Blocks walk GROUP_M block-rows before moving one
 * block-column right.
 *
 * Launch geometry (the same for both paths): the declaration below, which the
 * registry (mmd/kernels.py) reads from here; docs/kernels.md ("Writing a kernel
 * mmd can run") has each field. Each thread owns 64 = 8 * 8 outputs (not a
 * contiguous patch). The dynamic shared memory holds A's big and small tiles and
 * B's raw slab per stage, and 1024 bytes that let the kernel align its tiles to
 * 1024 bytes for the 128-byte swizzle: 201728 bytes at the defaults; the
 * launcher raises CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it and
 * passes it. arch: -gencode=arch=compute_90a,code=sm_90a for the wgmma path
 * (Hopper); -arch=sm_80 .. sm_90 build the mma.sync path (same launch).
 *
 * mmd:
 *   rung: 10
 *   description: "3xTF32 tensor cores: fp32-class accuracy above fp32 speed (tile ignored)"
 *   entry: mmd_tc3
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   precision: fp32
 *   exact: false  # fp32-class in error, but may print 0.13 where printf of the exact product prints 0.12
 *   course: false  # the ladder plan's (mmd bench --plan ladder), not the course's
 *   min_compute_capability: [8, 0]
 *   needs: TF32 tensor cores
 *   arch_specific: [sm_90]  # built for sm_90a there: wgmma
 *   tile_macro: null
 *   defines: {BM: 128, BN: 128, BK: 32, STAGES: 4, PROMOTE: 1, GROUP_M: 8, TMA: 0}
 *   switches: [USE_WGMMA]  # the file sets it by target
 *   requires:
 *     not TMA or PROMOTE == 1: the TMA build promotes every slab (PROMOTE=1)
 *   block: [256 + 128*TMA]  # two warpgroups that multiply; the TMA build's third copies and splits
 *   producers: 128*TMA
 *   block_tile: [BM, BN, BK]
 *   thread_tile: [BM/16, BN/16]
 *   grid: [columns, rows]
 *   shared_bytes: 0
 *   # per stage A's big and small tiles and B's slab (padded rows; the TMA build's unpadded, and three mbarriers)
 *   dynamic_shared_bytes: >-
 *     STAGES*(2*BM*BK + BK*BN)*4 + 1024 + 24*STAGES if TMA else STAGES*(2*BM*BK + BK*(BN + 8))*4 + 1024
 *   tensor_maps: {when: TMA, a_box: [BM, BK], b_box: [BK, 32], swizzle: 128, tf32: 0}
 *   # on sm_90a: tiles by the copy engine, split once by a producer warpgroup (docs/tensorcores.md, "The TMA
 *   # build of tc3")
 *   arch_variants:
 *     sm_90a: {label: tma, defines: {TMA: 1}}
 *
 * Shapes: any M, K, N >= 1; any lda >= K, ldb >= N, ldc >= N; any float
 * alignment of A, B, C. Row-major, C = A * B. TILE, if given, is ignored.
 *
 * The TMA build (TMA = 1, sm_90a only; docs/tensorcores.md, "The TMA build of
 * tc3"): 384 threads in three warpgroups with one job each (warp
 * specialization). Warpgroup 0 produces: its thread 0 copies each slab with
 * the copy engine (A's 32 x 128 box and B's four 32 x 32 boxes, 128-byte
 * swizzle, edges landing as zeros) onto the stage's full mbarrier, STAGES - 1
 * slabs ahead; then its 128 threads make A's small part once, beside A's slab
 * (A's big part is A as loaded, which the tensor cores truncate to TF32; the
 * small part is x less that, rounded to nearest: trunc_rest), fence the
 * stores to the tensor cores and arrive on the stage's ready mbarrier.
 * Warpgroups 1 and 2 only multiply: per slab they wait for ready, load and
 * split their B^T fragments (split_tf32, as the cp.async build; tc1's TMA map
 * of B's boxes, TmaBFrag), issue the 12 wgmmas into the chunk accumulators,
 * wait, release the stage on its empty mbarrier and promote. setmaxnreg gives
 * the producer 40 registers and the multipliers 232. Launch: (map_a, map_b, C,
 * M, K, N, ldc) through mmd/cuda/libcuda.py; block 384 (the declaration's
 * producers: 128); dynamic shared memory STAGES * (2 * BM * BK + BK * BN) * 4 +
 * 1024 + 24 * STAGES = 197728 bytes; A and B 16-byte aligned with ld a
 * multiple of 4 floats, else the cp.async build runs (mmd/cuda/stream.py,
 * launch_build). ptxas (nvcc 13.0, sm_90a): 168 registers at launch, 0 spills (after setmaxnreg
 * the multipliers may use up to 232: ptxas allocates them by it).
 * Its barrier waits acquire at the block's scope: no cluster, no remote arrival (cluster scope would
 * invalidate L1 at every wait). Its figures: docs/tensorcores.md, "The TMA build of tc3".
 *
 * ptxas (nvcc 13.0, -cubin -O3 -Xptxas -v, default macros), 1 barrier each:
 *   -gencode=arch=compute_90a,code=sm_90a (wgmma):  212 registers, 0 bytes stack frame, 0 spill stores/loads
 *                                                   (PROMOTE=2: 241 registers, no spills)
 *   -arch=sm_90 (mma.sync):                         208 registers, 0 bytes stack frame, 0 spill stores/loads
 *   -arch=sm_80 (mma.sync):                         196 registers, 0 bytes stack frame, 0 spill stores/loads
 * Figures for both paths: docs/tensorcores.md (benchmarks/tc_ladder.py).
 */
#include <stdint.h>

#ifndef BM
#define BM 128 /* rows of C per block: the N of one wgmma (A^T's columns) */
#endif
#ifndef BN
#define BN 128 /* columns of C per block: 64 per warpgroup (the M of one wgmma) */
#endif
#ifndef BK
#define BK 32 /* depth of one k-slab: 32 tf32 = one 128-byte swizzled row of A */
#endif
#ifndef STAGES
#define STAGES 4 /* shared-memory stages (>= 3) */
#endif
#ifndef PROMOTE
#define PROMOTE 1 /* slabs per tensor-core chunk before it is added into the fp32 accumulators: 1 or 2 */
#endif
#ifndef GROUP_M
#define GROUP_M 8 /* block-rows walked before moving one block-column right */
#endif
#ifndef TMA
#define TMA 0 /* 1: tiles by the copy engine, a producer warpgroup that splits them (the TMA build) */
#endif
#define A_PARTS 2 /* copies of A's slab per stage: big (raw until split) and small */

#include "tc_common.cuh"

/* Slabs in flight ahead of the one multiplied. A stage may be refilled once
 * every warp is done with it: with PROMOTE 1 every slab's products are waited
 * for before the barrier that ends it, otherwise one slab may still run. */
#define LOOKAHEAD (PROMOTE == 1 ? STAGES - 1 : STAGES - 2)

static_assert(BM == 128, "BM must be 128: the N of wgmma m64n128k8 (two accumulator sets of 64 registers)");
static_assert(PROMOTE == 1 || PROMOTE == 2, "PROMOTE must be 1 or 2 slabs");
static_assert(LOOKAHEAD >= 2, "at least two slabs must be in flight (the wgmma path readies slab t+1 during slab t)");

/* ---- small helpers ------------------------------------------------------ */

/* 3xTF32 split: x = big + small + (x - big - small), big = tf32(x),
 * small = tf32(x - big); the remainder is below 2^-22 |x|. An infinite big
 * (x infinite, or within half a TF32 step of FLT_MAX) gets small = 0, not
 * inf - inf = NaN, so that infinities propagate as they would in fp32.
 * small is rounded the cheap way: x - big is exact, and half a TF32 step
 * (bit 12) is added to its bit pattern; the tensor cores read a TF32 operand
 * by dropping the low 13 bits, so what they see is x - big rounded to
 * nearest, ties away from zero: cvt.rna's result, for one integer add instead
 * of cvt.rna's four instructions (sm_80+ has no native cvt to TF32). */
__device__ __forceinline__ void split_tf32(float x, float& big, float& small)
{
    big = __uint_as_float(tf32_bits(x));
    const float rest = isinf(big) ? 0.0f : x - big;
    small = __uint_as_float(__float_as_uint(rest) + 0x1000u);
}

__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small)
{
    float b, s;
    split_tf32(x, b, s);
    big = __float_as_uint(b);
    small = __float_as_uint(s);
}

#if USE_WGMMA
/* A slab's B^T fragments, big and small parts: [k8 step][a0..a3]. */
struct Frags {
    uint32_t big[BK / 8][4], small[BK / 8][4];
};

/* Pin the fragment registers and descriptors: their definitions stay before
 * this point (defined inside a wgmma pipeline stage, ptxas would serialize
 * the wgmmas: C7513). */
__device__ __forceinline__ void pin(Frags& f, uint64_t (&desc)[BK / 8][2])
{
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) {
        asm volatile("" : "+r"(f.big[kk][0]), "+r"(f.big[kk][1]), "+r"(f.big[kk][2]), "+r"(f.big[kk][3])::"memory");
        asm volatile("" : "+r"(f.small[kk][0]), "+r"(f.small[kk][1]), "+r"(f.small[kk][2]),
                     "+r"(f.small[kk][3]), "+l"(desc[kk][0]), "+l"(desc[kk][1])::"memory");
    }
}

/* Keep fragment registers live up to this point. */
__device__ __forceinline__ void hold(Frags& f)
{
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) {
        asm volatile("" : "+r"(f.big[kk][0]), "+r"(f.big[kk][1]), "+r"(f.big[kk][2]), "+r"(f.big[kk][3])::"memory");
        asm volatile("" : "+r"(f.small[kk][0]), "+r"(f.small[kk][1]), "+r"(f.small[kk][2]),
                     "+r"(f.small[kk][3])::"memory");
    }
}

/* d(64 x 128, this warpgroup) = a(64 x 8, registers) * b(8 x 128, shared
 * memory) + (accumulate ? d : 0). */
__device__ __forceinline__ void wgmma_m64n128k8_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int accumulate)
{
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n"
        "}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

/* k step kk's fragment values (lo: k 8kk+q, hi: k 8kk+q+4, the thread's two columns), split into f. */
__device__ __forceinline__ void split_frag(Frags& f, int kk, float2 lo, float2 hi)
{
    split_tf32(lo.x, f.big[kk][0], f.small[kk][0]);
    split_tf32(lo.y, f.big[kk][1], f.small[kk][1]);
    split_tf32(hi.x, f.big[kk][2], f.small[kk][2]);
    split_tf32(hi.y, f.big[kk][3], f.small[kk][3]);
}

/* A slab's 3 x 4 products into dc, queued on the tensor cores as one group: per k8 step the two small
 * terms first, then big x big. a_big: A's big tile (its small tile A_TILE_BYTES on); fresh: the slab
 * starts a chunk, and its first product overwrites dc. */
__device__ __forceinline__ void issue_products(float (&dc)[64], Frags& f, uint32_t a_big, bool fresh)
{
    uint64_t desc[BK / 8][2]; /* [kk][big, small]: k8 step kk starts 32 bytes further into each row */
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) {
        desc[kk][0] = smem_desc(a_big + 32 * kk);
        desc[kk][1] = smem_desc(a_big + A_TILE_BYTES + 32 * kk);
    }
    pin(f, desc);
    wgmma_fence(); /* orders the fragment registers' writes before the wgmmas' reads */
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) {
        wgmma_m64n128k8_rs(dc, f.small[kk], desc[kk][0], kk > 0 || !fresh); /* A big x B small */
        wgmma_m64n128k8_rs(dc, f.big[kk], desc[kk][1], 1);                  /* A small x B big */
        wgmma_m64n128k8_rs(dc, f.big[kk], desc[kk][0], 1);                  /* A big x B big */
    }
    wgmma_commit();
}

#endif

#if TMA
/* ---- the TMA build: a producer warpgroup, two multiplying warpgroups ------ */

#if !USE_WGMMA
#error "TMA=1 is the wgmma path's: build for sm_90a"
#endif

#define TMA_THREADS (THREADS + 128)                   /* warpgroup 0 copies and splits; 1 and 2 multiply */
#define B_TILE (BK * BN * 4)                            /* B's slab as the copy engine leaves it: four boxes */
#define TMA_STAGE_BYTES (2 * A_TILE_BYTES + B_TILE)     /* A's slab (its big part), its small part, B's slab */
#define TMA_COPY_BYTES (A_TILE_BYTES + B_TILE)         /* what the copy engine delivers per stage */
#define TMA_SMEM_BYTES (STAGES * TMA_STAGE_BYTES + 1024 + 3 * STAGES * 8)
#define PRODUCER_REGS 40  /* setmaxnreg: the producer's registers ... */
#define CONSUMER_REGS 232 /* ... and the multipliers': 128 * 40 + 256 * 232 <= 65536 */
static_assert(TMA_SMEM_BYTES <= 227 * 1024, "the stages must fit in the 227 KiB of shared memory a block may use");
static_assert(TMA_STAGE_BYTES % 1024 == 0, "every tile must start on a 1024-byte boundary (128-byte swizzle)");
static_assert(BN / TMA_B_BOX_COLS == 4, "B's slab is four boxes, two per multiplying warpgroup");
static_assert(128 * PRODUCER_REGS + 2 * 128 * CONSUMER_REGS <= 65536, "the register file holds both roles");
static_assert(PROMOTE == 1, "the TMA build promotes every slab");

/* A's small part in the TMA build: x less x truncated to TF32 (what the tensor cores read of x as loaded: its
 * big part), rounded the cheap way (split_tf32's); an infinite x gets 0, as there. */
__device__ __forceinline__ float trunc_rest(float x)
{
    const float rest = isinf(x) ? 0.0f : x - __uint_as_float(__float_as_uint(x) & 0xFFFFE000u);
    return __uint_as_float(__float_as_uint(rest) + 0x1000u);
}

extern "C" __global__ void __launch_bounds__(TMA_THREADS, 1)
mmd_tc3(const __grid_constant__ CUtensorMap map_a, /* A: box BK x BM, 128-byte swizzle, fp32 */
        const __grid_constant__ CUtensorMap map_b, /* B: box 32 x BK, 128-byte swizzle, fp32 */
        float* __restrict__ C,
        int M, int K, int N, int ldc)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t tiles = (raw + 1023u) & ~1023u;
    unsigned char* const tiles_ptr = smem_raw + (tiles - raw);
    /* full[s]: the copy engine's bytes; ready[s]: the producer's split; empty[s]: the multipliers are done */
    const uint32_t bars = tiles + STAGES * TMA_STAGE_BYTES;
    auto a_tile = [&](int s) { return tiles + s * TMA_STAGE_BYTES; };
    auto b_tile = [&](int s) { return tiles + s * TMA_STAGE_BYTES + 2 * A_TILE_BYTES; };
    auto full = [&](int s) { return bars + 8 * s; };
    auto ready = [&](int s) { return bars + 8 * (STAGES + s); };
    auto empty = [&](int s) { return bars + 8 * (2 * STAGES + s); };

    int row0, col0;
    block_origin(row0, col0);
    const int tid = threadIdx.x;
    const int warp = tid / WARP, lane = tid % WARP;
    const int wg = warp / 4;
    const int slabs = (K + BK - 1) / BK;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);      /* the producer's expect_tx; the bytes complete it */
            mbar_init(ready(s), 128);   /* every producer thread, its share split */
            mbar_init(empty(s), WARPS); /* every multiplying warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- the producer: copies each slab, then makes A's small part beside it (its big part is A as
         * loaded). Thread 0 refills slab t-1's stage with slab t-1+STAGES once the multipliers release it,
         * so STAGES - 1 slabs are copied ahead of the one split. */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        auto produce = [&](int t) {
            const int s = t % STAGES, k0 = t * BK;
            mbar_expect_tx(full(s), TMA_COPY_BYTES);
            tma_load(a_tile(s), &map_a, k0, row0, full(s));
#pragma unroll
            for (int j = 0; j < BN / TMA_B_BOX_COLS; ++j)
                tma_load(b_tile(s) + j * TMA_B_BOX_BYTES, &map_b, col0 + j * TMA_B_BOX_COLS, k0, full(s));
        };
        if (tid == 0)
            for (int t = 0; t < STAGES && t < slabs; ++t) produce(t);
        for (int t = 0; t < slabs; ++t) {
            const int s = t % STAGES;
            mbar_wait<false>(full(s), (t / STAGES) & 1);
            float4* big = reinterpret_cast<float4*>(tiles_ptr + s * TMA_STAGE_BYTES);
            /* A's big part is A as loaded; its small part goes beside it. Elementwise: any layout, here the
             * swizzled one, 16 bytes a thread in turn. */
#pragma unroll
            for (int i = 0; i < A_TILE_BYTES / 16 / 128; ++i) {
                const int at = tid + 128 * i;
                const float4 v = big[at];
                big[at + A_TILE_BYTES / 16] = make_float4(trunc_rest(v.x), trunc_rest(v.y), trunc_rest(v.z),
                                                          trunc_rest(v.w));
            }
            fence_async_shared(); /* the split, visible to the tensor cores */
            mbar_arrive(ready(s));
            const int next = t - 1 + STAGES;
            if (tid == 0 && t > 0 && next < slabs) {
                mbar_wait<false>(empty((t - 1) % STAGES), ((t - 1) / STAGES) & 1);
                produce(next);
            }
        }
        return;
    }

    /* ---- the multipliers: warpgroup wg owns columns 64(wg-1) .. +63 of the C tile ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int q = lane % 4;
    const TmaBFrag bf(wg - 1, warp, lane);
    float d[64];  /* fp32 accumulators (FADD, round to nearest) */
    float dc[64]; /* the tensor cores' accumulators of the current slab */
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = dc[i] = 0.0f;

    /* Slab t's B^T fragments, split, once its stage is copied and split. */
    auto load_frags = [&](int t, Frags& f) {
        const int s = t % STAGES, parity = (t / STAGES) & 1;
        mbar_wait<false>(full(s), parity); /* no cluster: the block's scope (no L1 invalidation) */
        mbar_wait<false>(ready(s), parity);
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            float2 lo, hi;
            bf.load(b_tile(s), kk, lo, hi);
            split_frag(f, kk, lo, hi);
        }
    };
    auto issue = [&](int t, Frags& f, bool fresh) { issue_products(dc, f, a_tile(t % STAGES), fresh); };
    auto release = [&](int t) {
        if (lane == 0) mbar_arrive(empty(t % STAGES));
    };
    auto promote = [&]() {
        fence_acc(dc);
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] += dc[i];
    };

    Frags f;
    for (int t = 0; t < slabs; ++t) {
        load_frags(t, f);
        issue(t, f, true);
        wgmma_wait<0>();
        release(t);
        promote();
    }

    const bool vec_c = ((reinterpret_cast<uintptr_t>(C) % (2 * sizeof(float))) == 0) && (ldc % 2 == 0);
    store_wgmma_acc(C, ldc, M, N, vec_c, bf.frag_col, q, d);
}

#else

/* ---- the kernel ------------------------------------------------------- */

extern "C" __global__ void __launch_bounds__(THREADS, 1)
mmd_tc3(const float* __restrict__ A,
        const float* __restrict__ B,
        float* __restrict__ C,
        int M, int K, int N,
        int lda, int ldb, int ldc)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const Stages st(smem_raw); /* A's big tile (raw until split), A's small tile, B's raw slab */

    int row0, col0;
    block_origin(row0, col0);
    const int tid = threadIdx.x;
    const int warp = tid / WARP, lane = tid % WARP;
    const int g = lane / 4, q = lane % 4;

    const bool vec_a = vector_ok(A, lda);
    const bool vec_b = vector_ok(B, ldb);
    const bool vec_c = ((reinterpret_cast<uintptr_t>(C) % (2 * sizeof(float))) == 0) && (ldc % 2 == 0);
    const SlabCopy copy(A, B, M, K, N, lda, ldb, row0, col0, tid, vec_a, vec_b);
    const bool inner = vec_a && vec_b && row0 + BM <= M && col0 + BN <= N; /* see SlabCopy::load */

    /* This thread's A chunks of stage s (landed: the caller waited for them),
     * split: big in place, small into the small tile. */
    auto split_own_a = [&](int s) {
#pragma unroll
        for (int l = 0; l < A_CHUNKS; ++l) {
            float4* p = reinterpret_cast<float4*>(st.smem + s * STAGE_BYTES + copy.a_dst + l * A_ROW_STEP * 128);
            const float4 v = *p;
            float4 big, small;
            split_tf32(v.x, big.x, small.x);
            split_tf32(v.y, big.y, small.y);
            split_tf32(v.z, big.z, small.z);
            split_tf32(v.w, big.w, small.w);
            p[0] = big;
            p[A_TILE_BYTES / 16] = small;
        }
    };

    const int slabs = (K + BK - 1) / BK;

    /* Prologue: the first LOOKAHEAD slabs in flight. */
#pragma unroll
    for (int p = 0; p < LOOKAHEAD; ++p) copy.issue<0>(st, p, slabs, inner);

#if USE_WGMMA
    /* ---- wgmma path: warpgroup wg owns columns 64*wg .. +63 of the C tile ---- */
    const int wg = warp / 4;
    float d[64];  /* fp32 accumulators (FADD, round to nearest) */
    float dc[64]; /* the tensor cores' accumulators of the current chunk */
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = dc[i] = 0.0f;

    /* B^T fragment of k step kk (as in tc1.cu): a0 = (row g, k 8kk+q),
     * a1 = (row g+8, k 8kk+q), a2, a3 = the same at k + 4, with logical rows
     * g, g+8 = columns 2g, 2g+1 of the warp's 16. */
    const int frag_col = 64 * wg + 16 * (warp % 4) + 2 * g;
    auto load_frags = [&](int s, Frags& f) {
        const float* bs = st.b_ptr(s) + frag_col;
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            const float2 lo = *reinterpret_cast<const float2*>(bs + (8 * kk + q) * B_LD);
            const float2 hi = *reinterpret_cast<const float2*>(bs + (8 * kk + q + 4) * B_LD);
            split_frag(f, kk, lo, hi);
        }
    };
    auto issue = [&](int s, Frags& f, bool fresh) { issue_products(dc, f, st.a_tile(s), fresh); };
    /* One slab. Its stage was split and published by the barrier that ended
     * the previous slab. While its products run, this thread readies slab
     * t+1 (waits for its own copies, splits them) and issues the loads of
     * slab t + LOOKAHEAD; at a chunk's end (promote) it waits for the
     * products and adds the chunk in. f / f_prev: this slab's fragments and
     * the previous slab's (read by the tensor cores until the wait). */
    auto step = [&](int t, Frags& f, Frags& f_prev, bool fresh, bool promote) {
        load_frags(t % STAGES, f);
        issue(t % STAGES, f, fresh);
        if (t + 1 < slabs) {
            /* committed: slabs up to t + LOOKAHEAD - 1; slab t+1 has landed when
             * at most LOOKAHEAD - 2 of them are still in flight */
            cp_async_wait<LOOKAHEAD - 2>();
            split_own_a((t + 1) % STAGES);
            fence_async_shared();
        }
        /* The stage of slab t + LOOKAHEAD last held slab t + LOOKAHEAD - STAGES,
         * which every warpgroup finished before the last barrier. */
        copy.issue<LOOKAHEAD>(st, t, slabs, inner);
        if (promote) {
            wgmma_wait<0>(); /* the chunk is done: add it in, round to nearest */
            fence_acc(dc);
#pragma unroll
            for (int i = 0; i < 64; ++i) d[i] += dc[i];
        } else {
            wgmma_wait<1>(); /* the previous slab's products are done; this one's run on */
        }
        hold(f_prev);
        __syncthreads(); /* slab t+1 is split everywhere; slab t (PROMOTE 1) or t-1 is done everywhere */
    };

    cp_async_wait<LOOKAHEAD - 1>(); /* slab 0 has landed */
    split_own_a(0);
    fence_async_shared();
    __syncthreads();
#if PROMOTE == 1
    /* Every slab is waited for before the next one's fragments are loaded:
     * one set of fragment registers does. */
    Frags f;
    for (int t = 0; t < slabs; ++t) step(t, f, f, true, true);
#else
    /* Slab t runs on while slab t+1's fragments are loaded: two sets, alternating. */
    Frags f0, f1;
    int t = 0;
    for (; t + 1 < slabs; t += 2) { /* a chunk per trip */
        step(t, f0, f1, true, false);
        step(t + 1, f1, f0, false, true);
    }
    if (t < slabs) step(t, f0, f1, true, true);
#endif

    store_wgmma_acc(C, ldc, M, N, vec_c, frag_col, q, d);
#else
    /* ---- mma.sync path: warp (wm, wn) owns rows 32*wm .. +31, columns 64*wn .. +63 ---- */
    const int wm = warp % 4, wn = warp / 4;
    float d[4][4][4];  /* fp32 accumulators (FADD, round to nearest) */
    float dc[4][4][4]; /* the tensor cores' accumulators of the current chunk */
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[i][j][e] = dc[i][j][e] = 0.0f;

    /* m16n8k8 (tf32) of the transposed product, g = lane / 4, q = lane % 4:
     *   "A" = B^T (16 x 8 per tile i: columns of C, permuted as in tc1.cu):
     *        a0 (row g, k q), a1 (row g+8, k q), a2 / a3 the same at k + 4;
     *   "B" = A^T (8 x 8 per tile j: rows of C): b0 (k q, row g of A), b1 (k q+4);
     *   accumulators c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1). */
    auto multiply = [&](int s) {
        const float* bs = st.b_ptr(s) + 64 * wn + 2 * g;
        const float* as = st.a_ptr(s);
#pragma unroll 1
        for (int kk = 0; kk < BK / 8; ++kk) {
            uint32_t tb[4][4], ts[4][4], ab[4][2], as_[4][2]; /* B^T big, small; A^T big, small */
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 lo = *reinterpret_cast<const float2*>(bs + 16 * i + (8 * kk + q) * B_LD);
                const float2 hi = *reinterpret_cast<const float2*>(bs + 16 * i + (8 * kk + q + 4) * B_LD);
                split_tf32(lo.x, tb[i][0], ts[i][0]);
                split_tf32(lo.y, tb[i][1], ts[i][1]);
                split_tf32(hi.x, tb[i][2], ts[i][2]);
                split_tf32(hi.y, tb[i][3], ts[i][3]);
            }
            /* Rows 32wm + 8j + g of A all have r % 8 = g: chunk (2kk) ^ g holds k 8kk .. +3. */
            const int lo = (((2 * kk) ^ g) << 2) + q, hi = (((2 * kk + 1) ^ g) << 2) + q;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float* ar = as + (32 * wm + 8 * j + g) * BK;
                ab[j][0] = __float_as_uint(ar[lo]);
                ab[j][1] = __float_as_uint(ar[hi]);
                as_[j][0] = __float_as_uint(ar[A_TILE_BYTES / 4 + lo]);
                as_[j][1] = __float_as_uint(ar[A_TILE_BYTES / 4 + hi]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    mma_m16n8k8(dc[i][j], ts[i], ab[j]);  /* A big x B small */
                    mma_m16n8k8(dc[i][j], tb[i], as_[j]); /* A small x B big */
                    mma_m16n8k8(dc[i][j], tb[i], ab[j]);  /* A big x B big */
                }
        }
    };

    for (int t = 0; t < slabs; ++t) {
        const int s = t % STAGES;
        cp_async_wait<LOOKAHEAD - 1>(); /* this thread's copies of slab t have landed */
        split_own_a(s);
        __syncthreads(); /* everyone's are split; every warp is done with slab t-1 */
        /* The stage of slab t + LOOKAHEAD last held slab t + LOOKAHEAD - STAGES <= t - 1. */
        copy.issue<LOOKAHEAD>(st, t, slabs, inner);
        multiply(s);
        if ((t + 1) % PROMOTE == 0 || t + 1 == slabs) { /* the chunk is done: add it in */
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        d[i][j][e] += dc[i][j][e];
                        dc[i][j][e] = 0.0f;
                    }
        }
    }

    store_mma_acc(C, ldc, M, N, vec_c, wm, wn, g, q, d);
#endif
}
#endif /* TMA */
