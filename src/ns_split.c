/*
 * Split Newton-Schulz: the blocked iteration, whose bits do not depend on
 * how many ranks share it (the plan and the sum orders: src/muon.h,
 * "split Newton-Schulz").
 *
 * With n <= m after the transpose trick of src/ns.c, a matrix whose long
 * side m reaches SPLIT_LONG is cut along m into k blocks of SPLIT_BLOCK
 * (the last shorter). The standard iteration, per step (a, b, c):
 *     P_j = s^2 X_j X_j^T            one syrk per block (k = its width)
 *     A   = ((P_1 + P_2) + ...) + P_k  elementwise, in block order
 *     B   = b A + c A A + a I        stripe by stripe (below)
 *     X_j <- s B X_j                 one symm per block
 * (s: the normalization, folded into the first step as in src/ns.c). The
 * n x n side is cut into row stripes [r0, r1) of SPLIT_STRIPE rows; stripe
 * r0 of a product C = alpha L M is the one gemm C[r0:r1, r0:n] =
 * alpha L[r0:r1, :] M[:, r0:n] (+ beta C), the upper trapezoid: every
 * symmetric n x n matrix is kept as its upper triangle (memory r*n + c,
 * c >= r, whichever the layout) and mirrored when a product reads it
 * whole. The Gram iteration (src/ns_gram.c's polynomial on R = X X^T,
 * restarts, guard) forms R the same way and runs its n x n products (P =
 * c R R + b R + a I, Q = P Q, F = P P, R = F R) as such stripes; its
 * products are kept symmetric (upper trapezoid, mirrored), so its bits are
 * its own. The bfloat16 iteration (mu_ns_opts.dtype = MU_BF16) rounds
 * where src/ns_bf16.c's does, with its rows and coefficients: P_j in
 * float32 (oneDNN tiles of the stripe grid), A = bf16(sum) once, B in
 * tiles (b' A alone when c' = 0), X_j in bfloat16. The Gram iteration in
 * bfloat16 (src/ns_gram_bf16.c) has no blocked form: its shapes keep one
 * block (split_plan_method).
 *
 * One machine per rank runs the phases of a call (mu__split_next); the
 * exchanges between phases are the driver's: one process (g = 1) has none
 * (its partial products are added to A as they come, in block order), the
 * tests' virtual ranks copy in memory, mu__split_run uses a mu_comm. Each
 * phase spreads its items (blocks, stripes) over the worker team; the bits
 * do not depend on the team either.
 *
 * Exchanges of rank r in a group of g (es: element bytes; T = n (n + 1) / 2
 * the triangle, T_q the triangle elements of rank q's stripes, nb_q its
 * blocks):
 *   head     all-gather, 2 doubles per rank (status, batch), once per call
 *   norms    all-gather, 2 doubles per block and matrix, once per call
 *   partials all-to-all: block j's part of stripe s to s's owner, T_q per
 *            block to rank q (sends nb_r (T - T_r), receives (k - nb_r) T_r)
 *   A, B ... all-gather of the owners' stripes (sends T_r to each other
 *            rank, receives T - T_r)
 *   guard    all-gather, 2 doubles per block (Gram only)
 *   status   all-gather, 1 double per rank, once per call
 * Standard iteration per step: partials + 2 all-gathers; Gram: partials
 * per phase (1 + restarts), then per step 2 to 4 all-gathers.
 */
#include "ns_split.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The plan's sizes (src/muon.h; MU_NS_SPLIT_PLAN replaces them). Block
 * width 2048: measured on 2048 x 8192 float32 (AMD EPYC Zen 3, AVX2,
 * OpenBLAS Haswell core, 2 workers, medians of 5 interleaved rounds on a
 * shared machine), the blocked iteration took 0.95x the unblocked one's
 * time with blocks of 2048 and 1.07x with 1024 (each block's syrk writes
 * all of its n x n product and each symm repacks the n x n factor: k
 * times per step). A 2048 x 8192 matrix then has 4 blocks, a 12288 x
 * 49152 one 24. Stripes of 128 rows: measured single-threaded (n = 2048,
 * the same machine), the 16 stripe gemms of the upper trapezoid take 1.11x
 * one syrk of the whole (64 rows: 1.17x, 512: 1.26x: their repacking
 * against the wasted half of the diagonal blocks); bfloat16 keeps
 * src/ns_bf16.c's tile edge of 192. */
#define SPLIT_LONG 8192
#define SPLIT_BLOCK 2048
#define SPLIT_STRIPE 128
#define SPLIT_STRIPE_BF16 192

/* ---------------------------------------------------------------- plan */

/* The long side from which a matrix is blocked, the block width, the
 * stripe rows: the defaults or MU_NS_SPLIT_PLAN's. */
static void split_sizes(int bf16, int64_t *lng, int64_t *blk, int64_t *str)
{
    *lng = SPLIT_LONG;
    *blk = SPLIT_BLOCK;
    *str = bf16 ? SPLIT_STRIPE_BF16 : SPLIT_STRIPE;
    const char *e = getenv("MU_NS_SPLIT_PLAN");
    long long a, b, c;
    if (!e || !*e) return;
    if (strcmp(e, "off") == 0) *lng = INT64_MAX;
    else if (sscanf(e, "%lld,%lld,%lld", &a, &b, &c) == 3 && a > 0 && b > 0 && c > 0) {
        *lng = a;
        *blk = b;
        *str = c;
    }
}

/* The plan of a shape for the iteration `method` (MU_NS_STANDARD or
 * MU_NS_GRAM, as mu_ns_method_for resolves it; o valid). */
static int split_plan_method(split_plan *p, int dt, int64_t rows, int64_t cols, const mu_ns_opts *o,
                             int method)
{
    memset(p, 0, sizeof *p);
    if (dt != MU_F32 && dt != MU_F64)
        return mu__fail(MU_EDTYPE, "split ns: dtype must be MU_F32 or MU_F64, got %d", dt);
    if (o->dtype == MU_BF16 && dt != MU_F32)
        return mu__fail(MU_EDTYPE, "split ns: dtype bfloat16 takes float32 tensors");
    if (rows < 0 || cols < 0 || rows > INT32_MAX || cols > INT32_MAX)
        return mu__fail(MU_EINVAL, "split ns: rows and cols must be in [0, 2^31), got %lld x %lld",
                        (long long)rows, (long long)cols);
    p->dt = dt;
    p->o = o;
    p->bf16 = o->dtype == MU_BF16;
    p->tall = rows > cols;
    p->lo = p->tall ? CblasColMajor : CblasRowMajor;
    p->up = p->tall ? CblasLower : CblasUpper;
    p->rows = rows;
    p->cols = cols;
    p->n = p->tall ? cols : rows;
    p->m = p->tall ? rows : cols;
    int64_t lng, blk, str;
    split_sizes(p->bf16, &lng, &blk, &str);
    p->gram = method == MU_NS_GRAM;
    p->k = 1;
    p->w = p->m;
    /* (the Gram iteration in bfloat16, src/ns_gram_bf16.c, has no blocked
     * form: its shapes keep one block at every size, so one process runs it
     * unblocked and a group never splits it; the choice follows the method,
     * from the shape and options only, the same on every rank) */
    if (p->n > 0 && p->m >= lng && p->m > blk && o->path == MU_NS_SYMMETRIC &&
        o->precond == MU_NS_PRECOND_NONE && !(p->bf16 && p->gram)) {
        p->w = blk;
        p->k = (p->m + blk - 1) / blk;
    }
    p->sr = p->n >= 2 * str ? str : (p->n > 0 ? p->n : 1);
    p->S = (p->n + p->sr - 1) / p->sr;
    p->T = p->n * (p->n + 1) / 2;
    if (p->gram) {
        p->restarts = mu__ns_gram_restarts(o->steps, MU_F32);
        mu__ns_gram_band_f32(o, p->n, &p->band_lo, &p->band_hi);
    }
    return MU_OK;
}

static int split_plan_init(split_plan *p, int dt, int64_t rows, int64_t cols, const mu_ns_opts *o)
{
    memset(p, 0, sizeof *p);
    int rc = mu__ns_check_opts(o);
    if (rc != MU_OK) return rc;
    const int method = mu_ns_method_for(rows, cols, o);
    return method < 0 ? method : split_plan_method(p, dt, rows, cols, o, method);
}

int mu__split_plan(int64_t rows, int64_t cols, const mu_ns_opts *opts, int64_t *blocks,
                   int64_t *width)
{
    split_plan p;
    if (blocks) *blocks = 0;
    if (width) *width = 0;
    int rc = split_plan_init(&p, MU_F32, rows, cols, opts);
    if (rc != MU_OK) return rc;
    if (blocks) *blocks = p.k;
    if (width) *width = p.w;
    return MU_OK;
}

/* ------------------------------------------------------------- program */

/* A program being made: its ops (or only counted: ops NULL) and the flops
 * they perform in one process. */
typedef struct prog_out {
    const split_plan *p;
    split_op *ops;
    int n;
    double flops;
} prog_out;

/* The upper trapezoid of stripes (2 rows (n - r0) summed): the `count`
 * stripes listed in own, or every stripe (own NULL). */
static double stripes_trap(const split_plan *p, const int64_t *own, int64_t count)
{
    double trap = 0;
    const int64_t S = own ? count : p->S;
    for (int64_t i = 0; i < S; i++) {
        int64_t r0, r1;
        stripe_rows(p, own ? own[i] : i, &r0, &r1);
        trap += 2.0 * (double)(r1 - r0) * (double)(p->n - r0);
    }
    return trap;
}

/* The flops of op (2 per multiply-add), as src/ns_cost.c counts those of
 * the unblocked iterations (a syrk: its triangle, n^2 per column): the
 * partial products (bfloat16: the tiles on and above the stripe grid's
 * diagonal), the stripes' gemms on the upper trapezoid (none for a
 * polynomial step with c = 0), the update. The share of a rank whose
 * blocks are `width` wide along m and whose stripes' trapezoid is `trap`
 * (2 rows (n - r0) summed over them); one process: m and every stripe. */
static double op_flops(const split_plan *p, const split_op *op, double width, double trap)
{
    const double n = (double)p->n;
    switch (op->kind) {
    case OP_PARTIALS: return p->bf16 ? stripes_trap(p, NULL, 0) * width : n * n * width;
    case OP_SP: {
        const double c = p->o->coeffs[3 * op->k + 2];
        const int skip = op->poly && (p->bf16 ? mu__ns_bf16_coef(p->o, c) == 0.0f : c == 0.0);
        return skip ? 0 : trap * n;
    }
    case OP_UPDATE: return 2 * n * n * width;
    default: return 0;
    }
}

static void emit(prog_out *out, split_op op)
{
    if (out->ops) out->ops[out->n] = op;
    out->n++;
    out->flops += op_flops(out->p, &op, (double)out->p->m, stripes_trap(out->p, NULL, 0));
}

/* The standard iteration's ops: per step PARTIALS, COMBINE, SP, UPDATE,
 * ping-ponging between XP0 and OUT so that the last step writes OUT. */
static int prog_standard(const split_plan *p, prog_out *out)
{
    const int steps = p->o->steps, dst_first = steps % 2 == 1;
    for (int k = 0; k < steps; k++) {
        const int to_out = dst_first ^ (k & 1);
        const int src = k == 0 ? PIECE_X0 : to_out ? PIECE_XP0 : PIECE_OUT;
        const int dst = to_out ? PIECE_OUT : PIECE_XP0;
        emit(out, (split_op){.kind = OP_PARTIALS, .k = k, .c = 0, .scaled = k == 0, .src = src});
        emit(out, (split_op){.kind = OP_COMBINE, .k = k, .c = 0, .mirror = 1});
        emit(out, (split_op){.kind = OP_SP, .k = k, .c = 1, .l = 0, .m = 0, .poly = 1,
                              .mirror = p->bf16});
        emit(out, (split_op){.kind = OP_UPDATE, .k = k, .c = 1, .scaled = k == 0, .src = src,
                              .dst = dst, .last = k + 1 == steps});
    }
    return out->n;
}

/* n x n buffers of the Gram program: the same choices on every rank. */
static int take(int *used)
{
    for (int i = 0; i < SPLIT_NBUF; i++)
        if (!used[i]) {
            used[i] = 1;
            return i;
        }
    return -1; /* not reached: at most SPLIT_NBUF are live */
}

/* The Gram iteration's ops (the sequence of src/ns_gram.c's gram_one),
 * then GUARD; *final_xp: the scratch holding the result when in place. */
static int prog_gram(const split_plan *p, prog_out *out, int *final_xp)
{
    const int steps = p->o->steps;
    const int n0 = out->n;
    int used[SPLIT_NBUF] = {0}, nx = 0, base = PIECE_X0, R = -1, P = -1, Q = -1;
    for (int k = 0; k < steps; k++) {
        const int start = k == 0 || (p->restarts >> k & 1);
        if (start) {
            R = take(used);
            emit(out, (split_op){.kind = OP_PARTIALS, .k = k, .c = R, .scaled = k == 0, .src = base});
            emit(out, (split_op){.kind = OP_COMBINE, .k = k, .c = R, .mirror = 1});
        }
        P = take(used);
        emit(out, (split_op){.kind = OP_SP, .k = k, .c = P, .l = R, .m = R, .poly = 1, .mirror = 1});
        if (Q < 0) {
            Q = P;
        } else {
            const int Qn = take(used);
            emit(out, (split_op){.kind = OP_SP, .k = k, .c = Qn, .l = P, .m = Q, .mirror = 1});
            used[Q] = 0;
            Q = Qn;
        }
        const int last = k + 1 == steps || (p->restarts >> (k + 1) & 1);
        if (!last) {
            const int F = take(used), Rn = take(used);
            emit(out, (split_op){.kind = OP_SP, .k = k, .c = F, .l = P, .m = P, .mirror = 1});
            emit(out, (split_op){.kind = OP_SP, .k = k, .c = Rn, .l = F, .m = R, .mirror = 1});
            used[F] = used[R] = 0;
            if (P != Q) used[P] = 0;
            R = Rn;
            continue;
        }
        int y = PIECE_FINAL;
        if (k + 1 < steps) {
            y = nx ? PIECE_XP1 : PIECE_XP0;
            nx ^= 1;
        }
        emit(out, (split_op){.kind = OP_UPDATE, .k = k, .c = Q, .scaled = base == PIECE_X0,
                              .src = base, .dst = y, .last = k + 1 == steps});
        used[R] = used[Q] = 0;
        if (P != Q) used[P] = 0;
        R = P = Q = -1;
        base = y;
    }
    *final_xp = nx;
    emit(out, (split_op){.kind = OP_GUARD});
    return out->n - n0;
}

/* Ops of both programs: at most 4 per step (standard), 2 + 4 per step (Gram). */
static int prog_cap(const split_plan *p) { return 6 * p->o->steps + 4 + 4 * p->o->steps + 1; }

int mu__ns_split_flops(int64_t rows, int64_t cols, const mu_ns_opts *o, int method, double *flops)
{
    split_plan p;
    if (rows > INT32_MAX || cols > INT32_MAX ||
        split_plan_method(&p, MU_F32, rows, cols, o, method) != MU_OK || p.k < 2)
        return 0;
    prog_out out = {.p = &p};
    int final_xp;
    if (p.gram) prog_gram(&p, &out, &final_xp);
    else prog_standard(&p, &out);
    *flops = out.flops;
    return 1;
}

/* ------------------------------------------------------------- machine */

/* States of a call. */
enum {
    ST_IDLE,
    ST_HEAD,        /* the head exchange (status, batch), then ST_HEAD_POST */
    ST_HEAD_POST,
    ST_NORMS,       /* the input norms' terms, exchanged, then checked in ST_NORMS_POST */
    ST_NORMS_POST,
    ST_MATRIX,      /* matrix i's prologue */
    ST_RUN,         /* its program */
    ST_GUARD,       /* the Gram guard's decision */
    ST_STATUS,      /* the status exchange, then ST_STATUS_POST */
    ST_STATUS_POST,
    ST_DONE
};

static size_t rnd64(size_t b) { return (b + 63) & ~(size_t)63; }

/* Lay the buffers out from base (NULL: only count); the bytes. Borrowed
 * buffers (one process: the workspace's slot 0 holds nn[0], nn[1], xp[0])
 * are skipped. */
static size_t split_layout(mu__split *s, char *base, int borrowed)
{
    const split_plan *p = &s->p;
    const size_t es = split_es(p), ef = p->bf16 ? sizeof(float) : es;
    const size_t nn = (size_t)(p->n * p->n), piece = (size_t)(p->n * s->plen);
    size_t off = 0;
#define SPLIT_PUT(ptr, bytes)                                                                     \
    do {                                                                                          \
        if (base) (ptr) = (void *)(base + off);                                                   \
        off += rnd64(bytes);                                                                      \
    } while (0)
    const int nbuf = p->gram ? SPLIT_NBUF : 2;
    for (int i = borrowed ? 2 : 0; i < nbuf; i++) SPLIT_PUT(s->nn[i], nn * ef);
    size_t tmp = nn > SPLIT_CHUNK ? nn : SPLIT_CHUNK;
    if (p->bf16 && (size_t)(p->n * p->w) > tmp) tmp = (size_t)(p->n * p->w);
    for (int w = 0; w < s->workers; w++) SPLIT_PUT(s->tmp[w], tmp * ef);
    if (!borrowed) SPLIT_PUT(s->xp[0], piece * es);
    if (p->gram) SPLIT_PUT(s->xp[1], piece * es);
    SPLIT_PUT(s->gsendn, (size_t)(2 * s->nb + 1) * sizeof(double));
    SPLIT_PUT(s->grecvn, (size_t)(2 * p->k + 1) * sizeof(double));
    if (s->g > 1) {
        const size_t eg = p->bf16 ? 2 : es, town = (size_t)s->tri[s->rank];
        SPLIT_PUT(s->send1, (size_t)(s->nb * p->T) * ef);
        SPLIT_PUT(s->recv1, (size_t)p->k * town * ef);
        SPLIT_PUT(s->gsend, town * eg);
        SPLIT_PUT(s->grecv, (size_t)p->T * eg);
        SPLIT_PUT(s->hrecv, (size_t)(2 * s->g) * sizeof(double));
        SPLIT_PUT(s->strecv, (size_t)s->g * sizeof(double));
    }
#undef SPLIT_PUT
    return off;
}

/* Blocks dealt in rank order: rank q holds [bstart[q], bstart[q + 1]). */
static int64_t first_block(const split_plan *p, int g, int q) { return (int64_t)q * p->k / g; }

/* Stripes dealt by cost (rows x trapezoid width: the gemm's flops, which
 * fall with the stripe's index), the largest first to the least loaded
 * rank (ties: the lower rank): shape and g only. */
static int deal_stripes(mu__split *s)
{
    const split_plan *p = &s->p;
    double *load = calloc((size_t)s->g, sizeof *load);
    if (!load) return mu__fail(MU_ENOMEM, "split ns: out of memory");
    for (int64_t t = 0; t < p->S; t++) {
        int64_t r0, r1;
        stripe_rows(p, t, &r0, &r1);
        int best = 0;
        for (int q = 1; q < s->g; q++)
            if (load[q] < load[best]) best = q;
        s->owner[t] = best;
        load[best] += (double)(r1 - r0) * (double)(p->n - r0);
    }
    free(load);
    return MU_OK;
}

/* The tables of a machine of rank `rank` in a group of g. */
static int split_tables(mu__split *s)
{
    const split_plan *p = &s->p;
    const int g = s->g;
    for (int q = 0; q <= g; q++) s->bstart[q] = first_block(p, g, q);
    s->b0 = s->bstart[s->rank];
    s->nb = s->bstart[s->rank + 1] - s->b0;
    const int64_t lo = s->b0 * p->w, hi = (s->b0 + s->nb) * p->w;
    s->plen = (hi < p->m ? hi : p->m) - (lo < p->m ? lo : p->m);
    int rc = MU_OK;
    if (g == 1) {
        for (int64_t t = 0; t < p->S; t++) s->owner[t] = 0;
    } else {
        rc = deal_stripes(s);
    }
    for (int q = 0; q < g; q++) s->tri[q] = 0;
    s->nown = 0;
    for (int64_t t = 0; t < p->S; t++) {
        const int q = s->owner[t];
        s->soff[t] = s->tri[q];
        s->tri[q] += stripe_tri(p, t);
        if (q == s->rank) s->own[s->nown++] = t;
    }
    for (int q = 0; q < g; q++) {
        const int64_t nbq = s->bstart[q + 1] - s->bstart[q];
        s->x1sc[q] = s->nb * s->tri[q];
        s->x1sd[q] = q == 0 ? 0 : s->x1sd[q - 1] + s->x1sc[q - 1];
        s->x1rc[q] = nbq * s->tri[s->rank];
        s->x1rd[q] = s->bstart[q] * s->tri[s->rank];
        s->agc[q] = s->tri[q];
        s->agd[q] = q == 0 ? 0 : s->agd[q - 1] + s->agc[q - 1];
        s->hc[q] = 2;
        s->hd[q] = 2 * q;
        s->stc[q] = 1;
        s->std_[q] = q;
        s->gc[q] = 2 * nbq;
        s->gd[q] = 2 * s->bstart[q];
    }
    return rc;
}
/* ------------------------------------------------------------ the call */

static void scale_copy(int dt, void *dst, const void *src, int64_t len, double scale)
{
    for (int64_t e = 0; e < len; e++) {
        if (dt == MU_F32) ((float *)dst)[e] = (float)(scale * ((const float *)src)[e]);
        else ((double *)dst)[e] = scale * ((const double *)src)[e];
    }
}

/* Matrix i's norm from every rank's terms (block order); 0 for NaN/Inf. */
static int matrix_norm(mu__split *s, int64_t i, double *norm)
{
    double *v = s->grecvn;
    for (int q = 0; q < s->g; q++) {
        const int64_t nbq = s->bstart[q + 1] - s->bstart[q];
        memcpy(v + 2 * s->bstart[q], s->nrecv + s->nd[q] + 2 * i * nbq, (size_t)(2 * nbq) * sizeof *v);
    }
    return mu__split_combine_norms(v, s->p.k, norm);
}

/* The standard program's start: the step-1 source (the input; a copy in
 * place when step 1 writes the output; normalized first when the norm is
 * too large or small to fold into the first products, as src/ns.c). */
static void std_setup(mu__split *s, const char *in, char *out, double scale, int inrange)
{
    const int64_t len = piece_elems(s), bytes = len * (int64_t)split_es(&s->p);
    const int dst_first = s->p.o->steps % 2 == 1;
    const char *x0 = in;
    if (s->inplace && dst_first) {
        if (bytes > 0) memcpy(s->xp[0], in, (size_t)bytes);
        x0 = s->xp[0];
    }
    s->xs = scale;
    if (!inrange) {
        char *buf = x0 == s->xp[0] || dst_first ? s->xp[0] : out;
        scale_copy(s->p.dt, buf, x0, len, scale);
        x0 = buf;
        s->xs = 1.0;
    }
    s->x0 = x0;
    s->run = s->prog;
    s->nrun = s->nstd;
}

/* A tall matrix's block (wj x n, x) into the iterate's (n x wj, X). */
static void bf16_block_tall(uint16_t *X, const float *x, int64_t n, int64_t wj, double c, float d)
{
    MU__NS_BLOCKED(n, 0, wj, X[i * wj + j] = mu__bf16_from_f32(bfr((float)(c * x[j * n + i])) / d));
}

/* bfloat16: X = bf16(bf16(c x) / d), d = bf16(norm_scale bf16(||c x||) +
 * bf16(c eps)) (src/ns_bf16.c's prologue: c = 1, or beyond ||x|| in
 * [2^-60, 2^60] the power of two bringing ||c x|| near 1; the norm is the
 * blocks' of bf16_wide(x), times c), into the bfloat16 iterate by block (a
 * tall matrix's blocks transposed); with 0 steps that is the output. */
static int bf16_prologue(mu__split *s, const float *in, float *out)
{
    const split_plan *p = &s->p;
    const double c = mu__ns_bf16_prescale(s->norm);
    const float d = mu__ns_bf16_divisor(p->o, c * s->norm, c);
    if (p->o->steps == 0) {
        for (int64_t e = 0; e < piece_elems(s); e++) out[e] = bfr(bfr((float)(c * in[e])) / d);
        return 0;
    }
    float *row = s->tmp[0]; /* (c x: a row of a block at a time) */
    for (int64_t j = s->b0; j < s->b0 + s->nb; j++) {
        const int64_t wj = block_width(p, j), n = p->n;
        int64_t ld;
        const float *x = (const float *)piece_block(s, (const char *)in, j, &ld);
        uint16_t *X = bf16_block(s, j);
        if (!p->tall) {
            for (int64_t i = 0; i < n; i++) {
                const float *xi = x + i * ld;
                if (c != 1.0) {
                    for (int64_t e = 0; e < wj; e++) row[e] = (float)(c * xi[e]);
                    xi = row;
                }
                mu__ns_bf16_scale(X + i * wj, xi, wj, d);
            }
            continue;
        }
        bf16_block_tall(X, x, n, wj, c, d);
    }
    s->run = s->prog;
    s->nrun = s->nstd;
    return 1;
}

/* Matrix i's start, its norm known: zeros, the normalization alone (0
 * steps), or its program. Returns 1 when the program runs. */
static int prologue(mu__split *s)
{
    const split_plan *p = &s->p;
    const mu_ns_opts *o = p->o;
    const int64_t len = piece_elems(s), bytes = len * (int64_t)split_es(p);
    const char *in = s->in + s->i * bytes;
    char *out = s->out + s->i * bytes;
    if (s->norm == 0.0) { /* zero in, zero out (eps > 0 was checked) */
        if (bytes > 0) memset(out, 0, (size_t)bytes);
        return 0;
    }
    if (p->bf16) return bf16_prologue(s, (const float *)in, (float *)out);
    const double scale = 1.0 / (o->norm_scale * s->norm + o->eps);
    if (o->steps == 0) {
        scale_copy(p->dt, out, in, len, scale);
        return 0;
    }
    const double lim = p->dt == MU_F32 ? 0x1p40 : 0x1p400;
    const int inrange = s->norm <= lim && s->norm >= 1.0 / lim;
    if (p->gram && inrange) {
        s->x0 = in;
        s->xs = scale;
        s->run = s->prog + s->nstd;
        s->nrun = s->ngram;
        return 1;
    }
    std_setup(s, in, out, scale, inrange);
    return 1;
}

static int finish(mu__split *s, int rc)
{
    s->state = ST_DONE;
    s->err = rc;
    return rc;
}

static void xfer_gather(mu__split_xfer *x, int dtype, const void *send, int64_t count, void *recv,
                        const int64_t *counts, const int64_t *displs)
{
    *x = (mu__split_xfer){.op = MU__SPLIT_ALLGATHERV, .dtype = dtype, .send = send,
                          .sendcount = count, .recv = recv, .recvcounts = counts, .rdispls = displs};
}

/* A failure some rank reported (codes as doubles, one per rank at
 * codes[stride q]): this rank's own, else the first one's. */
static int reported(mu__split *s, const double *codes, int stride)
{
    for (int q = 0; q < s->g; q++) {
        const int code = (int)codes[stride * q];
        if (code == MU_OK) continue;
        if (s->err != MU_OK) return finish(s, s->err);
        return finish(s, mu__fail(code, "split ns: rank %d failed (%s)", q, mu_strerror(code)));
    }
    return MU_OK;
}

/* The Gram result's guard (src/ns_gram.c's band on its Frobenius norm):
 * kept (copied to the output when it ran in place), or matrix i is redone
 * with the standard program. */
static void guard_post(mu__split *s)
{
    const split_plan *p = &s->p;
    double got = 0.0;
    const int ok = mu__split_combine_norms(s->grecvn, p->k, &got) && got <= p->band_hi && got >= p->band_lo &&
                   !mu__ns_gram_guard_forced();
    const int64_t bytes = piece_elems(s) * (int64_t)split_es(p);
    const char *in = s->in + s->i * bytes;
    char *out = s->out + s->i * bytes;
    if (ok) {
        if (s->inplace && bytes > 0) memcpy(out, s->xp[s->final_xp], (size_t)bytes);
        s->i++;
        s->state = ST_MATRIX;
        return;
    }
    std_setup(s, in, out, 1.0 / (p->o->norm_scale * s->norm + p->o->eps), 1);
    s->pc = 0;
    s->state = ST_RUN;
}

/* The next op of the program (after the post of the one before), and
 * its exchange. Returns 1 with *x set, 0 to go on. */
static int run_next(mu__split *s, mu__split_xfer *x)
{
    const split_plan *p = &s->p;
    const split_op *post = s->pending;
    s->pending = NULL;
    if (s->pc == s->nrun) { /* (the last op, UPDATE, leaves no post) */
        s->i++;
        s->state = ST_MATRIX;
        return 0;
    }
    const split_op *op = &s->run[s->pc++];
    if (op->kind == OP_GUARD) {
        if (post) mu__split_run_op(s, post, NULL);
        const int64_t bytes = piece_elems(s) * (int64_t)split_es(p);
        const char *res = s->inplace ? s->xp[s->final_xp] : s->out + s->i * bytes;
        mu__split_run_norms(s, res, 1, 0, s->g > 1 ? s->gsendn : s->grecvn);
        s->state = ST_GUARD;
        if (s->g == 1) return 0;
        xfer_gather(x, MU_F64, s->gsendn, 2 * s->nb, s->grecvn, s->gc, s->gd);
        return 1;
    }
    mu__split_run_op(s, post, op);
    if (op->kind == OP_UPDATE) return 0;
    if (op->kind != OP_PARTIALS) s->pending = op;
    if (s->g == 1) return 0;
    const int ef = p->bf16 ? MU_F32 : p->dt, eg = p->bf16 ? MU_BF16 : p->dt;
    if (op->kind == OP_PARTIALS)
        *x = (mu__split_xfer){.op = MU__SPLIT_ALLTOALLV, .dtype = ef, .send = s->send1,
                              .sendcounts = s->x1sc, .sdispls = s->x1sd, .recv = s->recv1,
                              .recvcounts = s->x1rc, .rdispls = s->x1rd};
    else
        xfer_gather(x, eg, s->gsend, s->tri[s->rank], s->grecv, s->agc, s->agd);
    return 1;
}

static int split_step(mu__split *s, mu__split_xfer *x)
{
    for (;;) {
        switch (s->state) {
        case ST_HEAD:
            s->head[0] = s->err;
            s->head[1] = (double)s->batch;
            xfer_gather(x, MU_F64, s->head, 2, s->hrecv, s->hc, s->hd);
            s->state = ST_HEAD_POST;
            return 1;
        case ST_HEAD_POST: {
            int rc = reported(s, s->hrecv, 2);
            if (rc != MU_OK) return rc;
            for (int q = 0; q < s->g; q++)
                if (s->hrecv[2 * q + 1] != (double)s->batch)
                    return finish(s, mu__fail(MU_EINVAL, "split ns: rank %d has a batch of %.0f "
                                              "matrices, rank %d %lld", q, s->hrecv[2 * q + 1],
                                              s->rank, (long long)s->batch));
            if (s->batch == 0) return finish(s, MU_OK);
            s->state = ST_NORMS;
            break;
        }
        case ST_NORMS:
            mu__split_run_norms(s, s->in, s->batch, s->p.bf16, s->nsend);
            s->state = ST_NORMS_POST;
            if (s->g > 1) {
                xfer_gather(x, MU_F64, s->nsend, 2 * s->nb * s->batch, s->nrecv, s->nc, s->nd);
                return 1;
            }
            break;
        case ST_NORMS_POST:
            for (int64_t i = 0; i < s->batch; i++) {
                double norm;
                if (!matrix_norm(s, i, &norm))
                    return finish(s, mu__fail(MU_ENONFINITE, "split ns: input matrix %lld (0-based "
                                              "batch index) holds NaN or Inf", (long long)i));
                if (norm == 0.0 && s->p.o->eps == 0.0)
                    return finish(s, mu__fail(MU_EINVAL, "split ns: input matrix %lld (0-based batch "
                                              "index) is all zeros and eps = 0 (division by zero)",
                                              (long long)i));
            }
            s->i = 0;
            s->state = ST_MATRIX;
            break;
        case ST_MATRIX:
            if (s->i == s->batch) {
                s->state = ST_STATUS;
                break;
            }
            matrix_norm(s, s->i, &s->norm);
            if (!prologue(s)) {
                s->i++;
                break;
            }
            s->pc = 0;
            s->state = ST_RUN;
            break;
        case ST_RUN:
            if (run_next(s, x)) return 1;
            break;
        case ST_GUARD:
            guard_post(s);
            break;
        case ST_STATUS: {
            const int local = s->dnnl ? mu__dnnl_take_failure(s->dnnl) : MU_OK;
            if (s->g == 1) return finish(s, local);
            s->err = local;
            s->status = local;
            s->state = ST_STATUS_POST;
            xfer_gather(x, MU_F64, &s->status, 1, s->strecv, s->stc, s->std_);
            return 1;
        }
        case ST_STATUS_POST: {
            const int rc = reported(s, s->strecv, 1);
            return rc != MU_OK ? rc : finish(s, MU_OK);
        }
        default: /* ST_DONE */
            return s->err;
        }
    }
}

int mu__split_next(mu__split *s, mu__split_xfer *x)
{
    if (!s || !x) return mu__fail(MU_EINVAL, "split ns: s and x must not be NULL");
    memset(x, 0, sizeof *x);
    if (s->state == ST_IDLE) return mu__fail(MU_ESTATE, "split ns: no call begun (mu__split_begin)");
    const int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    const int dsaved = s->dnnl ? mu__dnnl_threads(s->dnnl) : 0;
    const int rc = split_step(s, x);
    if (s->dnnl) mu__dnnl_set_threads(s->dnnl, dsaved);
    if (saved != 1) openblas_set_num_threads(saved);
    return rc;
}

/* --------------------------------------------------------- the machine */

/* The tables and the programs of a machine laid out from base (NULL: only
 * count); the bytes. */
static size_t tables_layout(mu__split *s, char *base)
{
    const int64_t g = s->g, S = s->p.S;
    size_t off = 0;
    int64_t *t = NULL;
#define SPLIT_TAB(ptr, type, count)                                                               \
    do {                                                                                          \
        if (base) (ptr) = (type *)(void *)(base + off);                                           \
        off += rnd64((size_t)(count) * sizeof(type));                                             \
    } while (0)
    SPLIT_TAB(s->bstart, int64_t, g + 1);
    SPLIT_TAB(s->owner, int, S);
    SPLIT_TAB(s->soff, int64_t, S);
    SPLIT_TAB(s->tri, int64_t, g);
    SPLIT_TAB(s->own, int64_t, S);
    SPLIT_TAB(t, int64_t, 14 * g);
    SPLIT_TAB(s->prog, split_op, prog_cap(&s->p));
#undef SPLIT_TAB
    if (base) {
        int64_t **tabs[] = {&s->x1sc, &s->x1sd, &s->x1rc, &s->x1rd, &s->agc, &s->agd, &s->hc,
                            &s->hd,   &s->stc,  &s->std_, &s->gc,   &s->gd,   &s->nc,  &s->nd};
        for (int i = 0; i < 14; i++) *tabs[i] = t + i * g;
    }
    return off;
}

/* Tables and programs into place (after tables_layout). */
static int split_arm(mu__split *s)
{
    int rc = split_tables(s);
    prog_out out = {.p = &s->p, .ops = s->prog};
    s->nstd = prog_standard(&s->p, &out);
    s->ngram = s->p.gram ? prog_gram(&s->p, &out, &s->final_xp) : 0;
    return rc;
}

/* Doubles of a call's norm buffers (nsend, then nrecv unless g = 1). */
static int64_t norm_doubles(const mu__split *s, int64_t batch)
{
    return 2 * s->nb * batch + (s->g > 1 ? 2 * s->p.k * batch : 0);
}

static void norm_carve(mu__split *s, double *base, int64_t batch)
{
    s->nsend = base;
    s->nrecv = s->g > 1 ? base + 2 * s->nb * batch : base;
    for (int q = 0; q < s->g; q++) {
        s->nc[q] = 2 * (s->bstart[q + 1] - s->bstart[q]) * batch;
        s->nd[q] = 2 * s->bstart[q] * batch;
    }
}

static int workers_clamp(int w) { return w < 1 ? 1 : w > MU__POOL_MAX ? MU__POOL_MAX : w; }

/* The plan of rank `rank` of a group of `group` for a shape of k > 1 blocks. */
static int split_check_new(split_plan *p, int dtype, int64_t rows, int64_t cols, const mu_ns_opts *opts,
                           int group, int rank)
{
    if (group < 1 || rank < 0 || rank >= group)
        return mu__fail(MU_EINVAL, "split ns: rank %d of a group of %d (0 <= rank < group)", rank, group);
    int rc = split_plan_init(p, dtype, rows, cols, opts);
    if (rc == MU_OK && p->k < 2)
        rc = mu__fail(MU_EINVAL, "split ns: a %lld x %lld matrix is one block (not split: the long "
                      "side, the path, the preconditioning or the bfloat16 Gram iteration)",
                      (long long)rows, (long long)cols);
    return rc;
}

int mu__split_new(int dtype, int64_t rows, int64_t cols, const mu_ns_opts *opts, int group, int rank,
                  mu__split **out)
{
    if (!out) return mu__fail(MU_EINVAL, "split ns: out is NULL");
    *out = NULL;
    mu__split *s = calloc(1, sizeof *s);
    if (!s) return mu__fail(MU_ENOMEM, "split ns: out of memory");
    int rc = split_check_new(&s->p, dtype, rows, cols, opts, group, rank);
    if (rc != MU_OK) {
        free(s);
        return rc;
    }
    s->opts = *opts;
    s->coeffs = malloc((size_t)(3 * (opts->steps > 0 ? opts->steps : 1)) * sizeof(double));
    if (s->coeffs && opts->steps > 0) memcpy(s->coeffs, opts->coeffs, (size_t)(3 * opts->steps) * sizeof(double));
    s->opts.coeffs = s->coeffs;
    s->p.o = &s->opts;
    s->g = group;
    s->rank = rank;
    s->workers = workers_clamp(mu__ns_workers());
    char *tab = s->coeffs ? malloc(tables_layout(s, NULL)) : NULL;
    if (!tab) {
        mu__split_free(s);
        return mu__fail(MU_ENOMEM, "split ns: out of memory");
    }
    tables_layout(s, tab);
    rc = split_arm(s);
    const size_t bytes = rc == MU_OK ? split_layout(s, NULL, 0) : 0;
    s->mem = rc == MU_OK ? aligned_alloc(64, bytes ? bytes : 64) : NULL;
    if (rc == MU_OK && !s->mem)
        rc = mu__fail(MU_ENOMEM, "split ns: out of memory (%zu bytes of buffers)", bytes);
    if (rc == MU_OK) {
        split_layout(s, s->mem, 0);
        s->bytes = bytes + tables_layout(s, NULL);
        if (s->p.bf16) {
            rc = mu__dnnl_open(&s->dnnl);
            if (rc == MU_OK) rc = mu__split_bf16_want(s);
        }
    }
    if (rc != MU_OK) {
        mu__split_free(s);
        return rc;
    }
    *out = s;
    return MU_OK;
}

void mu__split_free(mu__split *s)
{
    if (!s) return;
    free(s->coeffs);
    free(s->bstart); /* the tables' one allocation */
    free(s->mem);
    free(s->nmem);
    mu__dnnl_close(s->dnnl);
    free(s);
}

/* Bytes moved per exchange of op kind (logical: to / from other ranks). */
static void op_bytes(const mu__split *s, int kind, int64_t *sent, int64_t *recv)
{
    const split_plan *p = &s->p;
    const int64_t ef = p->bf16 ? 4 : (int64_t)split_es(p), eg = p->bf16 ? 2 : ef;
    *sent = *recv = 0;
    if (kind == OP_PARTIALS) {
        for (int q = 0; q < s->g; q++)
            if (q != s->rank) {
                *sent += s->x1sc[q] * ef;
                *recv += s->x1rc[q] * ef;
            }
    } else if (kind == OP_GUARD) {
        *sent = 16 * s->nb * (s->g - 1);
        *recv = 16 * (p->k - s->nb);
    } else if (kind != OP_UPDATE) {
        *sent = s->tri[s->rank] * eg * (s->g - 1);
        *recv = (p->T - s->tri[s->rank]) * eg;
    }
}

/* The plan as rank s->rank sees it (its tables armed) into *out. */
static void fill_info(const mu__split *s, mu__split_info *out)
{
    const split_plan *p = &s->p;
    memset(out, 0, sizeof *out);
    out->blocks = p->k;
    out->width = p->w;
    out->stripes = p->S;
    out->stripe_rows = p->sr;
    out->group = s->g;
    out->rank = s->rank;
    out->first_block = s->b0;
    out->nblocks = s->nb;
    out->dim = p->tall ? 0 : 1;
    out->start = s->b0 * p->w < p->m ? s->b0 * p->w : p->m;
    out->length = s->plen;
    out->workspace_bytes = (int64_t)(s->bytes + (size_t)s->ncap * sizeof(double));
    const split_op *prog = p->gram ? s->prog + s->nstd : s->prog;
    const int nprog = p->gram ? s->ngram : s->nstd;
    const double trap = stripes_trap(p, s->own, s->nown);
    for (int i = 0; i < nprog; i++) out->flops += op_flops(p, &prog[i], (double)s->plen, trap);
    if (s->g == 1) return;
    /* per matrix: its norms' share of the norms exchange, then the ops' */
    out->bytes_sent = 16 * s->nb * (s->g - 1);
    out->bytes_recv = 16 * (p->k - s->nb);
    for (int i = 0; i < nprog; i++) {
        int64_t a, b;
        if (prog[i].kind == OP_UPDATE) continue;
        op_bytes(s, prog[i].kind, &a, &b);
        out->exchanges++;
        out->bytes_sent += a;
        out->bytes_recv += b;
    }
    out->call_exchanges = 3; /* head, norms, status */
    out->call_bytes_sent = 24 * (int64_t)(s->g - 1);
    out->call_bytes_recv = 24 * (int64_t)(s->g - 1);
}

int mu__split_get_info(const mu__split *s, mu__split_info *out)
{
    if (!s || !out) return mu__fail(MU_EINVAL, "split ns: s and out must not be NULL");
    fill_info(s, out);
    return MU_OK;
}

int mu__split_info_of(int dtype, int64_t rows, int64_t cols, const mu_ns_opts *opts, int group,
                      int rank, mu__split_info *out)
{
    if (!out) return mu__fail(MU_EINVAL, "split ns: out is NULL");
    memset(out, 0, sizeof *out);
    mu__split s;
    memset(&s, 0, sizeof s);
    int rc = split_check_new(&s.p, dtype, rows, cols, opts, group, rank);
    if (rc != MU_OK) return rc;
    s.g = group;
    s.rank = rank;
    s.workers = workers_clamp(mu__ns_workers());
    const size_t tb = tables_layout(&s, NULL);
    char *tab = malloc(tb);
    if (!tab) return mu__fail(MU_ENOMEM, "split ns: out of memory");
    tables_layout(&s, tab);
    rc = split_arm(&s);
    if (rc == MU_OK) {
        s.bytes = split_layout(&s, NULL, 0) + tb;
        fill_info(&s, out);
    }
    free(tab);
    return rc;
}

/* The call's tensors: this rank's pieces, (batch x) piece rows x cols. */
static int check_io(mu__split *s, const mu_tensor *in, const mu_tensor *out)
{
    const split_plan *p = &s->p;
    if (!in || !out) return mu__fail(MU_EINVAL, "split ns: in and out must not be NULL");
    int rc = mu__tensor_check(in, "split ns: in");
    if (rc == MU_OK) rc = mu__tensor_check(out, "split ns: out");
    if (rc != MU_OK) return rc;
    if (in->scalar != p->dt || out->scalar != p->dt)
        return mu__fail(MU_EDTYPE, "split ns: in and out must be %s (as made)", mu_dtype_name(p->dt));
    if ((in->ndim != 2 && in->ndim != 3) || out->ndim != in->ndim)
        return mu__fail(MU_ESHAPE, "split ns: in and out must be 2-D or 3-D alike, got %d and %d dims",
                        in->ndim, out->ndim);
    const int64_t pr = p->tall ? s->plen : p->n, pc = p->tall ? p->n : s->plen;
    const int64_t batch = in->ndim == 3 ? in->dims[0] : 1;
    for (int d = 0; d < in->ndim; d++)
        if (out->dims[d] != in->dims[d])
            return mu__fail(MU_ESHAPE, "split ns: out dim %d is %lld, in's %lld", d,
                            (long long)out->dims[d], (long long)in->dims[d]);
    if (in->dims[in->ndim - 2] != pr || in->dims[in->ndim - 1] != pc)
        return mu__fail(MU_ESHAPE, "split ns: rank %d's piece is %lld x %lld, got %lld x %lld", s->rank,
                        (long long)pr, (long long)pc, (long long)in->dims[in->ndim - 2],
                        (long long)in->dims[in->ndim - 1]);
    if (!mu_tensor_is_contiguous(in) || !mu_tensor_is_contiguous(out))
        return mu__fail(MU_EINVAL, "split ns: in and out must be C-contiguous");
    const int64_t bytes = batch * pr * pc * (int64_t)split_es(p);
    const char *ib = in->data, *ob = out->data;
    if (ib != ob && bytes > 0 && ib < ob + bytes && ob < ib + bytes)
        return mu__fail(MU_EINVAL, "split ns: out partially overlaps in");
    s->in = ib;
    s->out = out->data;
    s->inplace = ib == ob;
    s->batch = batch;
    return MU_OK;
}

/* Room for a call's norms (grown with the batch). */
static int norm_room(mu__split *s)
{
    const int64_t need = norm_doubles(s, s->batch);
    if (need > s->ncap) {
        double *m = malloc((size_t)need * sizeof *m);
        if (!m) return mu__fail(MU_ENOMEM, "split ns: out of memory (norms of %lld matrices)",
                                (long long)s->batch);
        free(s->nmem);
        s->nmem = m;
        s->ncap = need;
    }
    norm_carve(s, s->nmem, s->batch);
    return MU_OK;
}

int mu__split_begin(mu__split *s, const mu_tensor *in, mu_tensor *out)
{
    if (!s) return mu__fail(MU_EINVAL, "split ns: s is NULL");
    s->err = MU_OK;
    s->pending = NULL;
    s->i = 0;
    int rc = check_io(s, in, out);
    if (rc == MU_OK) rc = norm_room(s);
    if (rc != MU_OK) {
        s->err = rc;
        s->batch = 0;
    }
    s->state = s->g > 1 ? ST_HEAD : rc != MU_OK || s->batch == 0 ? ST_DONE : ST_NORMS;
    return rc;
}

int mu__split_run(mu__split *s, mu_comm *c, const mu_tensor *in, mu_tensor *out)
{
    if (!s || !c) return mu__fail(MU_EINVAL, "split ns: s and c must not be NULL");
    if (mu_comm_size(c) != s->g || mu_comm_rank(c) != s->rank)
        return mu__fail(MU_EINVAL, "split ns: the machine is rank %d of %d, the communicator's rank "
                        "%d of %d", s->rank, s->g, mu_comm_rank(c), mu_comm_size(c));
    mu__split_begin(s, in, out); /* (a bad argument is reported to every rank by next) */
    mu__split_xfer x;
    int rc;
    while ((rc = mu__split_next(s, &x)) == 1) {
        rc = x.op == MU__SPLIT_ALLTOALLV
                 ? mu_comm_alltoallv(c, x.dtype, x.send, x.sendcounts, x.sdispls, x.recv,
                                     x.recvcounts, x.rdispls)
                 : mu_comm_allgatherv(c, x.dtype, x.send, x.sendcount, x.recv, x.recvcounts,
                                      x.rdispls);
        if (rc != MU_OK) return finish(s, rc);
    }
    return rc;
}

/* ---------------------------------------------------------- one process */

int mu__ns_split_batch(const mu__ns_batch *b)
{
    mu__split s;
    memset(&s, 0, sizeof s);
    int rc = split_plan_init(&s.p, b->dt, b->rows, b->cols, b->opts);
    if (rc != MU_OK) return rc;
    mu_ns_workspace *ws = b->ws;
    s.g = 1;
    s.workers = workers_clamp(b->threads);
    s.batch = b->batch;
    /* the workspace: slot 0's buffers, then the rest in its split area */
    const size_t tb = tables_layout(&s, NULL);
    s.nb = s.p.k; /* (split_tables sets it again) */
    s.plen = s.p.m;
    const size_t bb = split_layout(&s, NULL, 1);
    const size_t need = tb + bb + rnd64((size_t)norm_doubles(&s, s.batch) * sizeof(double));
    rc = mu__ns_grow(&ws->split, &ws->split_bytes, need, "the blocked iteration's buffers");
    if (rc != MU_OK) return rc;
    char *area = ws->split;
    tables_layout(&s, area);
    rc = split_arm(&s);
    if (rc != MU_OK) return rc;
    split_layout(&s, area + tb, 1);
    s.nn[0] = ws->slot[0].a;
    s.nn[1] = ws->slot[0].b;
    s.xp[0] = ws->slot[0].x;
    norm_carve(&s, (double *)(void *)(area + tb + bb), s.batch);
    if (s.p.bf16) {
        rc = ws->dnnl ? MU_OK : mu__dnnl_open(&ws->dnnl);
        s.dnnl = ws->dnnl;
        if (rc == MU_OK) rc = mu__split_bf16_want(&s);
        if (rc != MU_OK) return rc;
    }
    s.in = b->in;
    s.out = b->out;
    s.inplace = b->in == b->out;
    s.state = ST_NORMS;
    mu__split_xfer x;
    while ((rc = mu__split_next(&s, &x)) == 1) {
    } /* (one process: no exchanges) */
    return rc;
}
