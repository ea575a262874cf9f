/*
 * Newton-Schulz orthogonalization (the seed's zeropower_via_newtonschulz5).
 *
 * For an n x m matrix (n <= m after transposing a tall input):
 *     X = X / (norm_scale * ||X||_F + eps)
 *     per step (a, b, c):  A = X X^T;  B = b A + c A A;  X = a X + B X
 *
 * Implementation notes
 * - No transpose copy: a row-major rows x cols buffer with rows > cols is,
 *   read column-major, its cols x rows transpose; the iteration runs with
 *   CblasColMajor on the same memory and writes the output the same way.
 * - The normalization is folded into the first step (alpha = s^2 for X X^T,
 *   alpha = s for B X), and a X + B X is computed as (B + a I) X, so each
 *   step is three BLAS calls and O(n^2) elementwise work, no pass over X.
 * - Iterates ping-pong between the workspace and the output buffer, so the
 *   final iterate lands in `out` without a copy.
 * - Symmetric path: A = X X^T with syrk (n^2 m flops instead of 2 n^2 m);
 *   A is mirrored and B = b A + c A A^T is one syrk with beta (n^3 instead of
 *   2 n^3); (B + a I) X with symm. Plain path: three gemms (testing/bench).
 * - Batches of small matrices: one single-threaded BLAS worker per core,
 *   each on its own matrices and its own workspace slot (measured faster
 *   than threaded BLAS per matrix below MU__NS_BATCH_PAR_MAX elements).
 */
#include "muon_internal.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { MU__NS_MAX_SLOTS = 16 };

/* Batches whose matrices have at most this many elements (n * m) run one
 * matrix per thread with single-threaded BLAS; larger ones use threaded
 * BLAS per matrix. Measured with tests/bench/ns_bench.lua (see README). */
#ifndef MU__NS_BATCH_PAR_MAX
#define MU__NS_BATCH_PAR_MAX (1024 * 4096)
#endif

typedef struct mu__ns_slot {
    void *x; /* n * m: ping-pong iterate */
    void *a; /* n * n: Gram matrix */
    void *b; /* n * n: polynomial matrix */
} mu__ns_slot;

struct mu_ns_workspace {
    int dtype;
    int64_t cap_nm; /* elements of x */
    int64_t cap_nn; /* elements of a and b */
    int nslots;     /* slots allocated so far (>= 1) */
    mu__ns_slot slot[MU__NS_MAX_SLOTS];
};

/* ------------------------------------------------------------ presets */

/* Seed (_NS_LEGACY_COEFFS): Keller Jordan's quintic, the same triple each step. */
static const double ns_legacy[3] = {3.4445, -4.7750, 2.0315};

/* Seed (_NS_ASYM5_COEFFS): five per-step triples; more steps is an error. */
static const double ns_asym5[5][3] = {
    {4.0848, -6.8946, 2.9270},
    {3.9505, -6.3029, 2.6377},
    {3.7418, -5.5913, 2.3037},
    {2.8769, -3.1427, 1.2046},
    {2.8366, -3.0525, 1.2012},
};

/* Polar Express (Amsel, Persson, Musco, Gower 2025), as used by modded-nanogpt
 * train_gpt.py (polar_express) and microsoft/dion dion/polar_express.py:
 * the input is divided by 1.02 * ||X||_F + eps, then these five steps. */
static const double ns_polar_express[5][3] = {
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
};

/* deepseekv4 (NVIDIA Emerging-Optimizers): the legacy quintic 8 times, then
 * the convergent (2, -1.5, 0.5) twice, 10 steps. */
static const double ns_dsv4_tail[3] = {2.0, -1.5, 0.5};

int mu_ns_preset(const char *name, int steps, double *coeffs, int cap, double *norm_scale,
                 int *nsteps)
{
    if (nsteps) *nsteps = 0;
    if (!name) return mu__fail(MU_EINVAL, "ns preset name is NULL");
    int natural, fixed;
    double scale = 1.0;
    if (strcmp(name, "legacy") == 0) {
        natural = 5;
        fixed = 0;
    } else if (strcmp(name, "asym5") == 0) {
        natural = 5;
        fixed = 1;
    } else if (strcmp(name, "polar_express") == 0) {
        natural = 5;
        fixed = 1;
        scale = 1.02;
    } else if (strcmp(name, "deepseekv4") == 0) {
        natural = 10;
        fixed = 1;
    } else {
        return mu__fail(MU_EINVAL,
                        "ns preset must be 'legacy', 'asym5', 'polar_express' or 'deepseekv4', "
                        "got '%s'", name);
    }
    if (steps <= 0) steps = natural;
    if (fixed && steps > natural)
        return mu__fail(MU_EINVAL, "ns_steps=%d exceeds the %d steps of the '%s' schedule", steps,
                        natural, name);
    if (steps > cap)
        return mu__fail(MU_EINVAL, "ns preset '%s': %d steps do not fit in cap=%d triples", name,
                        steps, cap);
    if (!coeffs) return mu__fail(MU_EINVAL, "coeffs is NULL");
    for (int k = 0; k < steps; k++) {
        const double *t;
        if (strcmp(name, "legacy") == 0) t = ns_legacy;
        else if (strcmp(name, "asym5") == 0) t = ns_asym5[k];
        else if (strcmp(name, "polar_express") == 0) t = ns_polar_express[k];
        else t = k < 8 ? ns_legacy : ns_dsv4_tail;
        memcpy(coeffs + 3 * k, t, 3 * sizeof(double));
    }
    if (norm_scale) *norm_scale = scale;
    if (nsteps) *nsteps = steps;
    return MU_OK;
}

/* ---------------------------------------------------------- workspace */

static void *ns_alloc(int64_t elems, size_t esize)
{
    size_t bytes = (size_t)(elems > 0 ? elems : 1) * esize;
    bytes = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes);
}

static void ns_slot_free(mu__ns_slot *s)
{
    free(s->x);
    free(s->a);
    free(s->b);
    memset(s, 0, sizeof *s);
}

static int ns_slot_alloc(mu_ns_workspace *ws, mu__ns_slot *s)
{
    size_t es = mu_dtype_size(ws->dtype);
    s->x = ns_alloc(ws->cap_nm, es);
    s->a = ns_alloc(ws->cap_nn, es);
    s->b = ns_alloc(ws->cap_nn, es);
    if (!s->x || !s->a || !s->b) {
        ns_slot_free(s);
        return mu__fail(MU_ENOMEM, "ns workspace: out of memory (%lld x %lld)",
                        (long long)ws->cap_nn, (long long)ws->cap_nm);
    }
    return MU_OK;
}

int mu_ns_workspace_new(int dtype, int64_t rows, int64_t cols, mu_ns_workspace **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    if (dtype != MU_F32 && dtype != MU_F64)
        return mu__fail(MU_EDTYPE, "ns workspace: dtype must be MU_F32 or MU_F64, got %d", dtype);
    if (rows < 0 || cols < 0)
        return mu__fail(MU_EINVAL, "ns workspace: rows and cols must be >= 0, got %lld x %lld",
                        (long long)rows, (long long)cols);
    int64_t n = rows < cols ? rows : cols, m = rows < cols ? cols : rows;
    if (n > 0 && (m > INT64_MAX / n || m > INT32_MAX))
        return mu__fail(MU_EINVAL, "ns workspace: %lld x %lld is too large", (long long)rows,
                        (long long)cols);
    mu_ns_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return mu__fail(MU_ENOMEM, "ns workspace: out of memory");
    ws->dtype = dtype;
    ws->cap_nm = n * m;
    ws->cap_nn = n * n;
    int rc = ns_slot_alloc(ws, &ws->slot[0]);
    if (rc != MU_OK) {
        free(ws);
        return rc;
    }
    ws->nslots = 1;
    *out = ws;
    return MU_OK;
}

void mu_ns_workspace_free(mu_ns_workspace *ws)
{
    if (!ws) return;
    for (int i = 0; i < ws->nslots; i++) ns_slot_free(&ws->slot[i]);
    free(ws);
}

/* ---------------------------------------------------- element helpers */

/* Sum of squares in double; returns 0 when a value is NaN/Inf. Scaled so
 * large finite float64 values do not overflow. */
static int ns_norm(int dt, const void *p, int64_t len, double *norm)
{
    double acc[8] = {0}, ss = 0.0;
    int64_t i = 0, main = len & ~(int64_t)7;
    if (dt == MU_F32) {
        const float *x = p;
        for (; i < main; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * x[i + k];
        for (; i < len; i++) ss += (double)x[i] * x[i];
        for (int k = 0; k < 8; k++) ss += acc[k];
        if (!isfinite(ss)) return 0; /* float32 squares cannot overflow a double */
        *norm = sqrt(ss);
        return 1;
    }
    const double *x = p;
    for (; i < main; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * x[i + k];
    for (; i < len; i++) ss += x[i] * x[i];
    for (int k = 0; k < 8; k++) ss += acc[k];
    if (isfinite(ss)) {
        *norm = sqrt(ss);
        return 1;
    }
    /* NaN/Inf, or finite values whose squares overflow: rescale by max|x|. */
    double amax = 0.0;
    for (i = 0; i < len; i++) {
        if (!isfinite(x[i])) return 0;
        amax = fmax(amax, fabs(x[i]));
    }
    ss = 0.0;
    for (i = 0; i < len; i++) {
        double v = x[i] / amax;
        ss += v * v;
    }
    *norm = amax * sqrt(ss);
    return 1;
}

enum { NS_BLK = 16 }; /* tile edge of the mirror (measured: 16 beats 32..128) */

/* The computed triangle of an n x n symmetric matrix is, in memory, the
 * positions r*n + c with c >= r (RowMajor Upper == ColMajor Lower).
 * ns_prep: mirror A into its other triangle and set B's triangle = b * A,
 * tile by tile (rows of the tile read, columns written). */
#define NS_PREP_BODY(TYPE)                                                                  \
    do {                                                                                    \
        TYPE *restrict a = ap, *restrict b = bp;                                            \
        const TYPE bf = (TYPE)bcoef;                                                        \
        for (int64_t r0 = 0; r0 < n; r0 += NS_BLK) {                                        \
            int64_t r1 = r0 + NS_BLK < n ? r0 + NS_BLK : n;                                 \
            for (int64_t r = r0; r < r1; r++)                                               \
                for (int64_t c = r; c < r1; c++) {                                          \
                    TYPE v = a[r * n + c];                                                  \
                    a[c * n + r] = v;                                                       \
                    b[r * n + c] = bf * v;                                                  \
                }                                                                           \
            for (int64_t c0 = r1; c0 < n; c0 += NS_BLK) {                                   \
                int64_t c1 = c0 + NS_BLK < n ? c0 + NS_BLK : n;                             \
                for (int64_t r = r0; r < r1; r++) {                                         \
                    const TYPE *ar = a + r * n;                                             \
                    TYPE *br = b + r * n;                                                   \
                    for (int64_t c = c0; c < c1; c++) br[c] = bf * ar[c];                   \
                }                                                                           \
                for (int64_t c = c0; c < c1; c++) {                                         \
                    TYPE *ac = a + c * n;                                                   \
                    for (int64_t r = r0; r < r1; r++) ac[r] = a[r * n + c];                 \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    } while (0)

static void ns_prep(int dt, void *ap, void *bp, int64_t n, double bcoef)
{
    if (dt == MU_F32) NS_PREP_BODY(float);
    else NS_PREP_BODY(double);
}

static void ns_add_diag(int dt, void *p, int64_t n, double v)
{
    if (dt == MU_F32) {
        float *x = p;
        for (int64_t i = 0; i < n; i++) x[i * n + i] += (float)v;
    } else {
        double *x = p;
        for (int64_t i = 0; i < n; i++) x[i * n + i] += v;
    }
}

static void ns_scale_copy(int dt, void *dst, const void *src, int64_t len, double s)
{
    if (dt == MU_F32) {
        float *d = dst;
        const float *x = src;
        for (int64_t i = 0; i < len; i++) d[i] = (float)(s * x[i]);
    } else {
        double *d = dst;
        const double *x = src;
        for (int64_t i = 0; i < len; i++) d[i] = s * x[i];
    }
}

/* ------------------------------------------------------- BLAS wrappers */

static void ns_syrk(int dt, enum CBLAS_ORDER lo, enum CBLAS_UPLO up, int n, int k, double alpha,
                    const void *a, int lda, double beta, void *c, int ldc)
{
    if (dt == MU_F32)
        cblas_ssyrk(lo, up, CblasNoTrans, n, k, (float)alpha, a, lda, (float)beta, c, ldc);
    else
        cblas_dsyrk(lo, up, CblasNoTrans, n, k, alpha, a, lda, beta, c, ldc);
}

static void ns_gemm(int dt, enum CBLAS_ORDER lo, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
                    double alpha, const void *a, int lda, const void *b, int ldb, double beta,
                    void *c, int ldc)
{
    if (dt == MU_F32)
        cblas_sgemm(lo, CblasNoTrans, tb, m, n, k, (float)alpha, a, lda, b, ldb, (float)beta, c,
                    ldc);
    else
        cblas_dgemm(lo, CblasNoTrans, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void ns_symm(int dt, enum CBLAS_ORDER lo, enum CBLAS_UPLO up, int m, int n, double alpha,
                    const void *a, int lda, const void *b, int ldb, void *c, int ldc)
{
    if (dt == MU_F32)
        cblas_ssymm(lo, CblasLeft, up, m, n, (float)alpha, a, lda, b, ldb, 0.0f, c, ldc);
    else
        cblas_dsymm(lo, CblasLeft, up, m, n, alpha, a, lda, b, ldb, 0.0, c, ldc);
}

/* ------------------------------------------------------------ one matrix */

typedef struct ns_job {
    int dt;
    int64_t rows, cols;
    const char *in; /* batch base pointers */
    char *out;
    int64_t bytes_per; /* bytes per matrix */
    const mu_ns_opts *opts;
    int inplace;         /* out aliases in */
    const double *norms; /* per-matrix norms from the check pass, or NULL */
} ns_job;

/* Orthogonalize matrix `i` of the job with workspace slot s. The input is
 * known finite and, if zero, eps > 0. */
static void ns_one(const ns_job *job, const mu__ns_slot *s, int64_t i)
{
    const int dt = job->dt;
    const size_t es = mu_dtype_size(dt);
    const int64_t rows = job->rows, cols = job->cols, len = rows * cols;
    const char *src = job->in + i * job->bytes_per;
    char *dst = job->out + i * job->bytes_per;
    const mu_ns_opts *o = job->opts;

    double norm = 0.0;
    if (job->norms) norm = job->norms[i];
    else ns_norm(dt, src, len, &norm);
    if (norm == 0.0) { /* zero in, zero out (eps > 0 was checked) */
        memset(dst, 0, (size_t)len * es);
        return;
    }
    const double scale = 1.0 / (o->norm_scale * norm + o->eps);
    if (o->steps == 0) {
        ns_scale_copy(dt, dst, src, len, scale);
        return;
    }

    const int tall = rows > cols;
    const enum CBLAS_ORDER lo = tall ? CblasColMajor : CblasRowMajor;
    const enum CBLAS_UPLO up = tall ? CblasLower : CblasUpper;
    const int n = (int)(tall ? cols : rows), m = (int)(tall ? rows : cols);
    const int ldx = tall ? n : m;
    const int plain = o->path == MU_NS_PLAIN;
    void *A = s->a, *B = s->b;

    /* Ping-pong: the last step writes dst, the one before the workspace,
     * and so on backwards; in place with an odd step count, the input is
     * first copied to the workspace so step 1 does not overwrite its source. */
    const void *x = src;
    double xs = scale; /* pending scale of x (normalization folded in) */
    int to_dst = o->steps % 2 == 1;
    if (job->inplace && to_dst) {
        memcpy(s->x, src, (size_t)len * es);
        x = s->x;
    }
    /* Folding the scale into the first step's alpha (s^2 for X X^T) is exact
     * enough while the unscaled products neither overflow nor underflow;
     * otherwise normalize first, into a buffer step 1 does not write. */
    const double lim = dt == MU_F32 ? 0x1p40 : 0x1p400;
    if (!(norm <= lim && norm >= 1.0 / lim)) {
        void *buf = x == s->x ? s->x : to_dst ? s->x : (void *)dst;
        ns_scale_copy(dt, buf, x, len, scale);
        x = buf;
        xs = 1.0;
    }
    for (int k = 0; k < o->steps; k++) {
        const double ca = o->coeffs[3 * k], cb = o->coeffs[3 * k + 1], cc = o->coeffs[3 * k + 2];
        void *y = to_dst ? (void *)dst : s->x;
        if (plain) {
            /* A = X X^T; B = b A + c A A; Y = (B + a I) X */
            ns_gemm(dt, lo, CblasTrans, n, n, m, xs * xs, x, ldx, x, ldx, 0.0, A, n);
            memcpy(B, A, (size_t)n * n * es);
            ns_gemm(dt, lo, CblasNoTrans, n, n, n, cc, A, n, A, n, cb, B, n);
            ns_add_diag(dt, B, n, ca);
            ns_gemm(dt, lo, CblasNoTrans, n, m, n, xs, B, n, x, ldx, 0.0, y, ldx);
        } else {
            ns_syrk(dt, lo, up, n, m, xs * xs, x, ldx, 0.0, A, n);
            ns_prep(dt, A, B, n, cb);
            ns_syrk(dt, lo, up, n, n, cc, A, n, 1.0, B, n);
            ns_add_diag(dt, B, n, ca);
            ns_symm(dt, lo, up, n, m, xs, B, n, x, ldx, y, ldx);
        }
        x = y;
        xs = 1.0;
        to_dst = !to_dst;
    }
}

/* ------------------------------------------------------- batch workers */

typedef struct ns_pool {
    const ns_job *job;
    mu_ns_workspace *ws;
    int64_t count;
    atomic_llong next;
} ns_pool;

typedef struct ns_worker {
    ns_pool *pool;
    int slot;
} ns_worker;

static void *ns_worker_main(void *arg)
{
    ns_worker *w = arg;
    ns_pool *p = w->pool;
    for (;;) {
        long long i = atomic_fetch_add(&p->next, 1);
        if (i >= p->count) break;
        ns_one(p->job, &p->ws->slot[w->slot], i);
    }
    return NULL;
}

/* ------------------------------------------------------------- the API */

static int ns_check_opts(const mu_ns_opts *o)
{
    if (!o) return mu__fail(MU_EINVAL, "opts is NULL");
    if (o->steps < 0) return mu__fail(MU_EINVAL, "ns steps must be >= 0, got %d", o->steps);
    if (o->steps > 0 && !o->coeffs) return mu__fail(MU_EINVAL, "ns coeffs is NULL");
    for (int k = 0; k < 3 * o->steps; k++)
        if (!isfinite(o->coeffs[k]))
            return mu__fail(MU_EINVAL, "ns coefficients[%d] must contain only finite values",
                            k / 3);
    if (!isfinite(o->eps) || o->eps < 0)
        return mu__fail(MU_EINVAL, "ns eps must be finite and >= 0, got %g", o->eps);
    if (!isfinite(o->norm_scale) || o->norm_scale <= 0)
        return mu__fail(MU_EINVAL, "ns norm_scale must be finite and > 0, got %g", o->norm_scale);
    if (o->path != MU_NS_SYMMETRIC && o->path != MU_NS_PLAIN)
        return mu__fail(MU_EINVAL, "ns path must be MU_NS_SYMMETRIC or MU_NS_PLAIN, got %d",
                        o->path);
    return MU_OK;
}

int mu_ns_zeropower(const mu_tensor *in, mu_tensor *out, const mu_ns_opts *opts,
                    mu_ns_workspace *ws)
{
    if (!in || !out) return mu__fail(MU_EINVAL, "ns: in and out must not be NULL");
    int rc = ns_check_opts(opts);
    if (rc != MU_OK) return rc;
    if (in->ndim != 2 && in->ndim != 3)
        return mu__fail(MU_ESHAPE, "ns: input must be 2-D or 3-D, got %d dims", in->ndim);
    if (in->scalar != MU_F32 && in->scalar != MU_F64)
        return mu__fail(MU_EDTYPE, "ns: unsupported dtype %d", in->scalar);
    if (out->scalar != in->scalar)
        return mu__fail(MU_EDTYPE, "ns: out dtype differs from the input's");
    if (out->ndim != in->ndim)
        return mu__fail(MU_ESHAPE, "ns: out has %d dims, input %d", out->ndim, in->ndim);
    for (int d = 0; d < in->ndim; d++)
        if (out->dims[d] != in->dims[d])
            return mu__fail(MU_ESHAPE, "ns: out dim %d is %lld, input's %lld", d,
                            (long long)out->dims[d], (long long)in->dims[d]);
    if (!mu_tensor_is_contiguous(in) || !mu_tensor_is_contiguous(out))
        return mu__fail(MU_EINVAL, "ns: in and out must be C-contiguous");

    const int dt = in->scalar;
    const int64_t batch = in->ndim == 3 ? in->dims[0] : 1;
    const int64_t rows = in->dims[in->ndim - 2], cols = in->dims[in->ndim - 1];
    const int64_t n = rows < cols ? rows : cols, m = rows < cols ? cols : rows;
    if (batch == 0 || n == 0) return MU_OK;
    if (m > INT32_MAX) return mu__fail(MU_ESHAPE, "ns: matrix %lld x %lld too large for BLAS",
                                       (long long)rows, (long long)cols);
    const size_t es = mu_dtype_size(dt);
    const int64_t len = rows * cols;
    const char *ib = in->data;
    char *ob = out->data;
    const int64_t total = len * batch * (int64_t)es;
    if (ib != (const char *)ob && ib < ob + total && ob < ib + total)
        return mu__fail(MU_EINVAL, "ns: out partially overlaps the input");

    /* Validate everything before writing anything (norms kept for small
     * batches, recomputed otherwise). */
    enum { NORMS_KEPT = 128 };
    double norms[NORMS_KEPT];
    for (int64_t i = 0; i < batch; i++) {
        double norm;
        if (!ns_norm(dt, ib + i * len * (int64_t)es, len, &norm))
            return mu__fail(MU_ENONFINITE, "ns: input matrix %lld (0-based batch index) holds "
                            "NaN or Inf", (long long)i);
        if (norm == 0.0 && opts->eps == 0.0)
            return mu__fail(MU_EINVAL, "ns: input matrix %lld (0-based batch index) is all zeros "
                            "and eps = 0 (division by zero)", (long long)i);
        if (i < NORMS_KEPT) norms[i] = norm;
    }

    mu_ns_workspace *own = NULL;
    if (!ws) {
        rc = mu_ns_workspace_new(dt, rows, cols, &own);
        if (rc != MU_OK) return rc;
        ws = own;
    }
    if (ws->dtype != dt) {
        mu_ns_workspace_free(own);
        return mu__fail(MU_EDTYPE, "ns: workspace dtype differs from the input's");
    }
    if (n * m > ws->cap_nm || n * n > ws->cap_nn) {
        mu_ns_workspace_free(own);
        return mu__fail(MU_ESHAPE, "ns: workspace too small for a %lld x %lld matrix",
                        (long long)rows, (long long)cols);
    }

    ns_job job = {dt,   rows, cols, ib, ob, len * (int64_t)es, opts, ib == (const char *)ob,
                  batch <= NORMS_KEPT ? norms : NULL};

    int threads = openblas_get_num_threads();
    if (threads > MU__NS_MAX_SLOTS) threads = MU__NS_MAX_SLOTS;
    if (threads > batch) threads = (int)batch;
    int par = threads > 1 && len <= MU__NS_BATCH_PAR_MAX;
    if (par) {
        while (ws->nslots < threads) {
            if (ns_slot_alloc(ws, &ws->slot[ws->nslots]) != MU_OK) break;
            ws->nslots++;
        }
        mu__clear_error();
        if (ws->nslots < threads) threads = ws->nslots;
        par = threads > 1;
    }
    if (!par) {
        for (int64_t i = 0; i < batch; i++) ns_one(&job, &ws->slot[0], i);
    } else {
        ns_pool pool = {&job, ws, batch, 0};
        ns_worker wk[MU__NS_MAX_SLOTS];
        pthread_t tid[MU__NS_MAX_SLOTS];
        int started = 0;
        int saved = openblas_get_num_threads();
        openblas_set_num_threads(1);
        for (int t = 1; t < threads; t++) {
            wk[t].pool = &pool;
            wk[t].slot = t;
            if (pthread_create(&tid[t], NULL, ns_worker_main, &wk[t]) != 0) break;
            started = t;
        }
        wk[0].pool = &pool;
        wk[0].slot = 0;
        ns_worker_main(&wk[0]);
        for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
        openblas_set_num_threads(saved);
    }
    mu_ns_workspace_free(own);
    return MU_OK;
}
