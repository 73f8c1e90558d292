/*
 * mmd._fasttext: a small C accelerator for mmd.textformat.
 *
 *   parse_values(data, offset, out_a, out_b, min_split, threads) -> (status, position)
 *   format_rows(c, m, n) -> bytes
 *   format_input_rows(c, m, n) -> bytes
 *   parse_output_values(data, offset, m, n, out, min_split, threads) -> None | fault
 *   parse_output_rows(data, offset, rows, n, out, min_split, threads, end) -> next offset | -1
 *   row_blocks(data, offset, m, n, step) -> [offset of each block of step rows, end] | None
 *
 * All work on buffers (no numpy C API) and run with the GIL released. The
 * parsers read a body in up to `threads` parts at once (default 2), none
 * shorter than min_split bytes (default 1 MiB; 0: no minimum).
 *
 * parse_values reads whitespace-separated values (' ', '\t', '\r', '\n')
 * from data[offset:] with exactly the grammar of mmd.textformat:
 *
 *   value := [+-]? (DIGITS ['.' DIGITS?] | '.' DIGITS) ([eE] [+-]? DIGITS)?
 *
 * A run that is not one value but entirely a concatenation of
 * [+-]?DIGITS '.' DIGIT DIGIT fields (mmd's own output, no separators) gives
 * one value per field. Each value is (float)(correctly rounded double):
 * mantissa <= 2^53 with a decimal exponent in [-22, 22] is one exact IEEE
 * multiplication or division of exact operands; anything else goes to
 * strtod (correctly rounded in glibc) on a NUL-terminated copy of the token,
 * whose grammar has been checked here first. It fills out_a, then out_b
 * (writable float32 buffers, or float64 ones that get the same float32
 * values) and returns (0, end). On any problem it stops
 * and returns a nonzero status and the byte offset of the offending run; the
 * caller then runs its own (slow) parser to produce the exact error message:
 *
 *   1 not a number, 2 too few values, 3 too many values, 4 outside float32.
 *
 * format_rows writes m rows of n fields, each byte-exact printf("%6.2f") of
 * a float32 (NaN/inf as Python's '%6.2f' prints them), '\n' after each row.
 * format_input_rows writes the same values as Python's '%.2f' does, one
 * space between them (the input files of mmd gen).
 *
 * parse_output_values checks an output's body (mmd check) and reads its
 * values into a float64 buffer in the same pass; see its section below.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GLIBC__) || defined(__APPLE__) || defined(__FreeBSD__)
#include <locale.h>
#if defined(__APPLE__)
#include <xlocale.h>
#endif
#define MMD_HAVE_STRTOD_L 1
static locale_t c_locale = (locale_t)0;
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define MMD_HAVE_PTHREAD 1
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#define MMD_SIMD 1 /* the 64-byte fast path of parse_output_values */

/*
 * The value in hundredths of "DIGITS.dd" with nd <= 5 digits, from the 8
 * bytes that end it (at w8; bytes before the digits are ignored): the '.'
 * squeezed out, the bytes before the digits made '0', and the 8 digits
 * summed pairwise in three multiplications.
 */
static inline uint64_t
short_hundredths(const unsigned char *w8, unsigned nd)
{
    uint64_t w;
    memcpy(&w, w8, 8);
    w = ((w & UINT64_C(0xFFFFFFFFFF)) << 8) | (w & UINT64_C(0xFFFF000000000000));
    uint64_t keep = ~UINT64_C(0) << (8 * (6 - nd));
    w = ((w & keep) | (UINT64_C(0x3030303030303030) & ~keep)) - UINT64_C(0x3030303030303030);
    w = w * 10 + (w >> 8); /* pairs */
    return (((w & UINT64_C(0x000000FF000000FF)) * (100 + (UINT64_C(1000000) << 32))) +
            (((w >> 16) & UINT64_C(0x000000FF000000FF)) * (1 + (UINT64_C(10000) << 32)))) >>
           32;
}

/* A 64-byte window (four 16-byte loads) and its byte masks: bit i for byte i. */
typedef struct {
    __m128i v[4];
} win64_t;

static inline win64_t
win_load(const unsigned char *p)
{
    win64_t w;
    for (int i = 0; i < 4; i++)
        w.v[i] = _mm_loadu_si128((const __m128i *)(p + 16 * i));
    return w;
}

static inline uint64_t
win_mask(const __m128i *m)
{
    return (uint64_t)(unsigned)_mm_movemask_epi8(m[0]) | (uint64_t)(unsigned)_mm_movemask_epi8(m[1]) << 16 |
           (uint64_t)(unsigned)_mm_movemask_epi8(m[2]) << 32 | (uint64_t)(unsigned)_mm_movemask_epi8(m[3]) << 48;
}

static inline uint64_t
win_eq(const win64_t *w, char c)
{
    __m128i m[4], k = _mm_set1_epi8(c);
    for (int i = 0; i < 4; i++)
        m[i] = _mm_cmpeq_epi8(w->v[i], k);
    return win_mask(m);
}

static inline uint64_t
win_digits(const win64_t *w)
{
    __m128i m[4];
    for (int i = 0; i < 4; i++) {
        __m128i t = _mm_sub_epi8(w->v[i], _mm_set1_epi8('0'));
        m[i] = _mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8(9)), t);
    }
    return win_mask(m);
}

/* The whitespace of the window (' ', '\n', '\t', '\r': IS_WS). */
static inline uint64_t
win_ws(const win64_t *w)
{
    const __m128i sp = _mm_set1_epi8(' '), nl = _mm_set1_epi8('\n'), tab = _mm_set1_epi8('\t'),
                  cr = _mm_set1_epi8('\r');
    __m128i m[4];
    for (int i = 0; i < 4; i++)
        m[i] = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(w->v[i], sp), _mm_cmpeq_epi8(w->v[i], nl)),
                            _mm_or_si128(_mm_cmpeq_epi8(w->v[i], tab), _mm_cmpeq_epi8(w->v[i], cr)));
    return win_mask(m);
}

/* Bits lo .. hi-1 (0 <= lo <= hi <= 63). */
static inline uint64_t
bits_between(unsigned lo, unsigned hi)
{
    return ((UINT64_C(1) << hi) - 1) & ~((UINT64_C(1) << lo) - 1);
}
#endif

enum { ST_OK = 0, ST_NAN = 1, ST_FEW = 2, ST_MANY = 3, ST_RANGE = 4, ST_NOMEM = 5 };

#define IS_WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\t' || (c) == '\r')
#define IS_DIGIT(c) ((unsigned)((c) - '0') < 10u)

static const double P10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

#define TWO53 (UINT64_C(1) << 53)

/* strtod on [s, e) (grammar already checked); -1 on out of memory. */
static int
slow_double(const unsigned char *s, const unsigned char *e, double *out)
{
    char small[128];
    size_t len = (size_t)(e - s);
    char *buf = small;
    if (len >= sizeof(small)) {
        buf = (char *)malloc(len + 1);
        if (buf == NULL)
            return -1;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
#ifdef MMD_HAVE_STRTOD_L
    *out = c_locale ? strtod_l(buf, NULL, c_locale) : strtod(buf, NULL);
#else
    *out = strtod(buf, NULL);
#endif
    if (buf != small)
        free(buf);
    return 0;
}

/*
 * d (>= 0, or -0.0 when neg) with its sign bit set where neg: "neg ? -d : d"
 * compiles to a branch, mispredicted on half the values of random data (it
 * took about a third of a parse's time).
 */
static inline double
with_sign(double d, int neg)
{
    uint64_t bits;
    memcpy(&bits, &d, 8);
    bits |= (uint64_t)(neg != 0) << 63;
    memcpy(&d, &bits, 8);
    return d;
}

/* Exact conversion of mant * 10^e10 (mant <= 2^53, |e10| <= 22). */
static inline double
fast_double(uint64_t mant, int64_t e10)
{
    double d = (double)mant;
    return e10 < 0 ? d / P10[-e10] : d * P10[e10];
}

/*
 * (float)(i / 100.0), the division correctly rounded, for the course's d.dd
 * and dd.dd (i < 10000): a load instead of a division and a conversion,
 * whose latencies were most of what such a value cost. Filled at import.
 */
static float HUNDREDTHS[10000];

/*
 * The course's shape at p (a run's start): [+-]?d.dd or [+-]?dd.dd followed
 * by whitespace, 6 bytes before hi at least. 1 with its float and end, else
 * 0 (one_number then reads the run).
 */
static inline int
course_value(const unsigned char *p, const unsigned char *hi, const unsigned char **next, float *val)
{
    int neg = (*p == '-');
    const unsigned char *q = p + (neg | (*p == '+')); /* branch-free: signs are random in real data */
    if (hi - q < 6 || !IS_DIGIT(q[0]))
        return 0;
    int two = IS_DIGIT(q[1]);
    const unsigned char *t = q + two;
    if (!(t[1] == '.' && IS_DIGIT(t[2]) && IS_DIGIT(t[3]) && IS_WS(t[4])))
        return 0;
    unsigned d0 = (unsigned)(q[0] - '0');
    unsigned ip = two ? d0 * 10 + (unsigned)(q[1] - '0') : d0;
    float f = HUNDREDTHS[ip * 100 + (unsigned)(t[2] - '0') * 10 + (unsigned)(t[3] - '0')];
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= (uint32_t)neg << 31; /* -0.00 stays -0.0 */
    memcpy(val, &bits, 4);
    *next = t + 4;
    return 1;
}

/*
 * One value at s (the start of a run). Returns 1 when [s, *next) is one
 * valid number followed by whitespace or the end, with its value in *val;
 * 0 when the run is not one number; -1 on out of memory.
 */
static inline int
one_number(const unsigned char *s, const unsigned char *end, const unsigned char **next, double *val)
{
    /* s < end: a run starts with a byte that is not whitespace */
    const unsigned char *q = s;
    int neg = (*q == '-');
    q += neg | (*q == '+');
    /* up to 19 digits (leading zeros included) accumulate exactly */
    const unsigned char *ds = q;
    uint64_t mant = 0;
    while (q < end && IS_DIGIT(*q)) {
        mant = mant * 10 + (unsigned)(*q - '0');
        q++;
    }
    Py_ssize_t ndig = q - ds;
    int64_t e10 = 0;
    if (q < end && *q == '.') {
        q++;
        const unsigned char *fs = q;
        while (q < end && IS_DIGIT(*q)) {
            mant = mant * 10 + (unsigned)(*q - '0');
            q++;
        }
        ndig += q - fs;
        e10 = -(int64_t)(q - fs);
    }
    if (ndig == 0)
        return 0;
    if (q < end && (*q | 0x20) == 'e') {
        const unsigned char *r = q + 1;
        int eneg = 0;
        if (r < end && (*r == '+' || *r == '-')) {
            eneg = (*r == '-');
            r++;
        }
        if (r < end && IS_DIGIT(*r)) {
            int64_t ex = 0;
            while (r < end && IS_DIGIT(*r)) {
                if (ex < 100000000)
                    ex = ex * 10 + (*r - '0');
                r++;
            }
            e10 += eneg ? -ex : ex;
            q = r;
        }
    }
    if (q < end && !IS_WS(*q))
        return 0;
    *next = q;
    double d;
    if (ndig <= 19 && mant <= TWO53 && e10 >= -22 && e10 <= 22) {
        d = fast_double(mant, e10);
    } else {
        if (slow_double(s + (s < q && (*s == '+' || *s == '-')), q, &d) < 0)
            return -1;
    }
    *val = with_sign(d, neg);
    return 1;
}

/* Where value number g goes: out_a[g] for g < na, else out_b[g - na]; float32 buffers, or float64
   ones (wide) that get the same float32 values, which a float64 product needs without a conversion pass. */
typedef struct {
    void *a, *b;
    Py_ssize_t na, total;
    int wide;
} dest_t;

static inline void
put(const dest_t *d, Py_ssize_t g, float f)
{
    /* the branches go the same way for every value of a part: predicted, about free */
    if (d->wide) {
        if (g < d->na)
            ((double *)d->a)[g] = f;
        else
            ((double *)d->b)[g - d->na] = f;
    } else {
        if (g < d->na)
            ((float *)d->a)[g] = f;
        else
            ((float *)d->b)[g - d->na] = f;
    }
}

/* The values from number s on, `count` of them: the part of *d that a part of the body fills. */
static dest_t
dest_from(const dest_t *d, Py_ssize_t s, Py_ssize_t count)
{
    size_t es = d->wide ? sizeof(double) : sizeof(float);
    dest_t r = *d;
    if (s <= d->na) {
        r.a = (char *)d->a + (size_t)s * es;
        r.na = d->na - s;
    } else {
        r.a = NULL;
        r.na = 0;
        r.b = (char *)d->b + (size_t)(s - d->na) * es;
    }
    r.total = count;
    return r;
}

/* Store c float32 values at numbers g, g+1, ... of *d. */
static void
put_all(const dest_t *d, Py_ssize_t g, const float *src, Py_ssize_t c)
{
    Py_ssize_t in_a = g < d->na ? d->na - g : 0;
    if (in_a > c)
        in_a = c;
    if (!d->wide) {
        if (in_a > 0)
            memcpy((float *)d->a + g, src, (size_t)in_a * sizeof(float));
        if (c > in_a)
            memcpy((float *)d->b + (g + in_a - d->na), src + in_a, (size_t)(c - in_a) * sizeof(float));
        return;
    }
    if (in_a > 0) {
        double *a = (double *)d->a + g;
        for (Py_ssize_t i = 0; i < in_a; i++)
            a[i] = src[i];
    }
    if (c > in_a) {
        double *b = (double *)d->b + (g + in_a - d->na);
        for (Py_ssize_t i = in_a; i < c; i++)
            b[i - in_a] = src[i];
    }
}

/* Touching %6.2f fields: the run [rs, re) is [+-]?DIGITS.dd repeated. Count or -1. */
static Py_ssize_t
fields_count(const unsigned char *rs, const unsigned char *re)
{
    Py_ssize_t cnt = 0;
    const unsigned char *q = rs;
    while (q < re) {
        if (*q == '+' || *q == '-')
            q++;
        const unsigned char *ds = q;
        while (q < re && IS_DIGIT(*q))
            q++;
        if (q == ds || re - q < 3 || q[0] != '.' || !IS_DIGIT(q[1]) || !IS_DIGIT(q[2]))
            return -1;
        q += 3;
        cnt++;
    }
    return cnt;
}

/* Store the fields of a checked run at g, g+1, ...; status, *where on failure. */
static int
fields_store(const unsigned char *rs, const unsigned char *re, const dest_t *dst, Py_ssize_t g,
             const unsigned char **where)
{
    const unsigned char *q = rs;
    while (q < re) {
        const unsigned char *fs = q;
        int neg = 0;
        if (*q == '+' || *q == '-') {
            neg = (*q == '-');
            q++;
        }
        const unsigned char *ds = q;
        uint64_t mant = 0;
        int nsig = 0;
        while (IS_DIGIT(*q)) {
            unsigned dg = *q - '0';
            if (mant || dg) {
                nsig++;
                if (nsig <= 17)
                    mant = mant * 10 + dg;
            }
            q++;
        }
        mant = mant * 100 + (unsigned)(q[1] - '0') * 10 + (unsigned)(q[2] - '0');
        q += 3;
        double d;
        if (nsig <= 15 && mant <= TWO53) {
            d = (double)mant / 100.0;
        } else if (slow_double(ds, q, &d) < 0) {
            *where = fs;
            return ST_NOMEM;
        }
        float f = (float)with_sign(d, neg);
        if (isinf(f)) {
            *where = fs;
            return ST_RANGE;
        }
        put(dst, g++, f);
    }
    return ST_OK;
}

#ifdef MMD_SIMD
/*
 * Course values a 64-byte window at a time, from p (a run's start or
 * whitespace): the runs of the window that end in it (whitespace after them)
 * must all have the shape course_value takes, [+-]?d.dd or [+-]?dd.dd, which
 * the window's byte masks check for all of them at once: each run's last four
 * bytes digit '.' digit digit, and before them at most a tens digit and a sign
 * at the run's start. Their values are then stored at g, g+1, ..., each from
 * its own bytes, so no value's work waits on the last one's (the byte loop
 * follows each run to find the next: about 20 cycles a value). A window
 * holding any other run stops the windows, leaving *pp at the window's first
 * run for the byte loop. Returns the values stored; the caller leaves room
 * for 32 (a window holds at most 32 runs).
 */
static Py_ssize_t
course_windows(const unsigned char **pp, const unsigned char *hi, const dest_t *dst, Py_ssize_t g)
{
    const unsigned char *p = *pp;
    Py_ssize_t g0 = g;
    while (hi - p >= 64 && dst->total - g >= 32) {
        win64_t w = win_load(p);
        uint64_t ws = win_ws(&w);
        uint64_t ends = ~ws & (ws >> 1); /* a run's last byte, whitespace after it in the window */
        if (ends == 0)
            break;
        unsigned last = 63u - (unsigned)__builtin_clzll(ends); /* < 63 */
        uint64_t runs = ~ws & ((UINT64_C(2) << last) - 1);    /* the bytes of the runs that end here */
        uint64_t starts = runs & ((ws << 1) | 1u);
        uint64_t digits = win_digits(&w), minus = win_eq(&w, '-');
        uint64_t signs = minus | win_eq(&w, '+');
        uint64_t need = ends | ends >> 1 | ends >> 3;
        uint64_t point = ends >> 2;
        uint64_t rest = runs & ~(need | point); /* what comes before a run's d.dd */
        uint64_t tens = rest & (ends >> 4) & digits;
        uint64_t sign = rest & ~tens; /* the rest: a sign at its run's start, or not the course's shape */
        /* (a run ending in bytes 0-2 is too short, and its four bytes would begin before the window) */
        if ((ends & 7u) != 0 || (digits & need) != need || (win_eq(&w, '.') & point) != point ||
            (sign & ~(signs & starts)) != 0)
            break;
        uint64_t neg = (minus & sign) << 2; /* bit e - 2 - t: the sign of the run ending at e */
        float vals[32];
        Py_ssize_t count = 0;
        for (uint64_t e_left = ends; e_left; e_left &= e_left - 1) {
            unsigned e = (unsigned)__builtin_ctzll(e_left);
            unsigned t = (unsigned)(((tens << 1) >> (e - 3)) & 1u); /* a tens digit at e - 4 */
            unsigned ip = t * (unsigned)(p[e - 3 - t] - '0') * 10u + (unsigned)(p[e - 3] - '0');
            float f = HUNDREDTHS[ip * 100u + (unsigned)(p[e - 1] - '0') * 10u + (unsigned)(p[e] - '0')];
            uint32_t bits;
            memcpy(&bits, &f, 4);
            bits |= (uint32_t)((neg >> (e - 2 - t)) & 1u) << 31; /* -0.00 stays -0.0 */
            memcpy(&vals[count++], &bits, 4);
        }
        put_all(dst, g, vals, count);
        g += count;
        p += last + 1;
    }
    *pp = p;
    return g - g0;
}
#endif

/* Values of [lo, hi) stored forwards from index 0; *count gets how many. */
static int
parse_forward(const unsigned char *lo, const unsigned char *hi, const dest_t *dst, Py_ssize_t *count,
              const unsigned char **where)
{
    const unsigned char *p = lo;
    Py_ssize_t g = 0, total = dst->total;
    int skip = 0; /* runs left before the windows are tried again, after one that did not fit */
    for (;;) {
        while (p < hi && IS_WS(*p))
            p++;
        if (p >= hi)
            break;
#ifdef MMD_SIMD
        if (skip > 0) {
            skip--;
        } else if (hi - p >= 64 && total - g >= 32) {
            Py_ssize_t got = course_windows(&p, hi, dst, g);
            g += got;
            if (got == 0) /* a run of another shape at p: the byte loop reads the next ones */
                skip = 64;
            continue;
        }
#endif
        const unsigned char *next = p;
        float f;
        if (course_value(p, hi, &next, &f)) {
            if (g >= total) {
                *where = p;
                return ST_MANY;
            }
            put(dst, g++, f);
            p = next;
            continue;
        }
        double d;
        int got = one_number(p, hi, &next, &d);
        *where = p;
        if (got > 0) {
            f = (float)d;
            if (isinf(f))
                return ST_RANGE;
            if (g >= total)
                return ST_MANY;
            put(dst, g++, f);
            p = next;
            continue;
        }
        if (got < 0)
            return ST_NOMEM;
        const unsigned char *re = p;
        while (re < hi && !IS_WS(*re))
            re++;
        Py_ssize_t cnt = fields_count(p, re);
        if (cnt < 0)
            return ST_NAN;
        if (cnt > total - g)
            return ST_MANY;
        int st = fields_store(p, re, dst, g, where);
        if (st)
            return st;
        g += cnt;
        p = re;
    }
    *count = g;
    return ST_OK;
}

/*
 * A scratch buffer, plain malloc: no huge-page advice, which costs far more
 * where the kernel has to compact memory to follow it (mmd.textcore.buffer
 * says more).
 */
static float *
scratch_alloc(size_t size)
{
    return (float *)malloc(size);
}

typedef struct {
    const unsigned char *lo, *hi;
    dest_t dst; /* a scratch buffer for every part but the first: where its values go is known at the end */
    Py_ssize_t count;
    const unsigned char *where;
    int status;
} part_t;

static void *
part_main(void *arg)
{
    part_t *h = (part_t *)arg;
    h->status = parse_forward(h->lo, h->hi, &h->dst, &h->count, &h->where);
    return NULL;
}

#define MAX_PARTS 16

/*
 * How many parts to cut `body` bytes into: `threads` (at most MAX_PARTS),
 * fewer where a part would have fewer than min_split bytes (0: no minimum).
 */
static int
parts_for(Py_ssize_t body, Py_ssize_t min_split, int threads)
{
    Py_ssize_t parts = threads < 1 ? 1 : threads > MAX_PARTS ? MAX_PARTS : threads;
    if (min_split > 0 && body / min_split < parts)
        parts = body / min_split;
    return parts < 1 ? 1 : (int)parts;
}

/* Where part i of [lo, hi) in `parts` would end (hi for the last), not before `cut`: the caller
   moves it on to a boundary. */
static inline const unsigned char *
share_end(const unsigned char *lo, const unsigned char *hi, int parts, int i, const unsigned char *cut)
{
    if (i + 1 >= parts)
        return hi;
    const unsigned char *end = lo + (hi - lo) / parts * (i + 1);
    return end < cut ? cut : end;
}

/* Run parts 1.. on threads of their own (inline where none can be made) and part 0 here. */
static void
run_parts(void *parts, size_t size, int count, void *(*fn)(void *))
{
#ifdef MMD_HAVE_PTHREAD
    pthread_t th[MAX_PARTS];
    int started[MAX_PARTS] = {0};
    for (int i = 1; i < count; i++)
        started[i] = pthread_create(&th[i], NULL, fn, (char *)parts + size * (size_t)i) == 0;
    for (int i = 1; i < count; i++)
        if (!started[i])
            fn((char *)parts + size * (size_t)i);
    fn(parts);
    for (int i = 1; i < count; i++)
        if (started[i])
            pthread_join(th[i], NULL);
#else
    for (int i = 0; i < count; i++)
        fn((char *)parts + size * (size_t)i);
#endif
}

/*
 * Runs (tokens between whitespace) in [lo, hi), where lo starts a run or is
 * whitespace: a value each, unless a run is touching %6.2f fields. Counted
 * 64 bytes at a time where SSE2 is, so that every part of a body knows
 * where its values go before it reads them.
 */
static Py_ssize_t
count_runs(const unsigned char *lo, const unsigned char *hi)
{
    Py_ssize_t runs = 0;
    uint64_t prev_ws = 1; /* the byte before lo counts as whitespace */
    const unsigned char *p = lo;
#ifdef MMD_SIMD
    for (; hi - p >= 64; p += 64) {
        win64_t w = win_load(p);
        uint64_t ws = win_ws(&w);
        runs += __builtin_popcountll(~ws & ((ws << 1) | prev_ws));
        prev_ws = ws >> 63;
    }
#endif
    for (; p < hi; p++) {
        uint64_t ws = IS_WS(*p);
        runs += (Py_ssize_t)((ws ^ 1) & prev_ws);
        prev_ws = ws;
    }
    return runs;
}

typedef struct {
    const unsigned char *lo, *hi;
    Py_ssize_t runs;
} count_t;

static void *
count_main(void *arg)
{
    count_t *c = (count_t *)arg;
    c->runs = count_runs(c->lo, c->hi);
    return NULL;
}

/*
 * The parts read straight into place: each part's runs are counted first
 * (all parts at once), which gives every part its first value's number when
 * each run is one value, as in every input that is not an output read back.
 * Each part may fill only its own values, so no two parts ever write the
 * same place. 0 when the counts do not add up or a part found more values
 * than runs (touching fields): the caller then reads the body the other way.
 */
static int
parse_in_place(const unsigned char *data, part_t *part, int parts, const dest_t *dst, int *st, Py_ssize_t *pos)
{
    count_t cnt[MAX_PARTS];
    Py_ssize_t s = 0;
    for (int i = 0; i < parts; i++)
        cnt[i] = (count_t){part[i].lo, part[i].hi, 0};
    /* the last part's count is the rest of the total (its read checks it), so it is not counted:
       counting it would read that part once more, on the threads the reads wait for */
    run_parts(cnt, sizeof(count_t), parts - 1, count_main);
    for (int i = 0; i < parts - 1; i++)
        s += cnt[i].runs;
    if (s > dst->total)
        return 0;
    cnt[parts - 1].runs = dst->total - s;
    s = 0;
    for (int i = 0; i < parts; i++) {
        part[i].dst = dest_from(dst, s, cnt[i].runs);
        s += cnt[i].runs;
    }
    run_parts(part, sizeof(part_t), parts, part_main);
    for (int i = 0; i < parts; i++)
        if (part[i].status == ST_MANY)
            return 0;
    for (int i = 0; i < parts; i++) {
        if (part[i].status) {
            *st = part[i].status;
            *pos = part[i].where - data;
            return 1;
        }
    }
    for (int i = 0; i < parts; i++)
        if (part[i].count != cnt[i].runs)
            return 0;
    *st = ST_OK;
    return 1;
}

/*
 * The whole body, in up to `threads` parts read at once. The body is cut
 * after the whitespace that follows each 1/parts of it, and the parts are
 * read straight into place (parse_in_place). Where that cannot be, the first
 * part is read into place and every other one forwards into a scratch buffer
 * (the count of values before it is known only at the end), and their
 * values are copied after the first part's once all are done. (A part read
 * backwards, straight into place, would need no count, but finding each
 * run's start by stepping back byte by byte made it about twice as slow.)
 * The counts must add up to the total; the first part with a problem names it.
 */
static int
parse_body(const unsigned char *data, Py_ssize_t len, Py_ssize_t offset, const dest_t *dst, Py_ssize_t min_split,
           int threads, Py_ssize_t *pos)
{
    const unsigned char *lo = data + offset, *hi = data + len;
    int parts = len - offset >= 2 ? parts_for(len - offset, min_split, threads) : 1;
    part_t part[MAX_PARTS];
    const unsigned char *cut = lo;
    int st = ST_OK;
    *pos = len;
    for (int i = 0; i < parts; i++) {
        const unsigned char *end = share_end(lo, hi, parts, i, cut);
        while (end < hi && !IS_WS(*end))
            end++;
        part[i] = (part_t){cut, end, *dst, 0, hi, ST_OK};
        cut = end;
    }
    if (parts > 1 && parse_in_place(data, part, parts, dst, &st, pos))
        return st;
    for (int i = 1; i < parts; i++) {
        /* every value takes a byte and a separator, every touching field four bytes */
        Py_ssize_t bound = (part[i].hi - part[i].lo) / 2 + 1;
        dest_t d = {scratch_alloc((size_t)bound * sizeof(float)), NULL, bound, bound, 0};
        if (d.a == NULL) {
            parts = i; /* fewer parts: the last one reads to the end */
            part[i - 1].hi = hi;
            break;
        }
        part[i].dst = d;
    }
    part[0].dst = *dst;
    for (int i = 0; i < parts; i++) {
        part[i].count = 0;
        part[i].where = hi;
        part[i].status = ST_OK;
    }
    run_parts(part, sizeof(part_t), parts, part_main);
    Py_ssize_t total = 0;
    for (int i = 0; i < parts; i++) {
        if (part[i].status) {
            st = part[i].status;
            *pos = part[i].where - data;
            break;
        }
        total += part[i].count;
    }
    if (st == ST_OK && total != dst->total)
        st = total < dst->total ? ST_FEW : ST_MANY;
    Py_ssize_t g = part[0].count;
    for (int i = 1; i < parts; i++) {
        Py_ssize_t c = part[i].count;
        if (st == ST_OK && c > 0)
            put_all(dst, g, (const float *)part[i].dst.a, c);
        g += c;
        free(part[i].dst.a);
    }
    return st;
}

static int
is_float_format(const char *fmt, char kind)
{
    if (fmt == NULL)
        return 0;
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    return fmt[0] == kind && fmt[1] == '\0';
}

/* A writable float32 (*wide 0) or float64 (*wide 1) buffer. */
static int
get_float_out(PyObject *obj, Py_buffer *view, int *wide)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    *wide = view->itemsize == 8 && is_float_format(view->format, 'd');
    if (!*wide && !(view->itemsize == 4 && is_float_format(view->format, 'f'))) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "output buffers must hold float32 or float64");
        return -1;
    }
    return 0;
}

static PyObject *
parse_values(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer data, oa, ob;
    Py_ssize_t offset, min_split = (Py_ssize_t)1 << 20;
    int threads = 2, wide_a = 0, wide_b = 0;
    PyObject *a_obj, *b_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*nO|Oni:parse_values", &data, &offset, &a_obj, &b_obj, &min_split, &threads))
        return NULL;
    if (offset < 0 || offset > data.len) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "offset out of range");
        return NULL;
    }
    if (get_float_out(a_obj, &oa, &wide_a) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    int have_b = (b_obj != Py_None);
    if (have_b && get_float_out(b_obj, &ob, &wide_b) < 0) {
        PyBuffer_Release(&oa);
        PyBuffer_Release(&data);
        return NULL;
    }
    if (have_b && wide_b != wide_a) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&oa);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_TypeError, "out_a and out_b must hold the same type");
        return NULL;
    }
    dest_t dst;
    dst.wide = wide_a;
    dst.a = oa.buf;
    dst.na = oa.len / oa.itemsize;
    dst.b = have_b ? ob.buf : NULL;
    dst.total = dst.na + (have_b ? ob.len / ob.itemsize : 0);
    Py_ssize_t where = 0;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = parse_body((const unsigned char *)data.buf, data.len, offset, &dst, min_split, threads, &where);
    Py_END_ALLOW_THREADS
    if (have_b)
        PyBuffer_Release(&ob);
    PyBuffer_Release(&oa);
    PyBuffer_Release(&data);
    if (st == ST_NOMEM)
        return PyErr_NoMemory();
    return Py_BuildValue("(in)", st, where);
}

/* ------------------------------------------------------------------------ */
/* emit */

static const char DIG2[201] =
    "00010203040506070809"
    "10111213141516171819"
    "20212223242526272829"
    "30313233343536373839"
    "40414243444546474849"
    "50515253545556575859"
    "60616263646566676869"
    "70717273747576777879"
    "80818283848586878889"
    "90919293949596979899";

#define MAXW 48 /* widest field: -3.4e38 is 39 digits + ".00" + sign */

static inline int
ndigits(uint64_t v)
{
    int n = 1;
    while (v >= 10000) {
        v /= 10000;
        n += 4;
    }
    if (v >= 10)
        n++;
    if (v >= 100)
        n++;
    if (v >= 1000)
        n++;
    return n;
}

/*
 * x * 100 rounded to an integer as printf rounds it ("%.2f": half to even)
 * into *u, for a finite x; 0 where |x| * 100 reaches 2^63 (the caller
 * prints x with put_huge instead), else 1.
 */
static inline int
hundredths(float x, uint64_t *u)
{
    double ay = fabs((double)x * 100.0); /* exact: 24 + 7 bits */
    if (ay < 4503599627370496.0) {           /* 2^52: round half to even */
        double t = ay + 4503599627370496.0; /* no -ffast-math here */
        *u = (uint64_t)(t - 4503599627370496.0);
        return 1;
    }
    if (ay < 9223372036854775808.0) { /* 2^63: already an integer */
        *u = (uint64_t)ay;
        return 1;
    }
    return 0;
}

/* Kept out of the field loops: inlined there, it made put_field's loop about
 * 3 % longer (callgrind's count), for values no product reaches. */
#if defined(__GNUC__)
#define COLD __attribute__((noinline, cold))
#else
#define COLD
#endif

/* "%.2f" of x where hundredths refused it, at o; returns the bytes written. */
static COLD int
put_huge(char *o, float x)
{
    /* |x| >= 2^56: an integer; %.0f has no locale-dependent point */
    char tmp[64];
    int L = snprintf(tmp, sizeof(tmp), "%.0f", (double)x);
    if (L < 0 || L > MAXW - 3)
        L = 0;
    memcpy(o, tmp, (size_t)L);
    memcpy(o + L, ".00", 3);
    return L + 3;
}

/* The digits of ip "." fr (fr < 100, two digits), written backwards so that
 * they end just before e; returns where they start. */
static inline char *
put_digits(char *e, uint64_t ip, unsigned fr)
{
    e[-1] = DIG2[2 * fr + 1];
    e[-2] = DIG2[2 * fr];
    e[-3] = '.';
    char *d = e - 3;
    while (ip >= 100) {
        unsigned r = (unsigned)(ip % 100);
        ip /= 100;
        d -= 2;
        d[0] = DIG2[2 * r];
        d[1] = DIG2[2 * r + 1];
    }
    if (ip >= 10) {
        d -= 2;
        d[0] = DIG2[2 * ip];
        d[1] = DIG2[2 * ip + 1];
    } else {
        *--d = (char)('0' + ip);
    }
    return d;
}

/* One %6.2f field of x at o; returns the bytes written (<= MAXW). */
static inline int
put_field(char *o, float x)
{
    if (isnan(x)) {
        memcpy(o, "   nan", 6);
        return 6;
    }
    if (isinf(x)) {
        memcpy(o, x < 0 ? "  -inf" : "   inf", 6);
        return 6;
    }
    int neg = signbit(x) ? 1 : 0;
    uint64_t u;
    if (!hundredths(x, &u)) {
        int L = put_huge(o, x);
        if (L < 6) { /* cannot happen, kept for safety */
            memmove(o + 6 - L, o, (size_t)L);
            memset(o, ' ', (size_t)(6 - L));
            L = 6;
        }
        return L;
    }
    uint64_t ip = u / 100;
    unsigned fr = (unsigned)(u % 100);
    int len = ndigits(ip) + 3 + neg;
    int w = len < 6 ? 6 : len;
    char *d = put_digits(o + w, ip, fr);
    if (neg)
        *--d = '-';
    while (d > o)
        *--d = ' ';
    return w;
}

/*
 * One printf("%.2f") of x at o, no padding (the input files mmd gen
 * writes); the same rounding as put_field. Returns the bytes written.
 */
static inline int
put_plain(char *o, float x)
{
    if (isnan(x)) {
        memcpy(o, "nan", 3);
        return 3;
    }
    if (isinf(x)) {
        if (x < 0) {
            memcpy(o, "-inf", 4);
            return 4;
        }
        memcpy(o, "inf", 3);
        return 3;
    }
    int neg = signbit(x) ? 1 : 0;
    uint64_t u;
    if (!hundredths(x, &u))
        return put_huge(o, x);
    uint64_t ip = u / 100;
    unsigned fr = (unsigned)(u % 100);
    /* the sign without a branch: random signs would mispredict half the time */
    o[0] = '-';
    o += neg;
    int nd = ndigits(ip);
    put_digits(o + nd + 3, ip, fr);
    return nd + 3 + neg;
}

/*
 * The text of c (m rows of n float32, C-contiguous) in one bytes object,
 * grown as it fills, with the GIL released while the fields are written.
 * plain 0: format_rows' %6.2f fields (put_field), side by side; plain 1:
 * format_input_rows' %.2f fields (put_plain), one space apart. Both callers
 * pass plain as a constant, so each gets its own copy of the row loop.
 */
static inline PyObject *
format_buffer(PyObject *c_obj, Py_ssize_t m, Py_ssize_t n, const char *name, int plain)
{
    if (m < 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative shape");
        return NULL;
    }
    Py_buffer c;
    if (PyObject_GetBuffer(c_obj, &c, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (c.itemsize != 4 || !is_float_format(c.format, 'f')) {
        PyBuffer_Release(&c);
        PyErr_Format(PyExc_TypeError, "%s needs a float32 buffer", name);
        return NULL;
    }
    /* the most bytes a field takes: plain, with its separator */
    const Py_ssize_t field = plain ? MAXW + 1 : MAXW;
    /* Sizes past a Py_ssize_t are a MemoryError, a buffer of another size a
     * ValueError; format_input_rows has always tested the widest row before
     * the buffer's size, format_rows after it (the order shows only where n
     * passes 2^55 and the buffer is of another size). */
    const int too_many = n > 0 && m > PY_SSIZE_T_MAX / 4 / n;
    const int too_wide = n > (PY_SSIZE_T_MAX - 1) / field / 4;
    if (too_many || (plain && too_wide)) {
        PyBuffer_Release(&c);
        return PyErr_NoMemory();
    }
    if (c.len != m * n * 4) {
        PyBuffer_Release(&c);
        PyErr_SetString(PyExc_ValueError, "buffer size does not match m*n float32");
        return NULL;
    }
    if (too_wide) {
        PyBuffer_Release(&c);
        return PyErr_NoMemory();
    }
    Py_ssize_t row_max = n * field + 1;
    /* a first guess of the text's size: typical fields are 8 (%6.2f of a
     * product) or 7 bytes (%.2f of an input, and its space) */
    Py_ssize_t cap = m * (n * (plain ? 7 : 8) + 1);
    if (cap < row_max)
        cap = row_max;
    PyObject *res = PyBytes_FromStringAndSize(NULL, cap);
    if (res == NULL) {
        PyBuffer_Release(&c);
        return NULL;
    }
    const float *x = (const float *)c.buf;
    Py_ssize_t pos = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        if (cap - pos < row_max) {
            Py_ssize_t want = cap + cap / 2;
            if (want < pos + row_max)
                want = pos + row_max;
            Py_BLOCK_THREADS
            int r = _PyBytes_Resize(&res, want);
            Py_UNBLOCK_THREADS
            if (r < 0) {
                failed = 1;
                break;
            }
            cap = want;
        }
        char *o = PyBytes_AS_STRING(res) + pos;
        const float *row = x + i * n;
        if (plain) {
            for (Py_ssize_t j = 0; j < n; j++) {
                o += put_plain(o, row[j]);
                *o++ = ' ';
            }
            if (n > 0)
                o--; /* the last separator becomes the newline */
        } else {
            for (Py_ssize_t j = 0; j < n; j++)
                o += put_field(o, row[j]);
        }
        *o++ = '\n';
        pos = o - PyBytes_AS_STRING(res);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&c);
    if (failed)
        return NULL; /* res is NULL and the error is set */
    if (_PyBytes_Resize(&res, pos) < 0)
        return NULL;
    return res;
}

static PyObject *
format_rows(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *c_obj;
    Py_ssize_t m, n;
    if (!PyArg_ParseTuple(args, "Onn:format_rows", &c_obj, &m, &n))
        return NULL;
    return format_buffer(c_obj, m, n, "format_rows", 0);
}

static PyObject *
format_input_rows(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *c_obj;
    Py_ssize_t m, n;
    if (!PyArg_ParseTuple(args, "Onn:format_input_rows", &c_obj, &m, &n))
        return NULL;
    return format_buffer(c_obj, m, n, "format_input_rows", 1);
}

/* ------------------------------------------------------------------------ */
/* reading an output back (mmd check) */

/*
 * An output body is m lines of n fields, each exactly printf("%6.2f"):
 *
 *   field := ' '* '-'? ('0' | [1-9][0-9]*) '.' [0-9][0-9]
 *
 * with max(0, 6 - len(core)) spaces before the core, '\n' after each line
 * and nothing after the last. The check and the values come from one pass
 * over the bytes. A field of at most OUT_INT_DIGITS digits before the point
 * is read as hundredths: |x|*100 then stays below 2^53, so the value is one
 * correctly rounded division of exact operands, the double that float()
 * gives for the same text. A wider one (rare: a value of 1e13 or more) must
 * be printf's of a float32, an integer (float32_digits), or it is an
 * OF_LARGE fault; the fast paths leave such rows to the byte loop.
 *
 * The fault kinds, the same in the numpy path of mmd.textformat:
 */
enum { OF_OK = 0, OF_FIELD = 1, OF_WIDTH = 2, OF_LARGE = 3, OF_COUNT = 4, OF_NEWLINE = 5, OF_EXTRA = 6, OF_ROWS = 7 };

/* mmd.textoutput's HUNDREDTHS_DIGITS and mmd.textformat's FLOAT32_DIGITS (FLT_MAX's 39 digits). */
#define OUT_INT_DIGITS 13
#define OUT_MAX_DIGITS 39

/*
 * Whether the nd digits at ds (no sign, no leading zero, nd > OUT_INT_DIGITS)
 * are the integer part printf writes for a float32: their value (strtod, C
 * locale, correctly rounded) is a float32 exactly, and "%.0f" of it, its
 * exact decimal, is those digits. The value in *out.
 */
static COLD int
float32_digits(const unsigned char *ds, Py_ssize_t nd, double *out)
{
    if (nd < 1 || nd > OUT_MAX_DIGITS)
        return 0;
    char back[OUT_MAX_DIGITS + 2];
    if (slow_double(ds, ds + nd, out) < 0 || !(*out <= FLT_MAX) || (double)(float)*out != *out)
        return 0;
    return snprintf(back, sizeof(back), "%.0f", *out) == (int)nd && memcmp(back, ds, (size_t)nd) == 0;
}

typedef struct {
    int kind;
    Py_ssize_t line;       /* 1-based */
    Py_ssize_t line_start; /* byte offset of that line */
    Py_ssize_t pos;        /* byte offset of the fault */
    Py_ssize_t count;      /* fields found (COUNT), field bytes (WIDTH, LARGE), values read (ROWS) */
} ofault_t;

static inline int
out_fault(ofault_t *f, int kind, const unsigned char *base, const unsigned char *ls, Py_ssize_t line,
          const unsigned char *pos, Py_ssize_t count)
{
    f->kind = kind;
    f->line = line;
    f->line_start = ls - base;
    f->pos = pos - base;
    f->count = count;
    return kind;
}

#ifdef MMD_SIMD

/*
 * One row of n fields in the common case, a 64-byte window at a time: 0
 * when anything is unusual, and out_rows's byte loop then reads the row
 * again and names its fault, so this path needs no fault of its own. It is
 * hand-written because reading outputs is most of what mmd check does, and
 * the masks replace a test per byte (benchmarks/bench_check.py times it;
 * docs/grading.md, "Speed").
 *
 * A field's '.' is its first, and the field ends two bytes after it: the
 * bytes before the '.' must be spaces, then an optional '-', then digits
 * (no leading zero), with the width rule of out_rows; *pp then moves past
 * the row's '\n'. Loads stop 64 bytes short of hi.
 */
static inline int
out_row_fast(const unsigned char **pp, const unsigned char *hi, Py_ssize_t n, double *o)
{
    const unsigned char *p = *pp;
    Py_ssize_t j = 0;
    while (j < n) {
        if (hi - p < 64)
            return 0;
        win64_t w = win_load(p);
        uint64_t dm = win_eq(&w, '.') & ((UINT64_C(1) << 62) - 1); /* room for ".dd" */
        uint64_t digits = win_digits(&w), sp = win_eq(&w, ' '), mi = win_eq(&w, '-');
        if (dm == 0)
            return 0;
        unsigned start = 0; /* every field of the window whose ".dd" it holds */
        do {
            unsigned d = (unsigned)__builtin_ctzll(dm); /* the field's '.' */
            dm &= dm - 1;
            unsigned s = start + (unsigned)__builtin_ctzll(~(sp >> start)); /* past the leading spaces */
            unsigned neg = (unsigned)((mi >> s) & 1u);
            unsigned ds = s + neg; /* the first digit */
            unsigned len = d + 3 - start;
            unsigned nd = d - ds;
            uint64_t need = bits_between(ds, d) | (UINT64_C(3) << (d + 1));
            /* the width rule: leading spaces only to make 6 bytes */
            int bad = (ds >= d) | ((s > start) & (len != 6)) | (len < 6) | ((digits & need) != need) |
                      (nd > OUT_INT_DIGITS);
            if (bad || (nd > 1 && p[ds] == '0'))
                return 0;
            uint64_t hundredths;
            if (nd <= 5) {
                hundredths = short_hundredths(p + d - 5, nd); /* len >= 6: at most 2 bytes before p */
            } else {
                uint64_t ip = 0;
                for (unsigned i = ds; i < d; i++)
                    ip = ip * 10 + (unsigned)(p[i] - '0');
                hundredths = ip * 100 + (unsigned)(p[d + 1] - '0') * 10 + (unsigned)(p[d + 2] - '0');
            }
            if (o != NULL) {
                o[j] = with_sign((double)hundredths / 100.0, (int)neg);
            }
            start = d + 3;
            j++;
        } while (dm != 0 && j < n);
        p += start;
    }
    if (p >= hi || *p != '\n')
        return 0;
    *pp = p + 1;
    return 1;
}
#endif

#if defined(MMD_SIMD) && defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define MMD_AVX2 1
#define AVX2_TARGET __attribute__((target("avx2")))
static int use_avx2 = 0; /* set at import where the CPU has AVX2; set_wide() switches it */

#define OUT_BATCH 64

/*
 * Values of up to OUT_BATCH fields of at most five digits before the '.',
 * four at a time: each field's eight bytes that end at its last one (up to
 * five digits, the '.', two digits: at[i] points at them), the bytes before
 * its nd digits made '0', the '.' squeezed out, and the eight digits summed
 * by multiply-adds of pairs ([10, 1], then [100, 1], then the two halves,
 * [10000, 1]). Each value is then one exact conversion (it is below 2^27)
 * and one correctly rounded division by 100, as the byte loop makes it.
 */
AVX2_TARGET static void
out_batch_avx2(const unsigned char *const *at, const unsigned char *nd, const unsigned char *neg, Py_ssize_t count,
               double *o)
{
    const __m256i low5 = _mm256_set1_epi64x(INT64_C(0xFFFFFFFFFF)), top2 = _mm256_set1_epi64x(-INT64_C(0x1000000000000));
    const __m256i zeros = _mm256_set1_epi8('0'), all = _mm256_set1_epi64x(-1), eight = _mm256_set1_epi64x(8);
    const __m256i six = _mm256_set1_epi64x(6), pairs = _mm256_set1_epi16(0x010A), quads = _mm256_set1_epi32(0x00010064);
    const __m256i e4 = _mm256_set1_epi64x(10000), magic = _mm256_set1_epi64x(INT64_C(0x4330000000000000));
    const __m256d two52 = _mm256_set1_pd(4503599627370496.0), hundred = _mm256_set1_pd(100.0);
    Py_ssize_t i = 0;
    for (; i + 4 <= count; i += 4) {
        uint64_t w[4];
        for (int k = 0; k < 4; k++)
            memcpy(&w[k], at[i + k], 8);
        __m256i v = _mm256_loadu_si256((const __m256i *)w);
        v = _mm256_or_si256(_mm256_slli_epi64(_mm256_and_si256(v, low5), 8), _mm256_and_si256(v, top2));
        __m256i n = _mm256_set_epi64x(nd[i + 3], nd[i + 2], nd[i + 1], nd[i]);
        __m256i keep = _mm256_sllv_epi64(all, _mm256_mul_epu32(_mm256_sub_epi64(six, n), eight));
        v = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(v, keep), _mm256_andnot_si256(keep, zeros)), zeros);
        v = _mm256_madd_epi16(_mm256_maddubs_epi16(v, pairs), quads);
        v = _mm256_add_epi64(_mm256_mul_epu32(v, e4), _mm256_srli_epi64(v, 32));
        __m256d d = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(v, magic)), two52);
        __m256i sign = _mm256_slli_epi64(_mm256_set_epi64x(neg[i + 3], neg[i + 2], neg[i + 1], neg[i]), 63);
        d = _mm256_div_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_castpd_si256(d), sign)), hundred);
        _mm256_storeu_pd(o + i, d);
    }
    for (; i < count; i++)
        o[i] = with_sign((double)short_hundredths(at[i], nd[i]) / 100.0, neg[i]);
}

/*
 * out_row_fast with the grammar of every field of a window checked at once
 * on its byte masks (only the width and the digit count a field at a time),
 * and the values made by out_batch_avx2, OUT_BATCH fields at a time, the
 * values the same to the bit as out_row_fast's (benchmarks/bench_check.py
 * times reading outputs; docs/grading.md, "Speed").
 */
AVX2_TARGET static int
out_row_avx2(const unsigned char **pp, const unsigned char *hi, Py_ssize_t n, double *o)
{
    const unsigned char *p = *pp;
    const unsigned char *at[OUT_BATCH];
    unsigned char nds[OUT_BATCH], negs_at[OUT_BATCH];
    Py_ssize_t j = 0, queued = 0; /* fields read; of them, waiting in the batch (they end at j) */
    while (j < n) {
        if (hi - p < 64)
            return 0;
        win64_t w = win_load(p);
        uint64_t nl = win_eq(&w, '\n');
        uint64_t before_nl = nl ? (nl & (0 - nl)) - 1 : ~UINT64_C(0);
        uint64_t dots = win_eq(&w, '.') & (before_nl >> 2); /* the window's fields, ".dd" and all */
        if (dots == 0 || __builtin_popcountll(dots) > n - j)
            return 0;
        unsigned end = 63u - (unsigned)__builtin_clzll(dots) + 2u; /* the last field's last byte */
        uint64_t region = end == 63 ? ~UINT64_C(0) : (UINT64_C(2) << end) - 1;
        uint64_t frac = dots << 1 | dots << 2;
        uint64_t ints = region & ~(dots | frac); /* what comes before each '.' */
        uint64_t digits = win_digits(&w);
        uint64_t sp = win_eq(&w, ' ') & ints, mi = win_eq(&w, '-') & ints, dg = digits & ints;
        uint64_t starts = dots << 3 | 1u; /* after each field's last byte */
        uint64_t first = dg & ~(dg << 1); /* each field's first digit */
        /* spaces only first, a '-' only first or after them and before a digit, digits then up to the
           '.', no leading zero: every field of the window at once */
        if ((digits & frac) != frac || (ints & ~(sp | mi | dg)) != 0 || (sp & ~starts & ~(sp << 1)) != 0 ||
            (mi & ~(starts | sp << 1)) != 0 || ((mi << 1) & ~dg) != 0 || ((dots >> 1) & ~dg) != 0 ||
            (first & (dg >> 1) & win_eq(&w, '0')) != 0)
            return 0;
        starts &= region;
        uint64_t negs = mi << 1; /* bit i: a '-' before byte i */
        if (queued + 32 > OUT_BATCH) {
            if (o != NULL)
                out_batch_avx2(at, nds, negs_at, queued, o + (j - queued));
            queued = 0;
        }
        do {
            unsigned d = (unsigned)__builtin_ctzll(dots), s = (unsigned)__builtin_ctzll(starts);
            unsigned ds = (unsigned)__builtin_ctzll(first);
            dots &= dots - 1;
            starts &= starts - 1;
            first &= first - 1;
            unsigned len = d + 3 - s, nd = d - ds, neg = (unsigned)((negs >> ds) & 1u);
            /* the width rule: leading spaces only to make 6 bytes */
            if (len < 6 || (((sp >> s) & 1u) && len != 6) || nd > OUT_INT_DIGITS)
                return 0;
            if (nd <= 5) {
                at[queued] = p + d - 5; /* len >= 6: at most 2 bytes before p */
                nds[queued] = (unsigned char)nd;
                negs_at[queued++] = (unsigned char)neg;
            } else {
                if (o != NULL) {
                    out_batch_avx2(at, nds, negs_at, queued, o + (j - queued));
                    uint64_t ip = 0;
                    for (unsigned k = ds; k < d; k++)
                        ip = ip * 10 + (unsigned)(p[k] - '0');
                    ip = ip * 100 + (unsigned)(p[d + 1] - '0') * 10 + (unsigned)(p[d + 2] - '0');
                    o[j] = with_sign((double)ip / 100.0, (int)neg);
                }
                queued = 0;
            }
            j++;
        } while (dots != 0);
        p += end + 1;
    }
    if (p >= hi || *p != '\n')
        return 0;
    if (o != NULL)
        out_batch_avx2(at, nds, negs_at, queued, o + (j - queued));
    *pp = p + 1;
    return 1;
}
#endif

/*
 * Rows row0, row0+1, ... from lo (a line start) to hi, their values stored
 * at out + row*n (out may be NULL: check only). Reading a row at or beyond
 * row_end is an OF_EXTRA fault. Line numbers are row + 2 (the header is
 * line 1). On OF_OK, *rows gets the number of rows read.
 */
static int
out_rows(const unsigned char *base, const unsigned char *lo, const unsigned char *hi, Py_ssize_t row0,
         Py_ssize_t row_end, Py_ssize_t n, double *out, ofault_t *f, Py_ssize_t *rows)
{
    const unsigned char *p = lo;
    Py_ssize_t row = row0;
    while (p < hi) {
        const unsigned char *ls = p;
        Py_ssize_t line = row + 2;
        if (row >= row_end)
            return out_fault(f, OF_EXTRA, base, ls, line, ls, 0);
        double *o = out ? out + row * n : NULL;
#ifdef MMD_AVX2
        if (use_avx2 ? out_row_avx2(&p, hi, n, o) : out_row_fast(&p, hi, n, o)) {
            row++;
            continue;
        }
#elif defined(MMD_SIMD)
        if (out_row_fast(&p, hi, n, o)) {
            row++;
            continue;
        }
#endif
        Py_ssize_t j = 0;
        const unsigned char *extra = NULL; /* the first field beyond n */
        while (p < hi && *p != '\n') {
            const unsigned char *fs = p;
            while (p < hi && *p == ' ')
                p++;
            const unsigned char *cs = p;
            int neg = (p < hi && *p == '-');
            p += neg;
            const unsigned char *ds = p;
            uint64_t ip = 0;
            if (p < hi && *p == '0') {
                p++;
            } else if (p < hi && (unsigned)(*p - '1') < 9u) {
                while (p < hi && IS_DIGIT(*p)) {
                    if (p - ds < 18)
                        ip = ip * 10 + (unsigned)(*p - '0');
                    p++;
                }
            } else {
                return out_fault(f, OF_FIELD, base, ls, line, fs, 0);
            }
            Py_ssize_t nd = p - ds;
            if (hi - p < 3 || p[0] != '.' || !IS_DIGIT(p[1]) || !IS_DIGIT(p[2]))
                return out_fault(f, OF_FIELD, base, ls, line, fs, 0);
            unsigned fr = (unsigned)(p[1] - '0') * 10 + (unsigned)(p[2] - '0');
            p += 3;
            Py_ssize_t core = p - cs;
            if (cs - fs != (core < 6 ? 6 - core : 0))
                return out_fault(f, OF_WIDTH, base, ls, line, fs, p - fs);
            double wide = 0.0;
            if (nd > OUT_INT_DIGITS && !(fr == 0 && float32_digits(ds, nd, &wide)))
                return out_fault(f, OF_LARGE, base, ls, line, fs, p - fs);
            if (j < n) {
                if (o != NULL) {
                    double d = nd > OUT_INT_DIGITS ? wide : (double)(ip * 100 + fr) / 100.0;
                    o[j] = with_sign(d, neg);
                }
            } else if (j == n) {
                extra = fs;
            }
            j++;
        }
        if (j != n)
            return out_fault(f, OF_COUNT, base, ls, line, j > n ? extra : p, j);
        if (p >= hi)
            return out_fault(f, OF_NEWLINE, base, ls, line, p, 0);
        p++;
        row++;
    }
    *rows = row - row0;
    return OF_OK;
}

/* The whole body, one thread, forwards: OF_OK or the first fault. */
static int
out_body(const unsigned char *base, Py_ssize_t len, Py_ssize_t offset, Py_ssize_t m, Py_ssize_t n, double *out,
         ofault_t *f)
{
    Py_ssize_t rows = 0;
    int st = out_rows(base, base + offset, base + len, 0, m, n, out, f, &rows);
    if (st != OF_OK)
        return st;
    if (rows == m)
        return OF_OK;
    /* the file ends early: name its last line (the header when no row came) */
    const unsigned char *end = base + len - 1; /* the '\n' that ends it */
    const unsigned char *ls = end;
    while (ls > base && ls[-1] != '\n')
        ls--;
    return out_fault(f, OF_ROWS, base, ls, rows == 0 ? 1 : rows + 1, end, rows * n);
}

typedef struct {
    const unsigned char *base, *lo, *hi;
    Py_ssize_t row0, row_end, n, rows;
    double *out;
    ofault_t fault;
    int status;
} out_part_t;

static void *
out_part_main(void *arg)
{
    out_part_t *h = (out_part_t *)arg;
    h->status = out_rows(h->base, h->lo, h->hi, h->row0, h->row_end, h->n, h->out, &h->fault, &h->rows);
    return NULL;
}

/*
 * The start of the row after the one at q, its '\n' found before end (end[-1]
 * is a '\n'). A row of n fields holds 6n bytes at least, so the search for its
 * '\n' starts past them: it reads about a sixth of the bytes a plain memchr
 * would. A shorter row (a fault) may be counted with the next one; the
 * counts then do not add up, or a part finds the fault, and the body is read
 * again by the one thread that names it.
 */
static inline const unsigned char *
next_row(const unsigned char *q, const unsigned char *end, Py_ssize_t n)
{
    const unsigned char *from = end - q > 6 * n ? q + 6 * n : q;
    return (const unsigned char *)memchr(from, '\n', (size_t)(end - from)) + 1;
}

/*
 * Up to `threads` parts read at once (parts_for): the body is cut after the
 * '\n' that follows each 1/parts of it, each part's rows are counted
 * (memchr over its newlines) so that its first row index is known, and each
 * part is read forwards into its own rows. Any fault, or row counts that do
 * not add up, and the body is read again by one thread from the start,
 * which names the first fault in the file.
 */
static int
out_body_split(const unsigned char *base, Py_ssize_t len, Py_ssize_t offset, Py_ssize_t m, Py_ssize_t n,
               double *out, Py_ssize_t min_split, int threads, ofault_t *f)
{
    const unsigned char *lo = base + offset, *hi = base + len;
    int parts = len - offset >= 2 && hi[-1] == '\n' ? parts_for(len - offset, min_split, threads) : 1;
    if (parts < 2)
        return out_body(base, len, offset, m, n, out, f);
    out_part_t part[MAX_PARTS];
    const unsigned char *cut = lo;
    Py_ssize_t row = 0;
    for (int i = 0; i < parts; i++) {
        const unsigned char *end = share_end(lo, hi, parts, i, cut);
        const unsigned char *nl = end < hi ? memchr(end, '\n', (size_t)(hi - end)) : NULL;
        end = nl == NULL ? hi : nl + 1;
        Py_ssize_t rows = 0;
        for (const unsigned char *q = cut; q < end && row + rows <= m; rows++)
            q = next_row(q, end, n);
        if (row + rows > m)
            return out_body(base, len, offset, m, n, NULL, f);
        part[i] = (out_part_t){base, cut, end, row, row + rows, n, 0, out, {0, 0, 0, 0, 0}, OF_OK};
        row += rows;
        cut = end;
    }
    if (row != m)
        return out_body(base, len, offset, m, n, NULL, f);
    run_parts(part, sizeof(out_part_t), parts, out_part_main);
    for (int i = 0; i < parts; i++)
        if (part[i].status != OF_OK || part[i].rows != part[i].row_end - part[i].row0)
            return out_body(base, len, offset, m, n, NULL, f);
    return OF_OK;
}

/* 1 (ValueError set) unless offset is a line start of data, past its first line, and rows, n > 0. */
static int
bad_rows_args(const Py_buffer *data, Py_ssize_t offset, Py_ssize_t rows, Py_ssize_t n)
{
    if (offset >= 1 && offset <= data->len && ((const unsigned char *)data->buf)[offset - 1] == '\n' && rows > 0 &&
        n > 0)
        return 0;
    PyErr_SetString(PyExc_ValueError, "offset must follow a newline, and rows and fields be positive");
    return 1;
}

/* A writable float64 buffer of rows*n values (an output's rows). */
static int
get_rows_out(PyObject *obj, Py_buffer *view, Py_ssize_t rows, Py_ssize_t n)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != 8 || !is_float_format(view->format, 'd') || n > PY_SSIZE_T_MAX / 8 / rows ||
        view->len != rows * n * 8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "out must be a float64 buffer of rows*n values");
        return -1;
    }
    return 0;
}

static PyObject *
parse_output_values(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer data;
    Py_ssize_t offset, m, n, min_split = (Py_ssize_t)1 << 20;
    int threads = 2;
    PyObject *out_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*nnn|Oni:parse_output_values", &data, &offset, &m, &n, &out_obj, &min_split,
                          &threads))
        return NULL;
    if (bad_rows_args(&data, offset, m, n)) {
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_buffer ob;
    double *out = NULL;
    if (out_obj != Py_None) {
        if (get_rows_out(out_obj, &ob, m, n) < 0) {
            PyBuffer_Release(&data);
            return NULL;
        }
        out = (double *)ob.buf;
    }
    ofault_t f = {0, 0, 0, 0, 0};
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = out_body_split((const unsigned char *)data.buf, data.len, offset, m, n, out, min_split, threads, &f);
    Py_END_ALLOW_THREADS
    if (out != NULL)
        PyBuffer_Release(&ob);
    PyBuffer_Release(&data);
    if (st == OF_OK)
        Py_RETURN_NONE;
    return Py_BuildValue("(innnn)", f.kind, f.line, f.line_start, f.pos, f.count);
}

/* Past `rows` rows from q, each found by next_row: where they end (hi where they run out first), and in
   *found how many there were. next_row needs a '\n' at hi[-1]: without one the last row has none, a fault,
   and no row is passed. */
static const unsigned char *
skip_rows(const unsigned char *q, const unsigned char *hi, Py_ssize_t rows, Py_ssize_t n, Py_ssize_t *found)
{
    *found = 0;
    if (hi[-1] == '\n')
        for (; *found < rows && q < hi; ++*found)
            q = next_row(q, hi, n);
    return q;
}

/*
 * parse_output_rows: the next `rows` rows of an output from `offset` (a line
 * start), their values into the float64 buffer out (rows*n), as
 * parse_output_values reads a body; the offset after them, or -1 on any
 * fault (the caller reads the whole body again to name the first one). So an
 * output can be read a block of rows at a time into one small buffer. Where
 * the caller knows where the rows end (`end`, from row_blocks), they are not
 * searched for again.
 */
static PyObject *
parse_output_rows(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer data, ob;
    Py_ssize_t offset, rows, n, min_split = (Py_ssize_t)1 << 20, end = -1;
    int threads = 2;
    PyObject *out_obj;
    if (!PyArg_ParseTuple(args, "y*nnnO|nin:parse_output_rows", &data, &offset, &rows, &n, &out_obj, &min_split,
                          &threads, &end))
        return NULL;
    if (bad_rows_args(&data, offset, rows, n) || (end != -1 && (end <= offset || end > data.len))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "end must lie after offset, within the data");
        PyBuffer_Release(&data);
        return NULL;
    }
    if (get_rows_out(out_obj, &ob, rows, n) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)data.buf, *hi = base + data.len;
    Py_ssize_t next = -1;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t found = rows;
    const unsigned char *q = end == -1 ? skip_rows(base + offset, hi, rows, n, &found) : base + end;
    ofault_t f = {0, 0, 0, 0, 0};
    if (found == rows && q[-1] == '\n' &&
        out_body_split(base, q - base, offset, rows, n, (double *)ob.buf, min_split, threads, &f) == OF_OK)
        next = q - base;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob);
    PyBuffer_Release(&data);
    return PyLong_FromSsize_t(next);
}

/*
 * row_blocks: where each block of `step` rows of an output's m rows begins, from `offset` (a line
 * start), and where the last row ends: a list of ceil(m/step)+1 offsets, found as parse_output_rows
 * finds a block's end (skip_rows), or None where the rows run out first. So that the blocks of one
 * output can be read at once on several threads, each from its own offset to the next.
 */
static PyObject *
row_blocks(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer data;
    Py_ssize_t offset, m, n, step;
    if (!PyArg_ParseTuple(args, "y*nnnn:row_blocks", &data, &offset, &m, &n, &step))
        return NULL;
    if (bad_rows_args(&data, offset, m, n) || step < 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "step must be positive");
        PyBuffer_Release(&data);
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)data.buf, *hi = base + data.len;
    Py_ssize_t blocks = (m + step - 1) / step;
    Py_ssize_t *at = PyMem_RawMalloc((size_t)(blocks + 1) * sizeof(Py_ssize_t));
    if (at == NULL) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    Py_ssize_t row = 0;
    Py_BEGIN_ALLOW_THREADS
    const unsigned char *q = base + offset;
    for (Py_ssize_t i = 0; i < blocks; i++) {
        Py_ssize_t want = m - row < step ? m - row : step, found;
        at[i] = q - base;
        q = skip_rows(q, hi, want, n, &found);
        row += found;
        if (found < want)
            break;
    }
    at[blocks] = q - base;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyObject *list = NULL;
    if (row == m && (list = PyList_New(blocks + 1)) != NULL)
        for (Py_ssize_t i = 0; i <= blocks; i++) {
            PyObject *v = PyLong_FromSsize_t(at[i]);
            if (v == NULL) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, i, v);
        }
    PyMem_RawFree(at);
    if (row != m && !PyErr_Occurred())
        Py_RETURN_NONE;
    return list;
}

static PyObject *
set_wide(PyObject *Py_UNUSED(self), PyObject *arg)
{
    int want = PyObject_IsTrue(arg);
    if (want < 0)
        return NULL;
#ifdef MMD_AVX2
    int was = use_avx2;
    use_avx2 = want && __builtin_cpu_supports("avx2");
    return PyBool_FromLong(was);
#else
    Py_RETURN_FALSE;
#endif
}

/* Whether two buffers hold the same bytes: one memcmp without the GIL (mmd check meets outputs with
   the very bytes of the expected ones often; numpy's comparison would hold the check until numpy is
   imported, and a memoryview's compares byte by byte). */
static PyObject *
same_bytes(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer x, y;
    if (!PyArg_ParseTuple(args, "y*y*:same_bytes", &x, &y))
        return NULL;
    int same = x.len == y.len;
    if (same && x.len > 0) {
        Py_BEGIN_ALLOW_THREADS
        same = memcmp(x.buf, y.buf, (size_t)x.len) == 0;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return PyBool_FromLong(same);
}

static PyMethodDef methods[] = {
    {"set_wide", set_wide, METH_O,
     "set_wide(flag) -> bool\n\n"
     "Read outputs with the AVX2 path (where the CPU has AVX2) or the SSE2 one; returns the previous choice."},
    {"parse_values", parse_values, METH_VARARGS,
     "parse_values(data, offset, out_a, out_b=None, min_split=1<<20) -> (status, position)\n\n"
     "Fill buffers out_a then out_b (both float32, or both float64 given the float32 values)\n"
     "with the values of data[offset:]\n"
     "(two threads when data[offset:] has at least min_split bytes).\n"
     "status: 0 ok, 1 not a number, 2 too few, 3 too many, 4 outside float32."},
    {"format_rows", format_rows, METH_VARARGS,
     "format_rows(c, m, n) -> bytes\n\n"
     "m rows of n '%6.2f' fields of the float32 buffer c, '\\n' after each row."},
    {"format_input_rows", format_input_rows, METH_VARARGS,
     "format_input_rows(c, m, n) -> bytes\n\n"
     "m rows of n '%.2f' values of the float32 buffer c, one space between them, '\\n' after each row."},
    {"parse_output_rows", parse_output_rows, METH_VARARGS,
     "parse_output_rows(data, offset, rows, n, out, min_split=1<<20, threads=2, end=-1) -> int\n\n"
     "Read the next rows rows of n '%6.2f' fields from data[offset:] (a line start) into the float64\n"
     "buffer out, as parse_output_values reads a body; the offset after them, or -1 on any fault.\n"
     "end: where the rows end, when known (row_blocks), else -1: found here."},
    {"row_blocks", row_blocks, METH_VARARGS,
     "row_blocks(data, offset, m, n, step) -> list | None\n\n"
     "The offsets at which each block of step rows of an output's m rows of n fields begins, from\n"
     "data[offset:] (a line start), then the offset after the last row; None where the rows run out."},
    {"parse_output_values", parse_output_values, METH_VARARGS,
     "parse_output_values(data, offset, m, n, out=None, min_split=1<<20) -> None | (kind, line, line_start, pos, count)\n\n"
     "Check that data[offset:] is exactly m rows of n '%6.2f' fields and store their values in the float64\n"
     "buffer out (if given). None when it is; else the first fault: its kind (FIELD, WIDTH, LARGE, COUNT,\n"
     "NEWLINE, EXTRA, ROWS), 1-based line, the byte offsets of that line and of the fault, and a count."},
    {"same_bytes", same_bytes, METH_VARARGS,
     "same_bytes(x, y) -> bool\n\nWhether the buffers x and y hold the same bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fasttext", "C accelerator for mmd.textformat (parse and %6.2f emit).", -1, methods,
};

PyMODINIT_FUNC
PyInit__fasttext(void)
{
    for (int i = 0; i < 10000; i++)
        HUNDREDTHS[i] = (float)((double)i / 100.0);
#ifdef MMD_AVX2
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
#ifdef MMD_HAVE_STRTOD_L
    if (c_locale == (locale_t)0)
        c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
#endif
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddIntConstant(mod, "OK", ST_OK) < 0 || PyModule_AddIntConstant(mod, "NOT_A_NUMBER", ST_NAN) < 0 ||
        PyModule_AddIntConstant(mod, "TOO_FEW", ST_FEW) < 0 || PyModule_AddIntConstant(mod, "TOO_MANY", ST_MANY) < 0 ||
        PyModule_AddIntConstant(mod, "OUT_OF_RANGE", ST_RANGE) < 0 ||
        PyModule_AddIntConstant(mod, "OUT_FIELD", OF_FIELD) < 0 || PyModule_AddIntConstant(mod, "OUT_WIDTH", OF_WIDTH) < 0 ||
        PyModule_AddIntConstant(mod, "OUT_LARGE", OF_LARGE) < 0 || PyModule_AddIntConstant(mod, "OUT_COUNT", OF_COUNT) < 0 ||
        PyModule_AddIntConstant(mod, "OUT_NEWLINE", OF_NEWLINE) < 0 ||
        PyModule_AddIntConstant(mod, "OUT_EXTRA", OF_EXTRA) < 0 || PyModule_AddIntConstant(mod, "OUT_ROWS", OF_ROWS) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
