/*
 * Split Newton-Schulz, the phases: the kernels of one item (a block, a
 * stripe) of each op of a machine's program, and the worker team that
 * runs an op's items (src/ns_split.c describes the iteration). Every item
 * is a fixed list of BLAS / oneDNN calls and elementwise passes whose
 * sizes come from the shape only; which worker runs it never matters.
 */
#include "ns_split.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* f rounded to bfloat16's 8 significant bits (to nearest, ties to even)
 * at any exponent: bf16(f) where that is a normal bfloat16 number, and no
 * overflow or subnormal loss beyond; c x rounded for a power of two c
 * bringing it into range is c bf16_wide(x). */
static double bf16_wide(float f)
{
    double d = f;
    if (!isfinite(d)) return d;
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    enum { DROP = 52 - 7 }; /* float64's fraction bits beyond bfloat16's 7 */
    u += (((uint64_t)1 << (DROP - 1)) - 1) + (u >> DROP & 1);
    u &= ~(((uint64_t)1 << DROP) - 1);
    memcpy(&d, &u, sizeof d);
    return d;
}

/* The norm terms of block j of x (ld): max |v| = f 2^e (f in [0.5, 1))
 * and ss = the sum of (v 2^-e)^2 in float64, with 8 running sums by
 * column index mod 8 over the block's memory rows in order, then added in
 * order; v = x, or bf16_wide(x) for the bfloat16 iteration (whose
 * normalization, as src/ns_bf16.c's, rounds c x for a power of two c when
 * ||x|| lies beyond [2^-60, 2^60]). out = {e, ss}; {0,
 * 0} for zeros, {NaN, NaN} when a value is NaN or Inf. The same bits
 * wherever the block lives (any ld). 2^-e is applied as two exact powers
 * of two (a float64 one may not fit in one). */
#define SPLIT_NORM(NAME, TYPE, VAL)                                                                \
    static void NAME(const TYPE *x, int64_t ld, int64_t R, int64_t Cn, double out[2])             \
    {                                                                                              \
        double amax = 0.0;                                                                         \
        for (int64_t r = 0; r < R; r++) {                                                          \
            const TYPE *row = x + r * ld;                                                          \
            double m = 0.0;                                                                        \
            int bad = 0;                                                                           \
            for (int64_t c = 0; c < Cn; c++) {                                                     \
                const double a = fabs((double)VAL(row[c]));                                        \
                bad |= !(a <= 1.79769313486231570815e308); /* NaN or Inf */                        \
                m = a > m ? a : m;                                                                 \
            }                                                                                      \
            if (bad) {                                                                             \
                out[0] = out[1] = NAN;                                                             \
                return;                                                                            \
            }                                                                                      \
            amax = m > amax ? m : amax;                                                            \
        }                                                                                          \
        out[0] = out[1] = 0.0;                                                                     \
        if (amax == 0.0) return;                                                                   \
        int e;                                                                                     \
        frexp(amax, &e);                                                                           \
        const double s1 = ldexp(1.0, -e / 2), s2 = ldexp(1.0, -e - (-e / 2));                       \
        double acc[8] = {0};                                                                       \
        for (int64_t r = 0; r < R; r++) {                                                          \
            const TYPE *row = x + r * ld;                                                          \
            int64_t c = 0;                                                                         \
            for (; c + 8 <= Cn; c += 8)                                                            \
                for (int l = 0; l < 8; l++) {                                                      \
                    const double v = (double)VAL(row[c + l]) * s1 * s2;                            \
                    acc[l] += v * v;                                                               \
                }                                                                                  \
            for (; c < Cn; c++) {                                                                  \
                const double v = (double)VAL(row[c]) * s1 * s2;                                    \
                acc[c & 7] += v * v;                                                               \
            }                                                                                      \
        }                                                                                          \
        double ss = 0.0;                                                                           \
        for (int l = 0; l < 8; l++) ss += acc[l];                                                  \
        out[0] = e;                                                                                \
        out[1] = ss;                                                                               \
    }
#define SPLIT_AS_IS(v) (v)
SPLIT_NORM(norm_f32, float, SPLIT_AS_IS)
SPLIT_NORM(norm_bf16, float, bf16_wide)
SPLIT_NORM(norm_f64, double, SPLIT_AS_IS)
#undef SPLIT_AS_IS
#undef SPLIT_NORM

static void block_norm(const split_plan *p, const char *x, int64_t ld, int64_t wj, int bf16,
                       double out[2])
{
    const int64_t R = p->tall ? wj : p->n, Cn = p->tall ? p->n : wj;
    if (p->dt == MU_F64) norm_f64((const double *)x, ld, R, Cn, out);
    else if (bf16) norm_bf16((const float *)x, ld, R, Cn, out);
    else norm_f32((const float *)x, ld, R, Cn, out);
}

/* The norm of k blocks' terms (block order): 0 when one holds NaN/Inf. */
int mu__split_combine_norms(const double *v, int64_t k, double *norm)
{
    double top = -INFINITY, ss = 0.0;
    for (int64_t j = 0; j < k; j++) {
        if (isnan(v[2 * j])) return 0;
        if (v[2 * j + 1] > 0.0 && v[2 * j] > top) top = v[2 * j];
    }
    *norm = 0.0;
    if (top == -INFINITY) return 1;
    for (int64_t j = 0; j < k; j++)
        if (v[2 * j + 1] > 0.0) ss += ldexp(v[2 * j + 1], 2 * (int)(v[2 * j] - top));
    *norm = ldexp(sqrt(ss), (int)top);
    return 1;
}

/* Stripe t of the upper triangle of n x n m (element size es) to / from
 * its packed form (rows r0.., each from its diagonal). */
static void pack_stripe(const split_plan *p, size_t es, const void *m, int64_t t, void *dst)
{
    int64_t r0, r1;
    stripe_rows(p, t, &r0, &r1);
    const int64_t base = tri_before(p, r0);
    for (int64_t r = r0; r < r1; r++)
        memcpy((char *)dst + (tri_before(p, r) - base) * (int64_t)es,
               (const char *)m + (r * p->n + r) * (int64_t)es, (size_t)(p->n - r) * es);
}

static void unpack_stripe(const split_plan *p, size_t es, const void *src, int64_t t, void *m)
{
    int64_t r0, r1;
    stripe_rows(p, t, &r0, &r1);
    const int64_t base = tri_before(p, r0);
    for (int64_t r = r0; r < r1; r++)
        memcpy((char *)m + (r * p->n + r) * (int64_t)es,
               (const char *)src + (tri_before(p, r) - base) * (int64_t)es, (size_t)(p->n - r) * es);
}

/* Mirror rows [r0, r1) of the upper triangle of n x n m into the lower
 * one, in 16 x 16 squares (rows of a square read, columns written). */
static void mirror_rows(int dt, void *m, int64_t n, int64_t r0, int64_t r1)
{
    enum { B = 16 };
    for (int64_t i0 = r0; i0 < r1; i0 += B) {
        const int64_t i1 = i0 + B < r1 ? i0 + B : r1;
        for (int64_t j0 = i0; j0 < n; j0 += B) {
            const int64_t j1 = j0 + B < n ? j0 + B : n;
            for (int64_t c = j0; c < j1; c++) {
                const int64_t re = i1 < c ? i1 : c;
                if (dt == MU_F32) {
                    float *a = m;
                    for (int64_t r = i0; r < re; r++) a[c * n + r] = a[r * n + c];
                } else {
                    double *a = m;
                    for (int64_t r = i0; r < re; r++) a[c * n + r] = a[r * n + c];
                }
            }
        }
    }
}

static void blas_syrk(int dt, enum CBLAS_ORDER lo, enum CBLAS_UPLO up, int64_t n, int64_t k,
                      double alpha, const void *a, int64_t lda, void *c)
{
    if (dt == MU_F32)
        cblas_ssyrk(lo, up, CblasNoTrans, (int)n, (int)k, (float)alpha, a, (int)lda, 0.0f, c, (int)n);
    else
        cblas_dsyrk(lo, up, CblasNoTrans, (int)n, (int)k, alpha, a, (int)lda, 0.0, c, (int)n);
}

/* The bfloat16 products' shapes (oneDNN primitives are made per shape). */
static mu__dnnl_shape bf16_tile(int64_t M, int64_t N, int64_t K, int64_t ld, int64_t ldc)
{
    return (mu__dnnl_shape){.M = M, .N = N, .K = K, .lda = ld, .ldb = ld, .ldc = ldc, .transb = 1};
}

static mu__dnnl_shape bf16_update(int64_t n, int64_t wj)
{
    return (mu__dnnl_shape){.M = n, .N = wj, .K = n, .lda = n, .ldb = wj, .ldc = wj, .transb = 0};
}

/* C (float32, ld n) = X X^T on the upper tiles of the stripe grid, X n x
 * K bfloat16 (ld K): one oneDNN call per tile (stripes a <= b). */
static void bf16_gram(const mu__split *s, int w, const uint16_t *x, int64_t K, float *c)
{
    const split_plan *p = &s->p;
    for (int64_t a = 0; a < p->S; a++)
        for (int64_t b = a; b < p->S; b++) {
            int64_t a0, a1, b0, b1;
            stripe_rows(p, a, &a0, &a1);
            stripe_rows(p, b, &b0, &b1);
            const mu__dnnl_shape sh = bf16_tile(a1 - a0, b1 - b0, K, K, p->n);
            mu__dnnl_gemm(s->dnnl, w, &sh, x + a0 * K, x + b0 * K, c + a0 * p->n + b0);
        }
}

/* Every product shape of the bfloat16 plan, wanted before workers run. */
int mu__split_bf16_want(const mu__split *s)
{
    const split_plan *p = &s->p;
    int rc = MU_OK;
    const int64_t widths[2] = {p->w, block_width(p, p->k - 1)};
    for (int64_t a = 0; rc == MU_OK && a < p->S; a++)
        for (int64_t b = a; rc == MU_OK && b < p->S; b++) {
            int64_t a0, a1, b0, b1;
            stripe_rows(p, a, &a0, &a1);
            stripe_rows(p, b, &b0, &b1);
            mu__dnnl_shape sh = bf16_tile(a1 - a0, b1 - b0, p->n, p->n, p->n);
            rc = mu__dnnl_want(s->dnnl, &sh);
            for (int i = 0; rc == MU_OK && i < 2; i++) {
                sh = bf16_tile(a1 - a0, b1 - b0, widths[i], widths[i], p->n);
                rc = mu__dnnl_want(s->dnnl, &sh);
            }
        }
    for (int i = 0; rc == MU_OK && i < 2; i++) {
        const mu__dnnl_shape sh = bf16_update(p->n, widths[i]);
        rc = mu__dnnl_want(s->dnnl, &sh);
    }
    return rc == MU_OK ? mu__dnnl_workers(s->dnnl, s->workers) : rc;
}

/* bfloat16: A (bfloat16) and B share nn[1]. */
static uint16_t *bf16_A(const mu__split *s) { return (uint16_t *)s->nn[1]; }
static uint16_t *bf16_B(const mu__split *s) { return (uint16_t *)s->nn[1] + s->p.n * s->p.n; }

/* ------------------------------------------------------------- phases */

/* One pool run: the post of an op whose exchange is done (or, g = 1, of
 * the op before: its stripes unpacked and mirrored), then an op's items. */
typedef struct split_job {
    mu__split *s;
    const split_op *post, *op;
    int64_t items;      /* the op's items (blocks or stripes) */
    const char *src;    /* PARTIALS, UPDATE, NORMS: the piece read */
    char *dst;          /* UPDATE: the piece written */
    double alpha;
    double *terms;      /* NORMS: 2 per block of each matrix */
    int bf16;           /* NORMS: of the bfloat16-rounded values */
    atomic_llong next, next_post, summed;
} split_job;

/* The stripe t of the result of op (COMBINE or SP) from its exchange, then
 * mirrored when the result is read whole later. */
static void post_stripe(const mu__split *s, const split_op *op, int64_t t)
{
    const split_plan *p = &s->p;
    const size_t es = split_es(p);
    int64_t r0, r1;
    stripe_rows(p, t, &r0, &r1);
    if (p->bf16) {
        uint16_t *dst = op->kind == OP_COMBINE ? bf16_A(s) : bf16_B(s);
        if (s->g > 1) {
            unpack_stripe(p, 2, (const uint16_t *)s->grecv + s->agd[s->owner[t]] + s->soff[t], t, dst);
        } else if (op->kind == OP_COMBINE) { /* A = bf16(the float32 sum) */
            const float *a = s->nn[0];
            for (int64_t r = r0; r < r1; r++) mu__ns_bf16_round(dst + r * p->n + r, a + r * p->n + r, p->n - r);
        }
        if (op->mirror) mu__ns_bf16_mirror(dst, p->n, &(mu__ns_rect){(int)r0, (int)r1, (int)r0, (int)p->n});
        return;
    }
    if (s->g > 1)
        unpack_stripe(p, es, (const char *)s->grecv + (s->agd[s->owner[t]] + s->soff[t]) * (int64_t)es,
                      t, s->nn[op->c]);
    if (op->mirror) mirror_rows(p->dt, s->nn[op->c], p->n, r0, r1);
}

/* Block j's partial product P_j = alpha X_j X_j^T: g = 1, added to nn[c]
 * in block order (the first one written there); else its stripes packed
 * for their owners. */
static void partials_item(split_job *jb, mu__pool *team, int w, int64_t j)
{
    const mu__split *s = jb->s;
    const split_plan *p = &s->p;
    const int64_t wj = block_width(p, j);
    void *target = s->nn[jb->op->c];
    const int direct = s->g == 1 && j == 0;
    void *dst = direct ? target : s->tmp[w];
    if (p->bf16) {
        bf16_gram(s, w, bf16_block(s, j), wj, dst);
    } else {
        int64_t ld;
        const char *x = piece_block(s, jb->src, j, &ld);
        blas_syrk(p->dt, p->lo, p->up, p->n, wj, jb->alpha, x, ld, dst);
    }
    const int dt = p->bf16 ? MU_F32 : p->dt;
    const size_t ef = mu_dtype_size(dt);
    if (s->g == 1) {
        if (!direct) {
            mu__pool_wait(team, &jb->summed, j);
            mu__ns_accumulate(dt, target, dst, p->n, 0, p->n);
        }
        atomic_store(&jb->summed, j + 1);
        mu__pool_wake(team);
        return;
    }
    for (int64_t t = 0; t < p->S; t++) {
        const int q = s->owner[t];
        const int64_t at = s->x1sd[q] + (j - s->b0) * s->tri[q] + s->soff[t];
        pack_stripe(p, ef, dst, t, (char *)s->send1 + at * (int64_t)ef);
    }
}

/* Own stripe t of A: the received partials summed in block order (chunk
 * by chunk), into the exchange's send buffer (bfloat16: rounded). */
static void combine_item(const split_job *jb, int w, int64_t t)
{
    const mu__split *s = jb->s;
    const split_plan *p = &s->p;
    const int64_t len = stripe_tri(p, t), town = s->tri[s->rank];
    for (int64_t e0 = 0; e0 < len; e0 += SPLIT_CHUNK) {
        const int64_t e1 = e0 + SPLIT_CHUNK < len ? e0 + SPLIT_CHUNK : len, at = s->soff[t] + e0;
        if (p->dt == MU_F64) {
            double *acc = (double *)s->gsend + at;
            const double *src = (const double *)s->recv1 + at;
            memcpy(acc, src, (size_t)(e1 - e0) * sizeof *acc);
            for (int64_t j = 1; j < p->k; j++)
                for (int64_t e = 0; e < e1 - e0; e++) acc[e] += src[j * town + e];
            continue;
        }
        float *acc = p->bf16 ? (float *)s->tmp[w] : (float *)s->gsend + at;
        const float *src = (const float *)s->recv1 + at;
        memcpy(acc, src, (size_t)(e1 - e0) * sizeof *acc);
        for (int64_t j = 1; j < p->k; j++)
            for (int64_t e = 0; e < e1 - e0; e++) acc[e] += src[j * town + e];
        if (p->bf16) mu__ns_bf16_round((uint16_t *)s->gsend + at, acc, e1 - e0);
    }
}

/* Stripe t of a small-side product (see split_op), packed for the
 * exchange when g > 1. bfloat16: B = bf16(bf16(b' A) + bf16(c' bf16(A A)))
 * on the stripe's tiles. */
static void sp_item(const split_job *jb, int w, int64_t t)
{
    const mu__split *s = jb->s;
    const split_plan *p = &s->p;
    const split_op *op = jb->op;
    const double *co = p->o->coeffs + 3 * op->k;
    const int64_t n = p->n;
    int64_t r0, r1;
    stripe_rows(p, t, &r0, &r1);
    if (p->bf16) {
        const uint16_t *A = bf16_A(s);
        uint16_t *B = bf16_B(s);
        float *F = s->tmp[w];
        const float bc = mu__ns_bf16_coef(p->o, co[1]), cc = mu__ns_bf16_coef(p->o, co[2]);
        for (int64_t b = t; b < p->S; b++) {
            int64_t c0, c1;
            stripe_rows(p, b, &c0, &c1);
            const mu__dnnl_shape sh = bf16_tile(r1 - r0, c1 - c0, n, n, n);
            if (cc != 0.0f) /* (c = 0: B = bf16(b' A), no A A, as src/ns_bf16.c) */
                mu__dnnl_gemm(s->dnnl, w, &sh, A + r0 * n, A + c0 * n, F + r0 * n + c0);
            for (int64_t r = r0; r < r1; r++) {
                const int64_t cs = c0 > r ? c0 : r, at = r * n + cs;
                if (c1 <= cs) continue;
                if (cc != 0.0f) mu__ns_bf16_poly(B + at, A + at, F + at, c1 - cs, bc, cc);
                else
                    for (int64_t i = 0; i < c1 - cs; i++)
                        B[at + i] = mu__bf16_from_f32(bc * mu__f32_from_bf16(A[at + i]));
            }
        }
        if (s->g > 1) pack_stripe(p, 2, B, t, (uint16_t *)s->gsend + s->soff[t]);
        return;
    }
    const int dt = p->dt;
    const size_t es = split_es(p);
    char *C = s->nn[op->c];
    const char *L = s->nn[op->l], *M = s->nn[op->m];
    double alpha = 1.0, beta = 0.0;
    if (op->poly) { /* C = b L on the trapezoid's upper part, then c L M added */
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = r; c < n; c++) {
                if (dt == MU_F32) ((float *)C)[r * n + c] = (float)co[1] * ((const float *)L)[r * n + c];
                else ((double *)C)[r * n + c] = co[1] * ((const double *)L)[r * n + c];
            }
        alpha = co[2];
        beta = 1.0;
    }
    const int64_t mm = r1 - r0, nn = n - r0;
    char *c = C + (r0 * n + r0) * (int64_t)es;
    /* (c = 0: no L M; gemm with alpha 0 would leave C as it is) */
    if (alpha != 0.0 && dt == MU_F32)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mm, (int)nn, (int)n, (float)alpha,
                    (const float *)L + r0 * n, (int)n, (const float *)M + r0, (int)n, (float)beta,
                    (float *)c, (int)n);
    else if (alpha != 0.0)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mm, (int)nn, (int)n, alpha,
                    (const double *)L + r0 * n, (int)n, (const double *)M + r0, (int)n, beta,
                    (double *)c, (int)n);
    if (op->poly) mu__ns_add_diag(dt, C, n, r0, r1, co[0]);
    if (s->g > 1) pack_stripe(p, es, C, t, (char *)s->gsend + s->soff[t] * (int64_t)es);
}

/* Own block j: X_j <- alpha S X_j (symm on nn[c]'s upper triangle), from
 * src to dst. bfloat16: X_j = bf16(bf16(a' X_j) + bf16(B X_j)) in place;
 * at the last step also written to the output (float32). */
static void update_item(const split_job *jb, int w, int64_t j)
{
    const mu__split *s = jb->s;
    const split_plan *p = &s->p;
    const split_op *op = jb->op;
    const int64_t n = p->n, wj = block_width(p, j);
    if (!p->bf16) {
        int64_t ld;
        const char *x = piece_block(s, jb->src, j, &ld);
        char *y = piece_block(s, jb->dst, j, &ld);
        if (p->dt == MU_F32)
            cblas_ssymm(p->lo, CblasLeft, p->up, (int)n, (int)wj, (float)jb->alpha, s->nn[op->c],
                        (int)n, (const float *)x, (int)ld, 0.0f, (float *)y, (int)ld);
        else
            cblas_dsymm(p->lo, CblasLeft, p->up, (int)n, (int)wj, jb->alpha, s->nn[op->c], (int)n,
                        (const double *)x, (int)ld, 0.0, (double *)y, (int)ld);
        return;
    }
    uint16_t *x = bf16_block(s, j);
    float *C = s->tmp[w];
    const mu__dnnl_shape sh = bf16_update(n, wj);
    mu__dnnl_gemm(s->dnnl, w, &sh, bf16_B(s), x, C);
    const float ac = mu__ns_bf16_coef(p->o, p->o->coeffs[3 * op->k]);
    for (int64_t i = 0; i < n; i++) mu__ns_bf16_apply(x + i * wj, C + i * wj, wj, ac, op->last);
    if (!op->last) return;
    int64_t ld;
    float *out = (float *)piece_block(s, jb->dst, j, &ld);
    if (!p->tall) {
        for (int64_t i = 0; i < n; i++) memcpy(out + i * ld, C + i * wj, (size_t)wj * sizeof *out);
        return;
    }
    for (int64_t r = 0; r < wj; r++) /* block rows r of the output: column r of X_j */
        for (int64_t i = 0; i < n; i++) out[r * n + i] = C[i * wj + r];
}

static void split_worker(mu__pool *team, int rank, void *arg)
{
    split_job *jb = arg;
    const mu__split *s = jb->s;
    if (jb->post) {
        for (;;) {
            const long long t = atomic_fetch_add(&jb->next_post, 1);
            if (t >= s->p.S) break;
            post_stripe(s, jb->post, t);
        }
        mu__pool_sync(team, mu__pool_size(team));
    }
    if (!jb->op) return;
    for (;;) {
        const long long i = atomic_fetch_add(&jb->next, 1);
        if (i >= jb->items) break;
        switch (jb->op->kind) {
        case OP_PARTIALS: partials_item(jb, team, rank, s->b0 + i); break;
        case OP_COMBINE: combine_item(jb, rank, s->own[i]); break;
        case OP_SP: sp_item(jb, rank, s->g == 1 ? i : s->own[i]); break;
        case OP_NORMS: {
            const int64_t m = i / s->nb, j = s->b0 + i % s->nb;
            int64_t ld;
            const char *x = piece_block(s, jb->src + m * s->p.n * s->plen * (int64_t)split_es(&s->p), j, &ld);
            block_norm(&s->p, x, ld, block_width(&s->p, j), jb->bf16, jb->terms + 2 * i);
            break;
        }
        default: update_item(jb, rank, s->b0 + i); break;
        }
    }
}

/* A piece buffer of matrix i. */
static char *piece(const mu__split *s, int id)
{
    const int64_t bytes = s->p.n * s->plen * (int64_t)split_es(&s->p);
    char *out = s->out + s->i * bytes;
    switch (id) {
    case PIECE_X0: return (char *)s->x0;
    case PIECE_OUT: return out;
    case PIECE_XP0: return s->xp[0];
    case PIECE_XP1: return s->xp[1];
    default: return s->inplace ? s->xp[s->final_xp] : out;
    }
}

/* The norm terms of every own block of `matrices` matrices of pieces
 * from src into terms (matrix by matrix, 2 per block), on the team. */
void mu__split_run_norms(mu__split *s, const char *src, int64_t matrices, int bf16, double *terms)
{
    static const split_op norms = {.kind = OP_NORMS};
    split_job jb = {.s = s, .op = &norms, .items = matrices * s->nb, .src = src, .terms = terms,
                    .bf16 = bf16};
    atomic_init(&jb.next, 0);
    atomic_init(&jb.next_post, 0);
    atomic_init(&jb.summed, 0);
    const mu__pool_cfg cfg = mu__ns_pool_cfg(s->workers);
    mu__pool_run(&cfg, split_worker, &jb);
}

/* Run op (NULL: only the post) on the team, after the post of `post`. */
void mu__split_run_op(mu__split *s, const split_op *post, const split_op *op)
{
    split_job jb = {.s = s, .post = post, .op = op};
    atomic_init(&jb.next, 0);
    atomic_init(&jb.next_post, 0);
    atomic_init(&jb.summed, 0);
    if (op) {
        switch (op->kind) {
        case OP_PARTIALS: jb.items = s->nb; break;
        case OP_COMBINE: jb.items = s->g == 1 ? 0 : s->nown; break;
        case OP_SP: jb.items = s->g == 1 ? s->p.S : s->nown; break;
        default: jb.items = s->nb; break;
        }
        jb.src = piece(s, op->src);
        jb.dst = op->kind == OP_UPDATE ? piece(s, op->dst) : NULL;
        jb.alpha = op->scaled ? (op->kind == OP_PARTIALS ? s->xs * s->xs : s->xs) : 1.0;
    }
    const mu__pool_cfg cfg = mu__ns_pool_cfg(s->workers);
    mu__pool_run(&cfg, split_worker, &jb);
}
