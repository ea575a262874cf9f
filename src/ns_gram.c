/*
 * Gram Newton-Schulz: the seed's iteration run on the small n x n Gram
 * matrix R = X X^T instead of the n x m X (n <= m after the transpose
 * trick of src/ns.c).
 *
 * Every step of the standard iteration is X <- p(X X^T) X with
 * p(R) = a I + b R + c R^2, so after k steps X_k = Q_k X_0, where Q_k is a
 * polynomial in R_0 (symmetric, commuting with R_0). Per step:
 *     P = a I + b R + c R R          syrk, n^3 flops
 *     Q <- P Q                       symm, 2 n^3 (the first step: Q = P)
 *     R <- (P P) R                   syrk + symm, 3 n^3 (R_k = X_k X_k^T)
 * and at the end X = Q X_0: one n x n times n x m product. A restart
 * materializes X = Q X_0 and recomputes R = X X^T (Q = I), so the float32
 * error R has picked up does not keep growing; the last step of a phase
 * does not update R. Cost with s steps and r restarts (syrk counted at
 * its n^2 k flops):
 *     gram     = 3 (r + 1) n^2 m + (6 s - 5 (r + 1)) n^3
 *     standard = s (3 n^2 m + n^3)
 * e.g. s = 5, r = 1 at 1024 x 4096: 44 n^3 against 65 n^3.
 *
 * Guard: the result's Frobenius norm must be finite and within the band
 * the scalar map of the schedule allows (see mu__ns_gram_band); otherwise that
 * matrix is redone with the standard iteration.
 *
 * Reproducible bits, as in src/ns.c: every product is a fixed list of
 * single-threaded BLAS calls chosen from (dtype, rows, cols, restarts)
 * only, so the result does not depend on the worker count, the batch or
 * in place. A matrix with n >= GRAM_SPLIT_MIN (512) splits every product in two
 * tiles (the Gram products in two halves of their inner dimension, summed
 * afterwards; the others in two column blocks) for two workers; smaller
 * matrices make one call per product.
 */
#include "ns_internal.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* n from which a matrix's products are split in two tiles. Lower than the
 * standard iteration's 1024: measured (SkylakeX, gram alone, 2 workers) a
 * lone 512x2048 takes 16.9 ms split vs 28.5 whole, 768x3072 56.5 vs 93.7,
 * while batches, which run whole matrices per worker either way, pay for
 * the split calls: 6 x 768x3072 295 vs 285 ms, 4 x 512x2048 60.3 vs 58.6. */
enum { GRAM_SPLIT_MIN = 512, GRAM_ALIGN = 16, GRAM_NBUF = 5 };

/* Batches of matrices up to this many elements run whole matrices per
 * worker (as src/ns.c's MU__NS_BATCH_PAR_MAX). */
#define GRAM_BATCH_PAR_MAX (1024 * 4096)

/* Restarts (src/ns_internal.h), chosen from the accuracy measurements in
 * the README: float32 in the middle of the schedule (before step 3 of 5,
 * every 3 steps for longer ones); bfloat16 before step 2 and every 2 steps
 * (its rounding grows in R faster). */
uint64_t mu__ns_gram_restarts(int steps, int dtype)
{
    const int bf16 = dtype == MU_BF16, every = bf16 ? 2 : 3;
    /* measurement knobs: "2,4" or "none" */
    const char *env = getenv(bf16 ? "MU_NS_GRAM16_RESTARTS" : "MU_NS_GRAM_RESTARTS");
    uint64_t mask = 0;
    if (env && *env) {
        if (strcmp(env, "none") == 0) return 0;
        for (const char *p = env; *p;) {
            char *end;
            long k = strtol(p, &end, 10);
            if (end == p) break;
            if (k > 0 && k < steps && k < 64) mask |= (uint64_t)1 << k;
            p = *end ? end + 1 : end;
        }
        return mask;
    }
    for (int k = every; k < steps && k < 64; k += every) mask |= (uint64_t)1 << k;
    return mask;
}

/* ------------------------------------------------------------- the plan */

typedef struct gram_plan {
    int dt;
    const mu_ns_opts *opts;
    int64_t rows, cols;
    enum CBLAS_ORDER lo; /* RowMajor, or ColMajor for tall inputs (see src/ns.c) */
    enum CBLAS_UPLO up;
    int n, m, ldx;
    int split;  /* products in two tiles */
    int nh, mh; /* column split of n x n and n x m products */
    int band;   /* row split of the elementwise passes (equal triangle areas) */
    uint64_t restarts;
    double band_lo, band_hi; /* guard: expected range of ||result||_F */
} gram_plan;

static int round_up(int64_t v) { return (int)((v + GRAM_ALIGN - 1) / GRAM_ALIGN * GRAM_ALIGN); }

/* The schedule's scalar map on one singular value. */
static double gram_map(const mu_ns_opts *o, double s)
{
    for (int k = 0; k < o->steps; k++) {
        const double *c = o->coeffs + 3 * k, s2 = s * s;
        s = s * (c[0] + c[1] * s2 + c[2] * s2 * s2);
    }
    return s;
}

void mu__ns_gram_band(const mu_ns_opts *o, int64_t n, double top, double hi_margin, double lo_margin,
                      double *lo, double *hi)
{
    const double low = top / sqrt((double)n);
    double h = 0.0, l = INFINITY;
    enum { SAMPLES = 2048 };
    for (int i = 0; i <= SAMPLES; i++) {
        const double s = top * i / SAMPLES, g = fabs(gram_map(o, s));
        h = fmax(h, g);
        if (s >= 0.99 * low) l = fmin(l, g);
    }
    l = fmin(l, fabs(gram_map(o, 0.99 * low)));
    *hi = hi_margin * sqrt((double)n) * h + 1e-6;
    *lo = lo_margin * l;
}

void mu__ns_gram_band_f32(const mu_ns_opts *o, int64_t n, double *lo, double *hi)
{
    mu__ns_gram_band(o, n, 1.0 / o->norm_scale, 1.05, 0.5, lo, hi);
}

static void gram_plan_init(gram_plan *p, int dt, int64_t rows, int64_t cols, const mu_ns_opts *opts)
{
    const int tall = rows > cols;
    memset(p, 0, sizeof *p);
    p->dt = dt;
    p->opts = opts;
    p->rows = rows;
    p->cols = cols;
    p->lo = tall ? CblasColMajor : CblasRowMajor;
    p->up = tall ? CblasLower : CblasUpper;
    p->n = (int)(tall ? cols : rows);
    p->m = (int)(tall ? rows : cols);
    p->ldx = tall ? p->n : p->m;
    p->split = p->n >= GRAM_SPLIT_MIN;
    p->nh = p->split ? round_up((p->n + 1) / 2) : p->n;
    p->mh = p->split ? round_up((p->m + 1) / 2) : p->m;
    /* rows [0, band) of the upper triangle hold half its elements */
    p->band = p->split ? round_up((int64_t)(p->n * (1.0 - sqrt(0.5)))) : p->n;
    p->restarts = mu__ns_gram_restarts(opts->steps, MU_F32);
    mu__ns_gram_band_f32(opts, p->n, &p->band_lo, &p->band_hi);
}

/* ---------------------------------------------------------------- team */

/* The workers sharing one matrix (ranks 0 .. size-1 of a src/pool.c team):
 * every one runs the same control flow; tile t of a product runs on rank
 * t % size, and a barrier ends each product and pass. */
typedef struct gram_ctx {
    mu__pool *team; /* NULL: one worker */
    int rank, size;
    atomic_int *verdict; /* the guard's decision, written by rank 0 */
} gram_ctx;

static int mine(const gram_ctx *c, int t) { return !c->team || t % c->size == c->rank; }

static void sync_team(const gram_ctx *c)
{
    if (c->team) mu__pool_sync(c->team, c->size);
}

/* ------------------------------------------------------------ products */

static int64_t col_off(const gram_plan *p, int64_t j, int ld)
{
    return p->lo == CblasRowMajor ? j : j * ld;
}

static char *at(const gram_plan *p, const void *base, int64_t j, int ld)
{
    return (char *)base + col_off(p, j, ld) * (int64_t)mu_dtype_size(p->dt);
}

/* C = alpha X X^T + beta C for X n x k (ld ldp): split, the first half of
 * k into C with beta and the second into C2 with beta 0. */
static void gram_syrk(const gram_plan *p, const gram_ctx *c, const void *x, int ldp, int k,
                      double alpha, double beta, void *C, void *C2)
{
    const int h = p->split ? (round_up((k + 1) / 2) < k ? round_up((k + 1) / 2) : k) : k;
    for (int t = 0; t < (p->split ? 2 : 1); t++) {
        if (!mine(c, t)) continue;
        const int k0 = t == 0 ? 0 : h, kk = t == 0 ? h : k - h;
        void *dst = t == 0 ? C : C2;
        const double bt = t == 0 ? beta : 0.0;
        if (p->dt == MU_F32)
            cblas_ssyrk(p->lo, p->up, CblasNoTrans, p->n, kk, (float)alpha,
                        (const float *)at(p, x, k0, ldp), ldp, (float)bt, dst, p->n);
        else
            cblas_dsyrk(p->lo, p->up, CblasNoTrans, p->n, kk, alpha,
                        (const double *)at(p, x, k0, ldp), ldp, bt, dst, p->n);
    }
    sync_team(c);
}

/* Y = alpha S B for S n x n (symmetric: its stored triangle; else a general
 * matrix) and B n x w (ld ldb), in two column blocks when split. */
static void gram_apply(const gram_plan *p, const gram_ctx *c, int sym, const void *S, const void *B,
                       int ldb, int w, double alpha, void *Y, int ldy)
{
    const int half = w == p->m ? p->mh : p->nh;
    for (int t = 0; t < (p->split ? 2 : 1); t++) {
        if (!mine(c, t)) continue;
        const int j0 = t == 0 ? 0 : half, nj = p->split ? (t == 0 ? half : w - half) : w;
        if (nj <= 0) continue;
        const void *b = at(p, B, j0, ldb);
        void *y = at(p, Y, j0, ldy);
        if (p->dt == MU_F32) {
            if (sym)
                cblas_ssymm(p->lo, CblasLeft, p->up, p->n, nj, (float)alpha, S, p->n, b, ldb, 0.0f,
                            y, ldy);
            else
                cblas_sgemm(p->lo, CblasNoTrans, CblasNoTrans, p->n, nj, p->n, (float)alpha, S,
                            p->n, b, ldb, 0.0f, y, ldy);
        } else {
            if (sym)
                cblas_dsymm(p->lo, CblasLeft, p->up, p->n, nj, alpha, S, p->n, b, ldb, 0.0, y, ldy);
            else
                cblas_dgemm(p->lo, CblasNoTrans, CblasNoTrans, p->n, nj, p->n, alpha, S, p->n, b,
                            ldb, 0.0, y, ldy);
        }
    }
    sync_team(c);
}

/* A (+= B when sum) mirrored, B = bcoef A, then A += diag I: in two row
 * bands of equal triangle area when split. */
static void gram_prep(const gram_plan *p, const gram_ctx *c, void *A, void *B, int sum,
                      double bcoef, double diag)
{
    for (int t = 0; t < (p->split ? 2 : 1); t++) {
        if (!mine(c, t)) continue;
        const int r0 = t == 0 ? 0 : p->band, r1 = t == 0 ? p->band : p->n;
        mu__ns_prep(p->dt, A, B, p->n, r0, r1, sum, bcoef);
        if (diag != 0.0) mu__ns_add_diag(p->dt, A, p->n, r0, r1, diag);
    }
    sync_team(c);
}

/* A += B on the stored triangle (the halves of a split Gram product). */
static void gram_sum(const gram_plan *p, const gram_ctx *c, void *A, const void *B)
{
    for (int t = 0; t < 2; t++)
        if (mine(c, t))
            mu__ns_accumulate(p->dt, A, B, p->n, t == 0 ? 0 : p->band, t == 0 ? p->band : p->n);
    sync_team(c);
}

/* ------------------------------------------------------------ one matrix */

typedef struct gram_bufs {
    void *nn[GRAM_NBUF]; /* n x n */
    void *x[2];          /* n x m: restart iterates / the in-place result */
} gram_bufs;

static int gram_slot_bufs(mu_ns_workspace *ws, mu__ns_slot *s, gram_bufs *b)
{
    const size_t es = mu_dtype_size(ws->dtype);
    const int64_t nn = ws->cap_nn > 0 ? ws->cap_nn : 1;
    const int rc = mu__ns_slot_gram(ws, s);
    if (rc != MU_OK) return rc;
    char *g = s->g;
    b->nn[0] = s->a;
    b->nn[1] = s->b;
    b->nn[2] = g;
    b->nn[3] = g + nn * (int64_t)es;
    b->nn[4] = g + 2 * nn * (int64_t)es;
    b->x[0] = s->x;
    b->x[1] = g + 3 * nn * (int64_t)es;
    return MU_OK;
}

/* Buffer pool: which n x n buffers are free (the same choices on every rank).
 */
typedef struct gram_pool {
    void *const *buf;
    int used[GRAM_NBUF];
} gram_pool;

static void *take(gram_pool *pl)
{
    for (int i = 0; i < GRAM_NBUF; i++)
        if (!pl->used[i]) {
            pl->used[i] = 1;
            return pl->buf[i];
        }
    return NULL; /* not reached: at most GRAM_NBUF are live */
}

static void give(gram_pool *pl, const void *b)
{
    for (int i = 0; i < GRAM_NBUF; i++)
        if (pl->buf[i] == b) pl->used[i] = 0;
}

/* Test knob: MU_NS_GRAM_GUARD=fail makes the guard reject every result. */
int mu__ns_gram_guard_forced(void)
{
    const char *e = getenv("MU_NS_GRAM_GUARD");
    return e && strcmp(e, "fail") == 0;
}

/* The Gram iteration on one matrix src -> dst (may alias); norm = ||src||_F.
 * With a team, every rank calls it. Returns 1 if the guard sent it to the
 * standard iteration. */
static int gram_one(const gram_plan *p, const gram_ctx *c, const gram_bufs *gb,
                    const mu__ns_slot *slot, const void *src, void *dst, double norm)
{
    const mu_ns_opts *o = p->opts;
    const int dt = p->dt, n = p->n, m = p->m, ldx = p->ldx;
    const size_t es = mu_dtype_size(dt);
    const int64_t len = (int64_t)n * m;
    const int inplace = src == dst;
    const double scale = 1.0 / (o->norm_scale * norm + o->eps);
    const double lim = dt == MU_F32 ? 0x1p40 : 0x1p400;
    int fallback = norm == 0.0 || o->steps == 0 || !(norm <= lim && norm >= 1.0 / lim);

    if (!fallback) {
        gram_pool pl = {.buf = gb->nn};
        const void *base = src; /* X of the current phase */
        double xs = scale;      /* its pending scale */
        int nx = 0;             /* next n x m buffer for a restart */
        void *R = NULL, *P = NULL, *Q = NULL;
        for (int k = 0; k < o->steps; k++) {
            const double *co = o->coeffs + 3 * k;
            if (k == 0 || (p->restarts >> k & 1)) { /* phase start: R = xs^2 X X^T, P = b R */
                R = take(&pl);
                P = take(&pl);
                gram_syrk(p, c, base, ldx, m, xs * xs, 0.0, R, P);
                gram_prep(p, c, R, P, p->split, co[1], 0.0);
            }
            /* P = c R R + b R + a I (the second half of the syrk into T) */
            void *T = take(&pl);
            gram_syrk(p, c, R, n, n, co[2], 1.0, P, T);
            gram_prep(p, c, P, T, p->split, 0.0, co[0]);
            give(&pl, T);
            if (!Q) {
                Q = P;
            } else { /* Q = P Q */
                void *Qn = take(&pl);
                gram_apply(p, c, 1, P, Q, n, n, 1.0, Qn, n);
                give(&pl, Q);
                Q = Qn;
            }
            const int last = k + 1 == o->steps || (p->restarts >> (k + 1) & 1);
            if (!last) { /* R = (P P) R, then the next step's P = b' R */
                void *F1 = take(&pl), *F2 = take(&pl);
                gram_syrk(p, c, P, n, n, 1.0, 0.0, F1, F2);
                if (p->split) gram_sum(p, c, F1, F2); /* symm reads the stored triangle only */
                gram_apply(p, c, 1, F1, R, n, n, 1.0, F2, n);
                give(&pl, F1);
                give(&pl, R);
                if (P != Q) give(&pl, P);
                R = F2;
                P = take(&pl);
                gram_prep(p, c, R, P, 0, co[4], 0.0);
                continue;
            }
            /* phase end: X = xs Q base, into a restart buffer or the result */
            void *y;
            if (k + 1 < o->steps) {
                y = gb->x[nx];
                nx ^= 1;
            } else {
                y = inplace ? gb->x[nx] : dst;
            }
            gram_apply(p, c, 0, Q, base, ldx, m, xs, y, ldx);
            give(&pl, R);
            give(&pl, Q);
            if (P != Q) give(&pl, P);
            R = P = Q = NULL;
            base = y;
            xs = 1.0;
        }
        /* guard (rank 0 decides for the team) */
        if (!c->team || c->rank == 0) {
            double got = 0.0;
            int ok = mu__ns_norm(dt, base, len, &got) && got <= p->band_hi && got >= p->band_lo &&
                     !mu__ns_gram_guard_forced();
            if (c->team) atomic_store(c->verdict, ok);
            fallback = !ok;
        }
        sync_team(c);
        if (c->team) fallback = !atomic_load(c->verdict);
        if (!fallback && inplace && (!c->team || c->rank == 0)) memcpy(dst, base, (size_t)len * es);
    }
    if (fallback && (!c->team || c->rank == 0))
        mu__ns_standard_one(o, dt, p->rows, p->cols, src, dst, norm, slot);
    sync_team(c);
    return fallback;
}

/* ---------------------------------------------------------------- batch
 *
 * As src/ns.c: batches of small matrices run whole matrices per worker
 * (head); a lone split matrix and the last batch % workers of a split
 * batch run on a team of two (tail), on slot 0. */

typedef struct gram_run {
    const mu__ns_batch *b;
    const gram_plan *plan;
    gram_bufs bufs[MU__NS_MAX_SLOTS];
    int64_t head;
    atomic_llong next;
    int team; /* workers sharing a tail matrix (at most the pool's size) */
    atomic_int verdict;
} gram_run;

static double norm_of(const mu__ns_batch *b, int64_t i, const void *src, int64_t len)
{
    double v = 0.0;
    if (b->norms) return b->norms[i];
    mu__ns_norm(b->dt, src, len, &v);
    return v;
}

static void gram_worker(mu__pool *pool, int rank, void *arg)
{
    gram_run *r = arg;
    const mu__ns_batch *b = r->b;
    const int64_t len = b->rows * b->cols;
    const int64_t bytes = len * (int64_t)mu_dtype_size(b->dt);
    const gram_ctx solo = {NULL, 0, 1, NULL};
    for (;;) {
        long long i = atomic_fetch_add(&r->next, 1);
        if (i >= r->head) break;
        const char *src = b->in + i * bytes;
        gram_one(r->plan, &solo, &r->bufs[rank], &b->ws->slot[rank], src, b->out + i * bytes,
                 norm_of(b, i, src, len));
    }
    if (r->head == b->batch) return;
    const int size = r->team < mu__pool_size(pool) ? r->team : mu__pool_size(pool);
    if (rank >= size) return;
    const gram_ctx c = {size > 1 ? pool : NULL, rank, size, &r->verdict};
    sync_team(&c); /* slot 0 is free once rank 0 left the head */
    for (int64_t i = r->head; i < b->batch; i++) {
        const char *src = b->in + i * bytes;
        gram_one(r->plan, &c, &r->bufs[0], &b->ws->slot[0], src, b->out + i * bytes,
                 norm_of(b, i, src, len));
    }
}

int mu__ns_gram_batch(const mu__ns_batch *b)
{
    gram_plan plan;
    gram_plan_init(&plan, b->dt, b->rows, b->cols, b->opts);
    const int64_t len = b->rows * b->cols;
    int threads = b->threads < 1 ? 1 : b->threads;
    if (threads > MU__NS_MAX_SLOTS) threads = MU__NS_MAX_SLOTS;
    int64_t head = 0;
    int team = plan.split && threads > 1 ? 2 : 1;
    if (threads > 1 && b->batch > 1 && len <= GRAM_BATCH_PAR_MAX) {
        int per = threads < b->batch ? threads : (int)b->batch;
        per = mu__ns_slots(b->ws, per);
        if (per > 1) {
            threads = per;
            head = plan.split ? b->batch - b->batch % per : b->batch;
        }
    }
    if (head == 0) threads = team;
    if (team > threads) team = threads;

    gram_run r = {.b = b, .plan = &plan, .head = head, .team = team};
    atomic_init(&r.next, 0);
    atomic_init(&r.verdict, 0);
    for (int t = 0; t < (head > 0 ? threads : 1); t++) {
        int rc = gram_slot_bufs(b->ws, &b->ws->slot[t], &r.bufs[t]);
        if (rc != MU_OK) return rc;
    }
    const int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    const mu__pool_cfg cfg = mu__ns_pool_cfg(threads);
    mu__pool_run(&cfg, gram_worker, &r);
    if (saved != 1) openblas_set_num_threads(saved);
    return MU_OK;
}
