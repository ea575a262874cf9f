/*
 * Gram Newton-Schulz in bfloat16 (mu_ns_opts.dtype = MU_BF16 with the Gram
 * method), as its authors run it in half precision (Dao AI Lab's
 * gram-newton-schulz; DeepSpeed in fp16): the input normalized in float32
 * and rounded once, then the iteration on the small n x n Gram matrix
 * R = X X^T (n <= m after the transpose), restarted at fixed steps.
 *
 * Every step of the standard iteration is X <- P X with P = a I + b R +
 * c R R a polynomial in R, so within a phase X_k = Q_k X_0 and
 * R_k = X_k X_k^T = P R_{k-1} P (all of R, P, Q, T below are polynomials
 * in R_0: symmetric, commuting). Per step, every product bfloat16 inputs
 * into float32 (oneDNN, src/dnnl.c):
 *     ZP    P = a I + b R + c bf16(R) bf16(R)     (no product when c = 0)
 *     QP    Q = bf16(Q) bf16(P)                    (the phase's first: Q = P)
 *     T     T = bf16(R) bf16(P)                    (not on a phase's last step)
 *     RPT   R = bf16(P) bf16(T)                    (idem)
 *     XQ    X = bf16(Q) X                          (a phase's last step)
 * and at a phase's start R = X X^T. R is kept in float32 (it enters P
 * elementwise); P, Q and T only as product inputs, in bfloat16. The n x n
 * products are symmetric: only their blocks on and above the diagonal are
 * computed (their float32 sums rounded once), then mirrored. A restart
 * materializes X = Q X (rounded to bfloat16) and recomputes R, so the
 * rounding R has picked up does not keep growing; the last phase writes
 * the float32 result.
 *
 * Guard: the result's Frobenius norm must be finite and within the band the
 * schedule's scalar map allows for the normalized input's norm (with
 * margins for bfloat16 rounding); otherwise the matrix is redone with the
 * standard bfloat16 iteration (src/ns_bf16.c) from the same normalized
 * input, serially by the worker that checked it.
 *
 * Tiles: the blocks of the standard bfloat16 plan (its nb x nb blocks of
 * n x n matrices, its column blocks of X), so the oneDNN primitives are
 * the same; the scheduler of src/ns.c runs them stage by stage (stages
 * below), and the bits depend on the shape, options and build only.
 */
#include "ns_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf(uint16_t h) { return mu__f32_from_bf16(h); }
static inline uint16_t rb(float f) { return mu__bf16_from_f32(f); }

/* ----------------------------------------------------------- the stages */

enum { G_R, G_ZP, G_QT, G_Q, G_T, G_RPT, G_XQ, G_GUARD };

typedef struct g16_step {
    int start, last; /* the step starts / ends a phase */
    int j;           /* steps since the phase's start */
    int nst;
    int stage[5], tiles[5];
} g16_step;

static int phase_start(uint64_t restarts, int k) { return k == 0 || (restarts >> k & 1); }

/* The stages of step k (k == steps: the guard) of a plan. */
static void g16_step_of(const mu__ns_plan *p, const mu_ns_opts *o, uint64_t restarts, int k, g16_step *s)
{
    const int tt = p->tn * (p->tn + 1) / 2;
    memset(s, 0, sizeof *s);
    if (k == o->steps) {
        s->stage[0] = G_GUARD;
        s->tiles[0] = 1;
        s->nst = 1;
        return;
    }
    s->start = phase_start(restarts, k);
    s->last = k + 1 == o->steps || phase_start(restarts, k + 1);
    int k0 = k;
    while (!phase_start(restarts, k0)) k0--;
    s->j = k - k0;
#define G_ADD(st, n)                                                                                \
    do {                                                                                            \
        s->stage[s->nst] = (st);                                                                    \
        s->tiles[s->nst++] = (n);                                                                   \
    } while (0)
    if (s->start) G_ADD(G_R, tt);
    G_ADD(G_ZP, tt);
    if (!s->start && !s->last) G_ADD(G_QT, 2 * tt);
    if (!s->start && s->last) G_ADD(G_Q, tt);
    if (s->start && !s->last) G_ADD(G_T, tt);
    if (!s->last) G_ADD(G_RPT, tt);
    if (s->last) G_ADD(G_XQ, p->tm);
#undef G_ADD
}

static int64_t step_tickets(const g16_step *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->nst; i++) n += s->tiles[i];
    return n;
}

int64_t mu__ns_gram16_tickets(const mu__ns_job *job)
{
    const uint64_t restarts = mu__ns_gram_restarts(job->opts->steps, MU_BF16);
    int64_t n = 0;
    for (int k = 0; k <= job->opts->steps; k++) {
        g16_step s;
        g16_step_of(&job->plan, job->opts, restarts, k, &s);
        n += step_tickets(&s);
    }
    return n;
}

/* Ticket u (0-based, after the prologue) -> its step, stage (index into
 * s->stage) and tile; *first: the stage's first ticket. */
static void g16_locate(const mu__ns_job *job, int64_t u, int *k, g16_step *s, int *si, int *t,
                       int64_t *first)
{
    const uint64_t restarts = mu__ns_gram_restarts(job->opts->steps, MU_BF16);
    int64_t at = 0;
    for (*k = 0; *k <= job->opts->steps; (*k)++) {
        g16_step_of(&job->plan, job->opts, restarts, *k, s);
        const int64_t n = step_tickets(s);
        if (u < at + n) break;
        at += n;
    }
    for (*si = 0; u >= at + s->tiles[*si]; (*si)++) at += s->tiles[*si];
    *t = (int)(u - at);
    *first = at;
}

void mu__ns_gram16_stage(const mu__ns_job *job, int64_t u, int64_t *first, int *count)
{
    int k, si, t;
    g16_step s;
    g16_locate(job, u, &k, &s, &si, &t, first);
    *count = s.tiles[si];
}

/* ---------------------------------------------------------------- bufs */

/* The slot's buffers: X (n x m bfloat16) and X0 (its normalized input, for
 * the guard's fallback) in x; F (float32 n x n products) in a; R (float32)
 * in b; Rb, Pb, Qb[2], Tb (bfloat16 n x n) and Y (float32 n x m products
 * of XQ) in g (mu__ns_slot_gram). */
typedef struct g16_bufs {
    uint16_t *X, *X0, *Rb, *Pb, *Qb[2], *Tb;
    float *F, *R, *Y;
} g16_bufs;

static void g16_bufs_of(const mu__ns_iter *it, g16_bufs *b)
{
    const int64_t n = it->job->plan.n, m = it->job->plan.m;
    b->X = (uint16_t *)it->s->x;
    b->X0 = b->X + n * m;
    b->F = (float *)it->s->a;
    b->R = (float *)it->s->b;
    uint16_t *g = (uint16_t *)it->s->g;
    b->Rb = g;
    b->Pb = g + n * n;
    b->Qb[0] = g + 2 * n * n;
    b->Qb[1] = g + 3 * n * n;
    b->Tb = g + 4 * n * n;
    b->Y = (float *)((char *)g + ((10 * n * n + 63) & ~(int64_t)63)); /* cache-line aligned */
}

/* ------------------------------------------------------------ prologue */

/* X = bf16(scale x) in float32 (scale in double: no under- or overflow at
 * any scale), transposed when tall, and its copy X0; the normalized
 * norm (its singular values' bound) kept for the guard. */
void mu__ns_gram16_begin(mu__ns_iter *it, const char *src, double norm)
{
    const mu__ns_job *job = it->job;
    const mu__ns_plan *p = &job->plan;
    const mu_ns_opts *o = job->opts;
    const float *x = (const float *)src;
    const int64_t n = p->n, m = p->m;
    const double scale = 1.0 / (o->norm_scale * norm + o->eps);
    g16_bufs b;
    g16_bufs_of(it, &b);
    if (!p->tall) {
        for (int64_t i = 0; i < n * m; i++) b.X[i] = rb((float)(scale * x[i]));
    } else { /* x is m x n: X[i][j] = x[j][i] */
        MU__NS_BLOCKED(n, 0, m, b.X[i * m + j] = rb((float)(scale * x[j * n + i])));
    }
    memcpy(b.X0, b.X, (size_t)(n * m) * sizeof(uint16_t));
    it->xs0 = norm * scale;
    it->done = 0;
}

/* ---------------------------------------------------------------- tiles */

static void g16_guard(const mu__ns_iter *it, int w);

/* Product of a tile of the n x n blocks: F block (or dst at its block) =
 * A[r0:r1, :] B[c0:c1, :]^T, inner dimension K (ld K). */
static void g16_nn(mu__dnnl *d, int w, const mu__ns_plan *p, int t, int stage, const uint16_t *A,
                   const uint16_t *B, float *dst, const mu__ns_rect *rr)
{
    mu__dnnl_shape sh;
    mu__ns_bf16_shape(p, stage, t, &sh);
    mu__dnnl_gemm(d, w, &sh, A + (int64_t)rr->r0 * sh.K, B + (int64_t)rr->c0 * sh.K,
                  dst + (int64_t)rr->r0 * p->n + rr->c0);
}

/* bf16(v) of the block's stored-triangle positions (c >= r on a diagonal
 * block) into M, then mirrored. */
static void g16_round(uint16_t *M, const float *v, int64_t n, const mu__ns_rect *rr)
{
    for (int64_t r = rr->r0; r < rr->r1; r++) {
        const int64_t c0 = rr->c0 > r ? rr->c0 : r;
        if (rr->c1 > c0) mu__ns_bf16_round(M + r * n + c0, v + r * n + c0, rr->c1 - c0);
    }
    mu__ns_bf16_mirror(M, n, rr);
}

/* Tile u of a matrix's work after its prologue, on worker w. */
void mu__ns_gram16_tile(const mu__ns_iter *it, int64_t u, int w)
{
    const mu__ns_job *job = it->job;
    const mu__ns_plan *p = &job->plan;
    const mu_ns_opts *o = job->opts;
    const int64_t n = p->n, m = p->m;
    int k, si, t;
    int64_t first;
    g16_step s;
    g16_locate(job, u, &k, &s, &si, &t, &first);
    g16_bufs b;
    g16_bufs_of(it, &b);
    const int stage = s.stage[si];
    if (stage == G_GUARD) {
        g16_guard(it, w);
        return;
    }
    const double *co = o->coeffs + 3 * k;
    /* Q: the phase's first step writes Qb[0]; step j >= 1 reads Qb[(j-1)%2]
     * and writes Qb[j%2] */
    uint16_t *Qin = b.Qb[(s.j + 1) % 2], *Qout = b.Qb[s.j % 2];
    mu__ns_rect rr;
    if (stage == G_XQ) { /* Y[:, j0:j1] = Qb X[:, j0:j1]; X = bf16(Y) or the output */
        mu__dnnl_shape sh;
        mu__ns_bf16_shape(p, MU__NS_APPLY, t, &sh);
        sh.ldc = m; /* Y is laid out as X */
        const int64_t j0 = (int64_t)t * p->mb, nj = sh.N;
        mu__dnnl_gemm(job->dnnl, w, &sh, Qout, b.X + j0, b.Y + j0);
        if (k + 1 < o->steps) {
            for (int64_t i = 0; i < n; i++) mu__ns_bf16_round(b.X + i * m + j0, b.Y + i * m + j0, nj);
        } else if (!p->tall) {
            float *out = (float *)it->dst;
            for (int64_t i = 0; i < n; i++) memcpy(out + i * m + j0, b.Y + i * m + j0, (size_t)nj * sizeof(float));
        } else { /* out (m x n) rows j0:j1 = Y[:, j0:j1]^T */
            float *out = (float *)it->dst;
            MU__NS_BLOCKED(n, j0, j0 + nj, out[j * n + i] = b.Y[i * m + j]);
        }
        return;
    }
    int tt = t;
    const int tri = p->tn * (p->tn + 1) / 2;
    int second = 0; /* G_QT: tiles [0, tri) are Q's, [tri, 2 tri) T's */
    if (stage == G_QT && tt >= tri) {
        tt -= tri;
        second = 1;
    }
    mu__ns_tri_rect(p, tt, &rr);
    switch (stage) {
    case G_R: /* R = X X^T into the float32 R, and Rb */
        g16_nn(job->dnnl, w, p, tt, MU__NS_GRAM_A, b.X, b.X, b.R, &rr);
        g16_round(b.Rb, b.R, n, &rr);
        return;
    case G_ZP: { /* P = a I + b R + c Rb Rb (F: the product) */
        const int prod = co[2] != 0.0;
        if (prod) g16_nn(job->dnnl, w, p, tt, MU__NS_GRAM_B, b.Rb, b.Rb, b.F, &rr);
        const float a = (float)co[0], bc = (float)co[1], cc = (float)co[2];
        for (int64_t r = rr.r0; r < rr.r1; r++) {
            const int64_t c0 = rr.c0 > r ? rr.c0 : r;
            for (int64_t c = c0; c < rr.c1; c++) {
                float v = bc * b.R[r * n + c];
                if (prod) v += cc * b.F[r * n + c];
                if (c == r) v += a;
                b.Pb[r * n + c] = rb(v);
            }
        }
        mu__ns_bf16_mirror(b.Pb, n, &rr);
        if (s.start) { /* Q = P */
            for (int64_t r = rr.r0; r < rr.r1; r++) {
                const int64_t c0 = rr.c0 > r ? rr.c0 : r;
                if (rr.c1 > c0) memcpy(Qout + r * n + c0, b.Pb + r * n + c0, (size_t)(rr.c1 - c0) * 2);
            }
            mu__ns_bf16_mirror(Qout, n, &rr);
        }
        return;
    }
    case G_Q:
    case G_QT:
    case G_T:
        if (stage != G_T && !second) { /* Q = Qb Pb */
            g16_nn(job->dnnl, w, p, tt, MU__NS_GRAM_B, Qin, b.Pb, b.F, &rr);
            g16_round(Qout, b.F, n, &rr);
        } else { /* T = Rb Pb (its float32 product in R, free until RPT) */
            g16_nn(job->dnnl, w, p, tt, MU__NS_GRAM_B, b.Rb, b.Pb, b.R, &rr);
            g16_round(b.Tb, b.R, n, &rr);
        }
        return;
    default: /* G_RPT: R = Pb Tb, and Rb */
        g16_nn(job->dnnl, w, p, tt, MU__NS_GRAM_B, b.Pb, b.Tb, b.R, &rr);
        g16_round(b.Rb, b.R, n, &rr);
        return;
    }
}

/* ---------------------------------------------------------------- guard */

/* The last ticket: ||output||_F in the band for the normalized input's
 * norm, else the standard bfloat16 iteration from X0 on this worker. */
static void g16_guard(const mu__ns_iter *it, int w)
{
    const mu__ns_job *job = it->job;
    const mu__ns_plan *p = &job->plan;
    const int64_t n = p->n, m = p->m;
    double lo, hi, got = 0.0;
    mu__ns_gram_band(job->opts, n, it->xs0, 1.2, 0.25, &lo, &hi);
    const int ok = mu__ns_norm(MU_F32, it->dst, n * m, &got) && got <= hi && got >= lo && !mu__ns_gram_guard_forced();
    if (ok) return;
    mu__ns_job std = *job;
    mu__ns_plan_init(&std.plan, MU_F32, job->rows, job->cols, MU_NS_SYMMETRIC, 1);
    mu__ns_iter si = *it;
    si.job = &std;
    g16_bufs b;
    g16_bufs_of(it, &b);
    memcpy(b.X, b.X0, (size_t)(n * m) * sizeof(uint16_t)); /* X: the standard plan's iterate */
    const int64_t tiles = (int64_t)job->opts->steps * std.plan.nx;
    for (int64_t u = 0; u < tiles; u++) {
        const int k = (int)(u / std.plan.nx);
        int t = (int)(u % std.plan.nx), st = 0;
        while (t >= std.plan.tiles[st]) t -= std.plan.tiles[st++];
        mu__ns_bf16_tile(&si, k, st, t, w);
    }
}

/* ------------------------------------------------------------ cost, dnnl */

double mu__ns_gram16_flops(const mu__ns_plan *p, const mu_ns_opts *o)
{
    const uint64_t restarts = mu__ns_gram_restarts(o->steps, MU_BF16);
    double f = 0, nn = 0, xx = 0, xq = 0;
    for (int t = 0; t < p->tn * (p->tn + 1) / 2; t++) {
        mu__dnnl_shape a, g;
        mu__ns_bf16_shape(p, MU__NS_GRAM_A, t, &a);
        mu__ns_bf16_shape(p, MU__NS_GRAM_B, t, &g);
        xx += 2.0 * (double)a.M * (double)a.N * (double)a.K;
        nn += 2.0 * (double)g.M * (double)g.N * (double)g.K;
    }
    for (int t = 0; t < p->tm; t++) {
        mu__dnnl_shape a;
        mu__ns_bf16_shape(p, MU__NS_APPLY, t, &a);
        xq += 2.0 * (double)a.M * (double)a.N * (double)a.K;
    }
    for (int k = 0; k < o->steps; k++) {
        g16_step s;
        g16_step_of(p, o, restarts, k, &s);
        for (int i = 0; i < s.nst; i++) {
            switch (s.stage[i]) {
            case G_R: f += xx; break;
            case G_ZP: f += o->coeffs[3 * k + 2] != 0.0 ? nn : 0; break;
            case G_QT: f += 2 * nn; break;
            case G_XQ: f += xq; break;
            default: f += nn; break; /* G_Q, G_T, G_RPT */
            }
        }
    }
    return f;
}

int mu__ns_gram16_want(const mu__ns_job *job, mu__dnnl *d)
{
    /* its products have the standard plan's shapes (XQ with Y's leading
     * dimension); the guard's fallback needs those of the standard plan */
    mu__ns_plan std;
    mu__ns_plan_init(&std, MU_F32, job->rows, job->cols, MU_NS_SYMMETRIC, 1);
    int rc = mu__ns_bf16_want(&std, d);
    for (int t = 0; rc == MU_OK && t < job->plan.tm; t++) {
        mu__dnnl_shape sh;
        mu__ns_bf16_shape(&job->plan, MU__NS_APPLY, t, &sh);
        sh.ldc = job->plan.m;
        rc = mu__dnnl_want(d, &sh);
    }
    return rc;
}
