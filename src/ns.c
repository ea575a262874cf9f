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
 *   step is three products and O(n^2) elementwise work, no pass over X.
 * - Iterates ping-pong between the workspace and the output buffer, so the
 *   final iterate lands in `out` without a copy.
 * - Symmetric path: A = X X^T with syrk (n^2 m flops instead of 2 n^2 m);
 *   A is mirrored and B = b A + c A A^T is a syrk with beta (n^3 instead of
 *   2 n^3); (B + a I) X with symm. Plain path: three gemms (testing/bench).
 * - Reproducible bits: each product is a fixed list of tiles, each one
 *   single-threaded BLAS call, that depends on (dtype, rows, cols, path)
 *   only (see "the tiling"). A result is then the same bits whatever the
 *   number of workers, OpenBLAS's thread setting, the batch it came in,
 *   in place or not, and whichever process computes it.
 * - Workers (OpenBLAS's thread count, or MU_NS_THREADS): one scheduler
 *   takes every matrix of a call (a batch, or all the tensors of
 *   mu_ns_zeropower_many: a whole optimizer step). Large split matrices
 *   run first, tile by tile on all workers; then the others whole, each
 *   worker with its own workspace slot, largest first (see "scheduling").
 *   The workers are a team of src/pool.c: in a process with an OpenMP
 *   runtime a parallel region of it, so an OpenMP host shares its thread
 *   team with the engine.
 * - opts->dtype = MU_BF16: the seed's bfloat16 iteration, its own plan
 *   (src/ns_bf16.c) of oneDNN products (src/dnnl.c) under the same
 *   scheduler.
 * - opts->method: the Gram iteration (src/ns_gram.c) takes over the
 *   matrices whose shape mu_ns_method_for sends to it, after the checks
 *   below (one tensor at a time, before the scheduler runs the others).
 * - Matrices of more than one block (mu__split_plan: a long side of 8192
 *   or more) run the blocked iteration of src/ns_split.c instead, first,
 *   the same way: the bits of a split over any group of ranks.
 */
#include "ns_internal.h"
#include "tensor_internal.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Batches whose matrices have at most this many elements (n * m) run one
 * matrix per worker; larger ones share each matrix's tiles among the
 * workers. A speed choice only: the bits are the same either way.
 * Measured with tests/bench/ns_bench.lua (see README). */
#ifndef MU__NS_BATCH_PAR_MAX
#define MU__NS_BATCH_PAR_MAX (1024 * 4096)
#endif

/* A call whose matrices cost less than this on average (ns_cost: with 5
 * steps 8x8 matrices cost 1.0e4, 16x16 ones 8.2e4) runs on one worker
 * unless MU_NS_THREADS asks for more: each matrix is then a few short BLAS
 * calls, and a second worker only adds its start and the contention on
 * OpenBLAS's buffer lock (Zen 4, 2 cores, SkylakeX: 1,000 4x4 matrices took
 * 1.6x as long on two workers, 8x8 1.2x; 500 16x16 0.8x). A speed choice
 * only: the bits are the same. */
#ifndef MU__NS_PAR_MIN_COST
#define MU__NS_PAR_MIN_COST 65536.0
#endif

/* mu__ns_slot, struct mu_ns_workspace, the plan and job types: src/ns_internal.h */

/* ------------------------------------------------------------ presets */

/* Seed (_NS_LEGACY_COEFFS): Keller Jordan's quintic, the same triple each step. */
static const double ns_legacy[3] = {3.4445, -4.7750, 2.0315};

/* Seed (_NS_ASYM5_COEFFS): five per-step triples; asking for more runs these five. */
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

/* cans: Chebyshev-accelerated Newton-Schulz (Grishina, Smirnov, Rakhuba 2025,
 * arXiv:2506.10935), the five triples NVIDIA Emerging-Optimizers ships
 * (generated with the paper's Remez + adaptive-interval code). */
static const double ns_cans[5][3] = {
    {8.4703, -25.1081, 18.6293}, {4.1828, -3.1087, 0.5806}, {3.9619, -2.9541, 0.5630},
    {3.2866, -2.4647, 0.5074},   {2.2737, -1.6447, 0.4162},
};

/* polar_express_8: the 8-step Polar Express (Amsel, Persson, Musco, Gower
 * 2025, arXiv:2505.16932) as NVIDIA Emerging-Optimizers ships it, its
 * Algorithm 1's division by 1.01^degree folded into the triples; the
 * input is divided by ||X||_F + eps. */
static const double ns_polar_express_8[8][3] = {
    {8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184}, {3.9096, -2.8234, 0.5250},
    {3.2856, -2.4153, 0.4853},   {2.2779, -1.6198, 0.3985}, {1.8726, -1.2307, 0.3585},
    {1.8564, -1.2132, 0.3568},   {1.8750, -1.2500, 0.3750},
};

/* aol: Turbo-Muon (Boissin, modded-nanogpt record 2025-11-11; its
 * flash-newton-schulz repository): AOL preconditioning (MU_NS_PRECOND_AOL)
 * in place of the Frobenius normalization, then these four triples (as
 * NVIDIA Emerging-Optimizers and the flash-newton-schulz code ship them). */
static const double ns_aol[4][3] = {
    {4.0098, -7.0585, 2.4635}, {3.4585, -5.5479, 2.5959}, {2.7573, -3.2939, 1.4254},
    {2.7215, -3.0494, 1.3169},
};

/* cubic5: the relaxed cubic schedule of NVIDIA Emerging-Optimizers (its
 * "cubic5", citing arXiv:2606.00371): c = 0, so no A A product, its five
 * (a, b) optimized for singular values down to bfloat16's effective
 * l0 = 7e-3; the input divided by ||X||_F + eps. */
static const double ns_cubic5[5][3] = {
    {3.3656576, -3.3420992, 0.0}, {2.5744352, -1.4957376, 0.0}, {2.5368962, -1.4312570, 0.0},
    {2.4418906, -1.2764040, 0.0}, {2.2230472, -0.9630650, 0.0},
};

int mu_ns_preset_precond(const char *name)
{
    if (!name) return mu__fail(MU_EINVAL, "ns preset name is NULL");
    return strcmp(name, "aol") == 0 ? MU_NS_PRECOND_AOL : MU_NS_PRECOND_NONE;
}

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
    } else if (strcmp(name, "cans") == 0) {
        natural = 5;
        fixed = 1;
    } else if (strcmp(name, "polar_express_8") == 0) {
        natural = 8;
        fixed = 1;
    } else if (strcmp(name, "aol") == 0) {
        natural = 4;
        fixed = 1;
    } else if (strcmp(name, "cubic5") == 0) {
        natural = 5;
        fixed = 1;
    } else {
        return mu__fail(MU_EINVAL,
                        "ns preset must be 'legacy', 'asym5', 'polar_express', 'deepseekv4', 'cans', "
                        "'polar_express_8', 'aol' or 'cubic5', got '%s'", name);
    }
    if (steps <= 0) steps = natural;
    /* A fixed schedule stops at its length, as the seed's slice
     * _NS_ASYM5_COEFFS[:steps] does: *nsteps tells the caller. */
    if (fixed && steps > natural) steps = natural;
    if (steps > cap)
        return mu__fail(MU_EINVAL, "ns preset '%s': %d steps do not fit in cap=%d triples", name,
                        steps, cap);
    if (!coeffs) return mu__fail(MU_EINVAL, "coeffs is NULL");
    for (int k = 0; k < steps; k++) {
        const double *t;
        if (strcmp(name, "legacy") == 0) t = ns_legacy;
        else if (strcmp(name, "asym5") == 0) t = ns_asym5[k];
        else if (strcmp(name, "polar_express") == 0) t = ns_polar_express[k];
        else if (strcmp(name, "cans") == 0) t = ns_cans[k];
        else if (strcmp(name, "polar_express_8") == 0) t = ns_polar_express_8[k];
        else if (strcmp(name, "aol") == 0) t = ns_aol[k];
        else if (strcmp(name, "cubic5") == 0) t = ns_cubic5[k];
        else t = k < 8 ? ns_legacy : ns_dsv4_tail;
        memcpy(coeffs + 3 * k, t, 3 * sizeof(double));
    }
    if (norm_scale) *norm_scale = scale;
    if (nsteps) *nsteps = steps;
    return MU_OK;
}

/* ---------------------------------------------------------- workspace */

/* The bytes ns_alloc allocates for elems elements (at least one, rounded
 * up to a cache line). */
static size_t ns_bytes(int64_t elems, size_t esize)
{
    size_t bytes = (size_t)(elems > 0 ? elems : 1) * esize;
    return (bytes + 63) & ~(size_t)63;
}

static void *ns_alloc(int64_t elems, size_t esize)
{
    return aligned_alloc(64, ns_bytes(elems, esize));
}

static void ns_slot_free(mu__ns_slot *s)
{
    free(s->x);
    free(s->a);
    free(s->b);
    free(s->g);
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

int mu_ns_workspace_bytes(const mu_ns_workspace *ws, int64_t *out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = 0;
    if (!ws) return mu__fail(MU_EINVAL, "ws is NULL");
    size_t es = mu_dtype_size(ws->dtype),
           n = ws->sched_bytes + mu__dnnl_bytes(ws->dnnl) + ws->split_bytes;
    for (int i = 0; i < ws->nslots; i++)
        n += ns_bytes(ws->cap_nm, es) + 2 * ns_bytes(ws->cap_nn, es) + ws->slot[i].g_bytes;
    *out = (int64_t)n;
    return MU_OK;
}

void mu_ns_workspace_free(mu_ns_workspace *ws)
{
    if (!ws) return;
    for (int i = 0; i < ws->nslots; i++) ns_slot_free(&ws->slot[i]);
    free(ws->sched);
    free(ws->split);
    mu__dnnl_close(ws->dnnl);
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

/* The computed triangle of an n x n symmetric matrix is, in memory, the
 * positions r*n + c with c >= r (RowMajor Upper == ColMajor Lower).
 * ns_prep: on the memory rectangle rows [r0, r1) x columns [c0, c1) of that
 * triangle, first A += B when `sum` (B then holds the second half of a
 * split Gram product), then mirror A into the other triangle and set
 * B = b * A, MU__NS_BLK sub-tile by sub-tile (rows of the sub-tile read,
 * columns written). A rectangle touches only its own positions and their
 * mirror images, so rectangles can be done concurrently. */
#define NS_PREP_BODY(TYPE)                                                                  \
    do {                                                                                    \
        TYPE *restrict a = ap, *restrict b = bp;                                            \
        const TYPE bf = (TYPE)bcoef;                                                        \
        for (int64_t i0 = r0; i0 < r1; i0 += MU__NS_BLK) {                                      \
            int64_t i1 = i0 + MU__NS_BLK < r1 ? i0 + MU__NS_BLK : r1;                               \
            for (int64_t j0 = c0; j0 < c1; j0 += MU__NS_BLK) {                                  \
                int64_t j1 = j0 + MU__NS_BLK < c1 ? j0 + MU__NS_BLK : c1;                           \
                if (j1 <= i0) continue; /* below the diagonal */                            \
                for (int64_t r = i0; r < i1; r++) {                                         \
                    TYPE *ar = a + r * n, *br = b + r * n;                                  \
                    int64_t c = j0 > r ? j0 : r;                                            \
                    if (sum)                                                                \
                        for (; c < j1; c++) {                                               \
                            TYPE v = ar[c] + br[c];                                         \
                            ar[c] = v;                                                      \
                            br[c] = bf * v;                                                 \
                        }                                                                   \
                    else                                                                    \
                        for (; c < j1; c++) br[c] = bf * ar[c];                             \
                }                                                                           \
                for (int64_t c = j0; c < j1; c++) {                                         \
                    TYPE *ac = a + c * n;                                                   \
                    int64_t re = i1 < c ? i1 : c;                                           \
                    for (int64_t r = i0; r < re; r++) ac[r] = a[r * n + c];                 \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    } while (0)

static void ns_prep(int dt, void *ap, void *bp, int64_t n, int64_t r0, int64_t r1, int64_t c0,
                    int64_t c1, int sum, double bcoef)
{
    if (dt == MU_F32) NS_PREP_BODY(float);
    else NS_PREP_BODY(double);
}

/* B += S on the stored-triangle positions of the memory rectangle rows
 * [r0, r1) x columns [c0, c1) (S: the second half of a split Gram product). */
static void ns_accumulate(int dt, void *bp, const void *sp, int64_t n, int64_t r0, int64_t r1,
                          int64_t c0, int64_t c1)
{
    for (int64_t r = r0; r < r1; r++) {
        const int64_t from = c0 > r ? c0 : r;
        if (dt == MU_F32) {
            float *restrict b = (float *)bp + r * n;
            const float *restrict x = (const float *)sp + r * n;
            for (int64_t c = from; c < c1; c++) b[c] += x[c];
        } else {
            double *restrict b = (double *)bp + r * n;
            const double *restrict x = (const double *)sp + r * n;
            for (int64_t c = from; c < c1; c++) b[c] += x[c];
        }
    }
}

/* Add v to the diagonal positions i*n + i with i in [i0, i1). */
static void ns_add_diag(int dt, void *p, int64_t n, int64_t i0, int64_t i1, double v)
{
    if (dt == MU_F32) {
        float *x = p;
        for (int64_t i = i0; i < i1; i++) x[i * n + i] += (float)v;
    } else {
        double *x = p;
        for (int64_t i = i0; i < i1; i++) x[i * n + i] += v;
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

/* ||A - I||_F / sqrt(n) of an n x n matrix (both triangles stored): the
 * residual of mu_ns_stats, from the last step's Gram matrix. O(n^2). */
static double ns_residual(int dt, const void *ap, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            const double v = (dt == MU_F32 ? (double)((const float *)ap)[i * n + j]
                                           : ((const double *)ap)[i * n + j]) - (i == j);
            s += v * v;
        }
    return sqrt(s / (double)n);
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

/* ----------------------------------------------------------- the tiling
 *
 * Reproducibility: the bits of a result must not depend on the thread
 * count, on how matrices are batched, or on which process computes them.
 * OpenBLAS's threaded calls split work by thread count, so every BLAS call
 * here runs single-threaded, and every product is a fixed list of tiles,
 * each one call, chosen by mu__ns_plan_init from (dtype, rows, cols, path) only;
 * the elementwise passes between them are fixed too. A tile's call has the
 * same sizes, leading dimensions and scalars whichever worker runs it,
 * whenever, at whatever address, so each output element gets the same bits.
 * Parallelism comes from running the tiles of one large matrix, or whole
 * matrices of a batch, on different workers.
 *
 * With n <= m after the transpose trick, each step is a sequence of stages
 * (a stage starts when the previous one is complete):
 *   GRAM_A  A = s^2 X X^T           n x n, inner dimension m
 *   PREP    A mirrored, B = b A     elementwise
 *   GRAM_B  B = c A A^T + B         n x n, inner dimension n
 *   REDUCE  B = B + a I             elementwise
 *   APPLY   Y = s B X               n x m, in tm column blocks of mb columns
 *                                   (sub-matrices with the ld of X), one
 *                                   symm (gemm on the plain path) each
 * A matrix that is not split (n < 2 * MU__NS_TILE_MIN) makes one call per
 * product, as before tiling, with PREP and REDUCE done right after the
 * Gram calls by the same worker (so small matrices cost nothing extra).
 * Split matrices, symmetric path: each Gram product is two syrk calls over
 * the two halves of its inner dimension, the first into A (B), the second
 * into a scratch buffer (B for A; for B the step's output buffer, free
 * until APPLY), and PREP (REDUCE) first adds the second half. Those two
 * elementwise stages work on the stored triangle cut into tn x tn blocks
 * (tn(tn+1)/2 rectangles). The halves are equal work for two workers and,
 * added up, cost about one whole syrk, where splitting the rows of A
 * instead (two diagonal syrk blocks and one gemm block) keeps one worker
 * ~20% longer than the other (syrk is less efficient per flop than gemm)
 * and re-packs X. Split matrices, plain path: the Gram products are tn
 * row blocks of gemm (equal work), each tile then doing B = A (or + a I)
 * on its rows.
 *
 * Sizes. Splitting a product into independent calls costs speed: Y's
 * tiles each pack all of B. Measured single-threaded on the 2-core AVX-512
 * EPYC (SkylakeX sgemm ~225 GFLOP/s), two column halves vs one call: +3-4%
 * at 768x768 and 1024x4096, +2-4% at 4096x4096; quarters: +6-9%. Hence as
 * few tiles as keep two workers busy: Y in two column halves up to
 * 2 * MU__NS_TILE_M columns, and 4, 6, ... blocks of at most MU__NS_TILE_M
 * beyond (an even count: two workers get equal shares); the same for the
 * blocks of n (MU__NS_TILE_N) used by the elementwise stages and the plain
 * path's Gram products. Below n = 2 * MU__NS_TILE_MIN = 1024 nothing is
 * split: a batch must make the same calls as a lone matrix, and the split
 * costs batches of split matrices a few percent (measured with two
 * workers: +3-5% at 12 x 768x768 and 6 x 768x3072, +7% at 4 x 512x512,
 * which put the one-process GPT-2-small step 4% behind the threaded-BLAS
 * code it replaced), while matrices below 1024 usually come in batches
 * (one per layer) that keep both cores busy anyway. The price is a lone
 * matrix below 1024 running on one core: 768x768 alone takes ~45 ms
 * instead of ~23 (still 1.5x faster than the seed's torch). Block sizes
 * and the halves are rounded up to a multiple of MU__NS_TILE_ALIGN (the
 * kernels' register blocking). With more than two workers the Gram stages
 * still have two tiles: the plan is sized for the 2-core target.
 *
 * The plan is part of the result: a build with other values gives other
 * bits, so every process of a distributed run must use the same build (and
 * the same OpenBLAS core, whose kernels differ). */
#ifndef MU__NS_TILE_MIN
#define MU__NS_TILE_MIN 512
#endif
#ifndef MU__NS_TILE_N
#define MU__NS_TILE_N 2048
#endif
#ifndef MU__NS_TILE_M
#define MU__NS_TILE_M 2048
#endif

static int64_t ns_half(int64_t d) /* first half of a split inner dimension */
{
    int64_t h = (d + 1) / 2;
    h = (h + MU__NS_TILE_ALIGN - 1) / MU__NS_TILE_ALIGN * MU__NS_TILE_ALIGN;
    return h < d ? h : d;
}

/* Number of blocks for a dimension d (block size in *blk): one block below
 * 2 * min, else the smallest even count of blocks of at most `target`
 * (before rounding to MU__NS_TILE_ALIGN). */
int mu__ns_split(int64_t d, int64_t target, int64_t min, int *blk)
{
    int64_t count = 1, b = d;
    if (d >= 2 * min) {
        count = 2 * ((d + 2 * target - 1) / (2 * target));
        b = (d + count - 1) / count;
        b = (b + MU__NS_TILE_ALIGN - 1) / MU__NS_TILE_ALIGN * MU__NS_TILE_ALIGN;
    }
    *blk = (int)(b > 0 ? b : 1);
    return (int)((d + *blk - 1) / *blk);
}

void mu__ns_plan_init(mu__ns_plan *p, int dt, int64_t rows, int64_t cols, int path, int bf16)
{
    const int tall = rows > cols;
    memset(p, 0, sizeof *p);
    if (bf16) {
        p->dt = dt;
        p->bf16 = 1;
        p->tall = tall;
        p->lo = CblasRowMajor;
        p->up = CblasUpper;
        p->n = (int)(tall ? cols : rows);
        p->m = (int)(tall ? rows : cols);
        p->ldx = p->m;
        mu__ns_bf16_plan(p);
        return;
    }
    p->dt = dt;
    p->plain = path == MU_NS_PLAIN;
    p->lo = tall ? CblasColMajor : CblasRowMajor;
    p->up = tall ? CblasLower : CblasUpper;
    p->n = (int)(tall ? cols : rows);
    p->m = (int)(tall ? rows : cols);
    p->ldx = tall ? p->n : p->m;
    p->tn = mu__ns_split(p->n, MU__NS_TILE_N, MU__NS_TILE_MIN, &p->nb);
    p->tm = 1;
    p->mb = p->m;
    if (p->tn > 1) p->tm = mu__ns_split(p->m, MU__NS_TILE_M, MU__NS_TILE_MIN, &p->mb);
    p->halves = !p->plain && p->tn > 1;
    if (p->halves) {
        const int rects = p->tn * (p->tn + 1) / 2; /* blocks of the stored triangle */
        p->tiles[MU__NS_GRAM_A] = p->tiles[MU__NS_GRAM_B] = 2;
        p->tiles[MU__NS_PREP] = p->tiles[MU__NS_REDUCE] = rects;
    } else {
        p->tiles[MU__NS_GRAM_A] = p->tiles[MU__NS_GRAM_B] = p->tn; /* row blocks (1: the whole) */
    }
    p->tiles[MU__NS_APPLY] = p->tm;
    for (int st = 0; st < MU__NS_NSTAGES; st++) p->nx += p->tiles[st];
}

/* Element offsets of logical row i / column j of a matrix in layout lo. */
static int64_t ns_row(const mu__ns_plan *p, int64_t i, int ld)
{
    return p->lo == CblasRowMajor ? i * ld : i;
}

static int64_t ns_col(const mu__ns_plan *p, int64_t j, int ld)
{
    return p->lo == CblasRowMajor ? j : j * ld;
}

/* Rectangle t of the stored triangle in tn x tn blocks: the off-diagonal
 * blocks first (row by row: twice the elements of a diagonal one), then
 * the diagonal ones. */
void mu__ns_tri_rect(const mu__ns_plan *p, int t, mu__ns_rect *r)
{
    const int noff = p->tn * (p->tn - 1) / 2;
    int bi = 0, bj;
    if (t < noff) {
        while (t >= p->tn - 1 - bi) { /* block row bi holds tn - 1 - bi of them */
            t -= p->tn - 1 - bi;
            bi++;
        }
        bj = bi + 1 + t;
    } else {
        bi = bj = t - noff;
    }
    r->r0 = bi * p->nb;
    r->r1 = r->r0 + p->nb < p->n ? r->r0 + p->nb : p->n;
    r->c0 = bj * p->nb;
    r->c1 = r->c0 + p->nb < p->n ? r->c0 + p->nb : p->n;
}

/* A product of the iteration; ns_product_tile runs one of its tiles. */
typedef struct ns_prod {
    int apply;     /* 0: Gram C = alpha P Q + beta C (n x n); 1: C = alpha S P (n x m) */
    const void *p; /* Gram: P (n x k); apply: P = X (n x m) */
    int ldp, k;
    int qtrans;    /* Gram: Q = P^T (CblasTrans) or Q = P (plain B = c A A) */
    const void *s; /* apply: the n x n S (stored triangle on the symmetric path) */
    double alpha, beta;
    void *c, *c2;  /* c2: where the second half of a split Gram product goes */
    int ldc;
} ns_prod;

/* Run tile t of product pr: one single-threaded BLAS call. Tiles: APPLY,
 * column blocks; Gram on the plain path, row blocks (memory rows [r0, r1)
 * of C, returned in *rows); split symmetric Gram, the halves of k (the
 * first with beta into c, the second with beta 0 into c2); else the whole. */
static void ns_product_tile(const mu__ns_plan *p, const ns_prod *pr, int t, mu__ns_rect *rows)
{
    const int dt = p->dt, n = p->n;
    const int64_t es = (int64_t)mu_dtype_size(dt);
    const char *P = pr->p;
    if (pr->apply) {
        const int64_t j0 = (int64_t)t * p->mb;
        const int nj = (int)(j0 + p->mb < p->m ? p->mb : p->m - j0);
        const char *x = P + ns_col(p, j0, pr->ldp) * es;
        char *y = (char *)pr->c + ns_col(p, j0, pr->ldc) * es;
        if (p->plain)
            ns_gemm(dt, p->lo, CblasNoTrans, n, nj, n, pr->alpha, pr->s, n, x, pr->ldp, 0.0, y,
                    pr->ldc);
        else
            ns_symm(dt, p->lo, p->up, n, nj, pr->alpha, pr->s, n, x, pr->ldp, y, pr->ldc);
        return;
    }
    if (!p->plain) {
        int64_t k0 = 0, k1 = pr->k;
        void *c = pr->c;
        double beta = pr->beta;
        if (p->halves) {
            const int64_t h = ns_half(pr->k);
            k0 = t == 0 ? 0 : h;
            k1 = t == 0 ? h : pr->k;
            if (t == 1) {
                c = pr->c2;
                beta = 0.0;
            }
        }
        ns_syrk(dt, p->lo, p->up, n, (int)(k1 - k0), pr->alpha, P + ns_col(p, k0, pr->ldp) * es,
                pr->ldp, beta, c, pr->ldc);
        return;
    }
    /* plain: memory rows [r0, r1) of C are logical rows (RowMajor) or
     * columns (ColMajor) of C = alpha P Q + beta C */
    const int r0 = t * p->nb, r1 = r0 + p->nb < n ? r0 + p->nb : n;
    const int rowmajor = p->lo == CblasRowMajor;
    const int64_t i0 = rowmajor ? r0 : 0, j0 = rowmajor ? 0 : r0;
    const int ni = rowmajor ? r1 - r0 : n, nj = rowmajor ? n : r1 - r0;
    const int64_t qoff = pr->qtrans == CblasTrans ? ns_row(p, j0, pr->ldp) : ns_col(p, j0, pr->ldp);
    ns_gemm(dt, p->lo, (enum CBLAS_TRANSPOSE)pr->qtrans, ni, nj, pr->k, pr->alpha,
            P + ns_row(p, i0, pr->ldp) * es, pr->ldp, P + qoff * es, pr->ldp, pr->beta,
            (char *)pr->c + (int64_t)r0 * pr->ldc * es, pr->ldc);
    *rows = (mu__ns_rect){r0, r1, 0, n};
}

/* ------------------------------------------------------------ one matrix */


/* AOL preconditioning (Prach, Lampert 2022, "Almost-orthogonal layers",
 * arXiv:2208.03160; Turbo-Muon's use before Newton-Schulz): y = D x with
 * D = diag(1 / sqrt(max(r_i, eps))), r_i = sum_j |(x x^T)_ij|, which bounds
 * ||D x||_2 <= 1 (the Frobenius normalization's job) and starts the
 * iteration closer to orthogonal; a zero row (r_i = 0) stays zero. x is c
 * times the source (c a power of two that keeps its products in range), the
 * plan's n x m iterate (layout lo, ld ldx); y = D source, and may be x. The
 * Gram matrix goes to A (n x n, the slot's), the scales to sc (n doubles).
 * One syrk call of fixed sizes on one worker: the bits depend on x alone. */
static void ns_aol_scale(const mu__ns_plan *p, const void *x, void *y, void *A, double *sc, double eps,
                         double c)
{
    const int n = p->n, m = p->m, dt = p->dt;
    ns_syrk(dt, p->lo, p->up, n, m, 1.0, x, p->ldx, 0.0, A, n);
    for (int i = 0; i < n; i++) sc[i] = 0.0;
    for (int64_t r = 0; r < n; r++) /* the stored triangle: memory r*n + c, c >= r */
        for (int64_t c = r; c < n; c++) {
            const double v = fabs(dt == MU_F32 ? (double)((const float *)A)[r * n + c]
                                               : ((const double *)A)[r * n + c]);
            sc[r] += v;
            if (c != r) sc[c] += v;
        }
    for (int i = 0; i < n; i++) {
        const double r = sc[i] / c / c; /* the source's row sum */
        sc[i] = r > 0.0 ? 1.0 / sqrt(r > eps ? r : eps) / c : 0.0;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            const int64_t at = ns_row(p, i, p->ldx) + ns_col(p, j, p->ldx);
            if (dt == MU_F32) ((float *)y)[at] = (float)(sc[i] * ((const float *)x)[at]);
            else ((double *)y)[at] = sc[i] * ((const double *)x)[at];
        }
}

/* Prologue of matrix i (serial, O(rows * cols)): the norm, zero input and
 * 0 steps, and the buffers of the ping-pong. The input is known finite
 * and, if zero, eps > 0. */
static void ns_begin(mu__ns_iter *it, const mu__ns_job *job, const mu__ns_slot *s, int64_t i)
{
    const int dt = job->dt;
    const size_t es = mu_dtype_size(dt);
    const int64_t len = job->rows * job->cols;
    const char *src = job->in + i * job->bytes_per;
    const mu_ns_opts *o = job->opts;
    it->job = job;
    it->s = s;
    it->dst = job->out + i * job->bytes_per;
    it->done = 1;
    it->resid = job->resid ? job->resid + i : NULL;

    double norm = 0.0;
    if (job->norms) norm = job->norms[i];
    else ns_norm(dt, src, len, &norm);
    if (norm == 0.0) { /* zero in, zero out (eps > 0 was checked) */
        memset(it->dst, 0, (size_t)len * es);
        return;
    }
    const double scale = 1.0 / (o->norm_scale * norm + o->eps);
    if (job->plan.g16) {
        mu__ns_gram16_begin(it, src, norm);
        return;
    }
    if (job->plan.bf16) {
        mu__ns_bf16_begin(it, src, norm);
        return;
    }
    const int aol = o->precond == MU_NS_PRECOND_AOL;
    /* The scale (the seed's 1 / (norm_scale ||x|| + eps), in double) is
     * folded into the first step's products (alpha = s^2 for X X^T) while
     * the products of the unscaled input neither overflow nor underflow;
     * otherwise the input is scaled first: by the scale itself, or for AOL,
     * which divides by its own row sums, by a power of two c. */
    const double lim = dt == MU_F32 ? 0x1p40 : 0x1p400;
    const int fold = norm <= lim && norm >= 1.0 / lim;
    const double c = fold ? 1.0 : ldexp(1.0, -ilogb(norm));
    if (o->steps == 0) {
        if (!aol) {
            ns_scale_copy(dt, it->dst, src, len, scale);
        } else {
            if (!fold) ns_scale_copy(dt, it->dst, src, len, c);
            ns_aol_scale(&job->plan, fold ? src : it->dst, it->dst, s->a, s->b, o->eps, c);
        }
        return;
    }
    /* Ping-pong: the last step writes dst, the one before the workspace,
     * and so on backwards; in place with an odd step count, the input is
     * first copied to the workspace so step 1 does not overwrite its source. */
    const void *x = src;
    it->dst_first = o->steps % 2 == 1;
    if (job->inplace && it->dst_first) {
        memcpy(s->x, src, (size_t)len * es);
        x = s->x;
    }
    it->xs0 = scale;
    if (aol || !fold) { /* into a buffer step 1 does not write */
        void *buf = x == s->x ? s->x : it->dst_first ? s->x : (void *)it->dst;
        if (!fold) ns_scale_copy(dt, buf, x, len, aol ? c : scale);
        if (aol) ns_aol_scale(&job->plan, fold ? x : buf, buf, s->a, s->b, o->eps, c);
        x = buf;
        it->xs0 = 1.0;
    }
    it->x0 = x;
    it->done = 0;
}

/* Stage of tile t of a step (0 <= t < nx); t becomes the index within it. */
static int ns_stage(const mu__ns_plan *p, int *t)
{
    int st = 0;
    while (*t >= p->tiles[st]) *t -= p->tiles[st++];
    return st;
}

/* Tile u (0 <= u < ns_tickets) of the iteration: step u / nx, then the
 * stages in order, on worker w (the team rank: its per-worker oneDNN
 * objects). A tile may run only once every tile of the stages before its
 * own is done. */
static void ns_tile(const mu__ns_iter *it, int64_t u, int w)
{
    if (it->done) return;
    if (it->job->plan.g16) {
        mu__ns_gram16_tile(it, u, w);
        return;
    }
    const mu__ns_job *job = it->job;
    const mu__ns_plan *p = &job->plan;
    const int dt = p->dt, n = p->n;
    const int k = (int)(u / p->nx);
    int t = (int)(u % p->nx);
    const int stage = ns_stage(p, &t);
    if (p->bf16) {
        mu__ns_bf16_tile(it, k, stage, t, w);
        return;
    }
    const double *co = job->opts->coeffs + 3 * k; /* a, b, c */
    /* Step k reads the previous step's output and writes the other buffer. */
    const int to_dst = it->dst_first ^ (k & 1);
    const void *x = k == 0 ? it->x0 : to_dst ? it->s->x : (const void *)it->dst;
    void *y = to_dst ? (void *)it->dst : it->s->x;
    const double xs = k == 0 ? it->xs0 : 1.0;
    void *A = it->s->a, *B = it->s->b;
    mu__ns_rect r = {0, n, 0, n}; /* the whole matrix unless a tile says otherwise */

    switch (stage) {
    case MU__NS_GRAM_A: { /* A = xs^2 X X^T (second half into B) */
        const ns_prod pr = {.p = x, .ldp = p->ldx, .k = p->m, .qtrans = CblasTrans,
                            .alpha = xs * xs, .beta = 0.0, .c = A, .c2 = B, .ldc = n};
        ns_product_tile(p, &pr, t, &r);
        if (p->halves) return; /* PREP adds the halves */
        if (p->plain) {        /* B = A on the tile's rows */
            const size_t es = mu_dtype_size(dt);
            memcpy((char *)B + (int64_t)r.r0 * n * (int64_t)es,
                   (const char *)A + (int64_t)r.r0 * n * (int64_t)es,
                   (size_t)(r.r1 - r.r0) * (size_t)n * es);
        } else {
            ns_prep(dt, A, B, n, 0, n, 0, n, 0, co[1]);
        }
        return;
    }
    case MU__NS_PREP: /* A = A + B (the halves), mirrored; B = b A */
        mu__ns_tri_rect(p, t, &r);
        ns_prep(dt, A, B, n, r.r0, r.r1, r.c0, r.c1, 1, co[1]);
        return;
    case MU__NS_GRAM_B: { /* B = c A A^T + B (plain: c A A + b B); second half into y */
        const ns_prod pr = {.p = A, .ldp = n, .k = n,
                            .qtrans = p->plain ? CblasNoTrans : CblasTrans, .alpha = co[2],
                            .beta = p->plain ? co[1] : 1.0, .c = B, .c2 = y, .ldc = n};
        ns_product_tile(p, &pr, t, &r);
        if (!p->halves) ns_add_diag(dt, B, n, r.r0, r.r1, co[0]);
        return;
    }
    case MU__NS_REDUCE: /* B = B + second half, + a I */
        mu__ns_tri_rect(p, t, &r);
        ns_accumulate(dt, B, y, n, r.r0, r.r1, r.c0, r.c1);
        if (r.r0 == r.c0) ns_add_diag(dt, B, n, r.r0, r.r1, co[0]);
        return;
    default: { /* MU__NS_APPLY: Y = xs (B + a I) X */
        /* (the last step's Gram A, complete and mirrored since PREP, is only
         * read from here on: one tile takes its residual) */
        if (t == 0 && it->resid && k == job->opts->steps - 1) *it->resid = ns_residual(dt, A, n);
        const ns_prod pr = {.apply = 1, .p = x, .ldp = p->ldx, .s = B, .alpha = xs, .c = y,
                            .ldc = p->ldx};
        ns_product_tile(p, &pr, t, NULL);
        return;
    }
    }
}

/* The tickets of one matrix after its prologue: every tile of every step
 * (the bfloat16 Gram iteration's steps differ: src/ns_gram_bf16.c). */
static int64_t ns_tickets(const mu__ns_job *job)
{
    return job->plan.g16 ? mu__ns_gram16_tickets(job) : (int64_t)job->opts->steps * job->plan.nx;
}

/* A whole matrix on worker w: the same tiles in order. */
static void ns_one(const mu__ns_job *job, const mu__ns_slot *s, int64_t i, int w)
{
    mu__ns_iter it;
    ns_begin(&it, job, s, i);
    const int64_t ntiles = ns_tickets(job);
    for (int64_t u = 0; u < ntiles && !it.done; u++) ns_tile(&it, u, w);
}

/* ---------------------------------------------------------- scheduling
 *
 * One scheduler for every call. The matrices of a call (a batch for
 * mu_ns_zeropower, every tensor's for mu_ns_zeropower_many: a whole
 * optimizer step) are units; how they are spread over the workers is a
 * speed choice only, the bits are the same:
 * - shared units run first, one at a time, tile by tile on all workers
 *   (slot 0): splittable matrices (some stage of their plan has more than
 *   one tile) above MU__NS_BATCH_PAR_MAX elements, and the smallest
 *   S % workers of the S other splittable ones (which would otherwise leave
 *   workers idle at the end). Tickets from an atomic counter number their
 *   work in order: per matrix the prologue, then for each step the tiles of
 *   each stage. A ticket's stage may start once every ticket before the
 *   stage is done (`done` counts finished tickets; tickets of a later stage
 *   cannot finish first, so it is a prefix count). Stage after stage is the
 *   only ordering needed: each stage reads what the one before wrote, and
 *   the next matrix's prologue waits for the last step of the previous one,
 *   which used the same slot.
 * - whole units then run each on one worker with its own workspace slot,
 *   largest first (an atomic counter over the list sorted by ns_cost):
 *   the next largest goes to the worker that becomes free first, the least
 *   loaded one (greedy longest-processing-time scheduling). Worker 0 first
 *   waits for the shared units, which used its slot. */

typedef struct ns_unit {
    int64_t job, index; /* matrix `index` of the batch of jobs[job] */
    double cost;
    int shared;
} ns_unit;

/* Estimated cost of one matrix of a job: the standard iteration's
 * plain-gemm flops (+ the prologue's pass). It orders the whole units
 * only; any estimate proportional to the time keeps the schedule good. */
static double ns_cost(const mu__ns_job *job)
{
    return mu__ns_cost(job->rows, job->cols, job->opts);
}

/* Whether a job's matrices have a stage of more than one tile. */
static int ns_splittable(const mu__ns_job *job)
{
    if (job->plan.g16) return job->opts->steps > 0 && (job->plan.tn > 1 || job->plan.tm > 1);
    for (int st = 0; job->opts->steps > 0 && st < MU__NS_NSTAGES; st++)
        if (job->plan.tiles[st] > 1) return 1;
    return 0;
}

typedef struct ns_pool {
    const mu__ns_job *jobs;
    const ns_unit *unit;    /* [0, nshared): shared; [nshared, nunits): whole */
    const int64_t *tstart;  /* first ticket of shared unit k; tstart[nshared]: all */
    mu_ns_workspace *ws;
    int slots;              /* whole units: slots 0 .. slots-1 */
    int64_t nshared, nunits;
    atomic_llong next;      /* whole: next unit */
    atomic_llong ticket;    /* shared: next ticket */
    atomic_llong done;      /* shared: tickets done */
    mu__ns_iter it;             /* shared: the current matrix (set by its prologue) */
} ns_pool;

/* The shared unit a ticket belongs to (binary search of tstart). */
static int64_t ns_shared_unit(const ns_pool *p, int64_t ticket)
{
    int64_t lo = 0, hi = p->nshared - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (p->tstart[mid] <= ticket) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Ticket of shared unit k -> first ticket of its stage and one past its last. */
static void ns_stage_of(const ns_pool *p, int64_t k, int64_t ticket, int64_t *start, int64_t *end)
{
    const mu__ns_job *job = &p->jobs[p->unit[k].job];
    const mu__ns_plan *pl = &job->plan;
    const int64_t u = ticket - p->tstart[k];
    if (u == 0) { /* prologue */
        *start = ticket;
        *end = ticket + 1;
        return;
    }
    if (pl->g16) {
        int64_t first;
        int count;
        mu__ns_gram16_stage(job, u - 1, &first, &count);
        *start = p->tstart[k] + 1 + first;
        *end = *start + count;
        return;
    }
    int t = (int)((u - 1) % pl->nx);
    const int st = ns_stage(pl, &t);
    *start = ticket - t;
    *end = *start + pl->tiles[st];
}

/* A worker of the team (src/pool.c): its rank is its workspace slot. */
static void ns_worker(mu__pool *team, int rank, void *arg)
{
    ns_pool *p = arg;
    const int64_t count = p->tstart[p->nshared];
    for (;;) { /* shared */
        const long long ticket = atomic_fetch_add(&p->ticket, 1);
        if (ticket >= count) break;
        const int64_t k = ns_shared_unit(p, ticket);
        int64_t start, end;
        ns_stage_of(p, k, ticket, &start, &end);
        mu__pool_wait(team, &p->done, start);
        const ns_unit *un = &p->unit[k];
        const int64_t u = ticket - p->tstart[k];
        if (u == 0) ns_begin(&p->it, &p->jobs[un->job], &p->ws->slot[0], un->index);
        else ns_tile(&p->it, u - 1, rank);
        if (atomic_fetch_add(&p->done, 1) + 1 == end) mu__pool_wake(team);
    }
    if (rank >= p->slots) return; /* no slot of its own */
    if (rank == 0 && count > 0) mu__pool_wait(team, &p->done, count);
    for (;;) { /* whole */
        const long long i = atomic_fetch_add(&p->next, 1);
        if (i >= p->nunits) break;
        const ns_unit *un = &p->unit[i];
        ns_one(&p->jobs[un->job], &p->ws->slot[rank], un->index, rank);
    }
}

/* Workers: the OpenBLAS thread count when the call starts, or
 * MU_NS_THREADS (a positive integer) when set (then *asked = 1); at most
 * MU__NS_MAX_SLOTS. The results do not depend on it. */
static int ns_workers_asked(int *asked)
{
    int w = openblas_get_num_threads();
    const char *env = getenv("MU_NS_THREADS");
    *asked = 0;
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1) {
            w = v < MU__NS_MAX_SLOTS ? (int)v : MU__NS_MAX_SLOTS;
            *asked = 1;
        }
    }
    if (w < 1) w = 1;
    return w < MU__NS_MAX_SLOTS ? w : MU__NS_MAX_SLOTS;
}

int mu__ns_workers(void)
{
    int asked;
    return ns_workers_asked(&asked);
}

/* The team for `workers` workers: in a host with an OpenMP runtime, a
 * parallel region of it (src/pool.c), unless MU_NS_OPENMP=0 declines. */
mu__pool_cfg mu__ns_pool_cfg(int workers)
{
    const char *env = getenv("MU_NS_OPENMP");
    return (mu__pool_cfg){.workers = workers, .openmp = !(env && strcmp(env, "0") == 0)};
}

/* Shared first; then by decreasing cost; ties in call order. */
static int ns_unit_cmp(const void *pa, const void *pb)
{
    const ns_unit *a = pa, *b = pb;
    if (a->shared != b->shared) return a->shared ? -1 : 1;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->job != b->job) return a->job < b->job ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

static void ns_schedule_run(const mu__ns_job *jobs, int64_t njobs, ns_unit *unit, int64_t *tstart,
                            mu_ns_workspace *ws);
static int ns_takes_split(const mu__ns_job *job);

/* When a job is bfloat16: oneDNN into the workspace (MU_EIO without it),
 * and every product shape of the bfloat16 jobs and the most workers the
 * call can have made ready in it (MU_ENOMEM), so the workers' products
 * allocate nothing. Serial, before anything is written. */
static int ns_dnnl_ready(const mu__ns_job *jobs, int64_t njobs, mu_ns_workspace *ws)
{
    int bf16 = 0;
    for (int64_t j = 0; j < njobs; j++) bf16 |= jobs[j].batch > 0 && jobs[j].plan.bf16;
    if (!bf16) return MU_OK;
    int rc = ws->dnnl ? MU_OK : mu__dnnl_open(&ws->dnnl);
    for (int64_t j = 0; rc == MU_OK && j < njobs; j++) {
        const mu__ns_plan *p = &jobs[j].plan;
        if (jobs[j].batch == 0 || !p->bf16 || jobs[j].opts->steps == 0 || ns_takes_split(&jobs[j]))
            continue; /* (the blocked iteration wants its own shapes) */
        rc = p->g16 ? mu__ns_gram16_want(&jobs[j], ws->dnnl) : mu__ns_bf16_want(p, ws->dnnl);
        /* (the Gram iteration's buffers: slot 0's now, the others' when grown) */
        if (rc == MU_OK && p->g16) rc = mu__ns_slot_gram(ws, &ws->slot[0]);
    }
    /* the team of ns_schedule_run has at most mu__ns_workers() ranks */
    return rc == MU_OK ? mu__dnnl_workers(ws->dnnl, mu__ns_workers()) : rc;
}

/* Run every matrix of jobs[0, njobs) (validated; norms filled) with the
 * scratch lists unit[] and tstart[] (room for every matrix, + 1). The
 * bfloat16 ones get oneDNN (ns_dnnl_ready ran first), whose
 * products run one thread each: the caller's OpenMP thread count is 1
 * during the call and restored after. Fails with oneDNN missing (MU_EIO,
 * before anything is written) or a failed product (MU_ENOMEM). */
static int ns_schedule(mu__ns_job *jobs, int64_t njobs, ns_unit *unit, int64_t *tstart,
                       mu_ns_workspace *ws)
{
    int bf16 = 0;
    for (int64_t j = 0; j < njobs; j++) bf16 |= jobs[j].batch > 0 && jobs[j].plan.bf16;
    if (!bf16) {
        ns_schedule_run(jobs, njobs, unit, tstart, ws);
        return MU_OK;
    }
    if (!ws->dnnl) return mu__fail(MU_EIO, "ns: oneDNN is not open (ns_dnnl_ready first)");
    for (int64_t j = 0; j < njobs; j++) jobs[j].dnnl = ws->dnnl;
    const int saved = mu__dnnl_threads(ws->dnnl);
    ns_schedule_run(jobs, njobs, unit, tstart, ws);
    mu__dnnl_set_threads(ws->dnnl, saved);
    return mu__dnnl_take_failure(ws->dnnl);
}

static void ns_schedule_run(const mu__ns_job *jobs, int64_t njobs, ns_unit *unit, int64_t *tstart,
                        mu_ns_workspace *ws)
{
    int64_t total = 0;
    double sum = 0;
    for (int64_t j = 0; j < njobs; j++) {
        const mu__ns_job *job = &jobs[j];
        if (job->plan.n == 0) continue;
        const double cost = ns_cost(job);
        for (int64_t i = 0; i < job->batch; i++)
            unit[total++] = (ns_unit){.job = j, .index = i, .cost = cost};
        sum += cost * (double)job->batch;
    }
    if (total == 0) return;
    int asked;
    int threads = ns_workers_asked(&asked);
    if (!asked && sum < MU__NS_PAR_MIN_COST * (double)total) threads = 1;
    int64_t nshared = 0;
    int most = 1;  /* most tiles in a stage of a shared unit: its useful workers */
    int slots = 1; /* workspace slots the whole units may use */
    if (threads > 1) {
        qsort(unit, (size_t)total, sizeof *unit, ns_unit_cmp);
        int64_t small = 0; /* splittable units below MU__NS_BATCH_PAR_MAX */
        for (int64_t u = 0; u < total; u++) {
            const mu__ns_job *job = &jobs[unit[u].job];
            if (!ns_splittable(job)) continue;
            if (job->rows * job->cols > MU__NS_BATCH_PAR_MAX) unit[u].shared = 1;
            else small++;
        }
        for (int64_t u = total - 1, left = small % threads; u >= 0 && left > 0; u--) {
            const mu__ns_job *job = &jobs[unit[u].job];
            if (!unit[u].shared && ns_splittable(job)) {
                unit[u].shared = 1;
                left--;
            }
        }
        for (int64_t u = 0; u < total; u++) {
            if (!unit[u].shared) continue;
            nshared++;
            const mu__ns_plan *pl = &jobs[unit[u].job].plan;
            for (int st = 0; st < MU__NS_NSTAGES; st++)
                if (pl->tiles[st] > most) most = pl->tiles[st];
            if (pl->g16 && pl->tn * (pl->tn + 1) > most) most = pl->tn * (pl->tn + 1);
        }
        if (nshared > 0) qsort(unit, (size_t)total, sizeof *unit, ns_unit_cmp);
        /* Workers with something to do: a slot each for the whole units. */
        const int64_t nwhole = total - nshared;
        const int want = nwhole < threads ? (int)nwhole : threads;
        while (ws->nslots < want) {
            if (ns_slot_alloc(ws, &ws->slot[ws->nslots]) != MU_OK) break;
            ws->nslots++;
        }
        slots = ws->nslots;
        for (int64_t j = 0, g16 = 0; j < njobs && !g16; j++) {
            if (!(g16 = jobs[j].batch > 0 && jobs[j].plan.g16)) continue;
            for (slots = 1; slots < ws->nslots && mu__ns_slot_gram(ws, &ws->slot[slots]) == MU_OK;) slots++;
        }
        mu__clear_error(); /* out of memory only means fewer workers */
        int useful = nwhole < slots ? (int)nwhole : slots;
        if (nshared > 0 && most > useful) useful = most;
        if (threads > useful) threads = useful;
    }
    tstart[0] = 0;
    for (int64_t k = 0; k < nshared; k++)
        tstart[k + 1] = tstart[k] + 1 + ns_tickets(&jobs[unit[k].job]);

    /* Every BLAS call runs single-threaded (the count is process-wide). */
    const int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    if (threads > 1) {
        ns_pool pool = {.jobs = jobs, .unit = unit, .tstart = tstart, .ws = ws, .slots = slots,
                        .nshared = nshared, .nunits = total};
        atomic_init(&pool.next, nshared);
        atomic_init(&pool.ticket, 0);
        atomic_init(&pool.done, 0);
        const mu__pool_cfg cfg = mu__ns_pool_cfg(threads);
        mu__pool_run(&cfg, ns_worker, &pool);
    } else { /* one worker: the same tiles in order */
        for (int64_t u = 0; u < total; u++)
            ns_one(&jobs[unit[u].job], &ws->slot[0], unit[u].index, 0);
    }
    if (saved != 1) openblas_set_num_threads(saved);
}

/* ------------------------------------------------------------- the API */

static int ns_check_opts(const char *pre, const mu_ns_opts *o)
{
    if (!o) return mu__fail(MU_EINVAL, "%sopts is NULL", pre);
    if (o->steps < 0) return mu__fail(MU_EINVAL, "%ssteps must be >= 0, got %d", pre, o->steps);
    if (o->steps > 0 && !o->coeffs) return mu__fail(MU_EINVAL, "%scoeffs is NULL", pre);
    for (int k = 0; k < 3 * o->steps; k++)
        if (!isfinite(o->coeffs[k]))
            return mu__fail(MU_EINVAL, "%scoefficients[%d] must contain only finite values",
                            pre, k / 3);
    if (!isfinite(o->eps) || o->eps < 0)
        return mu__fail(MU_EINVAL, "%seps must be finite and >= 0, got %g", pre, o->eps);
    if (!isfinite(o->norm_scale) || o->norm_scale <= 0)
        return mu__fail(MU_EINVAL, "%snorm_scale must be finite and > 0, got %g", pre,
                        o->norm_scale);
    if (o->path != MU_NS_SYMMETRIC && o->path != MU_NS_PLAIN)
        return mu__fail(MU_EINVAL, "%spath must be MU_NS_SYMMETRIC or MU_NS_PLAIN, got %d",
                        pre, o->path);
    if (o->method != MU_NS_STANDARD && o->method != MU_NS_GRAM && o->method != MU_NS_AUTO)
        return mu__fail(MU_EINVAL,
                        "%smethod must be MU_NS_STANDARD, MU_NS_GRAM or MU_NS_AUTO, got %d", pre,
                        o->method);
    if (o->precond != MU_NS_PRECOND_NONE && o->precond != MU_NS_PRECOND_AOL)
        return mu__fail(MU_EINVAL, "%sprecond must be MU_NS_PRECOND_NONE or MU_NS_PRECOND_AOL, got %d",
                        pre, o->precond);
    if (o->precond == MU_NS_PRECOND_AOL && o->method == MU_NS_GRAM)
        return mu__fail(MU_EINVAL, "%sthe AOL preconditioning runs the standard iteration "
                        "(method MU_NS_STANDARD or MU_NS_AUTO)", pre);
    if (o->dtype != MU_F32 && o->dtype != MU_BF16)
        return mu__fail(MU_EINVAL, "%sdtype must be MU_F32 or MU_BF16, got %d", pre, o->dtype);
    if (o->dtype == MU_BF16 && o->precond == MU_NS_PRECOND_AOL)
        return mu__fail(MU_EINVAL, "%sdtype bfloat16 does not run the AOL preconditioning "
                        "(variant 'aol' is float32 only)", pre);
    return MU_OK;
}

int mu__ns_check_opts(const mu_ns_opts *o) { return ns_check_opts("ns: ", o); }

/* Check one (in, out, opts) triple and describe it as a job (without its
 * norms). `pre` starts every message ("ns: ", or naming the index). */
static int ns_job_init(const char *pre, const mu_tensor *in, mu_tensor *out,
                       const mu_ns_opts *opts, mu__ns_job *job)
{
    if (!in || !out) return mu__fail(MU_EINVAL, "%sin and out must not be NULL", pre);
    int rc = mu__tensor_check(in, "ns: in");
    if (rc == MU_OK) rc = mu__tensor_check(out, "ns: out");
    if (rc == MU_OK) rc = ns_check_opts(pre, opts);
    if (rc != MU_OK) return rc;
    if (in->ndim != 2 && in->ndim != 3)
        return mu__fail(MU_ESHAPE, "%sinput must be 2-D or 3-D, got %d dims", pre, in->ndim);
    if (in->scalar != MU_F32 && in->scalar != MU_F64)
        return mu__fail(MU_EDTYPE, "%sunsupported dtype %d", pre, in->scalar);
    if (out->scalar != in->scalar)
        return mu__fail(MU_EDTYPE, "%sout dtype differs from the input's", pre);
    if (opts->dtype == MU_BF16 && in->scalar != MU_F32)
        return mu__fail(MU_EDTYPE, "%sdtype bfloat16 takes float32 tensors, got %s", pre,
                        mu_dtype_name(in->scalar));
    if (out->ndim != in->ndim)
        return mu__fail(MU_ESHAPE, "%sout has %d dims, input %d", pre, out->ndim, in->ndim);
    for (int d = 0; d < in->ndim; d++)
        if (out->dims[d] != in->dims[d])
            return mu__fail(MU_ESHAPE, "%sout dim %d is %lld, input's %lld", pre, d,
                            (long long)out->dims[d], (long long)in->dims[d]);
    if (!mu_tensor_is_contiguous(in) || !mu_tensor_is_contiguous(out))
        return mu__fail(MU_EINVAL, "%sin and out must be C-contiguous", pre);
    const int dt = in->scalar;
    const int64_t rows = in->dims[in->ndim - 2], cols = in->dims[in->ndim - 1];
    const int64_t n = rows < cols ? rows : cols, m = rows < cols ? cols : rows;
    if (m > INT32_MAX)
        return mu__fail(MU_ESHAPE, "%smatrix %lld x %lld too large for BLAS", pre,
                        (long long)rows, (long long)cols);
    const int64_t batch = in->ndim == 3 ? in->dims[0] : 1;
    const int64_t len = rows * cols;
    const int64_t bytes = len * batch * (int64_t)mu_dtype_size(dt);
    const char *ib = in->data;
    char *ob = out->data;
    if (ib != (const char *)ob && ib < ob + bytes && ob < ib + bytes)
        return mu__fail(MU_EINVAL, "%sout partially overlaps the input", pre);
    *job = (mu__ns_job){.dt = dt, .rows = rows, .cols = cols, .batch = n == 0 ? 0 : batch,
                    .in = ib, .out = ob, .bytes_per = len * (int64_t)mu_dtype_size(dt),
                    .opts = opts, .inplace = ib == (const char *)ob};
    mu__ns_plan_init(&job->plan, dt, rows, cols, opts->path, opts->dtype == MU_BF16);
    job->plan.g16 = job->plan.bf16 && opts->steps > 0 && mu_ns_method_for(rows, cols, opts) == MU_NS_GRAM;
    return MU_OK;
}

/* The norms of a job's matrices into norms[] (set as job->norms); fails,
 * before anything is written, on NaN/Inf or a zero matrix with eps = 0. */
static int ns_job_norms(const char *pre, mu__ns_job *job, double *norms)
{
    const int64_t len = job->rows * job->cols;
    for (int64_t i = 0; i < job->batch; i++) {
        if (!ns_norm(job->dt, job->in + i * job->bytes_per, len, &norms[i]))
            return mu__fail(MU_ENONFINITE, "%sinput matrix %lld (0-based batch index) holds "
                            "NaN or Inf", pre, (long long)i);
        if (norms[i] == 0.0 && job->opts->eps == 0.0)
            return mu__fail(MU_EINVAL, "%sinput matrix %lld (0-based batch index) is all zeros "
                            "and eps = 0 (division by zero)", pre, (long long)i);
    }
    job->norms = norms;
    return MU_OK;
}

static int ns_ws_fits(const char *pre, const mu_ns_workspace *ws, const mu__ns_job *job)
{
    if (ws->dtype != job->dt)
        return mu__fail(MU_EDTYPE, "%sworkspace dtype differs from the input's", pre);
    const int64_t n = job->plan.n, m = job->plan.m;
    if (job->batch > 0 && (n * m > ws->cap_nm || n * n > ws->cap_nn))
        return mu__fail(MU_ESHAPE, "%sworkspace too small for a %lld x %lld matrix", pre,
                        (long long)job->rows, (long long)job->cols);
    return MU_OK;
}

/* The scheduler's lists for njobs jobs of `total` matrices in all, carved
 * from one buffer of the workspace (grown, so a step loop allocates once). */
typedef struct ns_lists {
    mu__ns_job *jobs;
    double *norms;
    double *resid;   /* total: the matrices' residuals */
    ns_unit *unit;
    int64_t *tstart; /* total + 1 */
    int64_t *order;  /* njobs: mu_ns_zeropower_many's outputs by address */
} ns_lists;

static size_t ns_round(size_t b) { return (b + 63) & ~(size_t)63; }

int mu__ns_grow(void **buf, size_t *bytes, size_t need, const char *what)
{
    if (need <= *bytes) return MU_OK;
    void *p = aligned_alloc(64, need);
    if (!p) return mu__fail(MU_ENOMEM, "ns: out of memory (%zu bytes of %s)", need, what);
    free(*buf);
    *buf = p;
    *bytes = need;
    return MU_OK;
}

static int ns_lists_get(mu_ns_workspace *ws, int64_t njobs, int64_t total, ns_lists *l)
{
    const size_t bj = ns_round((size_t)njobs * sizeof(mu__ns_job));
    const size_t bn = ns_round((size_t)total * sizeof(double));
    const size_t bu = ns_round((size_t)total * sizeof(ns_unit));
    const size_t bt = ns_round((size_t)(total + 1) * sizeof(int64_t));
    const size_t bo = ns_round((size_t)njobs * sizeof(int64_t));
    const size_t need = bj + 2 * bn + bu + bt + bo;
    const int rc = mu__ns_grow(&ws->sched, &ws->sched_bytes, need, "lists");
    if (rc != MU_OK) return rc;
    char *b = ws->sched;
    l->jobs = (mu__ns_job *)b;
    l->norms = (double *)(b + bj);
    l->unit = (ns_unit *)(b + bj + bn);
    l->tstart = (int64_t *)(b + bj + bn + bu);
    l->order = (int64_t *)(b + bj + bn + bu + bt);
    l->resid = (double *)(b + bj + bn + bu + bt + bo);
    for (int64_t i = 0; i < total; i++) l->resid[i] = NAN;
    return MU_OK;
}

/* The jobs `takes` claims, validated, run one at a time outside the
 * scheduler, each with `run` on every worker, and are left out of it
 * (batch set to 0). Fails only as `run` does (MU_ENOMEM: buffers allocated
 * on first use; MU_EIO: oneDNN). */
static int ns_run_aside(mu__ns_job *jobs, int64_t njobs, mu_ns_workspace *ws,
                        int (*takes)(const mu__ns_job *), int (*run)(const mu__ns_batch *))
{
    for (int64_t j = 0; j < njobs; j++) {
        mu__ns_job *job = &jobs[j];
        if (job->batch == 0 || !takes(job)) continue;
        const mu__ns_batch b = {.dt = job->dt, .rows = job->rows, .cols = job->cols,
                                .batch = job->batch, .in = job->in, .out = job->out,
                                .opts = job->opts, .ws = ws, .norms = job->norms,
                                .threads = mu__ns_workers()};
        int rc = run(&b);
        if (rc != MU_OK) return rc;
        job->batch = 0;
    }
    return MU_OK;
}

/* Add a finished call (total matrices, their residuals, since t0) to the
 * workspace's stats. */
static void ns_account(mu_ns_workspace *ws, const double *resid, int64_t total, double t0)
{
    mu_ns_stats *st = &ws->stats;
    st->seconds += mu_clock() - t0;
    st->matrices += total;
    for (int64_t i = 0; i < total; i++) {
        const double r = resid[i];
        if (r != r) continue;
        st->residuals++;
        st->residual_sumsq += r * r;
        if (r > st->residual_max) st->residual_max = r;
    }
}

int mu_ns_workspace_stats(mu_ns_workspace *ws, int reset, mu_ns_stats *out)
{
    if (!ws || !out) return mu__fail(MU_EINVAL, "ns stats: ws and out must not be NULL");
    *out = ws->stats;
    if (reset) memset(&ws->stats, 0, sizeof ws->stats);
    return MU_OK;
}

/* The float32 and float64 jobs whose shape mu_ns_method_for sends to the
 * Gram iteration (src/ns_gram.c; the bfloat16 one, src/ns_gram_bf16.c, runs
 * in the scheduler). */
static int ns_takes_gram(const mu__ns_job *job)
{
    return !job->plan.bf16 && mu_ns_method_for(job->rows, job->cols, job->opts) == MU_NS_GRAM;
}

/* The jobs whose shape has more than one block (mu__split_plan): the
 * blocked iteration (src/ns_split.c), so one process gives the bits a
 * split over any group size gives. They go first (Gram ones too). */
static int ns_takes_split(const mu__ns_job *job)
{
    int64_t blocks = 1;
    return mu__split_plan(job->rows, job->cols, job->opts, &blocks, NULL) == MU_OK && blocks > 1;
}

/* The jobs run aside: the blocked ones, then the Gram ones. */
static int ns_run_asides(mu__ns_job *jobs, int64_t njobs, mu_ns_workspace *ws)
{
    int rc = ns_run_aside(jobs, njobs, ws, ns_takes_split, mu__ns_split_batch);
    return rc == MU_OK ? ns_run_aside(jobs, njobs, ws, ns_takes_gram, mu__ns_gram_batch) : rc;
}

int mu_ns_zeropower(const mu_tensor *in, mu_tensor *out, const mu_ns_opts *opts,
                    mu_ns_workspace *ws)
{
    const double t0 = mu_clock();
    mu__ns_job job;
    int rc = ns_job_init("ns: ", in, out, opts, &job);
    if (rc != MU_OK) return rc;
    if (job.batch == 0) return MU_OK;
    /* Validate everything before writing anything (norms kept for small
     * batches, recomputed otherwise, until the workspace holds the lists). */
    enum { NORMS_KEPT = 128 };
    double norms[NORMS_KEPT];
    const int64_t len = job.rows * job.cols;
    for (int64_t i = 0; i < job.batch; i++) {
        double norm;
        if (!ns_norm(job.dt, job.in + i * job.bytes_per, len, &norm))
            return mu__fail(MU_ENONFINITE, "ns: input matrix %lld (0-based batch index) holds "
                            "NaN or Inf", (long long)i);
        if (norm == 0.0 && opts->eps == 0.0)
            return mu__fail(MU_EINVAL, "ns: input matrix %lld (0-based batch index) is all zeros "
                            "and eps = 0 (division by zero)", (long long)i);
        if (i < NORMS_KEPT) norms[i] = norm;
    }
    mu_ns_workspace *own = NULL;
    if (!ws) {
        rc = mu_ns_workspace_new(job.dt, job.rows, job.cols, &own);
        if (rc != MU_OK) return rc;
        ws = own;
    }
    ns_lists l;
    rc = ns_ws_fits("ns: ", ws, &job);
    if (rc == MU_OK) rc = ns_lists_get(ws, 1, job.batch, &l);
    if (rc == MU_OK) {
        if (job.batch <= NORMS_KEPT) memcpy(l.norms, norms, (size_t)job.batch * sizeof(double));
        else for (int64_t i = 0; i < job.batch; i++)
            ns_norm(job.dt, job.in + i * job.bytes_per, len, &l.norms[i]);
        job.norms = l.norms;
        job.resid = l.resid;
        l.jobs[0] = job;
        rc = ns_dnnl_ready(l.jobs, 1, ws);
        if (rc == MU_OK) rc = ns_run_asides(l.jobs, 1, ws);
        if (rc == MU_OK) rc = ns_schedule(l.jobs, 1, l.unit, l.tstart, ws);
        if (rc == MU_OK) ns_account(ws, l.resid, job.batch, t0);
    }
    mu_ns_workspace_free(own);
    return rc;
}

/* Outputs sorted by address (l->order) must not overlap each other, and an
 * input may overlap no output but its own identical one (in place). */
static int ns_check_aliasing(const ns_lists *l, int64_t count)
{
    const mu__ns_job *jobs = l->jobs;
    int64_t n = 0;
    for (int64_t j = 0; j < count; j++)
        if (jobs[j].batch > 0) l->order[n++] = j;
    /* insertion sort by output address: the lists are short (one per batch) */
    for (int64_t a = 1; a < n; a++) {
        const int64_t v = l->order[a];
        int64_t b = a;
        for (; b > 0 && jobs[l->order[b - 1]].out > jobs[v].out; b--) l->order[b] = l->order[b - 1];
        l->order[b] = v;
    }
#define NS_END(j) (jobs[j].out + jobs[j].batch * jobs[j].bytes_per)
    for (int64_t a = 1; a < n; a++)
        if (jobs[l->order[a]].out < NS_END(l->order[a - 1]))
            return mu__fail(MU_EINVAL, "ns many: out[%lld] overlaps out[%lld]",
                            (long long)l->order[a], (long long)l->order[a - 1]);
    for (int64_t i = 0; i < count; i++) {
        if (jobs[i].batch == 0) continue;
        const char *s = jobs[i].in, *e = s + jobs[i].batch * jobs[i].bytes_per;
        /* last output starting before e, then back while they reach past s */
        int64_t lo = 0, hi = n - 1, at = -1;
        while (lo <= hi) {
            const int64_t mid = (lo + hi) / 2;
            if (jobs[l->order[mid]].out < e) {
                at = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        for (; at >= 0 && NS_END(l->order[at]) > s; at--) {
            const int64_t j = l->order[at];
            if (j != i)
                return mu__fail(MU_EINVAL, "ns many: in[%lld] overlaps out[%lld]", (long long)i,
                                (long long)j);
        }
    }
#undef NS_END
    return MU_OK;
}

int mu_ns_zeropower_many(int64_t count, const mu_tensor *const *in, mu_tensor *const *out,
                         const mu_ns_opts *const *opts, mu_ns_workspace *ws)
{
    if (count < 0) return mu__fail(MU_EINVAL, "ns many: count must be >= 0, got %lld",
                                   (long long)count);
    if (count == 0) return MU_OK;
    if (!in || !out || !opts)
        return mu__fail(MU_EINVAL, "ns many: in, out and opts must not be NULL");
    const double t0 = mu_clock();
    char pre[64];
    /* First pass: shapes, dtypes and options; the number of matrices. */
    int64_t total = 0;
    int dt = -1;
    for (int64_t j = 0; j < count; j++) {
        mu__ns_job job;
        mu__name_index(pre, sizeof pre, "ns many: tensor ", "", (long long)j, ": ");
        if (!in[j] || !out[j])
            return mu__fail(MU_EINVAL, "%sin[%lld] and out[%lld] must not be NULL", pre,
                            (long long)j, (long long)j);
        if (!opts[j]) return mu__fail(MU_EINVAL, "%sopts[%lld] is NULL", pre, (long long)j);
        int rc = ns_job_init(pre, in[j], out[j], opts[j], &job);
        if (rc != MU_OK) return rc;
        if (dt < 0) dt = job.dt;
        else if (job.dt != dt)
            return mu__fail(MU_EDTYPE, "%sdtype differs from tensor 0's (one dtype per call)",
                            pre);
        total += job.batch;
    }
    mu_ns_workspace *own = NULL;
    if (!ws) { /* room for the largest */
        int64_t rows = 0, cols = 0;
        for (int64_t j = 0; j < count; j++) {
            const int64_t r = in[j]->dims[in[j]->ndim - 2], c = in[j]->dims[in[j]->ndim - 1];
            const int64_t n = r < c ? r : c, m = r < c ? c : r;
            if (n > cols) cols = n;
            if (m > rows) rows = m;
        }
        int rc = mu_ns_workspace_new(dt, rows, cols, &own);
        if (rc != MU_OK) return rc;
        ws = own;
    }
    ns_lists l;
    int rc = ns_lists_get(ws, count, total, &l);
    /* Second pass: every job with its norms, then aliasing, before any write. */
    for (int64_t j = 0, off = 0; rc == MU_OK && j < count; j++) {
        mu__name_index(pre, sizeof pre, "ns many: tensor ", "", (long long)j, ": ");
        rc = ns_job_init(pre, in[j], out[j], opts[j], &l.jobs[j]);
        if (rc == MU_OK) rc = ns_ws_fits(pre, ws, &l.jobs[j]);
        if (rc == MU_OK) rc = ns_job_norms(pre, &l.jobs[j], l.norms + off);
        if (rc == MU_OK) l.jobs[j].resid = l.resid + off;
        off += l.jobs[j].batch;
    }
    if (rc == MU_OK) rc = ns_check_aliasing(&l, count);
    if (rc == MU_OK) rc = ns_dnnl_ready(l.jobs, count, ws);
    if (rc == MU_OK) rc = ns_run_asides(l.jobs, count, ws);
    if (rc == MU_OK) rc = ns_schedule(l.jobs, count, l.unit, l.tstart, ws);
    if (rc == MU_OK) ns_account(ws, l.resid, total, t0);
    mu_ns_workspace_free(own);
    return rc;
}

/* ------------------------------------------- for src/ns_gram.c and others */

int mu__ns_norm(int dt, const void *p, int64_t len, double *norm)
{
    return ns_norm(dt, p, len, norm);
}

void mu__ns_prep(int dt, void *a, void *b, int64_t n, int64_t r0, int64_t r1, int sum,
                 double bcoef)
{
    ns_prep(dt, a, b, n, r0, r1, 0, n, sum, bcoef);
}

void mu__ns_add_diag(int dt, void *p, int64_t n, int64_t i0, int64_t i1, double v)
{
    ns_add_diag(dt, p, n, i0, i1, v);
}

void mu__ns_accumulate(int dt, void *b, const void *s, int64_t n, int64_t r0, int64_t r1)
{
    ns_accumulate(dt, b, s, n, r0, r1, 0, n);
}

int mu__ns_slot_gram(mu_ns_workspace *ws, mu__ns_slot *s)
{
    if (s->g) return MU_OK;
    const size_t es = mu_dtype_size(ws->dtype);
    const int64_t nn = ws->cap_nn > 0 ? ws->cap_nn : 1;
    const size_t bytes = ((size_t)(3 * nn + ws->cap_nm + 16) * es + 63) & ~(size_t)63;
    s->g = aligned_alloc(64, bytes);
    if (!s->g) return mu__fail(MU_ENOMEM, "ns gram workspace: out of memory");
    s->g_bytes = bytes;
    return MU_OK;
}

int mu__ns_slots(mu_ns_workspace *ws, int want)
{
    if (want > MU__NS_MAX_SLOTS) want = MU__NS_MAX_SLOTS;
    while (ws->nslots < want && ns_slot_alloc(ws, &ws->slot[ws->nslots]) == MU_OK) ws->nslots++;
    mu__clear_error(); /* out of memory only means fewer workers */
    return ws->nslots;
}

void mu__ns_standard_one(const mu_ns_opts *opts, int dt, int64_t rows, int64_t cols,
                         const void *in, void *out, double norm, const mu__ns_slot *s)
{
    mu__ns_job job = {.dt = dt, .rows = rows, .cols = cols, .in = in, .out = out,
                  .bytes_per = rows * cols * (int64_t)mu_dtype_size(dt), .opts = opts,
                  .inplace = in == out, .norms = &norm};
    mu__ns_plan_init(&job.plan, dt, rows, cols, opts->path, 0);
    ns_one(&job, s, 0, 0); /* float32/64: no per-worker oneDNN objects */
}

