/* Newton-Schulz internals (not part of the public API), shared by
 * src/ns.c (the standard iteration, its tile plan, the scheduler and the
 * API), src/ns_bf16.c (the bfloat16 iteration), src/ns_gram.c (the Gram
 * iteration) and other iterations built on the same products and
 * elementwise passes. Entry points declared here are kept stable: their
 * meaning changes only together with every caller. */
#ifndef MUON_NS_INTERNAL_H
#define MUON_NS_INTERNAL_H

#include "dnnl.h"
#include "muon_internal.h"
#include "pool.h"

#include <cblas.h>

enum { MU__NS_MAX_SLOTS = MU__POOL_MAX };

/* One worker's buffers. */
typedef struct mu__ns_slot {
    void *x; /* n * m: ping-pong iterate */
    void *a; /* n * n: Gram matrix */
    void *b; /* n * n: polynomial matrix */
    void *g; /* the Gram iteration's buffers (3 n*n + n*m), allocated on its first use */
    size_t g_bytes; /* bytes of g (0 until allocated) */
} mu__ns_slot;

struct mu_ns_workspace {
    int dtype;
    int64_t cap_nm; /* elements of x */
    int64_t cap_nn; /* elements of a and b */
    int nslots;     /* slots allocated so far (>= 1) */
    mu__ns_slot slot[MU__NS_MAX_SLOTS];
    void *sched;        /* the scheduler's lists (grown, kept across calls) */
    size_t sched_bytes;
    struct mu__dnnl *dnnl; /* oneDNN, opened by the first bfloat16 call (src/dnnl.c) */
    void *split;           /* the blocked iteration's buffers (src/ns_split.c), grown on use */
    size_t split_bytes;
    mu_ns_stats stats;     /* what its calls did since the last reset (mu_ns_workspace_stats) */
};

/* A batch call of mu_ns_zeropower, validated (inputs finite, workspace big
 * enough), for an iteration run outside the scheduler (the Gram iteration,
 * the blocked one). */
typedef struct mu__ns_batch {
    int dt;
    int64_t rows, cols, batch;
    const char *in;
    char *out;
    const mu_ns_opts *opts;
    const double *norms; /* per-matrix Frobenius norms, or NULL (recomputed) */
    mu_ns_workspace *ws;
    int threads; /* workers */
} mu__ns_batch;

/* ------------------------------------------------------- the tile plan
 * (src/ns.c, "the tiling"): each product of a step is a fixed list of
 * tiles, one single-threaded BLAS / oneDNN call each, chosen from the
 * dtype and shape only; a step is these stages in order. */

/* Sub-tile edge of the elementwise mirror passes; block sizes are rounded
 * up to a multiple of MU__NS_TILE_ALIGN (the kernels' register blocking). */
enum { MU__NS_BLK = 16, MU__NS_TILE_ALIGN = 16 }; /* (MU__NS_BLK: 16 measured best of 16..128) */

/* BODY for every (i, j) in [0, ni) x [j0, j1), MU__NS_BLK x MU__NS_BLK square
 * by square: the transposed copies between an n x m iterate and a tall
 * (m x n) tensor stay within cache lines. */
#define MU__NS_BLOCKED(ni, j0, j1, BODY)                                                            \
    for (int64_t mu_jb_ = (j0); mu_jb_ < (j1); mu_jb_ += MU__NS_BLK)                               \
        for (int64_t mu_ib_ = 0; mu_ib_ < (ni); mu_ib_ += MU__NS_BLK) {                            \
            const int64_t mu_je_ = mu_jb_ + MU__NS_BLK < (j1) ? mu_jb_ + MU__NS_BLK : (j1);        \
            const int64_t mu_ie_ = mu_ib_ + MU__NS_BLK < (ni) ? mu_ib_ + MU__NS_BLK : (ni);        \
            for (int64_t j = mu_jb_; j < mu_je_; j++)                                              \
                for (int64_t i = mu_ib_; i < mu_ie_; i++) BODY;                                    \
        }

enum { MU__NS_GRAM_A, MU__NS_PREP, MU__NS_GRAM_B, MU__NS_REDUCE, MU__NS_APPLY, MU__NS_NSTAGES };

typedef struct mu__ns_plan {
    int dt, plain;
    enum CBLAS_ORDER lo;     /* RowMajor, or ColMajor for tall inputs */
    enum CBLAS_UPLO up;      /* Upper (RowMajor) / Lower (ColMajor): same memory triangle */
    int n, m, ldx;           /* X is n x m in layout lo, leading dimension ldx */
    int nb, tn;              /* blocks of n: tn of nb (the last one shorter) */
    int mb, tm;              /* APPLY: tm column blocks of mb */
    int halves;              /* symmetric Gram products split in two halves */
    int tiles[MU__NS_NSTAGES];   /* tiles per stage and step; 0: fused into the one before */
    int nx;                  /* tiles per step */
    int bf16, tall;          /* the bfloat16 iteration (its own plan: src/ns_bf16.c) */
    int g16;                 /* its Gram iteration (src/ns_gram_bf16.c), on the same blocks */
} mu__ns_plan;

/* The memory rectangle rows [r0, r1) x columns [c0, c1) of an n x n buffer
 * (for ColMajor, logical rows and columns are swapped; the stored triangle
 * is c >= r either way). */
typedef struct mu__ns_rect {
    int r0, r1, c0, c1;
} mu__ns_rect;

/* A call's matrices of one shape and options (a batch), validated. */
typedef struct mu__ns_job {
    int dt;
    int64_t rows, cols;
    const char *in; /* batch base pointers */
    char *out;
    int64_t bytes_per; /* bytes per matrix */
    int64_t batch;     /* matrices (0 when they are empty) */
    const mu_ns_opts *opts;
    int inplace;         /* out aliases in */
    const double *norms; /* per-matrix norms from the check pass, or NULL */
    double *resid;       /* per-matrix residuals (mu_ns_stats), NaN until known; or NULL */
    mu__dnnl *dnnl;      /* the bfloat16 products (plan.bf16) */
    mu__ns_plan plan;
} mu__ns_job;

/* One matrix's iteration: set by its prologue (ns_begin in src/ns.c), then
 * its tiles run in order (stage by stage, ns_tile). */
typedef struct mu__ns_iter {
    const mu__ns_job *job;
    const mu__ns_slot *s;
    char *dst;
    const void *x0;  /* step 1's input (the source, or a copy in the workspace) */
    double xs0;      /* step 1's pending scale (normalization folded in) */
    int dst_first;   /* step 1 writes dst (else the workspace) */
    int done;        /* nothing left after ns_begin (zero input or 0 steps) */
    double *resid;   /* where the last step's residual goes, or NULL */
} mu__ns_iter;

int mu__ns_check_opts(const mu_ns_opts *o);
/* The flops of one rows x cols matrix by the cost model (src/ns_cost.c,
 * mu_ns_cost_of; opts valid): the scheduler's weight. */
double mu__ns_cost(int64_t rows, int64_t cols, const mu_ns_opts *opts);
/* Before which steps (0-based, a bit mask) the Gram iteration in dtype
 * (MU_F32: float32 and float64; MU_BF16) restarts (src/ns_gram.c;
 * MU_NS_GRAM_RESTARTS / MU_NS_GRAM16_RESTARTS override it for measurements). */
uint64_t mu__ns_gram_restarts(int steps, int dtype);
/* The Gram iterations' guard band for an n x n Gram matrix whose input's
 * singular values lie in [0, top] (top = ||X||_F after the normalization;
 * the largest is at least top / sqrt(n)): ||result||_F must lie in
 * [lo, hi], hi = hi_margin sqrt(n) max |g| and lo = lo_margin min |g| over
 * the largest one's range (g: the schedule's scalar map). */
void mu__ns_gram_band(const mu_ns_opts *o, int64_t n, double top, double hi_margin, double lo_margin,
                      double *lo, double *hi);
/* That band for the float32 and float64 Gram iterations (src/ns_gram.c and
 * the blocked one of src/ns_split.c: singular values in [0, 1 / norm_scale]
 * after the normalization, margins for float32 rounding). */
void mu__ns_gram_band_f32(const mu_ns_opts *o, int64_t n, double *lo, double *hi);
/* Test knob: MU_NS_GRAM_GUARD=fail makes every Gram guard reject its result. */
int mu__ns_gram_guard_forced(void);
/* The workers of a call: OpenBLAS's thread count, or MU_NS_THREADS
 * (1 .. MU__NS_MAX_SLOTS). */
int mu__ns_workers(void);
/* Grow a workspace buffer (*buf, *bytes long, 64-byte aligned; contents
 * dropped) to at least need bytes; MU_ENOMEM naming `what`. */
int mu__ns_grow(void **buf, size_t *bytes, size_t need, const char *what);
/* The worker team of a Newton-Schulz call (src/pool.c): `workers` of them,
 * on the host's OpenMP runtime when it has one, unless MU_NS_OPENMP=0. */
mu__pool_cfg mu__ns_pool_cfg(int workers);
/* The standard iteration on one matrix (src/ns.c), one worker. */
void mu__ns_standard_one(const mu_ns_opts *opts, int dt, int64_t rows, int64_t cols,
                         const void *in, void *out, double norm, const mu__ns_slot *s);
/* The Gram iteration on a batch (src/ns_gram.c). */
int mu__ns_gram_batch(const mu__ns_batch *b);
/* The blocked iteration (src/ns_split.c) on a batch whose shape has more
 * than one block (mu__split_plan), in one process: the bits every group
 * size gives. Fails only with MU_ENOMEM / MU_EIO (buffers, oneDNN). */
int mu__ns_split_batch(const mu__ns_batch *b);
/* When a rows x cols matrix has more than one block under opts (valid)
 * for the iteration `method` (MU_NS_STANDARD or MU_NS_GRAM): 1, with the
 * flops its blocked program performs in *flops (src/ns_split.c, counted as
 * src/ns_cost.c counts the others); else 0. */
int mu__ns_split_flops(int64_t rows, int64_t cols, const mu_ns_opts *opts, int method, double *flops);
/* Helpers of src/ns.c shared with the other iterations. */
/* ||x||_F of len values into *norm (in double, scaled so float64 squares do
 * not overflow); 0 when a value is NaN or Inf. */
int mu__ns_norm(int dt, const void *p, int64_t len, double *norm);
/* Rows [r0, r1) of the stored triangle (c >= r) of n x n a: a += b first
 * when sum; mirror a; b = bcoef * a (see ns_prep). */
void mu__ns_prep(int dt, void *a, void *b, int64_t n, int64_t r0, int64_t r1, int sum,
                 double bcoef);
/* Rows [r0, r1) of the stored triangle of n x n b: b += s. */
void mu__ns_accumulate(int dt, void *b, const void *s, int64_t n, int64_t r0, int64_t r1);
/* Add v to the diagonal positions i*n + i, i in [i0, i1). */
void mu__ns_add_diag(int dt, void *p, int64_t n, int64_t i0, int64_t i1, double v);
/* Grow the workspace to `want` slots (fewer on out of memory); returns the count. */
int mu__ns_slots(mu_ns_workspace *ws, int want);

/* The tile plan of a rows x cols matrix (path: MU_NS_SYMMETRIC or
 * MU_NS_PLAIN; bf16: the bfloat16 iteration's plan), from these only. */
void mu__ns_plan_init(mu__ns_plan *p, int dt, int64_t rows, int64_t cols, int path, int bf16);
/* Number of blocks for a dimension d (block size in *blk): one block below
 * 2 * min, else the smallest even count of blocks of at most `target`
 * (before rounding to MU__NS_TILE_ALIGN). */
int mu__ns_split(int64_t d, int64_t target, int64_t min, int *blk);
/* Rectangle t of the stored triangle (c >= r) of p's n x n matrices in
 * tn x tn blocks of nb: the off-diagonal blocks first (row by row), then
 * the diagonal ones. */
void mu__ns_tri_rect(const mu__ns_plan *p, int t, mu__ns_rect *r);

/* The bfloat16 iteration (src/ns_bf16.c): its tile plan (p->n, p->m set;
 * fills the blocks and tiles), its prologue (the seed's normalization of
 * src, of norm ||src||_F, into the slot's X; it->done stays 1 when nothing
 * is left), tile t of stage
 * `stage` of step k on worker w, and every product shape of its plan
 * wanted from oneDNN (before the workers start). */
void mu__ns_bf16_plan(mu__ns_plan *p);
void mu__ns_bf16_begin(mu__ns_iter *it, const char *src, double norm);
void mu__ns_bf16_tile(const mu__ns_iter *it, int k, int stage, int t, int w);
int mu__ns_bf16_want(const mu__ns_plan *p, mu__dnnl *d);
/* Pieces of it the other bfloat16 iterations share: the oneDNN product of
 * tile t of stage MU__NS_GRAM_A (X X^T blocks, inner dimension m),
 * MU__NS_GRAM_B (n x n blocks, inner dimension n) or MU__NS_APPLY (an
 * n x n matrix times column block t of X); mirror block rectangle rc of an
 * n x n bfloat16 matrix into the other triangle; d = bf16(f). */
void mu__ns_bf16_shape(const mu__ns_plan *p, int stage, int t, mu__dnnl_shape *s);
void mu__ns_bf16_mirror(uint16_t *M, int64_t n, const mu__ns_rect *rc);
void mu__ns_bf16_round(uint16_t *d, const float *f, int64_t len);
/* The rest of its rows (NS_BF16_ROWS), which the blocked iteration
 * (src/ns_split.c) runs too: poly d = bf16(bf16(b' a) + bf16(c' bf16(f))),
 * apply x = bf16(bf16(a' x) + bf16(f)) (with out, f = float32(x) too),
 * scale d = bf16(bf16(x) / s). */
void mu__ns_bf16_poly(uint16_t *d, const uint16_t *a, const float *f, int64_t len, float bc, float cc);
void mu__ns_bf16_apply(uint16_t *x, float *f, int64_t len, float ac, int out);
void mu__ns_bf16_scale(uint16_t *d, const float *x, int64_t len, float s);
/* A coefficient as the iteration applies it: rounded to bfloat16 as the
 * seed's torch code does, or in float32 (opts->coeffs_f32). */
float mu__ns_bf16_coef(const mu_ns_opts *o, double v);
/* The seed's normalization at every scale (mu__ns_bf16_begin): the power
 * of two c the input is scaled by first (1 when its norm ||x||_F lies in
 * [2^-60, 2^60]: beyond, ||c x|| is near 1), and the divisor d =
 * bf16(norm_scale bf16(nrm) + bf16(c eps)) for nrm = ||bf16(c x)||_F. */
double mu__ns_bf16_prescale(double norm);
float mu__ns_bf16_divisor(const mu_ns_opts *o, double nrm, double c);
/* The flops the products of the bfloat16 plan p perform over opts' steps. */
double mu__ns_bf16_flops(const mu__ns_plan *p, const mu_ns_opts *o);

/* The Gram iteration in bfloat16 (src/ns_gram_bf16.c), run by the scheduler
 * of src/ns.c on a bfloat16 plan with g16 set: its ticket
 * count after the prologue (the last one the guard), the stage of ticket u
 * (its first ticket and tile count: a ticket may run once every ticket
 * before its stage is done), its prologue (normalization in float32 into
 * the slot, whose g buffers it needs: mu__ns_slot_gram), ticket u on
 * worker w, its flops and the oneDNN shapes it needs. */
int64_t mu__ns_gram16_tickets(const mu__ns_job *job);
void mu__ns_gram16_stage(const mu__ns_job *job, int64_t u, int64_t *first, int *count);
void mu__ns_gram16_begin(mu__ns_iter *it, const char *src, double norm);
void mu__ns_gram16_tile(const mu__ns_iter *it, int64_t u, int w);
double mu__ns_gram16_flops(const mu__ns_plan *p, const mu_ns_opts *o);
int mu__ns_gram16_want(const mu__ns_job *job, mu__dnnl *d);
/* The Gram iterations' buffers of a slot (g: 3 n*n + n*m elements of the
 * workspace's dtype), allocated on first use; MU_ENOMEM. */
int mu__ns_slot_gram(mu_ns_workspace *ws, mu__ns_slot *s);

#endif
