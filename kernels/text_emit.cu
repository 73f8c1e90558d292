// text_emit.cu — format C as the course's %6.2f text on the GPU.
//
// Not a matmul kernel: mmd.gputext loads it (it is not in the matmul registry).
//
// Idea. For a float32 x, x·100 is exact in double (24 + 7 significant bits),
// so q = rint(|x|·100) (round half to even, the default rounding mode) is
// exactly the integer printf("%6.2f") prints as "int.ff", and the sign is
// signbit(x) ("-0.00" kept). A field is q's digits (at least three) with a
// '.' before the last two, a '-' when negative, left-padded with spaces to
// FIELD_WIDTH; the last field of a row is followed by '\n'.
//
//   1. emit_lengths: one thread per element writes its byte count (field and,
//      in the last column, the newline). Elements this path does not format
//      (not finite, or |x| of 10^16 or more: q of 19 digits or more, beyond
//      the uint64 digit loop) get FIELD_WIDTH placeholder bytes and are
//      counted in status[0]; the host then formats the whole output itself
//      (mmd.cuda.text), or refuses a product that is not finite, so the
//      placeholders are never written out.
//   2. The exclusive prefix sum of the lengths (scan_count / scan_block_sums
//      / scan_write in text_parse.cu) is each element's first byte.
//   3. emit_write: one thread per element writes its bytes at that offset.
//
// Geometry: 1-D blocks of TEXT_THREADS threads, one thread per element of the
// m×n matrix (row-major, row stride ldc). Lengths and offsets are int32: the
// host formats outputs that could reach 2 GiB itself.

#include <stdint.h>

#ifndef TEXT_THREADS
#define TEXT_THREADS 256  // threads per block
#endif

#define FIELD_WIDTH 6                       // %6.2f: fields are at least this wide
#define FAST_LIMIT 1000000000000000000ULL  // q below 10^18: at most 18 digits in a uint64 (exact in double)
#define SMALL_LIMIT 4294967296ULL           // q below 2^32: 32-bit digit loop

// q = rint(|x|·100) below FAST_LIMIT (x·100 is exact in double, and an integer wherever |x| is that large).
__device__ __forceinline__ bool fast_value(float x, unsigned long long& q) {
    if (!isfinite(x)) return false;
    double h = rint(fabs((double)x * 100.0));
    if (!(h < (double)FAST_LIMIT)) return false;
    q = (unsigned long long)h;
    return true;
}

__device__ __forceinline__ int digit_count(unsigned long long q) {
    int d = 1;
    while (q >= 10) {
        q /= 10;
        ++d;
    }
    return d;
}

// Bytes of the field: at least three digits ("0.05"), a '.', the sign, padded to FIELD_WIDTH.
__device__ __forceinline__ int field_bytes(unsigned long long q, bool neg) {
    int digits = max(digit_count(q), 3);
    return max(FIELD_WIDTH, digits + 1 + (neg ? 1 : 0));
}

extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    emit_lengths(const float* __restrict__ c, int m, int n, int ldc, int* __restrict__ lengths,
                 unsigned long long* __restrict__ status) {
    long long i = (long long)blockIdx.x * TEXT_THREADS + threadIdx.x;
    if (i >= (long long)m * n) return;
    int row = (int)(i / n);
    int col = (int)(i - (long long)row * n);
    float x = c[(long long)row * ldc + col];
    unsigned long long q;
    int bytes;
    if (fast_value(x, q)) {
        bytes = field_bytes(q, signbit(x));
    } else {
        bytes = FIELD_WIDTH;
        atomicAdd(&status[0], 1ULL);
    }
    lengths[i] = bytes + (col == n - 1 ? 1 : 0);
}

extern "C" __global__ void __launch_bounds__(TEXT_THREADS)
    emit_write(const float* __restrict__ c, int m, int n, int ldc, const int* __restrict__ offsets,
               unsigned char* __restrict__ out) {
    long long i = (long long)blockIdx.x * TEXT_THREADS + threadIdx.x;
    if (i >= (long long)m * n) return;
    int row = (int)(i / n);
    int col = (int)(i - (long long)row * n);
    float x = c[(long long)row * ldc + col];
    unsigned char* field = out + offsets[i];
    unsigned long long q;
    int bytes;
    int p;
    if (!fast_value(x, q)) {  // placeholder: the host formats the output, or refuses it
        bytes = FIELD_WIDTH;
        p = 0;
    } else {
        bool neg = signbit(x);
        bytes = field_bytes(q, neg);
        p = bytes;
        int written = 0;
        if (q < SMALL_LIMIT) {
            unsigned s = (unsigned)q;
            do {
                if (written == 2) field[--p] = '.';
                field[--p] = (unsigned char)('0' + s % 10);
                s /= 10;
                ++written;
            } while (s != 0 || written < 3);
        } else {
            do {
                if (written == 2) field[--p] = '.';
                field[--p] = (unsigned char)('0' + q % 10);
                q /= 10;
                ++written;
            } while (q != 0 || written < 3);
        }
        if (neg) field[--p] = '-';
    }
    while (p > 0) field[--p] = ' ';
    if (col == n - 1) field[bytes] = '\n';
}
