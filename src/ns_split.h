/*
 * Private to split Newton-Schulz: src/ns_split.c (the plan, the programs,
 * the machine and its drivers) and src/ns_split_phases.c (the phases'
 * kernels on the worker team). See src/ns_split.c.
 */
#ifndef MU_NS_SPLIT_H
#define MU_NS_SPLIT_H

#include "ns_internal.h"
#include "tensor_internal.h"

#include <cblas.h>
#include <stdint.h>

/* n x n buffers of a machine (the Gram program's most live); elements
 * per chunk of the combine's sums. */
enum { SPLIT_NBUF = 5, SPLIT_CHUNK = 4096 };

/* The plan of a matrix shape: from (dtype, rows, cols, options) only. */
typedef struct split_plan {
    int dt, bf16, gram, tall;
    enum CBLAS_ORDER lo; /* of the blocks: RowMajor, or ColMajor for a tall matrix */
    enum CBLAS_UPLO up;  /* the memory triangle c >= r in that layout */
    int64_t rows, cols, n, m;
    int64_t k, w;      /* blocks of w (the last m - (k - 1) w) */
    int64_t sr, S, T;  /* stripes of sr rows (the last shorter); the triangle's elements */
    const mu_ns_opts *o;
    uint64_t restarts; /* Gram */
    double band_lo, band_hi;
} split_plan;

static inline int64_t block_width(const split_plan *p, int64_t j)
{
    return j + 1 < p->k ? p->w : p->m - (p->k - 1) * p->w;
}

static inline void stripe_rows(const split_plan *p, int64_t s, int64_t *r0, int64_t *r1)
{
    *r0 = s * p->sr;
    *r1 = *r0 + p->sr < p->n ? *r0 + p->sr : p->n;
}

/* Elements of the packed upper triangle before row r. */
static inline int64_t tri_before(const split_plan *p, int64_t r) { return r * p->n - r * (r - 1) / 2; }

static inline int64_t stripe_tri(const split_plan *p, int64_t s)
{
    int64_t r0, r1;
    stripe_rows(p, s, &r0, &r1);
    return tri_before(p, r1) - tri_before(p, r0);
}

/* ------------------------------------------------------------- program
 *
 * A call runs, per matrix, a program of ops fixed by the plan. Ops name
 * their n x n buffers by index (nn[]) and their piece buffers (this rank's
 * blocks of an iterate) by PIECE_*. */

enum { OP_PARTIALS, OP_COMBINE, OP_SP, OP_UPDATE, OP_GUARD, OP_NORMS /* (not in programs) */ };
/* Piece buffers: the step-1 source (the input, or a copy), the output, two
 * scratch iterates, and the Gram result (the output, or a scratch in place). */
enum { PIECE_X0, PIECE_OUT, PIECE_XP0, PIECE_XP1, PIECE_FINAL };

typedef struct split_op {
    int kind, k;   /* step k's coefficients */
    int c, l, m;   /* PARTIALS, COMBINE: into nn[c]; SP: nn[c] = alpha nn[l] nn[m] (+ b nn[l] + a I);
                    * UPDATE: the symmetric nn[c] */
    int poly;      /* SP: alpha c_k, + b_k nn[l], + a_k I (else alpha 1, nothing added) */
    int mirror;    /* COMBINE, SP: the result is read whole later (mirrored after its gather) */
    int scaled;    /* PARTIALS: alpha s^2, UPDATE: alpha s (the first step or phase) */
    int src, dst;  /* PARTIALS: src; UPDATE: src -> dst */
    int last;      /* UPDATE: the call's last step */
} split_op;

/* One rank's machine (mu__split_new; one process: on the stack, its
 * buffers in the workspace). */
struct mu__split {
    split_plan p;
    mu_ns_opts opts;  /* heap machines: a copy (coefficients in coeffs) */
    double *coeffs;
    int g, rank, workers;
    int64_t b0, nb;   /* own blocks [b0, b0 + nb) */
    int64_t plen;     /* own piece: length along m */
    int64_t *bstart;  /* g + 1: every rank's first block */
    int *owner;       /* S: every stripe's owner */
    int64_t *soff;    /* S: a stripe's offset in its owner's packed stripes */
    int64_t *tri;     /* g: elements of every rank's stripes */
    int64_t *own;     /* own stripes (nown) */
    int64_t nown;
    /* exchange tables, g entries each */
    int64_t *x1sc, *x1sd, *x1rc, *x1rd; /* partials */
    int64_t *agc, *agd;                 /* stripes */
    int64_t *hc, *hd;                   /* head: 2 per rank */
    int64_t *stc, *std_;                /* status: 1 per rank */
    int64_t *gc, *gd;                   /* guard: 2 per block */
    int64_t *nc, *nd;                   /* norms: 2 per block and matrix (set per call) */
    /* buffers */
    void *nn[SPLIT_NBUF];         /* n x n (bfloat16: nn[0] float32 A, nn[1] A and B bfloat16) */
    void *tmp[MU__POOL_MAX];      /* per worker: max(n^2, bfloat16: n w) (float32 for bfloat16) */
    void *xp[2];                  /* pieces (bfloat16: xp[0] is the bfloat16 iterate) */
    void *send1, *recv1, *gsend, *grecv;
    double head[2], *hrecv, status, *strecv, *gsendn, *grecvn;
    double *nsend, *nrecv;        /* norms of a call (grown with the batch) */
    int64_t ncap;                 /* doubles of nsend + nrecv */
    void *mem, *nmem;             /* heap machines' buffers (mem: everything else) */
    size_t bytes;
    mu__dnnl *dnnl;
    int own_dnnl;
    split_op *prog;
    int nstd, ngram, final_xp;    /* prog: standard ops [0, nstd), Gram ops after */
    /* the call */
    int state, err;
    int64_t batch, i;
    const char *in;
    char *out;
    int inplace;
    const split_op *run;          /* the current program, its length, the next op */
    int nrun, pc;
    const split_op *pending;      /* an op whose exchange the driver made: its post is due */
    const char *x0;               /* the current matrix's step-1 source */
    double xs, norm, bfd;         /* the folded scale; the norm; bfloat16: the divisor */
};

static inline size_t split_es(const split_plan *p) { return mu_dtype_size(p->dt); }

static inline int64_t piece_elems(const mu__split *s) { return s->p.n * s->plen; }

/* Own block j of a piece buffer (one matrix of this rank's pieces): its
 * first element; *ld its leading dimension (a wide piece's width; n). */
static inline char *piece_block(const mu__split *s, const char *base, int64_t j, int64_t *ld)
{
    const split_plan *p = &s->p;
    const int64_t off = (j - s->b0) * p->w;
    *ld = p->tall ? p->n : s->plen;
    return (char *)base + (p->tall ? off * p->n : off) * (int64_t)split_es(p);
}

/* Own block j of the bfloat16 iterate: n x width, row-major, packed. */
static inline uint16_t *bf16_block(const mu__split *s, int64_t j)
{
    return (uint16_t *)s->xp[0] + (j - s->b0) * s->p.n * s->p.w;
}

static inline float bfr(float f) { return mu__f32_from_bf16(mu__bf16_from_f32(f)); }

/* The phases (src/ns_split_phases.c). Run op (NULL: only the post) on the
 * machine's worker team, after the post of `post` (an op whose exchange
 * is done, or with g = 1 the op before: its result unpacked, mirrored). */
void mu__split_run_op(mu__split *s, const split_op *post, const split_op *op);
/* The norm terms (2 per block: see the phases) of every own block of
 * `matrices` matrices of pieces from src into terms, matrix by matrix. */
void mu__split_run_norms(mu__split *s, const char *src, int64_t matrices, int bf16, double *terms);
/* The norm of k blocks' terms in block order; 0 when one holds NaN/Inf. */
int mu__split_combine_norms(const double *v, int64_t k, double *norm);
/* oneDNN made ready for every product shape of a bfloat16 plan. */
int mu__split_bf16_want(const mu__split *s);

#endif
