// text_parse.cu — tokenize the input's values and convert them to float32 on the GPU.
//
// Not a matmul kernel: mmd.gputext loads it (it is not in the matmul registry).
//
// Idea. The body of an input file (the bytes after the header line) is a
// sequence of *runs*: maximal stretches of bytes other than space, tab, CR and
// LF. A run is one value ("-2.50"), several touching %6.2f fields
// ("100.00-25.50", split after each ".dd", as the host parser does), something
// only the exact host path converts (exponents, more than MAX_DIGITS digits,
// a mantissa of 2^53 or more, more than MAX_FRAC fraction digits, runs longer
// than TEXT_MAX_RUN bytes), or an error (any other byte, a malformed number).
//
//   1. run_starts_count / scan_block_sums / run_starts_write: a run starts at
//      byte i when i is not a separator and i-1 is (or i == 0). Each block
//      counts the starts in its TEXT_BYTES_PER_BLOCK bytes, the block counts are
//      scanned, and each block writes the starts' offsets in order (a
//      stream compaction with cub::BlockScan inside the block).
//   2. runs_classify: one thread per run walks its bytes and writes how many
//      values it holds (0 for host-converted runs, which it lists in
//      `exotic` as (run, first byte) pairs, and for errors, whose first byte offset goes to
//      status[STATUS_BAD] by atomicMin so the host can name the line).
//   3. scan_count / scan_block_sums / scan_write: exclusive prefix sum of the
//      counts: the index of each run's first value. The total is the last
//      block offset.
//   4. runs_convert: one thread per run writes its values. A value is
//      sign · mant / 10^frac with mant < 2^53 and frac <= MAX_FRAC: both are
//      exact doubles and IEEE division rounds once, so the double equals
//      strtod's; __double2float_rn then gives strtod-then-float32 exactly.
//   5. set_counts / scatter_values: the host's values for exotic runs.
//
// Geometry: 1-D blocks of TEXT_THREADS threads. Byte passes: each thread owns
// TEXT_BYTES_PER_THREAD consecutive bytes (one uint4 load; the device buffer is
// padded with spaces to a whole block). Scan passes: each thread owns
// TEXT_ITEMS_PER_THREAD consecutive int32 items. Per-run passes: one thread per run.
// scan_block_sums is a single block. Offsets are int32: the host sends bodies
// of 2 GiB or more to the host parser.

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <stdint.h>

#ifndef TEXT_THREADS
#define TEXT_THREADS 256  // threads per block in every kernel here
#endif
#ifndef TEXT_BYTES_PER_THREAD
#define TEXT_BYTES_PER_THREAD 16  // one uint4 load per thread in the byte passes
#endif
#ifndef TEXT_ITEMS_PER_THREAD
#define TEXT_ITEMS_PER_THREAD 8  // int32 items per thread in the scan passes
#endif
#ifndef TEXT_MAX_RUN
#define TEXT_MAX_RUN 1024  // longest run one thread walks; longer runs go to the host
#endif

#define TEXT_BYTES_PER_BLOCK (TEXT_THREADS * TEXT_BYTES_PER_THREAD)
#define TEXT_ITEMS_PER_BLOCK (TEXT_THREADS * TEXT_ITEMS_PER_THREAD)
#define MAX_DIGITS 19  // significant digits that always fit a uint64
#define MAX_FRAC 22    // 10^22 is the largest power of ten a double holds exactly
#define TWO_POW_53 (1ULL << 53)

// status[] slots (unsigned long long)
#define STATUS_BAD 0     // smallest byte offset of a run that is an error
#define STATUS_EXOTIC 1  // number of runs for the host's exact path

static_assert(TEXT_BYTES_PER_THREAD == 16, "the byte passes load one uint4 (16 bytes) per thread");

typedef cub::BlockScan<int, TEXT_THREADS> BlockScanInt;
typedef cub::BlockReduce<int, TEXT_THREADS> BlockReduceInt;

__constant__ double kPow10[MAX_FRAC + 1] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                            1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                            1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

__device__ __forceinline__ bool is_sep(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
__device__ __forceinline__ bool is_digit(unsigned c) { return c - '0' < 10u; }

// Bit i of the result: byte i of the thread's 16 starts a run.
__device__ __forceinline__ unsigned start_mask(const unsigned char* __restrict__ text, long long base) {
    uint4 v = *reinterpret_cast<const uint4*>(text + base);
    unsigned words[4] = {v.x, v.y, v.z, v.w};
    unsigned prev_sep = base == 0 ? 1u : (unsigned)is_sep(text[base - 1]);
    unsigned mask = 0;
#pragma unroll
    for (int i = 0; i < TEXT_BYTES_PER_THREAD; ++i) {
        unsigned c = (words[i >> 2] >> (8 * (i & 3))) & 0xFFu;
        unsigned sep = is_sep(c);
        mask |= (prev_sep & (sep ^ 1u)) << i;
        prev_sep = sep;
    }
    return mask;
}

// text is padded with spaces to gridDim.x * TEXT_BYTES_PER_BLOCK bytes.
extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    run_starts_count(const unsigned char* __restrict__ text, int* __restrict__ block_sums) {
    __shared__ typename BlockReduceInt::TempStorage temp;
    long long base = (long long)blockIdx.x * TEXT_BYTES_PER_BLOCK + threadIdx.x * TEXT_BYTES_PER_THREAD;
    int count = __popc(start_mask(text, base));
    int total = BlockReduceInt(temp).Sum(count);
    if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    run_starts_write(const unsigned char* __restrict__ text, const int* __restrict__ block_offsets,
                     int* __restrict__ run_start) {
    __shared__ typename BlockScanInt::TempStorage temp;
    long long base = (long long)blockIdx.x * TEXT_BYTES_PER_BLOCK + threadIdx.x * TEXT_BYTES_PER_THREAD;
    unsigned mask = start_mask(text, base);
    int before;
    BlockScanInt(temp).ExclusiveSum(__popc(mask), before);
    int out = block_offsets[blockIdx.x] + before;
    while (mask) {
        int i = __ffs(mask) - 1;
        mask &= mask - 1;
        run_start[out++] = (int)(base + i);
    }
}

// Exclusive scan of sums[0, count) in place by one block; the total goes to sums[count].
extern "C" __global__ void __launch_bounds__(TEXT_THREADS) scan_block_sums(int* __restrict__ sums, int count) {
    __shared__ typename BlockScanInt::TempStorage temp;
    int carry = 0;
    for (int start = 0; start < count; start += TEXT_THREADS) {
        int i = start + threadIdx.x;
        int v = i < count ? sums[i] : 0;
        int before, tile_total;
        BlockScanInt(temp).ExclusiveSum(v, before, tile_total);
        if (i < count) sums[i] = carry + before;
        carry += tile_total;
        __syncthreads();
    }
    if (threadIdx.x == 0) sums[count] = carry;
}

// Per-block sums of in[0, count), TEXT_ITEMS_PER_BLOCK items a block.
extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    scan_count(const int* __restrict__ in, int count, int* __restrict__ block_sums) {
    __shared__ typename BlockReduceInt::TempStorage temp;
    long long base = (long long)blockIdx.x * TEXT_ITEMS_PER_BLOCK + threadIdx.x * TEXT_ITEMS_PER_THREAD;
    int sum = 0;
#pragma unroll
    for (int j = 0; j < TEXT_ITEMS_PER_THREAD; ++j)
        if (base + j < count) sum += in[base + j];
    int total = BlockReduceInt(temp).Sum(sum);
    if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

// out = exclusive prefix sum of in (out may be in), given scanned block offsets.
extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    scan_write(const int* in, int count, const int* __restrict__ block_offsets, int* out) {
    __shared__ typename BlockScanInt::TempStorage temp;
    long long base = (long long)blockIdx.x * TEXT_ITEMS_PER_BLOCK + threadIdx.x * TEXT_ITEMS_PER_THREAD;
    int items[TEXT_ITEMS_PER_THREAD];
    int sum = 0;
#pragma unroll
    for (int j = 0; j < TEXT_ITEMS_PER_THREAD; ++j) {
        items[j] = base + j < count ? in[base + j] : 0;
        sum += items[j];
    }
    int before;
    BlockScanInt(temp).ExclusiveSum(sum, before);
    int run = block_offsets[blockIdx.x] + before;
#pragma unroll
    for (int j = 0; j < TEXT_ITEMS_PER_THREAD; ++j) {
        if (base + j < count) out[base + j] = run;
        run += items[j];
    }
}

// A decimal [+-]?digits*(.digits*)? read from p; false when it needs the host's exact path.
struct Number {
    unsigned long long mant;
    int digits;       // all digits read
    int significant;  // digits from the first non-zero one
    int frac;         // digits after the dot
    bool neg;
};

__device__ __forceinline__ float to_float(const Number& v) {
    double d = (double)v.mant / kPow10[v.frac];
    float f = __double2float_rn(d);
    return v.neg ? -f : f;
}

__device__ __forceinline__ bool exact_ok(const Number& v) {
    return v.significant <= MAX_DIGITS && v.mant < TWO_POW_53 && v.frac <= MAX_FRAC;
}

__device__ __forceinline__ void add_digit(Number& v, unsigned c) {
    v.digits++;
    if (v.mant != 0 || c != '0') {
        v.significant++;
        if (v.significant <= MAX_DIGITS) v.mant = v.mant * 10 + (c - '0');
    }
}

// Kinds of run, from the bytes alone.
#define RUN_ERROR 0
#define RUN_SIMPLE 1  // one decimal
#define RUN_FIELDS 2  // touching %6.2f fields
#define RUN_EXOTIC 3  // the host's exact path decides

// Classify the run at [s, end) (end: first separator or n); fields holds the field count.
__device__ int classify(const unsigned char* __restrict__ text, int s, int end, bool truncated, int& fields) {
    bool has_exp = false;
    for (int p = s; p < end; ++p) {
        unsigned c = text[p];
        if (c == 'e' || c == 'E') {
            has_exp = true;
        } else if (!(is_digit(c) || c == '.' || c == '+' || c == '-')) {
            return RUN_ERROR;
        }
    }
    if (truncated || has_exp) return RUN_EXOTIC;
    // one decimal?
    {
        Number v = {0, 0, 0, 0, false};
        int p = s;
        if (text[p] == '+' || text[p] == '-') v.neg = text[p++] == '-';
        while (p < end && is_digit(text[p])) add_digit(v, text[p++]);
        if (p < end && text[p] == '.') {
            ++p;
            while (p < end && is_digit(text[p])) {
                add_digit(v, text[p++]);
                v.frac++;
            }
        }
        if (p == end && v.digits > 0) {
            fields = 1;
            return exact_ok(v) ? RUN_SIMPLE : RUN_EXOTIC;
        }
    }
    // touching fields: ([+-]?digits+.dd)+
    int p = s;
    int count = 0;
    bool exact = true;
    while (p < end) {
        Number v = {0, 0, 0, 0, false};
        if (text[p] == '+' || text[p] == '-') ++p;
        while (p < end && is_digit(text[p])) add_digit(v, text[p++]);
        if (v.digits == 0 || p + 3 > end || text[p] != '.' || !is_digit(text[p + 1]) || !is_digit(text[p + 2]))
            return RUN_ERROR;
        add_digit(v, text[p + 1]);
        add_digit(v, text[p + 2]);
        v.frac = 2;
        exact = exact && exact_ok(v);
        p += 3;
        ++count;
    }
    fields = count;
    return exact ? RUN_FIELDS : RUN_EXOTIC;
}

__device__ __forceinline__ int run_end(const unsigned char* __restrict__ text, int s, int n, bool& truncated) {
    int limit = min(n, s + TEXT_MAX_RUN);
    int p = s;
    while (p < limit && !is_sep(text[p])) ++p;
    truncated = p == limit && limit < n && !is_sep(text[p]);
    return p;
}

extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    runs_classify(const unsigned char* __restrict__ text, int n, const int* __restrict__ run_start, int nruns,
                  int* __restrict__ counts, unsigned long long* __restrict__ status, int* __restrict__ exotic,
                  int exotic_cap) {
    int r = blockIdx.x * TEXT_THREADS + threadIdx.x;
    if (r >= nruns) return;
    int s = run_start[r];
    bool truncated;
    int end = run_end(text, s, n, truncated);
    int fields = 0;
    int kind = classify(text, s, end, truncated, fields);
    if (kind == RUN_ERROR) {
        atomicMin(&status[STATUS_BAD], (unsigned long long)s);
        counts[r] = 0;
    } else if (kind == RUN_EXOTIC) {
        unsigned long long slot = atomicAdd(&status[STATUS_EXOTIC], 1ULL);
        if (slot < (unsigned long long)exotic_cap) {
            exotic[2 * slot] = r;
            exotic[2 * slot + 1] = s;
        }
        counts[r] = 0;
    } else {
        counts[r] = fields;
    }
}

// Values of A go to a[0, na), the rest to b[0, nb); indices beyond are dropped (the host checks the total).
extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    runs_convert(const unsigned char* __restrict__ text, int n, const int* __restrict__ run_start, int nruns,
                 const int* __restrict__ counts, const int* __restrict__ first, float* __restrict__ a, int na,
                 float* __restrict__ b, int nb) {
    int r = blockIdx.x * TEXT_THREADS + threadIdx.x;
    if (r >= nruns) return;
    int count = counts[r];
    if (count == 0) return;
    int s = run_start[r];
    bool truncated;
    int end = run_end(text, s, n, truncated);
    int index = first[r];
    int p = s;
    if (count == 1) {  // one decimal (a lone %6.2f field is one too)
        Number v = {0, 0, 0, 0, false};
        if (text[p] == '+' || text[p] == '-') v.neg = text[p++] == '-';
        while (p < end && is_digit(text[p])) add_digit(v, text[p++]);
        if (p < end && text[p] == '.') {
            ++p;
            while (p < end && is_digit(text[p])) {
                add_digit(v, text[p++]);
                v.frac++;
            }
        }
        float f = to_float(v);
        if (index < na) a[index] = f;
        else if (index - na < nb) b[index - na] = f;
        return;
    }
    for (int j = 0; j < count && p < end; ++j, ++index) {
        Number v = {0, 0, 0, 0, false};
        if (text[p] == '+' || text[p] == '-') v.neg = text[p++] == '-';
        while (p < end && is_digit(text[p])) add_digit(v, text[p++]);
        add_digit(v, text[p + 1]);
        add_digit(v, text[p + 2]);
        v.frac = 2;
        p += 3;
        float f = to_float(v);
        if (index < na) a[index] = f;
        else if (index - na < nb) b[index - na] = f;
    }
}

extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    set_counts(const int* __restrict__ runs, const int* __restrict__ values, int count, int* __restrict__ counts) {
    int i = blockIdx.x * TEXT_THREADS + threadIdx.x;
    if (i < count) counts[runs[i]] = values[i];
}

// values[i] is the j[i]-th value of run runs[i].
extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    scatter_values(const int* __restrict__ runs, const int* __restrict__ j, const float* __restrict__ values,
                   int count, const int* __restrict__ first, float* __restrict__ a, int na, float* __restrict__ b,
                   int nb) {
    int i = blockIdx.x * TEXT_THREADS + threadIdx.x;
    if (i >= count) return;
    int index = first[runs[i]] + j[i];
    if (index < na) a[index] = values[i];
    else if (index - na < nb) b[index - na] = values[i];
}
