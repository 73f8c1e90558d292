/*
 * mmd._fastcheck: fused passes for mmd.check.full and mmd.check.quick (the O(n^2) parts of mmd check).
 *
 * Why hand-written C: numpy does one operation per pass, so a rule such as
 * "|out - ref| <= 0.005 + c*|ref|, and sum the squares, and find the largest"
 * is a dozen passes per element, which mmd.check.full keeps in cache only by
 * walking the matrix in small chunks, paying numpy's per-call overhead for
 * every chunk. Here each matrix is read once per pass and every per-row and
 * per-column accumulator that pass needs is updated from the value in
 * registers. The rows are split in two halves (a fixed split, from the sizes
 * alone, so the sums are the same on every run), one per thread, with the
 * GIL released; the second half's column accumulators are private and added
 * to the first's after the join.
 *
 * Quick check (Freivalds, see mmd.check.quick). With v Gaussian vectors x (n x v)
 * and y (m x v), A m x k, B k x n, C (the output) m x n:
 *
 *   b_rows   one pass over B:  B.x, sum_j |B_rj|, max_j |B_rj| per row r;
 *                              sum_r B_rj^2 per column j
 *   a_rows   one pass over A:  A.(B.x), |A|.(sum|B|), |A|.(max|B|),
 *                              sum_k A_ik^2 per row i; y^T.A, sum_i |A_ik|,
 *                              max_i |A_ik| per column k
 *   b_cols   one pass over B:  (y^T.A).B, (sum|A|)^T.|B|, (max|A|)^T.|B| per column j
 *   c_pass   one pass over C:  C.x, sum_j C_ij^2 per row; y^T.C, sum_i C_ij^2 per
 *                              column; the count and first position of NaN/inf
 *
 * Elementwise rules (mmd.check.full's uniform rule, mmd.check.modelcheck.ModelCheck):
 *
 *   uniform  |out - ref| - allowed > 0 (or out not finite) counted; the largest
 *            |error|, the sums of squares for the relative error, and the worst
 *            position as numpy's argmax over the excess gives it (the first NaN,
 *            else the first largest)
 *   model    the elements that |out - ref| <= 0.005 + c*|ref| does not pass,
 *            in order, with their |error| (the caller bounds those); the NaN
 *            and infinite values counted apart, with the first of each
 *   sumsq    the sums of squares of a matrix's rows and of its columns (the
 *            norms of A's rows and B's columns that bound |A|.|B| above)
 *
 * Each element's arithmetic in the rules is the numpy path's, operation for
 * operation (two roundings for a*b + c: built with -ffp-contract=off), so
 * the decisions and positions are the same; sums (squares, projections) are
 * in another order, which the bounds in mmd.check.full and mmd.check.quick allow for.
 *
 * Matrices are float32 or float64 (the inputs A and B are float32 as read,
 * so no float64 copy of them is made); everything else is float64, C order.
 * Buffers are checked here; the layouts are mmd.check.full's and mmd.check.quick' business.
 *
 * Each pass takes a fraction of the time of numpy's passes for the same rule;
 * what the whole check costs is in docs/grading.md ("Speed", from
 * docs/results/grading/).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define MMD_HAVE_PTHREAD 1
#endif

/*
 * Vectors through GCC/clang vector types, in two widths: two doubles (SSE2
 * on x86-64, NEON on arm64) everywhere, and on x86-64 also four (AVX2), in
 * a second copy of each hot loop compiled for AVX2 and picked at import
 * where the CPU has it. (One source with four-double vectors everywhere was
 * several times slower without AVX: GCC breaks such vectors into scalars.)
 * Each kernel declares vd_t, vi_t, vf_t (doubles, 64-bit masks, floats of
 * its width) before using the helpers below.
 */
#if defined(__x86_64__) && defined(__GNUC__)
#define MMD_HAVE_WIDE 1
#define WIDE_TARGET __attribute__((target("avx2")))
static int use_wide = 0;
#endif

typedef double v2d __attribute__((vector_size(16)));
typedef long long v2i __attribute__((vector_size(16)));
typedef float v2f __attribute__((vector_size(8)));
typedef double v4d __attribute__((vector_size(32)));
typedef long long v4i __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

#define MAX_VECTORS 16

/* Macros, not functions, take and make the vectors: GCC warns of an ABI change for 32-byte vector
 * parameters and results without AVX, even for functions that are always inlined. */
#define LANES ((Py_ssize_t)(sizeof(vd_t) / sizeof(double)))
#define ld_f64(p)                                                                                                     \
    __extension__({                                                                                                   \
        vd_t ld_x_;                                                                                                   \
        memcpy(&ld_x_, (p), sizeof ld_x_);                                                                            \
        ld_x_;                                                                                                        \
    })
#define ld_f32(p)                                                                                                     \
    __extension__({                                                                                                   \
        vf_t ld_x_;                                                                                                   \
        memcpy(&ld_x_, (p), sizeof ld_x_);                                                                            \
        __builtin_convertvector(ld_x_, vd_t);                                                                         \
    })
#define st_f64(p, x)                                                                                                  \
    do {                                                                                                              \
        vd_t st_x_ = (x);                                                                                             \
        memcpy((p), &st_x_, sizeof st_x_);                                                                            \
    } while (0)
/* a broadcast: -0.0 is the exact identity of + (a -0.0 stays -0.0) */
#define splat(s) (-(vd_t){0} + (double)(s))
#define vabs(x) ((vd_t)((vi_t)(x) & ((vi_t){0} + 0x7fffffffffffffffLL)))
/* max that keeps a NaN, as numpy's max does */
#define vmax_nan(m, x)                                                                                                \
    __extension__({                                                                                                   \
        vd_t vm_m_ = (m), vm_x_ = (x);                                                                                \
        vi_t vm_take_ = (vm_x_ > vm_m_) | (vm_x_ != vm_x_);                                                           \
        (vd_t)(((vi_t)vm_x_ & vm_take_) | ((vi_t)vm_m_ & ~vm_take_));                                                 \
    })
#define hsum(x)                                                                                                       \
    __extension__({                                                                                                   \
        vd_t hs_x_ = (x);                                                                                             \
        double hs_s_ = hs_x_[0];                                                                                      \
        for (int hs_l_ = 1; hs_l_ < (int)LANES; hs_l_++)                                                              \
            hs_s_ += hs_x_[hs_l_];                                                                                    \
        hs_s_;                                                                                                        \
    })
#define hmax_nan(x)                                                                                                   \
    __extension__({                                                                                                   \
        vd_t hm_x_ = (x);                                                                                             \
        double hm_m_ = hm_x_[0];                                                                                      \
        for (int hm_l_ = 1; hm_l_ < (int)LANES; hm_l_++)                                                              \
            hm_m_ = max_nan(hm_m_, hm_x_[hm_l_]);                                                                     \
        hm_m_;                                                                                                        \
    })
#define any(mask)                                                                                                     \
    __extension__({                                                                                                   \
        vi_t an_m_ = (mask);                                                                                          \
        long long an_a_ = 0;                                                                                          \
        for (int an_l_ = 0; an_l_ < (int)LANES; an_l_++)                                                              \
            an_a_ |= an_m_[an_l_];                                                                                    \
        an_a_ != 0;                                                                                                   \
    })

static inline double
max_nan(double m, double x)
{
    return (x > m || x != x) ? x : m;
}

/* ------------------------------------------------------------------------
 * Two halves: fn(arg1) on a second thread, fn(arg0) on this one. Without
 * pthreads, or if the thread cannot be made, both here, one after the other
 * (the same results: each half writes only its own accumulators).
 */

typedef void *(*half_fn)(void *);

static void
run_halves(half_fn fn, void *arg0, void *arg1)
{
    if (arg1 == NULL) {
        fn(arg0);
        return;
    }
#ifdef MMD_HAVE_PTHREAD
    pthread_t th;
    if (pthread_create(&th, NULL, fn, arg1) == 0) {
        fn(arg0);
        pthread_join(th, NULL);
        return;
    }
#endif
    fn(arg0);
    fn(arg1);
}

/* ------------------------------------------------------------------------
 * The quick check's row passes. One description for all four: the matrix
 * (rows x cols, float32 or float64), per-column coefficient rows P, per-row
 * weights W, outputs per row (rowsT, transposed: one row of m per quantity)
 * and per column (cols, private to each half).
 */

typedef struct {
    const void *mat;
    int f32;
    Py_ssize_t rows, cols;
    int v;
    const double *P; /* coefficient rows over the columns */
    const double *W; /* per-row weights: rows x v (y), or nw rows over the rows (b_cols) */
    double *rowsT;   /* per-row results, nr rows of `rows` */
    Py_ssize_t r0, r1;
    double *acc;          /* per-column accumulators of this half */
    Py_ssize_t stride;    /* between the rows of P and of acc (padded: see run_rows) */
    Py_ssize_t nonfinite, first_nonfinite;
} rowjob_t;

/*
 * NAME_SUF(jb): the pass for jb->v vectors, with the common v = 4 a constant
 * that the compiler unrolls; NAME_SUF_v(jb, v) is the pass itself.
 */
#define DEF_V_DISPATCH(NAME, SUF, ATTR)                                                                               \
    ATTR static void NAME##_##SUF(rowjob_t *jb)                                                                       \
    {                                                                                                                 \
        if (jb->v == 4)                                                                                               \
            NAME##_##SUF##_v(jb, 4);                                                                                  \
        else                                                                                                          \
            NAME##_##SUF##_v(jb, jb->v);                                                                              \
    }

/* ... and NAME_SUF_v over jb's rows two at a time (NAME_SUF_r(jb, v, r, R), R = 2, then 1 for an odd last). */
#define DEF_PAIRED_RUN(NAME, SUF, ATTR)                                                                               \
    static inline __attribute__((always_inline)) ATTR void NAME##_##SUF##_v(rowjob_t *jb, const int v)                \
    {                                                                                                                 \
        Py_ssize_t r = jb->r0;                                                                                        \
        for (; r + 1 < jb->r1; r += 2)                                                                                \
            NAME##_##SUF##_r(jb, v, r, 2);                                                                            \
        if (r < jb->r1)                                                                                               \
            NAME##_##SUF##_r(jb, v, r, 1);                                                                            \
    }                                                                                                                 \
    DEF_V_DISPATCH(NAME, SUF, ATTR)

/* What each row kernel below starts with: its vector types, and the matrix as a local. The kernels
 * keep every field of jb they use in a local, not jb->: their stores could alias jb's fields, which
 * would then be read again each time. */
#define ROWJOB_VIEW(T, VD, VI, VF)                                                                                    \
    typedef VD vd_t;                                                                                                  \
    typedef VI vi_t;                                                                                                  \
    typedef VF vf_t __attribute__((unused)); /* for ld_f32 */                                                         \
    const T *const mat = (const T *)jb->mat

/* A window of R rows' values x[q] at column j, in a row kernel of a_rows or c_pass: each of the v
 * projections d[q][t] += x . P[t] (the rows' side) and acc[t] += y[i][t] x (the columns' side), each
 * column accumulator loaded and stored once for the R rows. */
#define PROJECT_WINDOW()                                                                                              \
    for (int t = 0; t < v; t++) {                                                                                     \
        vd_t pt = ld_f64(P + t * ps + j);                                                                             \
        double *ya = acc + t * ps + j;                                                                                \
        vd_t yat = ld_f64(ya);                                                                                        \
        for (int q = 0; q < R; q++) {                                                                                 \
            d[q][t] += x[q] * pt;                                                                                     \
            yat += splat(yi[q][t]) * x[q];                                                                            \
        }                                                                                                             \
        st_f64(ya, yat);                                                                                              \
    }

/*
 * b_rows over B (k x n): rowsT = [B.x (v rows), sum|B| , max|B|] over the k
 * rows; acc = sum_r B_rj^2.
 */
#define DEF_B_ROWS(SUF, T, LD, VD, VI, VF, ATTR)                                                                      \
    static inline __attribute__((always_inline)) ATTR void b_rows_##SUF##_v(rowjob_t *jb, const int v)                \
    {                                                                                                                 \
        ROWJOB_VIEW(T, VD, VI, VF);                                                                                   \
        const double *const P = jb->P;                                                                                \
        double *const acc = jb->acc, *const rowsT = jb->rowsT;                                                        \
        const Py_ssize_t ps = jb->stride;                                                                             \
        const Py_ssize_t n = jb->cols, k = jb->rows;                                                                  \
        const Py_ssize_t n4 = n - n % LANES;                                                                          \
        double *ssq = acc;                                                                                            \
        for (Py_ssize_t r = jb->r0; r < jb->r1; r++) {                                                                \
            const T *row = mat + r * n;                                                                               \
            vd_t d[MAX_VECTORS];                                                                                      \
            for (int t = 0; t < v; t++)                                                                               \
                d[t] = splat(0.0);                                                                                    \
            vd_t s = splat(0.0), mx = splat(0.0);                                                                     \
            Py_ssize_t j = 0;                                                                                         \
            for (; j < n4; j += LANES) {                                                                              \
                vd_t x = LD(row + j), ax = vabs(x);                                                                   \
                for (int t = 0; t < v; t++)                                                                           \
                    d[t] += x * ld_f64(P + t * ps + j);                                                               \
                s += ax;                                                                                              \
                mx = vmax_nan(mx, ax);                                                                                \
                st_f64(ssq + j, ld_f64(ssq + j) + x * x);                                                             \
            }                                                                                                         \
            double dt[MAX_VECTORS];                                                                                   \
            for (int t = 0; t < v; t++)                                                                               \
                dt[t] = hsum(d[t]);                                                                                   \
            double ss = hsum(s), mm = hmax_nan(mx);                                                                   \
            for (; j < n; j++) {                                                                                      \
                double x = (double)row[j], ax = fabs(x);                                                              \
                for (int t = 0; t < v; t++)                                                                           \
                    dt[t] += x * P[t * ps + j];                                                                       \
                ss += ax;                                                                                             \
                mm = max_nan(mm, ax);                                                                                 \
                ssq[j] += x * x;                                                                                      \
            }                                                                                                         \
            for (int t = 0; t < v; t++)                                                                               \
                rowsT[t * k + r] = dt[t];                                                                             \
            rowsT[v * k + r] = ss;                                                                                    \
            rowsT[(v + 1) * k + r] = mm;                                                                              \
        }                                                                                                             \
    }                                                                                                                 \
    DEF_V_DISPATCH(b_rows, SUF, ATTR)

/*
 * a_rows over A (m x k), P = [B.x transposed (v rows), sum|B|, max|B|] over
 * k, W = y (m x v): rowsT = [A.(B.x) (v rows), |A|.sum|B|, |A|.max|B|,
 * sum A_ik^2] over m; acc = [y^T.A (v rows), sum_i |A_ik|, max_i |A_ik|].
 */
#define DEF_A_ROWS(SUF, T, LD, VD, VI, VF, ATTR)                                                                      \
    /* R rows from i at once (R a constant: 2, or 1 for the last): each column accumulator is loaded and              \
       stored once for R rows, in the same order of additions as row by row */                                        \
    static inline __attribute__((always_inline)) ATTR void a_rows_##SUF##_r(rowjob_t *jb, const int v,                \
                                                                           Py_ssize_t i, const int R)                 \
    {                                                                                                                 \
        ROWJOB_VIEW(T, VD, VI, VF);                                                                                   \
        const double *const P = jb->P, *const W = jb->W;                                                              \
        double *const acc = jb->acc, *const rowsT = jb->rowsT;                                                        \
        const Py_ssize_t ps = jb->stride;                                                                             \
        const Py_ssize_t k = jb->cols, m = jb->rows;                                                                  \
        const Py_ssize_t k4 = k - k % LANES;                                                                          \
        const double *bsum = P + v * ps, *bmax = P + (v + 1) * ps;                                                    \
        double *csum = acc + v * ps, *cmax = acc + (v + 1) * ps;                                                      \
        const T *row[2];                                                                                              \
        const double *yi[2];                                                                                          \
        vd_t d[2][MAX_VECTORS], rs[2], rm[2], ss[2];                                                                  \
        for (int q = 0; q < R; q++) {                                                                                 \
            row[q] = mat + (i + q) * k;                                                                               \
            yi[q] = W + (i + q) * v;                                                                                  \
            for (int t = 0; t < v; t++)                                                                               \
                d[q][t] = splat(0.0);                                                                                 \
            rs[q] = rm[q] = ss[q] = splat(0.0);                                                                       \
        }                                                                                                             \
        Py_ssize_t j = 0;                                                                                             \
        for (; j < k4; j += LANES) {                                                                                  \
            vd_t x[2], ax[2];                                                                                         \
            for (int q = 0; q < R; q++) {                                                                             \
                x[q] = LD(row[q] + j);                                                                                \
                ax[q] = vabs(x[q]);                                                                                   \
            }                                                                                                         \
            PROJECT_WINDOW();                                                                                         \
            vd_t bs = ld_f64(bsum + j), bm = ld_f64(bmax + j), cs = ld_f64(csum + j), cm = ld_f64(cmax + j);          \
            for (int q = 0; q < R; q++) {                                                                             \
                rs[q] += ax[q] * bs;                                                                                  \
                rm[q] += ax[q] * bm;                                                                                  \
                ss[q] += x[q] * x[q];                                                                                 \
                cs += ax[q];                                                                                          \
                cm = vmax_nan(cm, ax[q]);                                                                             \
            }                                                                                                         \
            st_f64(csum + j, cs);                                                                                     \
            st_f64(cmax + j, cm);                                                                                     \
        }                                                                                                             \
        for (int q = 0; q < R; q++) {                                                                                 \
            double dt[MAX_VECTORS];                                                                                   \
            for (int t = 0; t < v; t++)                                                                               \
                dt[t] = hsum(d[q][t]);                                                                                \
            double rss = hsum(rs[q]), rmm = hsum(rm[q]), sss = hsum(ss[q]);                                           \
            for (Py_ssize_t jj = j; jj < k; jj++) {                                                                   \
                double xs = (double)row[q][jj], axs = fabs(xs);                                                       \
                for (int t = 0; t < v; t++) {                                                                         \
                    dt[t] += xs * P[t * ps + jj];                                                                     \
                    acc[t * ps + jj] += yi[q][t] * xs;                                                                \
                }                                                                                                     \
                rss += axs * bsum[jj];                                                                                \
                rmm += axs * bmax[jj];                                                                                \
                sss += xs * xs;                                                                                       \
                csum[jj] += axs;                                                                                      \
                cmax[jj] = max_nan(cmax[jj], axs);                                                                    \
            }                                                                                                         \
            for (int t = 0; t < v; t++)                                                                               \
                rowsT[t * m + i + q] = dt[t];                                                                         \
            rowsT[v * m + i + q] = rss;                                                                               \
            rowsT[(v + 1) * m + i + q] = rmm;                                                                         \
            rowsT[(v + 2) * m + i + q] = sss;                                                                         \
        }                                                                                                             \
    }                                                                                                                 \
    DEF_PAIRED_RUN(a_rows, SUF, ATTR)

/*
 * b_cols over B (k x n), W = [y^T.A (v rows), sum|A|, max|A|] over k:
 * acc = [(y^T.A).B (v rows), (sum|A|)^T.|B|, (max|A|)^T.|B|] over n.
 */
#define DEF_B_COLS(SUF, T, LD, VD, VI, VF, ATTR)                                                                      \
    /* R rows from r at once, as a_rows */                                                                            \
    static inline __attribute__((always_inline)) ATTR void b_cols_##SUF##_r(rowjob_t *jb, const int v,                \
                                                                           Py_ssize_t r, const int R)                 \
    {                                                                                                                 \
        ROWJOB_VIEW(T, VD, VI, VF);                                                                                   \
        const double *const W = jb->W;                                                                                \
        double *const acc = jb->acc;                                                                                  \
        const Py_ssize_t ps = jb->stride;                                                                             \
        const Py_ssize_t n = jb->cols, k = jb->rows;                                                                  \
        const Py_ssize_t n4 = n - n % LANES;                                                                          \
        double *csum = acc + v * ps, *cmax = acc + (v + 1) * ps;                                                      \
        const T *row[2];                                                                                              \
        double wt[2][MAX_VECTORS + 2]; /* the row's weights: v, then sum|A|, max|A| */                                \
        for (int q = 0; q < R; q++) {                                                                                 \
            row[q] = mat + (r + q) * n;                                                                               \
            for (int t = 0; t < v + 2; t++)                                                                           \
                wt[q][t] = W[t * k + r + q];                                                                          \
        }                                                                                                             \
        Py_ssize_t j = 0;                                                                                             \
        for (; j < n4; j += LANES) {                                                                                  \
            vd_t x[2], ax[2];                                                                                         \
            for (int q = 0; q < R; q++) {                                                                             \
                x[q] = LD(row[q] + j);                                                                                \
                ax[q] = vabs(x[q]);                                                                                   \
            }                                                                                                         \
            for (int t = 0; t < v; t++) {                                                                             \
                double *p = acc + t * ps + j;                                                                         \
                vd_t at = ld_f64(p);                                                                                  \
                for (int q = 0; q < R; q++)                                                                           \
                    at += splat(wt[q][t]) * x[q];                                                                     \
                st_f64(p, at);                                                                                        \
            }                                                                                                         \
            vd_t cs = ld_f64(csum + j), cm = ld_f64(cmax + j);                                                        \
            for (int q = 0; q < R; q++) {                                                                             \
                cs += splat(wt[q][v]) * ax[q];                                                                        \
                cm += splat(wt[q][v + 1]) * ax[q];                                                                    \
            }                                                                                                         \
            st_f64(csum + j, cs);                                                                                     \
            st_f64(cmax + j, cm);                                                                                     \
        }                                                                                                             \
        for (int q = 0; q < R; q++)                                                                                   \
            for (Py_ssize_t jj = j; jj < n; jj++) {                                                                   \
                double xs = (double)row[q][jj], axs = fabs(xs);                                                       \
                for (int t = 0; t < v; t++)                                                                           \
                    acc[t * ps + jj] += wt[q][t] * xs;                                                                \
                csum[jj] += wt[q][v] * axs;                                                                           \
                cmax[jj] += wt[q][v + 1] * axs;                                                                       \
            }                                                                                                         \
    }                                                                                                                 \
    DEF_PAIRED_RUN(b_cols, SUF, ATTR)

/*
 * c_pass over C (m x n), P = x transposed (v rows over n), W = y (m x v):
 * rowsT = [C.x (v rows), sum C_ij^2] over m; acc = [y^T.C (v rows),
 * sum_i C_ij^2] over n; NaN and infinities counted, the first one's place kept.
 */
#define DEF_C_PASS(SUF, T, LD, VD, VI, VF, ATTR)                                                                      \
    /* R rows from i at once, as a_rows */                                                                            \
    static inline __attribute__((always_inline)) ATTR void c_pass_##SUF##_r(rowjob_t *jb, const int v,                \
                                                                           Py_ssize_t i, const int R)                 \
    {                                                                                                                 \
        ROWJOB_VIEW(T, VD, VI, VF);                                                                                   \
        const double *const P = jb->P, *const W = jb->W;                                                              \
        double *const acc = jb->acc, *const rowsT = jb->rowsT;                                                        \
        const Py_ssize_t ps = jb->stride;                                                                             \
        const Py_ssize_t n = jb->cols, m = jb->rows;                                                                  \
        const Py_ssize_t n4 = n - n % LANES;                                                                          \
        double *cssq = acc + v * ps;                                                                                  \
        const vd_t inf = splat(INFINITY);                                                                             \
        const T *row[2];                                                                                              \
        const double *yi[2];                                                                                          \
        vd_t d[2][MAX_VECTORS], ss[2];                                                                                \
        vi_t bad = {0};                                                                                               \
        for (int q = 0; q < R; q++) {                                                                                 \
            row[q] = mat + (i + q) * n;                                                                               \
            yi[q] = W + (i + q) * v;                                                                                  \
            for (int t = 0; t < v; t++)                                                                               \
                d[q][t] = splat(0.0);                                                                                 \
            ss[q] = splat(0.0);                                                                                       \
        }                                                                                                             \
        Py_ssize_t j = 0;                                                                                             \
        for (; j < n4; j += LANES) {                                                                                  \
            vd_t x[2];                                                                                                \
            for (int q = 0; q < R; q++) {                                                                             \
                x[q] = LD(row[q] + j);                                                                                \
                bad |= ~(vabs(x[q]) < inf); /* NaN or infinite */                                                     \
            }                                                                                                         \
            PROJECT_WINDOW();                                                                                         \
            vd_t cs = ld_f64(cssq + j);                                                                               \
            for (int q = 0; q < R; q++) {                                                                             \
                vd_t x2 = x[q] * x[q];                                                                                \
                ss[q] += x2;                                                                                          \
                cs += x2;                                                                                             \
            }                                                                                                         \
            st_f64(cssq + j, cs);                                                                                     \
        }                                                                                                             \
        int any_bad = any(bad);                                                                                       \
        for (int q = 0; q < R; q++) {                                                                                 \
            double dt[MAX_VECTORS];                                                                                   \
            for (int t = 0; t < v; t++)                                                                               \
                dt[t] = hsum(d[q][t]);                                                                                \
            double sss = hsum(ss[q]);                                                                                 \
            for (Py_ssize_t jj = j; jj < n; jj++) {                                                                   \
                double xs = (double)row[q][jj];                                                                       \
                for (int t = 0; t < v; t++) {                                                                         \
                    dt[t] += xs * P[t * ps + jj];                                                                     \
                    acc[t * ps + jj] += yi[q][t] * xs;                                                                \
                }                                                                                                     \
                sss += xs * xs;                                                                                       \
                cssq[jj] += xs * xs;                                                                                  \
            }                                                                                                         \
            if (any_bad || !isfinite(sss)) {                                                                          \
                /* rare: count this row's NaN and infinities one by one */                                            \
                for (Py_ssize_t c = 0; c < n; c++)                                                                    \
                    if (!isfinite((double)row[q][c])) {                                                               \
                        if (jb->nonfinite++ == 0)                                                                     \
                            jb->first_nonfinite = (i + q) * n + c;                                                    \
                    }                                                                                                 \
            }                                                                                                         \
            for (int t = 0; t < v; t++)                                                                               \
                rowsT[t * m + i + q] = dt[t];                                                                         \
            rowsT[v * m + i + q] = sss;                                                                               \
        }                                                                                                             \
    }                                                                                                                 \
    DEF_PAIRED_RUN(c_pass, SUF, ATTR)

/*
 * sumsq over any matrix: rowsT = sum_j M_ij^2 per row, acc = sum_i M_ij^2 per
 * column (the norms that bound |A|.|B| in the model rule: rows of A, columns
 * of B; each call wants one of the two, and the other costs little beside
 * the read).
 */
#define DEF_SUMSQ(SUF, T, LD, VD, VI, VF, ATTR)                                                                       \
    ATTR static void sumsq_##SUF(rowjob_t *jb)                                                                        \
    {                                                                                                                 \
        typedef VD vd_t;                                                                                              \
        typedef VF vf_t __attribute__((unused)); /* for ld_f32 */                                                     \
        const T *const mat = (const T *)jb->mat;                                                                      \
        double *const acc = jb->acc, *const rowsT = jb->rowsT;                                                        \
        const Py_ssize_t n = jb->cols, n4 = n - n % LANES;                                                            \
        for (Py_ssize_t r = jb->r0; r < jb->r1; r++) {                                                                \
            const T *row = mat + r * n;                                                                               \
            vd_t ss = splat(0.0);                                                                                     \
            Py_ssize_t j = 0;                                                                                         \
            for (; j < n4; j += LANES) {                                                                              \
                vd_t x = LD(row + j), x2 = x * x;                                                                     \
                ss += x2;                                                                                             \
                st_f64(acc + j, ld_f64(acc + j) + x2);                                                                \
            }                                                                                                         \
            double sss = hsum(ss);                                                                                    \
            for (; j < n; j++) {                                                                                      \
                double x = (double)row[j];                                                                            \
                sss += x * x;                                                                                         \
                acc[j] += x * x;                                                                                      \
            }                                                                                                         \
            rowsT[r] = sss;                                                                                           \
        }                                                                                                             \
    }

#define DEF_ROW_PASSES(W, VD, VI, VF, ATTR)                                                                           \
    DEF_B_ROWS(f32_##W, float, ld_f32, VD, VI, VF, ATTR)                                                              \
    DEF_B_ROWS(f64_##W, double, ld_f64, VD, VI, VF, ATTR)                                                             \
    DEF_A_ROWS(f32_##W, float, ld_f32, VD, VI, VF, ATTR)                                                              \
    DEF_A_ROWS(f64_##W, double, ld_f64, VD, VI, VF, ATTR)                                                             \
    DEF_B_COLS(f32_##W, float, ld_f32, VD, VI, VF, ATTR)                                                              \
    DEF_B_COLS(f64_##W, double, ld_f64, VD, VI, VF, ATTR)                                                             \
    DEF_C_PASS(f32_##W, float, ld_f32, VD, VI, VF, ATTR)                                                              \
    DEF_C_PASS(f64_##W, double, ld_f64, VD, VI, VF, ATTR)                                                             \
    DEF_SUMSQ(f32_##W, float, ld_f32, VD, VI, VF, ATTR)                                                               \
    DEF_SUMSQ(f64_##W, double, ld_f64, VD, VI, VF, ATTR)

DEF_ROW_PASSES(narrow, v2d, v2i, v2f, )
#ifdef MMD_HAVE_WIDE
DEF_ROW_PASSES(wide, v4d, v4i, v4f, WIDE_TARGET)
/* the kernel of this CPU's width */
#define PICK(name) (use_wide ? name##_wide : name##_narrow)
#else
#define PICK(name) (name##_narrow)
#endif

typedef void (*row_kernel)(rowjob_t *);

typedef struct {
    row_kernel fn;
    rowjob_t job;
} rowhalf_t;

static void *
rowhalf_main(void *arg)
{
    rowhalf_t *h = (rowhalf_t *)arg;
    h->fn(&h->job);
    return NULL;
}

/*
 * The kernel over rows [0, rows), in two halves when the matrix has at
 * least min_split elements. P (p_rows rows of cols, or none) is read, and
 * the column accumulators (acc_rows rows of cols) made, in copies whose rows
 * are padded apart: rows of 4096 doubles lie 32 KiB apart, all in the same
 * L1 sets, and a dozen such streams per element would evict each other.
 * The accumulators of both halves are added to acc (its first sum_rows rows)
 * or max-merged into it (the rest), so a matrix given a block of rows at a
 * time accumulates in one acc, which the caller zeroes first (the maxima are
 * of absolute values). Returns -1 on out of memory (nothing is valid then).
 */
static int
run_rows(row_kernel fn, rowjob_t *job, const double *p, Py_ssize_t p_rows, double *acc, Py_ssize_t acc_rows,
         Py_ssize_t sum_rows, Py_ssize_t min_split)
{
    const Py_ssize_t cols = job->cols;
    const Py_ssize_t stride = ((cols + 511) & ~(Py_ssize_t)511) + 8; /* 64 bytes past a multiple of 4 KiB */
    int split = job->rows >= 2 && job->rows * job->cols >= min_split;
    double *pp = p_rows ? (double *)malloc((size_t)(p_rows * stride) * sizeof(double)) : NULL;
    double *a0 = (double *)calloc((size_t)(acc_rows * stride), sizeof(double));
    double *a1 = split ? (double *)calloc((size_t)(acc_rows * stride), sizeof(double)) : NULL;
    if ((p_rows && pp == NULL) || a0 == NULL || (split && a1 == NULL)) {
        free(pp);
        free(a0);
        free(a1);
        return -1;
    }
    for (Py_ssize_t t = 0; t < p_rows; t++)
        memcpy(pp + t * stride, p + t * cols, (size_t)cols * sizeof(double));
    job->P = pp;
    job->stride = stride;
    job->nonfinite = 0;
    job->first_nonfinite = -1;
    rowhalf_t h0 = {fn, *job}, h1 = {fn, *job};
    h0.job.acc = a0;
    h0.job.r0 = 0;
    h0.job.r1 = split ? job->rows / 2 : job->rows;
    h1.job.acc = a1;
    h1.job.r0 = h0.job.r1;
    h1.job.r1 = job->rows;
    run_halves(rowhalf_main, &h0, split ? &h1 : NULL);
    for (Py_ssize_t t = 0; t < acc_rows; t++) {
        double *dst = acc + t * cols;
        const double *s0 = a0 + t * stride, *s1 = split ? a1 + t * stride : NULL;
        if (t < sum_rows)
            for (Py_ssize_t j = 0; j < cols; j++)
                dst[j] += s1 == NULL ? s0[j] : s0[j] + s1[j];
        else
            for (Py_ssize_t j = 0; j < cols; j++)
                dst[j] = max_nan(dst[j], s1 == NULL ? s0[j] : max_nan(s0[j], s1[j]));
    }
    job->nonfinite = h0.job.nonfinite;
    job->first_nonfinite = h0.job.first_nonfinite;
    if (split) {
        if (job->nonfinite == 0)
            job->first_nonfinite = h1.job.first_nonfinite;
        job->nonfinite += h1.job.nonfinite;
    }
    free(pp);
    free(a0);
    free(a1);
    return 0;
}

/* ------------------------------------------------------------------------
 * Buffers: a matrix (float32 or float64) and float64 arrays of known length.
 */

static int
format_is(const char *fmt, char want)
{
    if (fmt == NULL)
        return 0;
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    return fmt[0] == want && fmt[1] == '\0';
}

/* *f32 = 1 for float32, 0 for float64 */
static int
get_matrix(PyObject *obj, Py_buffer *view, Py_ssize_t rows, Py_ssize_t cols, int *f32, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    int is32 = view->itemsize == 4 && format_is(view->format, 'f');
    int is64 = view->itemsize == 8 && format_is(view->format, 'd');
    if ((!is32 && !is64) || rows < 0 || cols < 0 || (rows && cols > PY_SSIZE_T_MAX / 8 / rows) ||
        view->len != rows * cols * view->itemsize) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous float32 or float64 buffer of %zd x %zd values", name,
                     rows, cols);
        return -1;
    }
    *f32 = is32;
    return 0;
}

static int
get_f64(PyObject *obj, Py_buffer *view, Py_ssize_t count, int writable, const char *name)
{
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != 8 || !format_is(view->format, 'd') || count < 0 || view->len != count * 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous float64 buffer of %zd values", name, count);
        return -1;
    }
    return 0;
}

static void
release_all(Py_buffer *views, int count)
{
    for (int q = 0; q < count; q++)
        PyBuffer_Release(&views[q]);
}


/*
 * The four row passes share one calling convention,
 *   name(mat, rows, cols, v, P, W, rowsT, acc, min_split=1<<16)
 * where P, W and rowsT are None for a pass that has none; the sizes each
 * needs follow from rows, cols and v. rowsT is written; acc is added to
 * (maxima: merged), so it must start at zeros, and a matrix passed a block
 * of rows at a time sums in one acc.
 */
enum { PASS_B_ROWS, PASS_A_ROWS, PASS_B_COLS, PASS_C, PASS_SUMSQ };

static PyObject *
row_pass(PyObject *args, int which, const char *fmt)
{
    PyObject *mat_o, *p_o, *w_o, *r_o, *acc_o;
    Py_ssize_t rows, cols, min_split = (Py_ssize_t)1 << 16;
    int v;
    if (!PyArg_ParseTuple(args, fmt, &mat_o, &rows, &cols, &v, &p_o, &w_o, &r_o, &acc_o, &min_split))
        return NULL;
    if (v < 1 || v > MAX_VECTORS || rows < 1 || cols < 1) {
        PyErr_Format(PyExc_ValueError, "need 1 <= v <= %d and a non-empty matrix", MAX_VECTORS);
        return NULL;
    }
    /* rows of cols for P and acc (0: None), of which acc's first sum_rows are sums (the rest maxima);
       W's and rowsT's sizes in doubles */
    Py_ssize_t p_rows = 0, acc_rows = 0, sum_rows = 0, w_len = 0, r_len = 0;
    row_kernel k32 = NULL, k64 = NULL;
    switch (which) {
    case PASS_B_ROWS:
        p_rows = v, acc_rows = sum_rows = 1, r_len = (v + 2) * rows;
        k32 = PICK(b_rows_f32), k64 = PICK(b_rows_f64);
        break;
    case PASS_A_ROWS:
        p_rows = v + 2, acc_rows = v + 2, sum_rows = v + 1, w_len = rows * v, r_len = (v + 3) * rows;
        k32 = PICK(a_rows_f32), k64 = PICK(a_rows_f64);
        break;
    case PASS_B_COLS:
        acc_rows = sum_rows = v + 2, w_len = (v + 2) * rows;
        k32 = PICK(b_cols_f32), k64 = PICK(b_cols_f64);
        break;
    case PASS_SUMSQ:
        acc_rows = sum_rows = 1, r_len = rows;
        k32 = PICK(sumsq_f32), k64 = PICK(sumsq_f64);
        break;
    default:
        p_rows = v, acc_rows = sum_rows = v + 1, w_len = rows * v, r_len = (v + 1) * rows;
        k32 = PICK(c_pass_f32), k64 = PICK(c_pass_f64);
        break;
    }
    const double *p = NULL;
    double *acc = NULL;
    Py_buffer views[5];
    int held = 0, f32 = 0;
    rowjob_t job;
    memset(&job, 0, sizeof job);
    if (get_matrix(mat_o, &views[held], rows, cols, &f32, "mat") < 0)
        return NULL;
    job.mat = views[held++].buf;
    if (p_rows) {
        if (get_f64(p_o, &views[held], p_rows * cols, 0, "P") < 0)
            goto fail;
        p = (const double *)views[held++].buf;
    }
    if (w_len) {
        if (get_f64(w_o, &views[held], w_len, 0, "W") < 0)
            goto fail;
        job.W = (const double *)views[held++].buf;
    }
    if (r_len) {
        if (get_f64(r_o, &views[held], r_len, 1, "rowsT") < 0)
            goto fail;
        job.rowsT = (double *)views[held++].buf;
    }
    if (get_f64(acc_o, &views[held], acc_rows * cols, 1, "acc") < 0)
        goto fail;
    acc = (double *)views[held++].buf;
    job.f32 = f32;
    job.rows = rows;
    job.cols = cols;
    job.v = v;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = run_rows(f32 ? k32 : k64, &job, p, p_rows, acc, acc_rows, sum_rows, min_split);
    Py_END_ALLOW_THREADS
    release_all(views, held);
    if (st < 0)
        return PyErr_NoMemory();
    if (which == PASS_C)
        return Py_BuildValue("(nn)", job.nonfinite, job.first_nonfinite);
    Py_RETURN_NONE;
fail:
    release_all(views, held);
    return NULL;
}

static PyObject *
b_rows(PyObject *Py_UNUSED(self), PyObject *args)
{
    return row_pass(args, PASS_B_ROWS, "OnniOOOO|n:b_rows");
}

static PyObject *
a_rows(PyObject *Py_UNUSED(self), PyObject *args)
{
    return row_pass(args, PASS_A_ROWS, "OnniOOOO|n:a_rows");
}

static PyObject *
b_cols(PyObject *Py_UNUSED(self), PyObject *args)
{
    return row_pass(args, PASS_B_COLS, "OnniOOOO|n:b_cols");
}

static PyObject *
c_pass(PyObject *Py_UNUSED(self), PyObject *args)
{
    return row_pass(args, PASS_C, "OnniOOOO|n:c_pass");
}

static PyObject *
sumsq(PyObject *Py_UNUSED(self), PyObject *args)
{
    return row_pass(args, PASS_SUMSQ, "OnniOOOO|n:sumsq");
}

/* ------------------------------------------------------------------------
 * The elementwise rules, over the flat range [lo, hi) of out and ref
 * (float64, the same shape); two halves split at the middle element.
 */

/* Elements per block of the uniform rule's search for the worst: small enough to stay in L1 for a rescan. */
#define WORST_BLOCK 1024

typedef struct {
    const double *o, *r;
    Py_ssize_t lo, hi;
    double allowed;
    Py_ssize_t bad;
    double max_err, ssq_err, ssq_ref;
    Py_ssize_t worst; /* the first NaN excess, else the first largest */
    double worst_ex;
    int nan;
} uniform_t;

static inline double
uniform_excess(const uniform_t *u, Py_ssize_t q)
{
    return fabs(u->o[q] - u->r[q]) - u->allowed;
}

/* The worst of [s, e) where the block's largest excess is top (or it has a NaN excess). */
static void
uniform_rescan(uniform_t *u, Py_ssize_t s, Py_ssize_t e, int has_nan, double top)
{
    for (Py_ssize_t q = s; q < e; q++) {
        double ex = uniform_excess(u, q);
        if (has_nan ? ex != ex : ex == top) {
            u->worst = q;
            u->worst_ex = ex;
            u->nan = has_nan;
            return;
        }
    }
}

#define DEF_UNIFORM_RUN(W, VD, VI, ATTR)                                                                              \
    ATTR static void uniform_run_##W(uniform_t *u)                                                                    \
    {                                                                                                                 \
        typedef VD vd_t;                                                                                              \
        typedef VI vi_t;                                                                                              \
        const double *o = u->o, *r = u->r;                                                                            \
        const vd_t al = splat(u->allowed), inf = splat(INFINITY), zero = splat(0.0);                                  \
        vd_t me = zero, se = zero, sr = zero;                                                                         \
        vi_t cnt = {0};                                                                                               \
        Py_ssize_t q = u->lo;                                                                                         \
        while (u->hi - q >= LANES) {                                                                                  \
            Py_ssize_t e = q + WORST_BLOCK;                                                                           \
            if (e > u->hi)                                                                                            \
                e = u->hi;                                                                                            \
            e -= (e - q) % LANES;                                                                                     \
            vd_t top = splat(-INFINITY);                                                                              \
            vi_t nans = {0};                                                                                          \
            for (Py_ssize_t j = q; j < e; j += LANES) {                                                               \
                vd_t ov = ld_f64(o + j), rv = ld_f64(r + j);                                                          \
                vd_t err = vabs(ov - rv), ex = err - al;                                                              \
                cnt -= (ex > zero) | ~(vabs(ov) < inf); /* a mask is -1 */                                            \
                me = vmax_nan(me, err);                                                                               \
                se += err * err;                                                                                      \
                sr += rv * rv;                                                                                        \
                nans |= ex != ex;                                                                                     \
                vi_t gt = ex > top;                                                                                   \
                top = (vd_t)(((vi_t)ex & gt) | ((vi_t)top & ~gt));                                                    \
            }                                                                                                         \
            /* the block's worst only where it beats the worst so far: a rare second look, in L1 */                   \
            if (!u->nan) {                                                                                            \
                if (any(nans)) {                                                                                      \
                    uniform_rescan(u, q, e, 1, 0.0);                                                                  \
                } else {                                                                                              \
                    double t = top[0];                                                                                \
                    for (int l = 1; l < (int)LANES; l++)                                                              \
                        t = top[l] > t ? top[l] : t;                                                                  \
                    if (t > u->worst_ex)                                                                              \
                        uniform_rescan(u, q, e, 0, t);                                                                \
                }                                                                                                     \
            }                                                                                                         \
            q = e;                                                                                                    \
        }                                                                                                             \
        double mes = hmax_nan(me), ses = hsum(se), srs = hsum(sr);                                                    \
        Py_ssize_t bad = 0;                                                                                           \
        for (int l = 0; l < (int)LANES; l++)                                                                          \
            bad += cnt[l];                                                                                            \
        for (; q < u->hi; q++) {                                                                                      \
            double err = fabs(o[q] - r[q]), ex = err - u->allowed;                                                    \
            bad += (ex > 0) || !isfinite(o[q]);                                                                       \
            mes = max_nan(mes, err);                                                                                  \
            ses += err * err;                                                                                         \
            srs += r[q] * r[q];                                                                                       \
            if (!u->nan && (ex != ex || ex > u->worst_ex)) {                                                          \
                u->worst = q;                                                                                         \
                u->worst_ex = ex;                                                                                     \
                u->nan = ex != ex;                                                                                    \
            }                                                                                                         \
        }                                                                                                             \
        u->bad = bad;                                                                                                 \
        u->max_err = mes;                                                                                             \
        u->ssq_err = ses;                                                                                             \
        u->ssq_ref = srs;                                                                                             \
    }

DEF_UNIFORM_RUN(narrow, v2d, v2i, )
#ifdef MMD_HAVE_WIDE
DEF_UNIFORM_RUN(wide, v4d, v4i, WIDE_TARGET)
#endif

/* The output and the reference of the rules, m x n float64 in C order, as views[0] and views[1];
   -1 with an exception set. */
static int
get_out_ref(PyObject *o_o, PyObject *r_o, Py_ssize_t m, Py_ssize_t n, Py_buffer views[2])
{
    if (m < 1 || n < 1 || n > PY_SSIZE_T_MAX / 8 / m) {
        PyErr_SetString(PyExc_ValueError, "need a non-empty matrix");
        return -1;
    }
    if (get_f64(o_o, &views[0], m * n, 0, "out") < 0)
        return -1;
    if (get_f64(r_o, &views[1], m * n, 0, "ref") < 0) {
        release_all(views, 1);
        return -1;
    }
    return 0;
}

/* Where the second thread's half of `total` elements starts (total: no second thread). */
static inline Py_ssize_t
half_of(Py_ssize_t total, Py_ssize_t min_split)
{
    return total >= min_split && total >= 2 ? total / 2 : total;
}

static void *
uniform_main(void *arg)
{
    PICK(uniform_run)((uniform_t *)arg);
    return NULL;
}

static PyObject *
uniform(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *o_o, *r_o;
    Py_ssize_t m, n, min_split = (Py_ssize_t)1 << 16;
    double allowed;
    if (!PyArg_ParseTuple(args, "OOnnd|n:uniform", &o_o, &r_o, &m, &n, &allowed, &min_split))
        return NULL;
    Py_buffer views[2];
    if (get_out_ref(o_o, r_o, m, n, views) < 0)
        return NULL;
    Py_ssize_t total = m * n, mid = half_of(total, min_split);
    uniform_t h0 = {views[0].buf, views[1].buf, 0, mid, allowed, 0, 0.0, 0.0, 0.0, 0, -INFINITY, 0};
    uniform_t h1 = h0;
    h1.lo = h1.worst = mid;
    h1.hi = total;
    Py_BEGIN_ALLOW_THREADS
    run_halves(uniform_main, &h0, mid < total ? &h1 : NULL);
    Py_END_ALLOW_THREADS
    release_all(views, 2);
    if (mid < total) {
        /* the first half wins ties, as the first occurrence does in argmax */
        if (!h0.nan && (h1.nan || h1.worst_ex > h0.worst_ex)) {
            h0.worst = h1.worst;
            h0.worst_ex = h1.worst_ex;
        }
        h0.bad += h1.bad;
        h0.max_err = max_nan(h0.max_err, h1.max_err);
        h0.ssq_err += h1.ssq_err;
        h0.ssq_ref += h1.ssq_ref;
    }
    return Py_BuildValue("(ndddn)", h0.bad, h0.max_err, h0.ssq_err, h0.ssq_ref, h0.worst);
}

/* ------------------------------------------------------------------------
 * The model rule's first sieve: what |err| <= half + scale*|ref| passes is
 * done with; the rest (in order, with |err|) go back to mmd.check.full, which
 * bounds |A|.|B| there. Past `limit` of them the list stops growing (the
 * caller then computes |A|.|B| in full and needs no list).
 */

typedef struct {
    const double *o, *r;
    Py_ssize_t lo, hi, limit;
    double scale, half;
    double max_err, ssq_err, ssq_ref;
    Py_ssize_t nonfinite, first_nan, first_nonfinite;
    Py_ssize_t left, cap;
    int64_t *idx;
    double *err;
    int nomem;
} model_t;

static void
model_keep(model_t *h, Py_ssize_t q, double err)
{
    if (h->left >= h->limit || h->nomem) {
        h->left++;
        return;
    }
    if (h->left == h->cap) {
        Py_ssize_t cap = h->cap ? 2 * h->cap : 1024;
        int64_t *idx = (int64_t *)realloc(h->idx, (size_t)cap * sizeof(int64_t));
        if (idx != NULL)
            h->idx = idx;
        double *e = idx != NULL ? (double *)realloc(h->err, (size_t)cap * sizeof(double)) : NULL;
        if (e == NULL) {
            h->nomem = 1;
            return;
        }
        h->err = e;
        h->cap = cap;
    }
    h->idx[h->left] = (int64_t)q;
    h->err[h->left] = err;
    h->left++;
}

/* an element the sieve did not pass */
static inline void
model_left(model_t *h, Py_ssize_t q, double err)
{
    double o = h->o[q];
    if (isfinite(o)) {
        model_keep(h, q, err);
        return;
    }
    if (h->nonfinite++ == 0)
        h->first_nonfinite = q;
    if (o != o && h->first_nan < 0)
        h->first_nan = q;
}

#define DEF_MODEL_RUN(W, VD, VI, ATTR)                                                                                \
    ATTR static void model_run_##W(model_t *h)                                                                        \
    {                                                                                                                 \
        typedef VD vd_t;                                                                                              \
        typedef VI vi_t;                                                                                              \
        const double *o = h->o, *r = h->r;                                                                            \
        const vd_t sc = splat(h->scale), hf = splat(h->half), zero = splat(0.0);                                      \
        vd_t me = zero, se = zero, sr = zero;                                                                         \
        Py_ssize_t q = h->lo;                                                                                         \
        for (; h->hi - q >= LANES; q += LANES) {                                                                      \
            vd_t ov = ld_f64(o + q), rv = ld_f64(r + q);                                                              \
            vd_t err = vabs(ov - rv);                                                                                 \
            vd_t allowed = vabs(rv) * sc + hf;                                                                        \
            vi_t left = ~(err <= allowed); /* a NaN error is never passed */                                          \
            me = vmax_nan(me, err);                                                                                   \
            se += err * err;                                                                                          \
            sr += rv * rv;                                                                                            \
            if (any(left))                                                                                            \
                for (int l = 0; l < (int)LANES; l++)                                                                  \
                    if (left[l])                                                                                      \
                        model_left(h, q + l, err[l]);                                                                 \
        }                                                                                                             \
        double mes = hmax_nan(me), ses = hsum(se), srs = hsum(sr);                                                    \
        for (; q < h->hi; q++) {                                                                                      \
            double err = fabs(o[q] - r[q]);                                                                           \
            double allowed = fabs(r[q]) * h->scale + h->half;                                                         \
            mes = max_nan(mes, err);                                                                                  \
            ses += err * err;                                                                                         \
            srs += r[q] * r[q];                                                                                       \
            if (!(err <= allowed))                                                                                    \
                model_left(h, q, err);                                                                                \
        }                                                                                                             \
        h->max_err = mes;                                                                                             \
        h->ssq_err = ses;                                                                                             \
        h->ssq_ref = srs;                                                                                             \
    }

DEF_MODEL_RUN(narrow, v2d, v2i, )
#ifdef MMD_HAVE_WIDE
DEF_MODEL_RUN(wide, v4d, v4i, WIDE_TARGET)
#endif

static void *
model_main(void *arg)
{
    PICK(model_run)((model_t *)arg);
    return NULL;
}

static PyObject *
model(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *o_o, *r_o;
    Py_ssize_t m, n, limit, min_split = (Py_ssize_t)1 << 16;
    double scale, half;
    if (!PyArg_ParseTuple(args, "OOnnddn|n:model", &o_o, &r_o, &m, &n, &scale, &half, &limit, &min_split))
        return NULL;
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "limit must be >= 0");
        return NULL;
    }
    Py_buffer views[2];
    if (get_out_ref(o_o, r_o, m, n, views) < 0)
        return NULL;
    Py_ssize_t total = m * n, mid = half_of(total, min_split);
    model_t h0;
    memset(&h0, 0, sizeof h0);
    h0.o = views[0].buf;
    h0.r = views[1].buf;
    h0.lo = 0;
    h0.hi = mid;
    h0.limit = limit;
    h0.scale = scale;
    h0.half = half;
    h0.first_nan = h0.first_nonfinite = -1;
    model_t h1 = h0;
    h1.lo = mid;
    h1.hi = total;
    Py_BEGIN_ALLOW_THREADS
    run_halves(model_main, &h0, mid < total ? &h1 : NULL);
    Py_END_ALLOW_THREADS
    release_all(views, 2);
    PyObject *res = NULL;
    if (h0.nomem || h1.nomem) {
        PyErr_NoMemory();
        goto done;
    }
    if (mid < total) {
        h0.max_err = max_nan(h0.max_err, h1.max_err);
        h0.ssq_err += h1.ssq_err;
        h0.ssq_ref += h1.ssq_ref;
        if (h0.first_nan < 0)
            h0.first_nan = h1.first_nan;
        if (h0.nonfinite == 0)
            h0.first_nonfinite = h1.first_nonfinite;
        h0.nonfinite += h1.nonfinite;
    }
    Py_ssize_t left = h0.left + (mid < total ? h1.left : 0);
    Py_ssize_t kept0 = h0.left < limit ? h0.left : limit, kept1 = h1.left < limit ? h1.left : limit;
    if (mid >= total)
        kept1 = 0;
    /* the list only where it is whole */
    Py_ssize_t kept = left <= limit ? kept0 + kept1 : 0;
    PyObject *idx = PyBytes_FromStringAndSize(NULL, kept * (Py_ssize_t)sizeof(int64_t));
    PyObject *err = PyBytes_FromStringAndSize(NULL, kept * (Py_ssize_t)sizeof(double));
    if (idx != NULL && err != NULL) {
        if (kept) {
            memcpy(PyBytes_AS_STRING(idx), h0.idx, (size_t)kept0 * sizeof(int64_t));
            memcpy(PyBytes_AS_STRING(idx) + kept0 * sizeof(int64_t), h1.idx, (size_t)kept1 * sizeof(int64_t));
            memcpy(PyBytes_AS_STRING(err), h0.err, (size_t)kept0 * sizeof(double));
            memcpy(PyBytes_AS_STRING(err) + kept0 * sizeof(double), h1.err, (size_t)kept1 * sizeof(double));
        }
        res = Py_BuildValue("(dddnnnnOO)", h0.max_err, h0.ssq_err, h0.ssq_ref, h0.nonfinite, h0.first_nan,
                            h0.first_nonfinite, left, idx, err);
    }
    Py_XDECREF(idx);
    Py_XDECREF(err);
done:
    free(h0.idx);
    free(h0.err);
    free(h1.idx);
    free(h1.err);
    return res;
}

/* For tests: the kernels of the other width, where there are two. */
static PyObject *
set_wide(PyObject *Py_UNUSED(self), PyObject *arg)
{
    int want = PyObject_IsTrue(arg);
    if (want < 0)
        return NULL;
#ifdef MMD_HAVE_WIDE
    int old = use_wide;
    use_wide = want && __builtin_cpu_supports("avx2");
    return PyBool_FromLong(old);
#else
    return PyBool_FromLong(0);
#endif
}

static PyMethodDef methods[] = {
    {"set_wide", set_wide, METH_O,
     "set_wide(flag) -> bool\n\n"
     "Use the AVX2 kernels (where the CPU has AVX2) or the two-double ones; returns the previous choice."},
    {"b_rows", b_rows, METH_VARARGS,
     "b_rows(b, k, n, v, xT, None, rowsT, acc, min_split=1<<16) -> None\n\n"
     "rowsT ((v+2) x k) = [B.x transposed, sum_j |B_rj|, max_j |B_rj|]; acc (n) = sum_r B_rj^2."},
    {"a_rows", a_rows, METH_VARARGS,
     "a_rows(a, m, k, v, P, y, rowsT, acc, min_split=1<<16) -> None\n\n"
     "P ((v+2) x k) = b_rows' rowsT, y (m x v): rowsT ((v+3) x m) = [A.(B.x) transposed, |A|.P[v],\n"
     "|A|.P[v+1], sum_k A_ik^2]; acc ((v+2) x k) = [y^T.A, sum_i |A_ik|, max_i |A_ik|]."},
    {"b_cols", b_cols, METH_VARARGS,
     "b_cols(b, k, n, v, None, W, None, acc, min_split=1<<16) -> None\n\n"
     "W ((v+2) x k) = a_rows' acc: acc ((v+2) x n) = [W[:v].B, W[v].|B|, W[v+1].|B|]."},
    {"c_pass", c_pass, METH_VARARGS,
     "c_pass(c, m, n, v, xT, y, rowsT, acc, min_split=1<<16) -> (nonfinite, first_nonfinite)\n\n"
     "rowsT ((v+1) x m) = [C.x transposed, sum_j C_ij^2]; acc ((v+1) x n) = [y^T.C, sum_i C_ij^2];\n"
     "the count of NaN and infinite values and the flat index of the first (-1: none)."},
    {"sumsq", sumsq, METH_VARARGS,
     "sumsq(mat, m, n, 1, None, None, rows, cols, min_split=1<<16) -> None\n\n"
     "rows (m) = the sums of squares of mat's rows, cols (n) those of its columns."},
    {"uniform", uniform, METH_VARARGS,
     "uniform(out, ref, m, n, allowed, min_split=1<<16) -> (bad, max_err, ssq_err, ssq_ref, worst)\n\n"
     "bad: elements with |out - ref| - allowed > 0 or out not finite; worst: the flat index of the first\n"
     "NaN excess, else of the first largest."},
    {"model", model, METH_VARARGS,
     "model(out, ref, m, n, scale, half, limit, min_split=1<<16)\n"
     "    -> (max_err, ssq_err, ssq_ref, nonfinite, first_nan, first_nonfinite, left, idx, err)\n\n"
     "The elements that |out - ref| <= |ref|*scale + half does not pass: the NaN and infinite outputs\n"
     "counted (first_nan, first_nonfinite: flat indices, -1 for none), the other `left` as int64 flat\n"
     "indices and float64 |errors| (bytes, in order; empty when left > limit)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastcheck", "Fused passes for mmd.check.full and mmd.check.quick (the quick check and the elementwise rules).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fastcheck(void)
{
#ifdef MMD_HAVE_WIDE
    __builtin_cpu_init();
    use_wide = __builtin_cpu_supports("avx2");
#endif
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddIntConstant(mod, "MAX_VECTORS", MAX_VECTORS) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
