/*
 * tc1.cu: TF32 tensor-core SGEMM, one pass (fp32 in, TF32 products, fp32 accumulation).
 *
 * Idea: the tensor cores multiply TF32 numbers (fp32's 8-bit exponent, 10 of
 * its 23 mantissa bits) about eight times faster than the FMA units multiply
 * fp32. The products are exact and summed in fp32; the result carries TF32's
 * input rounding, a relative error near 2^-11 per operand, instead of fp32's
 * 2^-24. tc3.cu recovers fp32 accuracy with three such products.
 *
 * The product is computed transposed, C^T = B^T A^T, because TF32 wgmma reads
 * a shared-memory operand only K-major (k contiguous): A (row-major, k along a
 * row) is K-major as it lies in memory and feeds the tensor cores straight from
 * shared memory; B (row-major, n along a row) is not, so it is the operand
 * taken from registers, where any layout can be loaded. Nothing is transposed
 * on the way in, so the tiles can travel global -> shared with cp.async (no
 * registers, no conversion, several slabs in flight).
 *
 * Data path, one BK = 32 deep k-slab at a time, STAGES slabs in shared memory:
 *   1. Global -> shared: cp.async, 16 bytes at a time (cp.async.cg), issued
 *      STAGES - 2 slabs ahead of the multiply. A's BM x 32 slab lands K-major
 *      with the 128-byte swizzle of the Hopper tensor cores (row r = 128 bytes,
 *      16-byte chunk c at chunk c ^ (r % 8)); B's 32 x BN slab lands as it is
 *      (a row per k), rows padded to BN + 8 floats so that the fragment loads
 *      of step 3 are free of bank conflicts. A chunk that crosses an edge of
 *      the matrix is copied with a shorter source size (cp.async zero-fills the
 *      rest); where A or B is not 16-byte aligned (base or ld not a multiple
 *      of 4 floats), each float is copied alone (cp.async.ca, 4 bytes). What
 *      lies outside the matrix is never read and lands as 0: any M, K, N works.
 *   2. One barrier per slab: every thread waits for its own copies of slab t
 *      (cp.async.wait_group), then __syncthreads publishes them and tells
 *      everyone that slab t-2 is no longer read (its stage may be refilled).
 *   3. Multiply, one of two paths chosen at compile time:
 *      - USE_WGMMA = 1 (default where the target is sm_90a): warpgroup w owns
 *        columns 64w .. 64w+63 of the block's C tile (the M = 64 rows of the
 *        transposed product) and all BM = 256 of its rows (wgmma N = 256). Per
 *        slab it loads its 64 x 32 part of B^T from shared memory into
 *        registers (8 x 64-bit loads per thread), rounds it to TF32
 *        (cvt.rna: to nearest, ties away from zero) and issues 4 x
 *        wgmma.mma_async.m64n256k8.f32.tf32.tf32 with A^T read by the tensor
 *        cores from shared memory through a matrix descriptor; 128 fp32
 *        accumulators per thread. One slab's wgmmas run while the next slab's
 *        are issued (wgmma.wait_group 1), so the tensor cores always have a
 *        queued slab; the fragment registers are double-buffered for that.
 *      - USE_WGMMA = 0 (sm_80, sm_90 without the a-suffix, or forced): warp
 *        (wm, wn) = (warp % 4, warp / 4) owns a 64 x 64 tile of C and issues
 *        per 8-deep k step 4 x 8 mma.sync.m16n8k8 (tf32) on fragments read
 *        from the same shared-memory layout (conflict-free), both operands
 *        rounded in registers.
 *   4. Epilogue: each thread writes its accumulators as float2 (two adjacent
 *      columns of C), guarded at the edges, scalar where C or ldc is not 8-byte
 *      aligned.
 * Rounding A (ROUND_A): on the wgmma path A reaches the tensor cores from
 * shared memory as it was loaded, and the tensor cores read an fp32 bit
 * pattern as TF32 by dropping its low 13 bits (truncation: twice the rounding
 * error). ROUND_A = 1 rounds A in place in shared memory (each thread its own
 * chunks, after they land, then a proxy fence so the tensor cores see the
 * stores); ROUND_A = 0 leaves it truncated. B is always rounded (in registers).
 *
 * The fragment trick: the rows of the transposed product (= columns n of C)
 * may be permuted freely, as long as the epilogue undoes it. Logical rows g
 * and g + 8 of a warp's 16 (g = lane / 4) are taken to be columns 2g and 2g+1,
 * so a thread's two B values for one k are adjacent in shared memory (one
 * 64-bit load) and its two results for one row of C are adjacent in C (one
 * float2 store).
 *
 * Blocks walk GROUP_M block-rows before moving one block-column right, as in
 * fast.cu, so that resident blocks share panels of A and B in L2.
 *
 * Launch geometry (the same for both paths): the declaration below, which the
 * registry (mmd/kernels.py) reads from here; docs/kernels.md ("Writing a kernel
 * mmd can run") has each field. Two warpgroups share a BM x BN tile of C; each
 * thread owns 128 = 16 * 8 outputs, not a contiguous patch (see the fragment
 * layouts). The dynamic shared memory holds STAGES k-slabs and 1024 bytes that
 * let the kernel align its tiles to 1024 bytes, as the 128-byte swizzle
 * requires: 201728 bytes at the defaults, 197696 in the TMA build (below); the
 * launcher raises CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it and
 * passes it. arch: -gencode=arch=compute_90a,code=sm_90a builds the wgmma path
 * (Hopper only), -arch=sm_80 / sm_86 / sm_89 / sm_90 the mma.sync path (same
 * launch).
 *
 * mmd:
 *   rung: 9
 *   description: "TF32 tensor cores, one pass: fastest, about 4e-4 relative error (tile ignored)"
 *   entry: mmd_tc1
 *   arguments: [A, B, C, M, K, N, lda, ldb, ldc]
 *   multiples: false
 *   precision: tf32
 *   exact: false
 *   course: false  # the ladder plan's (mmd bench --plan ladder), not the course's
 *   min_compute_capability: [8, 0]
 *   needs: TF32 tensor cores
 *   arch_specific: [sm_90]  # built for sm_90a there: wgmma
 *   tile_macro: null
 *   defines: {BM: 256, BN: 128, BK: 32, STAGES: 4, GROUP_M: 8, ROUND_A: 0, PREFETCH_A: 0, TMA: 0, TMA_TF32: 0,
 *             CLUSTER_N: 1}
 *   switches: [USE_WGMMA]  # the file sets it by target
 *   requires:
 *     (CLUSTER_N == 1 or TMA and CLUSTER_N == 2) and (TMA or not TMA_TF32):
 *       CLUSTER_N (1 or 2) and TMA_TF32 are settings of the TMA build (TMA=1)
 *   block: [256]  # two warpgroups
 *   block_tile: [BM, BN, BK]
 *   thread_tile: [BM/16, BN/16]
 *   grid: [columns, rows]
 *   shared_bytes: 0
 *   # per stage A's BM x BK slab and B's BK x BN slab, its rows padded by 8 floats (the TMA build's unpadded,
 *   # and a full and an empty mbarrier), and the 1024 bytes of alignment
 *   dynamic_shared_bytes: >-
 *     STAGES*(BM*BK + BK*BN)*4 + 1024 + 16*STAGES if TMA else STAGES*(BM*BK + BK*(BN + 8))*4 + 1024
 *   cluster_x: CLUSTER_N
 *   # each block of a cluster copies its share of A's slab (to all of them); B's slab is 32-column boxes
 *   # (TMA_B_BOX_COLS), one 128-byte swizzled row each
 *   tensor_maps: {when: TMA, a_box: [BM/CLUSTER_N, BK], b_box: [BK, 32], swizzle: 128, tf32: TMA_TF32}
 *   # on sm_90a: tiles by the copy engine, both operands rounded to TF32 by it: cuBLAS TF32's error, and its speed
 *   # where the cp.async build had three quarters of it (docs/tensorcores.md, "The TMA build of tc1")
 *   arch_variants:
 *     sm_90a: {label: tma, defines: {TMA: 1, TMA_TF32: 1}}
 *
 * Shapes: any M, K, N >= 1; any lda >= K, ldb >= N, ldc >= N; any float
 * alignment of A, B, C. Row-major, C = A * B. TILE, if given, is ignored.
 *
 * The TMA build (TMA = 1, sm_90a only; docs/tensorcores.md, "The TMA build"):
 * thread 0 copies each slab with the copy engine from two tensor maps (A's
 * 32 x 256 box, B as four 32 x 32 boxes, all with the 128-byte swizzle; boxes
 * past an edge land as zeros) onto a full mbarrier per stage; warps release a
 * stage on its empty mbarrier once their wgmmas of it are done, and STAGES - 1
 * slabs are in flight with no __syncthreads per slab. B's fragment columns are
 * mapped so that the 64-bit loads from the unpadded swizzled boxes are free of
 * bank conflicts. TMA_TF32 = 1: the maps are TF32, the copy engine rounds both
 * operands (cuBLAS TF32's error). CLUSTER_N = 2: two blocks of a 2 x 1 cluster
 * share A's slab by multicast. Launch: the kernel takes (map_a, map_b, C, M, K,
 * N, ldc), through mmd/cuda/libcuda.py (cuLaunchKernelEx, cluster attribute);
 * block 256; grid (CLUSTER_N * ceil(N / (CLUSTER_N * BN)), ceil(M / BM));
 * dynamic shared memory STAGES * (BM * BK + BK * BN) * 4 + 1024 + 16 * STAGES
 * = 197696 bytes; A and B 16-byte aligned with ld a multiple of 4 floats.
 * mmd's tc1 on sm_90a is this build with TMA_TF32 = 1 (arch_variants, above), and the cp.async
 * build wherever A or B is not 16-byte aligned (mmd/cuda/stream.py, launch_build).
 * ptxas (nvcc 13.0, sm_90a): 186 registers, 0 spills.
 *
 * ptxas (nvcc 13.0, -cubin -O3 -Xptxas -v, default macros), 1 barrier each:
 *   -gencode=arch=compute_90a,code=sm_90a (wgmma):  194 registers, 0 bytes stack frame, 0 spill stores/loads
 *                                                   (ROUND_A=1: 207 registers, no spills)
 *   -arch=sm_90 (mma.sync):                         243 registers, 0 bytes stack frame, 0 spill stores/loads
 *   -arch=sm_80 (mma.sync):                         240 registers, 0 bytes stack frame, 0 spill stores/loads
 * Measured (one H100 80GB HBM3, benchmarks/tc_ladder.py round 3, docs/tensorcores.md): 4096^3 in
 * 0.457 ms (301 TFLOP/s; cuBLAS TF32 0.344 ms, 400 TFLOP/s), max rel error vs float64 4.5e-4
 * (cuBLAS TF32 2.8e-4; ROUND_A=1: 2.8e-4 in 0.681 ms).
 */
#include <stdint.h>

#ifndef BM
#define BM 256 /* rows of C per block: the N of one wgmma (A^T's columns) */
#endif
#ifndef BN
#define BN 128 /* columns of C per block: 64 per warpgroup (the M of one wgmma) */
#endif
#ifndef BK
#define BK 32 /* depth of one k-slab: 32 tf32 = one 128-byte swizzled row of A */
#endif
#ifndef STAGES
#define STAGES 4 /* shared-memory stages (>= 3): loads run STAGES - 2 slabs ahead */
#endif
#ifndef GROUP_M
#define GROUP_M 8 /* block-rows walked before moving one block-column right */
#endif
#ifndef ROUND_A
#define ROUND_A 0 /* 1: round A to TF32 in shared memory (cvt.rna); 0: the tensor cores truncate it */
#endif
#ifndef PREFETCH_A
#define PREFETCH_A 0 /* 1: A's copies ask L2 for 256-byte lines (.L2::256B: the next slab's half comes along) */
#endif
#ifndef TMA
#define TMA 0 /* 1: tiles by the copy engine (tensor maps, mbarriers): the TMA build */
#endif
#ifndef TMA_TF32
#define TMA_TF32 0 /* TMA build: 1 = the tensor maps are TF32, the copy engine rounds A and B as it loads them */
#endif
#ifndef CLUSTER_N
#define CLUSTER_N 1 /* TMA build: blocks per cluster along x, sharing A's slab by multicast (1 or 2) */
#endif
#define A_PARTS 1 /* copies of A's slab per stage: as loaded (ROUND_A rounds it in place) */

#include "tc_common.cuh"

#define LOOKAHEAD (STAGES - 2) /* slabs in flight ahead of the one multiplied */

static_assert(BM == 256, "BM must be 256: the N of wgmma m64n256k8, and 4 warps x 64 rows on the mma.sync path");

/* ---- small helpers ------------------------------------------------------ */

__device__ __forceinline__ uint32_t a_bits(float x)
{
#if ROUND_A
    return tf32_bits(x);
#else
    return __float_as_uint(x); /* the tensor cores drop the low 13 bits */
#endif
}

#if USE_WGMMA
/* Pin the fragment registers and descriptors: their definitions stay before this point. */
__device__ __forceinline__ void pin(uint32_t (&f)[BK / 8][4], uint64_t (&desc)[BK / 8])
{
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) {
        asm volatile("" : "+r"(f[kk][0]), "+r"(f[kk][1]), "+r"(f[kk][2]), "+r"(f[kk][3]), "+l"(desc[kk])::"memory");
    }
}

/* Keep fragment registers live up to this point. */
__device__ __forceinline__ void hold(uint32_t (&f)[BK / 8][4])
{
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk)
        asm volatile("" : "+r"(f[kk][0]), "+r"(f[kk][1]), "+r"(f[kk][2]), "+r"(f[kk][3])::"memory");
}

/* d(64 x 256, this warpgroup) += a(64 x 8, registers) * b(8 x 256, shared memory). */
__device__ __forceinline__ void wgmma_m64n256k8_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b)
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
        "{%128, %129, %130, %131}, %132, 1, 1, 1;\n"
        "}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56),
          WG_ACC8(64), WG_ACC8(72), WG_ACC8(80), WG_ACC8(88), WG_ACC8(96), WG_ACC8(104), WG_ACC8(112), WG_ACC8(120)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
#endif

#if TMA
/* ---- the TMA build: tensor maps, mbarriers, clusters -------------------- */


#if !USE_WGMMA
#error "TMA=1 is the wgmma path's: build for sm_90a"
#endif
static_assert(CLUSTER_N == 1 || CLUSTER_N == 2, "CLUSTER_N must be 1 or 2");
static_assert(STAGES >= 2, "the TMA pipeline needs at least 2 stages");

#define TMA_A_BOX_ROWS (BM / CLUSTER_N)               /* rows of A's slab each block of a cluster copies (for all) */
#define TMA_STAGE_BYTES (A_TILE_BYTES + BK * BN * 4)  /* A's slab, then B's 4 boxes, unpadded */
#define TMA_BARRIERS (2 * STAGES * 8)                 /* a full and an empty mbarrier per stage */
#define TMA_SMEM_BYTES (STAGES * TMA_STAGE_BYTES + 1024 + TMA_BARRIERS)
static_assert(TMA_SMEM_BYTES <= 227 * 1024, "the stages must fit in the 227 KiB of shared memory a block may use");
static_assert(TMA_STAGE_BYTES % 1024 == 0, "every tile must start on a 1024-byte boundary (128-byte swizzle)");

/* B's value as the tensor cores' register operand: already TF32 where the copy engine rounded it. */
__device__ __forceinline__ uint32_t b_bits(float x)
{
#if TMA_TF32
    return __float_as_uint(x);
#else
    return tf32_bits(x);
#endif
}

/* Arrive on the same barrier in block `rank` of the cluster (this block's own where CLUSTER_N is 1). */
__device__ __forceinline__ void mbar_arrive_in(uint32_t bar, unsigned rank)
{
#if CLUSTER_N > 1
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
#else
    (void)rank;
    mbar_arrive(bar);
#endif
}

/* The same box into every block of the cluster (the same shared offset and barrier in each). */
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar,
                                                   uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(mask)
                 : "memory");
}

__device__ __forceinline__ void cluster_sync()
{
#if CLUSTER_N > 1
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __syncthreads();
#endif
}

__device__ __forceinline__ unsigned cluster_rank()
{
#if CLUSTER_N > 1
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    return 0;
#endif
}

/* ---- the kernel ------------------------------------------------------- */

extern "C" __global__ void __launch_bounds__(THREADS, 1)
mmd_tc1(const __grid_constant__ CUtensorMap map_a, /* A: box BK x BM/CLUSTER_N, 128-byte swizzle */
        const __grid_constant__ CUtensorMap map_b, /* B: box 32 x BK, 128-byte swizzle */
        float* __restrict__ C,
        int M, int K, int N, int ldc)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t tiles = (raw + 1023u) & ~1023u;
    const uint32_t bars = tiles + STAGES * TMA_STAGE_BYTES; /* full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s) */
    auto a_tile = [&](int s) { return tiles + s * TMA_STAGE_BYTES; };
    auto b_tile = [&](int s) { return tiles + s * TMA_STAGE_BYTES + A_TILE_BYTES; };
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };

    int row0, col0;
    block_origin(row0, col0);
    const int tid = threadIdx.x;
    const int warp = tid / WARP, lane = tid % WARP;
    const int q = lane % 4;
    const unsigned rank = cluster_rank();
    const int slabs = (K + BK - 1) / BK;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);                  /* the producer's expect_tx; the bytes complete it */
            mbar_init(empty(s), WARPS * CLUSTER_N); /* every warp of every block that reads the stage */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync(); /* every block's barriers exist before any copy or arrival reaches them */

    /* Thread 0 copies slab t into stage t % STAGES: its share of A (to every block of the
     * cluster) and its own B, announcing all of the stage's bytes (its partner's share of A
     * included) on its own full barrier. */
    auto produce = [&](int t) {
        const int s = t % STAGES, k0 = t * BK;
        mbar_expect_tx(full(s), TMA_STAGE_BYTES);
        const uint32_t a_dst = a_tile(s) + rank * TMA_A_BOX_ROWS * 128;
#if CLUSTER_N > 1
        tma_load_multicast(a_dst, &map_a, k0, row0 + rank * TMA_A_BOX_ROWS, full(s), (1u << CLUSTER_N) - 1);
#else
        tma_load(a_dst, &map_a, k0, row0, full(s));
#endif
#pragma unroll
        for (int j = 0; j < BN / TMA_B_BOX_COLS; ++j)
            tma_load(b_tile(s) + j * TMA_B_BOX_BYTES, &map_b, col0 + j * TMA_B_BOX_COLS, k0, full(s));
    };
    if (tid == 0)
        for (int t = 0; t < STAGES && t < slabs; ++t) produce(t);

    const int wg = warp / 4;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;

    const TmaBFrag bf(wg, warp, lane);
    auto load_frags = [&](int s, uint32_t (&f)[BK / 8][4]) {
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            float2 lo, hi;
            bf.load(b_tile(s), kk, lo, hi);
            f[kk][0] = b_bits(lo.x);
            f[kk][1] = b_bits(lo.y);
            f[kk][2] = b_bits(hi.x);
            f[kk][3] = b_bits(hi.y);
        }
    };
    auto issue = [&](int s, uint32_t (&f)[BK / 8][4]) {
        uint64_t desc[BK / 8];
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) desc[kk] = smem_desc(a_tile(s) + 32 * kk);
        pin(f, desc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) wgmma_m64n256k8_rs(d, f[kk], desc[kk]);
        wgmma_commit();
    };
    /* One slab: wait for its bytes, multiply; once slab t-1's wgmmas are done, every warp
     * releases its stage in every block of the cluster, and thread 0 refills that stage with
     * slab t-1+STAGES as soon as all of them have (STAGES - 1 slabs in flight). */
    auto step = [&](int t, uint32_t (&f)[BK / 8][4], uint32_t (&f_prev)[BK / 8][4]) {
        const int s = t % STAGES;
        mbar_wait<(CLUSTER_N > 1)>(full(s), (t / STAGES) & 1);
        load_frags(s, f);
        issue(s, f);
        wgmma_wait<1>();
        hold(f_prev);
        if (t > 0) {
            const int sp = (t - 1) % STAGES;
            if (lane == 0)
#pragma unroll
                for (unsigned r = 0; r < CLUSTER_N; ++r) mbar_arrive_in(empty(sp), r);
            const int next = t - 1 + STAGES;
            if (tid == 0 && next < slabs) {
                mbar_wait<(CLUSTER_N > 1)>(empty(sp), ((next / STAGES) + 1) & 1);
                produce(next);
            }
            __syncwarp();
        }
    };
    uint32_t f0[BK / 8][4], f1[BK / 8][4];
    int t = 0;
    for (; t + 1 < slabs; t += 2) {
        step(t, f0, f1);
        step(t + 1, f1, f0);
    }
    if (t < slabs) step(t, f0, f1);
    wgmma_wait<0>();
    fence_acc(d);

    const bool vec_c = ((reinterpret_cast<uintptr_t>(C) % (2 * sizeof(float))) == 0) && (ldc % 2 == 0);
    store_wgmma_acc(C, ldc, M, N, vec_c, bf.frag_col, q, d);
    /* A block leaves only when its cluster partner is done with it: the partner's last
     * arrivals on this block's empty barriers must find them. */
    cluster_sync();
}

#else

/* ---- the kernel ------------------------------------------------------- */

extern "C" __global__ void __launch_bounds__(THREADS, 1)
mmd_tc1(const float* __restrict__ A,
        const float* __restrict__ B,
        float* __restrict__ C,
        int M, int K, int N,
        int lda, int ldb, int ldc)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const Stages st(smem_raw);

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

#if USE_WGMMA && ROUND_A
    /* This thread's A chunks of stage s (landed: the caller waited for them), rounded in place. */
    auto round_own_a = [&](int s) {
#pragma unroll
        for (int l = 0; l < A_CHUNKS; ++l) {
            float4* p = reinterpret_cast<float4*>(st.smem + s * STAGE_BYTES + copy.a_dst + l * A_ROW_STEP * 128);
            const float4 v = *p;
            *p = make_float4(__uint_as_float(tf32_bits(v.x)), __uint_as_float(tf32_bits(v.y)),
                             __uint_as_float(tf32_bits(v.z)), __uint_as_float(tf32_bits(v.w)));
        }
        fence_async_shared();
    };
#endif

    const int slabs = (K + BK - 1) / BK;

    /* Prologue: the first LOOKAHEAD slabs in flight, so that "slab t has
     * landed" is cp.async.wait_group LOOKAHEAD - 1 at the top of iteration t. */
#pragma unroll
    for (int p = 0; p < LOOKAHEAD; ++p) copy.issue<0>(st, p, slabs, inner);

#if USE_WGMMA
    /* ---- wgmma path: warpgroup wg owns columns 64*wg .. +63 of the C tile ---- */
    const int wg = warp / 4;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;

    /* Warp w4 = warp % 4 of the warpgroup supplies rows 16*w4 .. +15 of the
     * transposed product: logical rows g, g+8 = columns 2g, 2g+1 (see the
     * header). A thread's B^T fragment for k step kk: a0 = (row g, k 8kk+q),
     * a1 = (row g+8, k 8kk+q), a2, a3 = the same at k + 4. */
    const int frag_col = 64 * wg + 16 * (warp % 4) + 2 * g;
    auto load_frags = [&](int s, uint32_t (&f)[BK / 8][4]) {
        const float* bs = st.b_ptr(s) + frag_col;
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            const float2 lo = *reinterpret_cast<const float2*>(bs + (8 * kk + q) * B_LD);
            const float2 hi = *reinterpret_cast<const float2*>(bs + (8 * kk + q + 4) * B_LD);
            f[kk][0] = tf32_bits(lo.x);
            f[kk][1] = tf32_bits(lo.y);
            f[kk][2] = tf32_bits(hi.x);
            f[kk][3] = tf32_bits(hi.y);
        }
    };
    /* All four k8 steps of stage s, queued on the tensor cores as one group. */
    auto issue = [&](int s, uint32_t (&f)[BK / 8][4]) {
        uint64_t desc[BK / 8]; /* k8 step kk starts 32 bytes further into each row */
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) desc[kk] = smem_desc(st.a_tile(s) + 32 * kk);
        /* Every input of the wgmmas is defined before the fence: otherwise
         * ptxas serializes them (C7513). */
        pin(f, desc);
        wgmma_fence(); /* orders the fragment registers' writes before the wgmmas' reads */
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) wgmma_m64n256k8_rs(d, f[kk], desc[kk]);
        wgmma_commit();
    };
    /* One slab. f: its fragment registers (two sets, alternating, because the
     * previous slab's wgmmas still read theirs while this one's are loaded). */
    auto step = [&](int t, uint32_t (&f)[BK / 8][4], uint32_t (&f_prev)[BK / 8][4]) {
        const int s = t % STAGES;
        cp_async_wait<LOOKAHEAD - 1>(); /* this thread's copies of slab t have landed */
#if ROUND_A
        round_own_a(s);
#endif
        __syncthreads(); /* everyone's have; and every warpgroup is done with slab t-2 */
        /* The stage of slab t + LOOKAHEAD = t - 2 (mod STAGES) is free. */
        copy.issue<LOOKAHEAD>(st, t, slabs, inner);
        load_frags(s, f);
        issue(s, f);
        wgmma_wait<1>(); /* slab t-1's wgmmas are done; slab t's run on */
        /* Slab t-1's fragments were read by the tensor cores until now: keep
         * them live to here, so that slab t's are not given their registers. */
        hold(f_prev);
    };
    /* Two slabs per trip, so that the fragment sets alternate at compile-time
     * indices, and no conditional step inside the loop: where the number of
     * wgmma groups in flight differs between paths, ptxas cannot prove the
     * registers safe and serializes every wgmma (info C7513). */
    uint32_t f0[BK / 8][4], f1[BK / 8][4];
    int t = 0;
    for (; t + 1 < slabs; t += 2) {
        step(t, f0, f1);
        step(t + 1, f1, f0);
    }
    if (t < slabs) step(t, f0, f1);
    wgmma_wait<0>();
    fence_acc(d);

    store_wgmma_acc(C, ldc, M, N, vec_c, frag_col, q, d);
#else
    /* ---- mma.sync path: warp (wm, wn) owns rows 64*wm .. +63, columns 64*wn .. +63 ---- */
    const int wm = warp % 4, wn = warp / 4;
    float d[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[i][j][e] = 0.0f;

    /* m16n8k8 (tf32) of the transposed product, g = lane / 4, q = lane % 4:
     *   "A" = B^T (16 x 8 per tile i: columns of C, permuted as in the header):
     *        a0 (row g, k q), a1 (row g+8, k q), a2 / a3 the same at k + 4;
     *   "B" = A^T (8 x 8 per tile j: rows of C): b0 (k q, row g of A), b1 (k q+4);
     *   accumulators c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1). */
    auto multiply = [&](int s) {
        const float* bs = st.b_ptr(s) + 64 * wn + 2 * g;
        const float* as = st.a_ptr(s);
#pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            uint32_t af[4][4], bf[8][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 lo = *reinterpret_cast<const float2*>(bs + 16 * i + (8 * kk + q) * B_LD);
                const float2 hi = *reinterpret_cast<const float2*>(bs + 16 * i + (8 * kk + q + 4) * B_LD);
                af[i][0] = tf32_bits(lo.x);
                af[i][1] = tf32_bits(lo.y);
                af[i][2] = tf32_bits(hi.x);
                af[i][3] = tf32_bits(hi.y);
            }
            /* Rows 64wm + 8j + g of A all have r % 8 = g: chunk (2kk) ^ g holds k 8kk .. +3. */
            const int lo = (((2 * kk) ^ g) << 2) + q, hi = (((2 * kk + 1) ^ g) << 2) + q;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float* ar = as + (64 * wm + 8 * j + g) * BK;
                bf[j][0] = a_bits(ar[lo]);
                bf[j][1] = a_bits(ar[hi]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) mma_m16n8k8(d[i][j], af[i], bf[j]);
        }
    };

    for (int t = 0; t < slabs; ++t) {
        const int s = t % STAGES;
        cp_async_wait<LOOKAHEAD - 1>(); /* this thread's copies of slab t have landed */
        __syncthreads();                /* everyone's have; and every warp is done with slab t-1 */
        copy.issue<LOOKAHEAD>(st, t, slabs, inner);
        multiply(s);
    }

    store_mma_acc(C, ldc, M, N, vec_c, wm, wn, g, q, d);
#endif
}
#endif /* TMA */
