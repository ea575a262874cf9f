/*
 * Fused multi-tensor ops (mu_foreach_*): one pass over memory per op, over
 * arrays of contiguous tensors, split across threads by the total element
 * range, no allocation.
 *
 * Kernels. Each op is written once, in src/foreach_generic.h, over a small
 * vector layer (src/foreach_vec.h) and compiled per dtype (float, double)
 * and per instruction set: portable C, AVX2+FMA and AVX-512. The dispatch
 * table KERNELS (Torch7's THVectorDispatch) picks the variant once per
 * call; the last len % W elements of each segment go to the portable
 * kernel. Every variant computes each element with the same IEEE
 * operations, so results do not depend on the CPU (tests compare them:
 * MU_FOREACH_SIMD=portable|avx2|avx512 caps the choice, MU_FOREACH_NOSIMD=1
 * is portable).
 *
 * Rounding. The ops reproduce the float32 (float64) rounding of the PyTorch
 * sequences they replace:
 *   momentum  u  = fma(m1, buf, g)          torch._foreach_add(g, buf, alpha=m1)
 *             b' = (buf * m2) + g           _foreach_mul_(bufs, m2); _foreach_add_(bufs, g)
 *             nesterov: u = (u * m1) + g    _foreach_mul_(us, m1); _foreach_add_(us, g)
 *   apply     p  = fma(alpha, u * s, p * decay)
 *                                           update.mul_(s); p.mul_(decay);
 *                                           p.add_(update, alpha=alpha)
 *   scale     x  = x * s
 *   adamw     see foreach_generic.h (torch 2.x's torch.optim.AdamW single-tensor
 *             path; 1 ulp from torch 1.13).
 *   lion      c = fma(1-b1, g, m*b1); u = sign(c); m' = fma(1-b2, g, m*b2)
 *                                           lion-pytorch's m.mul(b1).add(g, alpha=1-b1)
 * Scalars are rounded to the tensor dtype first, as torch does for a Python
 * scalar applied to a float32 tensor. torch's CPU add-with-alpha is a fused
 * multiply-add (Vectorized fmadd; checked against torch 1.13: 100% equal
 * with fma, 71% with separate multiply and add), so those steps use an
 * explicit fma and every other step must NOT be contracted: GCC in ISO C
 * mode (-std=c11, as the Makefile builds) defaults to -ffp-contract=off;
 * the pragmas below enforce it for clang and GNU dialects as well. Never
 * build this file with -ffast-math.
 *
 * Checks. The kernels that write an optimizer's step (momentum, adamw,
 * lion) report, from the same pass, the first tensor where a value they
 * wrote is NaN or Inf: the update (or, given the parameters, the value the
 * apply would write: fma(alpha, u, p * decay)) and the new state as stored
 * (bfloat16: the rounded value). They still write every element, so the
 * caller decides; the step's NaN/Inf checks cost no pass of their own.
 * The check-only ops (all_finite, apply's check) stop at the first bad
 * value.
 *
 * Threads: a call whose total element count reaches MU__FOREACH_MT_MIN runs
 * on up to the CPUs in the process affinity mask (capped at
 * MU__FOREACH_MAX_THREADS; the environment variable MU_FOREACH_THREADS
 * overrides the count, e.g. 1 for MPI ranks that fill the cores, and
 * MU_FOREACH_MT_MIN the threshold), through parallel_for on the shared
 * worker pool (src/pool.c). Each element is
 * computed by the same code whatever the split, so results are bitwise
 * independent of the thread count.
 */
#define _GNU_SOURCE
#include "pool.h"
#include "tensor_internal.h"

#include <math.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off") /* GNU dialects default to "fast" */
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MU__X86 1
#else
#define MU__X86 0
#endif

/* Below this many elements in a call, run on the calling thread only.
 * Measured on the 2-core EPYC (tests/bench/foreach_bench.lua): spawning and
 * joining one thread costs ~25-50 us, and one thread already streams
 * ~45 GB/s against ~55 GB/s for two, so the second thread pays off only for
 * passes of >= ~1 ms: 1<<21 elements (8 MB per float32 array). */
#ifndef MU__FOREACH_MT_MIN
#define MU__FOREACH_MT_MIN (1 << 21)
#endif
#define MU__FOREACH_MAX_THREADS 8
/* Thread range boundaries are rounded to this many elements (a cache line
 * of float32 / two of float64) so threads do not write the same line. */
#define MU__FOREACH_ALIGN 16

/* ------------------------------------------------------------ operations */

/* The ops' argument structs, in double as the API takes them (the kernels
 * round them to the dtype), and each op's arrays in kernel order. */
typedef struct momentum_args { /* grads, bufs, new_bufs, updates */
    double m1, m2;
    int nesterov;
} momentum_args;
typedef struct apply_args { /* params, updates */
    const double *scales; /* per tensor, or NULL for 1 */
    double decay, alpha;
    int cautious;
    int check; /* write nothing, report a non-finite result (mu_foreach_apply_finite) */
} apply_args;
typedef struct scale_args { /* xs */
    const double *scales; /* per tensor, or NULL for scale */
    double scale;
} scale_args;
typedef struct adamw_args { /* params (or NULL), grads, m, v, new m, new v, updates (or NULL) */
    double decay; /* 1 - lr * weight_decay; with updates: the checked apply's decay */
    double alpha; /* with params and updates: the checked apply's alpha */
    double w;     /* the lerp weight 1 - beta1 */
    double b2;    /* beta2 */
    double bc2s;  /* sqrt(1 - beta2^step) */
    double eps;
    double nss;   /* -lr / (1 - beta1^step) */
} adamw_args;
typedef struct lion_args { /* grads, m, new m, updates, params (or NULL) */
    double beta1, beta2;
    double decay, alpha; /* the checked apply's (with params) */
} lion_args;
typedef struct triad_args { /* dst, a, b */
    double s;
} triad_args;
typedef struct pack_args { /* the tensors */
    char *batch;
    const int64_t *offsets;
    size_t esize;
    int unpack;
} pack_args;

enum { OP_MOMENTUM, OP_APPLY, OP_SCALE, OP_ADAMW, OP_LION, OP_FINITE, OP_TRIAD, OP_COUNT };

/* A kernel: elements [k0, k0 + len) of tensor index i, p[] pointing at
 * element k0 of each of the op's arrays; len is a multiple of width.
 * Returns 0 when it found a bad value (a NaN or Inf it checks), else 1. */
typedef int (*kernel_fn)(const void *args, int i, int64_t k0, int64_t len, char *const *p);
typedef struct kernel {
    kernel_fn fn;
    int width;
} kernel;

/* ---------------------------------------------------------------- kernels */

/* Instruction sets (macros: foreach_vec.h tests them in #if). */
#define FE_PORTABLE 0
#define FE_AVX2 1
#define FE_AVX512 2
#define FE_ISA_COUNT 3

#define FE_ISA FE_PORTABLE
#include "foreach_types.h"
#if MU__X86
#define FE_ISA FE_AVX2
#include "foreach_types.h"
#define FE_ISA FE_AVX512
#include "foreach_types.h"
#endif

/* Kernel variants: float, double, float maths on bfloat16 state. */
enum { VAR_F32 = MU_F32, VAR_F64 = MU_F64, VAR_BF16, VAR_COUNT };

/* The dispatch table: each op's kernel per instruction set and variant. */
static const kernel *const KERNELS[FE_ISA_COUNT][VAR_COUNT] = {
    [FE_PORTABLE] = { kernels_f32_portable, kernels_f64_portable, kernels_f32_bf16_portable },
#if MU__X86
    [FE_AVX2] = { kernels_f32_avx2, kernels_f64_avx2, kernels_f32_bf16_avx2 },
    [FE_AVX512] = { kernels_f32_avx512, kernels_f64_avx512, kernels_f32_bf16_avx512 },
#endif
};

/* Per op, the widest instruction set that pays. Measured on the 2-core
 * EPYC (Zen 4), one thread, 4K to 8M elements, AVX-512 / AVX2 time:
 * momentum 0.87-1.22 and adamw 0.97-1.11 (slower on tensors past the
 * caches: two store streams of unaligned 64-byte vectors), apply 0.83-1.0,
 * cautious 0.81-1.0, scale 0.57-1.0, all_finite 0.67-0.99. */
static const int PAYS[OP_COUNT] = {
    [OP_MOMENTUM] = FE_AVX2, [OP_APPLY] = FE_AVX512, [OP_SCALE] = FE_AVX512,
    [OP_ADAMW] = FE_AVX2,    [OP_FINITE] = FE_AVX512, [OP_TRIAD] = FE_AVX2,
    [OP_LION] = FE_AVX2, /* two store streams, as momentum */
};

/* The instruction set for op: the widest the CPU has, up to the one that
 * pays. MU_FOREACH_SIMD = "portable", "avx2" or "avx512" asks for that
 * one instead (if the CPU has it) and MU_FOREACH_NOSIMD=1 for portable,
 * read per call so that tests can compare the variants. */
static int pick_isa(int op)
{
    int cpu = FE_PORTABLE;
#if MU__X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        cpu = FE_AVX2;
        if (__builtin_cpu_supports("avx512f")) cpu = FE_AVX512;
    }
#endif
    const char *no = getenv("MU_FOREACH_NOSIMD"), *want = getenv("MU_FOREACH_SIMD");
    int isa = PAYS[op];
    if (no && *no && *no != '0') isa = FE_PORTABLE;
    else if (want && strcmp(want, "portable") == 0) isa = FE_PORTABLE;
    else if (want && strcmp(want, "avx2") == 0) isa = FE_AVX2;
    else if (want && strcmp(want, "avx512") == 0) isa = FE_AVX512;
    return isa < cpu ? isa : cpu;
}

/* Pack/unpack: a copy of bytes, the same for every dtype and CPU. */
static int pack_seg(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const pack_args *a = va;
    char *bt = a->batch + (a->offsets[i] + k0) * (int64_t)a->esize;
    if (a->unpack) memcpy(p[0], bt, (size_t)len * a->esize);
    else memcpy(bt, p[0], (size_t)len * a->esize);
    return 1;
}

/* ------------------------------------------------------------------ jobs */

enum { MAX_ARRAYS = 7 };

/* One call: its arrays of n tensors in its kernel's order (NULL: unused),
 * the argument struct, the kernel and the portable kernel for the tails. */
typedef struct job {
    int n, narr;
    mu_tensor *const *arr[MAX_ARRAYS];
    const void *args;
    kernel body, tail;
    int64_t total;
    int nthreads;
    int complete; /* a kernel that reports a bad value wrote it: go on (else stop there) */
    int bad[MU__FOREACH_MAX_THREADS]; /* first tensor a kernel reported bad, per thread */
} job;

/* The first array given: its element counts are the ones split. */
static mu_tensor *const *lead(const job *J)
{
    for (int a = 0; a < J->narr; a++)
        if (J->arr[a]) return J->arr[a];
    return NULL;
}

static void at(const job *J, int i, int64_t k, char **p)
{
    for (int a = 0; a < J->narr; a++) {
        const mu_tensor *t = J->arr[a] ? J->arr[a][i] : NULL;
        p[a] = t ? (char *)t->data + k * (int64_t)mu_dtype_size(t->scalar) : NULL;
    }
}

/* Elements [k0, k0+len) of tensor index i: the kernel on the whole steps,
 * the portable kernel on the rest. 0 if a kernel reported a bad value
 * (a check-only job stops there). */
static int segment(const job *J, int i, int64_t k0, int64_t len)
{
    char *p[MAX_ARRAYS];
    int64_t nv = len - len % J->body.width;
    int ok = 1;
    if (nv > 0) {
        at(J, i, k0, p);
        ok = J->body.fn(J->args, i, k0, nv, p);
        if (!ok && !J->complete) return 0;
    }
    if (nv == len) return ok;
    at(J, i, k0 + nv, p);
    return J->tail.fn(J->args, i, k0 + nv, len - nv, p) & ok;
}

static int64_t range_edge(const job *J, int tid)
{
    if (tid >= J->nthreads) return J->total;
    int64_t e = (int64_t)((double)J->total * tid / J->nthreads);
    e -= e % MU__FOREACH_ALIGN;
    return e;
}

/* Range tid of the job's element range. */
static void run_range(void *arg, int tid)
{
    job *J = arg;
    mu_tensor *const *ts = lead(J);
    int64_t lo = range_edge(J, tid), hi = range_edge(J, tid + 1), base = 0;
    J->bad[tid] = -1;
    for (int i = 0; i < J->n && base < hi; i++) {
        int64_t ne = mu_tensor_numel(ts[i]);
        int64_t s = lo > base ? lo - base : 0, e = hi - base < ne ? hi - base : ne;
        if (s < e && !segment(J, i, s, e - s) && J->bad[tid] < 0) {
            J->bad[tid] = i;
            if (!J->complete) return; /* later tensors of this range cannot be "first" */
        }
        base += ne;
    }
}

/* ------------------------------------------------------------- threading */

typedef struct for_range {
    int n;
    void (*fn)(void *, int);
    void *arg;
} for_range;

static void for_range_worker(mu__pool *team, int rank, void *p)
{
    const for_range *r = p;
    for (int t = rank; t < r->n; t += mu__pool_size(team)) r->fn(r->arg, t);
}

/* fn(arg, t) for t = 0..n-1 on a team of the one worker pool (src/pool.c:
 * threads made per call, or the host's OpenMP team; 64 KiB stacks where the
 * process allows them), the calling thread taking part: the one place
 * foreach meets threads. A smaller team runs several t per worker
 * (results do not depend on who computes them). */
static void parallel_for(int n, void (*fn)(void *, int), void *arg)
{
    for_range r = { n, fn, arg };
    mu__pool_cfg cfg = { .workers = n, .openmp = 1, .stack = 1 << 16 };
    mu__pool_run(&cfg, for_range_worker, &r);
}

/* Threads for a large call: MU_FOREACH_THREADS if set (e.g. 1 for MPI ranks
 * that already fill the cores), else the CPUs this process may run on. */
static int cpu_count(void)
{
    const char *env = getenv("MU_FOREACH_THREADS");
    if (env && *env) {
        int t = atoi(env);
        return t < 1 ? 1 : t > MU__FOREACH_MAX_THREADS ? MU__FOREACH_MAX_THREADS : t;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    int c = CPU_COUNT(&set);
    return c < 1 ? 1 : c > MU__FOREACH_MAX_THREADS ? MU__FOREACH_MAX_THREADS : c;
}

static void run_job(job *J)
{
    mu_tensor *const *ts = lead(J);
    J->total = 0;
    for (int i = 0; i < J->n; i++) J->total += mu_tensor_numel(ts[i]);
    int64_t mt_min = MU__FOREACH_MT_MIN;
    const char *env = getenv("MU_FOREACH_MT_MIN"); /* benchmarks measure the threshold */
    if (env && *env) mt_min = atoll(env);
    J->nthreads = J->total >= mt_min ? cpu_count() : 1;
    parallel_for(J->nthreads, run_range, J);
}

/* Run body (the portable tail on the last len % width elements of each
 * segment) over n tensors per array, arrs in the kernels' order. */
static void run(job *J, int n, int narr, mu_tensor *const *const *arrs, const void *args,
                kernel body, kernel tail)
{
    J->n = n;
    J->narr = narr;
    for (int a = 0; a < narr; a++) J->arr[a] = arrs[a];
    J->args = args;
    J->body = body;
    J->tail = tail;
    run_job(J);
}

/* Run op on the variant's kernels, the instruction set picked per op.
 * The ops that only check (all_finite, apply's check) stop at the first
 * bad value; the others write everything. */
static void run_op(job *J, int op, int var, int n, int narr, mu_tensor *const *const *arrs,
                   const void *args)
{
    memset(J, 0, sizeof *J);
    J->complete = op != OP_FINITE && op != OP_APPLY;
    run(J, n, narr, arrs, args, KERNELS[pick_isa(op)][var][op], KERNELS[FE_PORTABLE][var][op]);
}

/* ------------------------------------------------------------ validation */

static int check_tensor(const mu_tensor *t, const char *what, int i, int dtype)
{
    if (!t) return mu__fail(MU_EINVAL, "%s[%d] is NULL", what, i);
    char name[48];
    mu__name_index(name, sizeof name, what, "[", i, "]");
    int rc = mu__tensor_check(t, name); /* inside its storage */
    if (rc) return rc;
    if (t->scalar != dtype)
        return mu__fail(MU_EDTYPE, "%s[%d] has dtype %s, expected %s", what, i,
                        mu_dtype_name(t->scalar), mu_dtype_name(dtype)); /* (known: checked above) */
    if (!mu_tensor_is_contiguous(t))
        return mu__fail(MU_EINVAL, "%s[%d] is not contiguous (pass contiguous tensors)", what, i);
    return MU_OK;
}

/* Two tensors of one index either are the same memory in the same dtype
 * or do not overlap (exact aliasing is fine element-wise; partial overlap,
 * or one buffer seen in two dtypes, is not). */
static int overlap_bad(const mu_tensor *x, const mu_tensor *y)
{
    if (x->data == y->data && x->scalar == y->scalar) return 0;
    const char *xa = x->data, *xb = xa + mu_tensor_numel(x) * (int64_t)mu_dtype_size(x->scalar);
    const char *ya = y->data, *yb = ya + mu_tensor_numel(y) * (int64_t)mu_dtype_size(y->scalar);
    return xa < yb && ya < xb;
}

/* The first tensor of the arrays whose bit in `mask` is (or is not) set. */
static const mu_tensor *first_of(int n, int narr, mu_tensor *const *const *arrays, unsigned mask,
                                 int want, int *which)
{
    for (int k = 0; k < narr; k++)
        if (((mask >> k) & 1u) == (unsigned)want && n > 0 && arrays[k][0]) {
            *which = k;
            return arrays[k][0];
        }
    return NULL;
}

/* Validate n arrays of tensors (names[k], arrays[k]) for equal numel per
 * index, dtypes, contiguity and overlap. The arrays whose bit is set in
 * `state` hold optimizer state: they share one dtype, the others' (taken
 * from the first of them) or MU_BF16 when the others are MU_F32; the
 * others are MU_F32 or MU_F64. *variant: the kernels to run (VAR_*). */
static int check_arrays(int n, int narr, mu_tensor *const *const *arrays, const char *const *names,
                        unsigned state, int *variant)
{
    if (n < 0) return mu__fail(MU_EINVAL, "n = %d is negative", n);
    for (int k = 0; k < narr; k++)
        if (n > 0 && !arrays[k]) return mu__fail(MU_EINVAL, "%s is NULL", names[k]);
    int kp = -1, ks = -1;
    const mu_tensor *tp = first_of(n, narr, arrays, state, 0, &kp);
    const mu_tensor *ts = first_of(n, narr, arrays, state, 1, &ks);
    int dt = tp ? tp->scalar : ts && ts->scalar != MU_BF16 ? ts->scalar : MU_F32;
    int st = ts ? ts->scalar : dt;
    if (dt != MU_F32 && dt != MU_F64) {
        const char *dn = mu_dtype_name(dt);
        return dn ? mu__fail(MU_EDTYPE, "%s[0] has unsupported dtype %s", names[tp ? kp : ks], dn)
                  : mu__fail(MU_EDTYPE, "%s[0] has unsupported dtype %d", names[tp ? kp : ks], dt);
    }
    if (st != dt && !(st == MU_BF16 && dt == MU_F32))
        return mu_dtype_name(st)
                   ? mu__fail(MU_EDTYPE, "%s[0] has dtype %s, expected %s%s", names[ks],
                              mu_dtype_name(st), mu_dtype_name(dt), dt == MU_F32 ? " or bfloat16" : "")
                   : mu__fail(MU_EDTYPE, "%s[0] has unsupported dtype %d", names[ks], st);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < narr; k++) {
            int rc = check_tensor(arrays[k][i], names[k], i, (state >> k) & 1u ? st : dt);
            if (rc) return rc;
        }
        int64_t ne = mu_tensor_numel(arrays[0][i]);
        for (int k = 1; k < narr; k++) {
            int64_t nk = mu_tensor_numel(arrays[k][i]);
            if (nk != ne)
                return mu__fail(MU_ESHAPE, "index %d: %s[%d] has %lld elements but %s[%d] has %lld",
                                i, names[k], i, (long long)nk, names[0], i, (long long)ne);
        }
        for (int k = 0; k < narr; k++)
            for (int l = k + 1; l < narr; l++)
                if (overlap_bad(arrays[k][i], arrays[l][i]))
                    return mu__fail(MU_EINVAL, "index %d: %s[%d] and %s[%d] partially overlap", i,
                                    names[k], i, names[l], i);
    }
    *variant = st == MU_BF16 ? VAR_BF16 : dt;
    return MU_OK;
}

static int finite_scalar(const char *what, double v)
{
    if (!isfinite(v)) return mu__fail(MU_EINVAL, "%s = %g is not finite", what, v);
    return MU_OK;
}

/* The arrays of a { grads, state, new state, updates } op (momentum, Lion)
 * and its two scalars: the state arrays may be bfloat16; the updates alias
 * none of the others (new state may be the state: in place). The arrays
 * whose bit (1 << k) is set in `optional` may be NULL (momentum's parts):
 * the others are checked alike. */
static int check_state_op(int n, mu_tensor *const *const *arrs, const char *const *names,
                          unsigned optional, const char *s1, double v1, const char *s2, double v2,
                          int *var)
{
    mu_tensor *const *given[4];
    const char *gnames[4];
    unsigned state = 0;
    int narr = 0;
    for (int k = 0; k < 4; k++) {
        if (!arrs[k] && ((optional >> k) & 1u)) continue;
        if (k == 1 || k == 2) state |= 1u << narr;
        given[narr] = arrs[k];
        gnames[narr++] = names[k];
    }
    int rc = check_arrays(n, narr, given, gnames, state, var);
    if (rc || (rc = finite_scalar(s1, v1)) || (rc = finite_scalar(s2, v2))) return rc;
    for (int i = 0; arrs[3] && i < n; i++) {
        const void *u = arrs[3][i]->data;
        if (mu_tensor_numel(arrs[3][i]) > 0 &&
            (u == arrs[0][i]->data || u == arrs[1][i]->data || (arrs[2] && u == arrs[2][i]->data)))
            return mu__fail(MU_EINVAL, "updates[%d] aliases an input or %s[%d]", i, names[2], i);
    }
    return MU_OK;
}

/* ------------------------------------------------------------ public API */

/* The first tensor a job's kernels reported bad, or -1. */
static int first_bad(const job *J)
{
    int first = -1;
    for (int t = 0; t < J->nthreads; t++)
        if (J->bad[t] >= 0 && (first < 0 || J->bad[t] < first)) first = J->bad[t];
    return first;
}

/* A job's report: 1 (nothing bad), or 0 with *bad (when not NULL) the
 * first tensor reported bad. */
static int report(const job *J, int *bad)
{
    int first = first_bad(J);
    if (bad) *bad = first;
    return first < 0 ? 1 : 0;
}

int mu_foreach_momentum(int n, mu_tensor *const *grads, mu_tensor *const *bufs,
                        mu_tensor *const *new_bufs, mu_tensor *const *updates, double m1,
                        double m2, int nesterov, int *bad)
{
    if (bad) *bad = -1;
    if (!new_bufs && !updates)
        return mu__fail(MU_EINVAL, "momentum: new_bufs and updates are both NULL (nothing to write)");
    mu_tensor *const *arrs[4] = { grads, bufs, new_bufs, updates };
    const char *names[4] = { "grads", "bufs", "new_bufs", "updates" };
    int dtype, rc = check_state_op(n, arrs, names, 0xCu, "m1", m1, "m2", m2, &dtype);
    if (rc) return rc;
    momentum_args a = { m1, m2, nesterov != 0 };
    job J;
    run_op(&J, OP_MOMENTUM, dtype, n, 4, arrs, &a);
    return report(&J, bad);
}

static int apply_job(int n, mu_tensor *const *params, mu_tensor *const *updates,
                     const double *scales, double decay, double alpha, int cautious, int *bad)
{
    mu_tensor *const *arrs[2] = { params, updates };
    const char *names[2] = { "params", "updates" };
    int dtype, rc = check_arrays(n, 2, arrs, names, 0, &dtype);
    if (rc) return rc;
    if ((rc = finite_scalar("decay", decay)) || (rc = finite_scalar("alpha", alpha))) return rc;
    if (scales)
        for (int i = 0; i < n; i++)
            if (!isfinite(scales[i]))
                return mu__fail(MU_EINVAL, "scales[%d] = %g is not finite", i, scales[i]);
    apply_args a = { scales, decay, alpha, cautious, bad != NULL };
    job J;
    run_op(&J, OP_APPLY, dtype, n, 2, arrs, &a);
    return bad ? report(&J, bad) : MU_OK;
}

int mu_foreach_apply(int n, mu_tensor *const *params, mu_tensor *const *updates,
                     const double *scales, double decay, double alpha)
{
    return apply_job(n, params, updates, scales, decay, alpha, 0, NULL);
}

int mu_foreach_apply_cautious(int n, mu_tensor *const *params, mu_tensor *const *updates,
                              const double *scales, double decay, double alpha)
{
    return apply_job(n, params, updates, scales, decay, alpha, 1, NULL);
}

int mu_foreach_apply_finite(int n, mu_tensor *const *params, mu_tensor *const *updates,
                            const double *scales, double decay, double alpha, int cautious, int *bad)
{
    int none;
    if (!bad) bad = &none;
    *bad = -1;
    return apply_job(n, params, updates, scales, decay, alpha, cautious != 0, bad);
}

int mu_foreach_scale(int n, mu_tensor *const *xs, const double *scales, double scale)
{
    mu_tensor *const *arrs[1] = { xs };
    const char *names[1] = { "xs" };
    int dtype, rc = check_arrays(n, 1, arrs, names, 0, &dtype);
    if (rc) return rc;
    if (scales) {
        for (int i = 0; i < n; i++)
            if (!isfinite(scales[i]))
                return mu__fail(MU_EINVAL, "scales[%d] = %g is not finite", i, scales[i]);
    } else if ((rc = finite_scalar("scale", scale))) {
        return rc;
    }
    scale_args a = { scales, scale };
    job J;
    run_op(&J, OP_SCALE, dtype, n, 1, arrs, &a);
    return MU_OK;
}

/* AdamW's scalars, checked, into a. */
static int adamw_scalars(adamw_args *a, double lr, double beta1, double beta2, double eps,
                         double weight_decay, int64_t step)
{
    int rc;
    if ((rc = finite_scalar("lr", lr)) || (rc = finite_scalar("eps", eps)) ||
        (rc = finite_scalar("weight_decay", weight_decay)))
        return rc;
    if (!(beta1 >= 0.0 && beta1 < 1.0)) return mu__fail(MU_EINVAL, "beta1 = %g is not in [0, 1)", beta1);
    if (!(beta2 >= 0.0 && beta2 < 1.0)) return mu__fail(MU_EINVAL, "beta2 = %g is not in [0, 1)", beta2);
    if (eps < 0.0) return mu__fail(MU_EINVAL, "eps = %g is negative", eps);
    if (step < 1) return mu__fail(MU_EINVAL, "step = %lld must be >= 1", (long long)step);
    double bc1 = 1.0 - pow(beta1, (double)step);
    double bc2 = 1.0 - pow(beta2, (double)step);
    if (!(bc1 > 0.0) || !(bc2 > 0.0))
        return mu__fail(MU_EINVAL, "bias correction is zero (beta1 = %g, beta2 = %g, step = %lld)",
                        beta1, beta2, (long long)step);
    *a = (adamw_args){ .decay = 1.0 - lr * weight_decay, .w = 1.0 - beta1, .b2 = beta2,
                       .bc2s = sqrt(bc2), .eps = eps, .nss = -(lr / bc1) };
    return MU_OK;
}

/* Arrays arrs[l] and arrs[k] (l < k < nsep) must not be the same memory at
 * any index (outputs may alias only the inputs they replace). */
static int adamw_distinct(int n, int narr, mu_tensor *const *const *arrs, const char *const *names)
{
    for (int i = 0; i < n; i++)
        for (int k = 1; k < narr; k++)
            for (int l = 0; l < k; l++)
                if (arrs[k][i]->data == arrs[l][i]->data && mu_tensor_numel(arrs[k][i]) > 0)
                    return mu__fail(MU_EINVAL, "index %d: %s[%d] and %s[%d] are the same memory",
                                    i, names[l], i, names[k], i);
    return MU_OK;
}

int mu_foreach_adamw(int n, mu_tensor *const *params, mu_tensor *const *grads,
                     mu_tensor *const *exp_avgs, mu_tensor *const *exp_avg_sqs, double lr,
                     double beta1, double beta2, double eps, double weight_decay, int64_t step)
{
    mu_tensor *const *arrs[4] = { params, grads, exp_avgs, exp_avg_sqs };
    const char *names[4] = { "params", "grads", "exp_avgs", "exp_avg_sqs" };
    int dtype, rc = check_arrays(n, 4, arrs, names, 0xcu, &dtype); /* the moments: state */
    if (rc) return rc;
    adamw_args a;
    if ((rc = adamw_scalars(&a, lr, beta1, beta2, eps, weight_decay, step))) return rc;
    if ((rc = adamw_distinct(n, 4, arrs, names))) return rc;
    mu_tensor *const *karrs[7] = { params, grads, exp_avgs, exp_avg_sqs, exp_avgs, exp_avg_sqs, NULL };
    job J;
    run_op(&J, OP_ADAMW, dtype, n, 7, karrs, &a);
    return MU_OK;
}

/* The parameters an update op checks its apply against (NULL: none): as
 * grads (dtype, numel, contiguous) and read only: neither the same memory
 * as nor overlapping any of the op's nout outputs; decay, alpha finite. */
static int check_params(int n, mu_tensor *const *params, mu_tensor *const *grads, int nout,
                        mu_tensor *const *const *outs, const char *const *onames, double decay,
                        double alpha)
{
    if (!params) return MU_OK;
    mu_tensor *const *arrs[2] = { grads, params };
    const char *names[2] = { "grads", "params" };
    int var, rc = check_arrays(n, 2, arrs, names, 0, &var);
    if (rc || (rc = finite_scalar("decay", decay)) || (rc = finite_scalar("alpha", alpha))) return rc;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nout; k++)
            if (mu_tensor_numel(params[i]) > 0 &&
                (params[i]->data == outs[k][i]->data || overlap_bad(params[i], outs[k][i])))
                return mu__fail(MU_EINVAL, "index %d: params[%d] overlaps %s[%d] (params are read only)",
                                i, i, onames[k], i);
    return MU_OK;
}

int mu_foreach_adamw_update(int n, mu_tensor *const *grads, mu_tensor *const *exp_avgs,
                            mu_tensor *const *exp_avg_sqs, mu_tensor *const *new_exp_avgs,
                            mu_tensor *const *new_exp_avg_sqs, mu_tensor *const *updates,
                            double lr, double beta1, double beta2, double eps, int64_t step,
                            mu_tensor *const *params, double decay, double alpha, int *bad)
{
    if (bad) *bad = -1;
    mu_tensor *const *arrs[6] = { grads, exp_avgs, exp_avg_sqs, new_exp_avgs, new_exp_avg_sqs,
                                  updates };
    const char *names[6] = { "grads", "exp_avgs", "exp_avg_sqs", "new_exp_avgs",
                             "new_exp_avg_sqs", "updates" };
    int dtype, rc = check_arrays(n, 6, arrs, names, 0x1eu, &dtype); /* the moments: state */
    if (rc) return rc;
    adamw_args a;
    if ((rc = adamw_scalars(&a, lr, beta1, beta2, eps, 0.0, step))) return rc;
    /* The inputs, and the outputs, are distinct; new_exp_avgs may be
     * exp_avgs and new_exp_avg_sqs exp_avg_sqs (in place), nothing else. */
    mu_tensor *const *ins[3] = { grads, exp_avgs, exp_avg_sqs };
    mu_tensor *const *outs[3] = { new_exp_avgs, new_exp_avg_sqs, updates };
    if ((rc = adamw_distinct(n, 3, ins, names)) || (rc = adamw_distinct(n, 3, outs, names + 3)))
        return rc;
    for (int i = 0; i < n; i++) {
        if (mu_tensor_numel(grads[i]) == 0) continue;
        for (int k = 0; k < 3; k++)
            for (int l = 0; l < 3; l++)
                if (outs[k][i]->data == ins[l][i]->data && !(l == k + 1))
                    return mu__fail(MU_EINVAL, "index %d: %s[%d] aliases %s[%d]", i, names[k + 3],
                                    i, names[l], i);
    }
    if ((rc = check_params(n, params, grads, 3, outs, names + 3, decay, alpha))) return rc;
    a.decay = decay;
    a.alpha = alpha;
    mu_tensor *const *karrs[7] = { params,       grads,           exp_avgs, exp_avg_sqs,
                                   new_exp_avgs, new_exp_avg_sqs, updates };
    job J;
    run_op(&J, OP_ADAMW, dtype, n, 7, karrs, &a);
    return report(&J, bad);
}

int mu_foreach_all_finite(int n, mu_tensor *const *xs, int *bad)
{
    if (bad) *bad = -1;
    mu_tensor *const *arrs[1] = { xs };
    const char *names[1] = { "xs" };
    int dtype, rc;
    if ((rc = check_arrays(n, 1, arrs, names, 0x1u, &dtype))) return rc; /* any dtype */
    job J;
    run_op(&J, OP_FINITE, dtype, n, 1, arrs, NULL);
    return report(&J, bad);
}

int mu_foreach_sumsq(int n, mu_tensor *const *xs, double *out)
{
    if (n < 0) return mu__fail(MU_EINVAL, "n = %d is negative", n);
    if (n > 0 && (!xs || !out)) return mu__fail(MU_EINVAL, "xs and out must not be NULL");
    for (int i = 0; i < n; i++) { /* (each tensor its own dtype) */
        char what[32];
        snprintf(what, sizeof what, "xs[%d]", i);
        int rc = mu__tensor_check(xs[i], what);
        if (rc) return rc;
        if (!mu_tensor_is_contiguous(xs[i])) return mu__fail(MU_EINVAL, "%s is not contiguous", what);
    }
    for (int i = 0; i < n; i++) {
        const int64_t len = mu_tensor_numel(xs[i]);
        double acc[8] = {0};
        int64_t k = 0;
        if (xs[i]->scalar == MU_F32) {
            const float *x = (const float *)xs[i]->data;
            for (; k + 8 <= len; k += 8)
                for (int j = 0; j < 8; j++) acc[j] += (double)x[k + j] * (double)x[k + j];
            for (; k < len; k++) acc[k % 8] += (double)x[k] * (double)x[k];
        } else if (xs[i]->scalar == MU_F64) {
            const double *x = (const double *)xs[i]->data;
            for (; k + 8 <= len; k += 8)
                for (int j = 0; j < 8; j++) acc[j] += x[k + j] * x[k + j];
            for (; k < len; k++) acc[k % 8] += x[k] * x[k];
        } else { /* bfloat16: the upper half of a float32 */
            const uint16_t *x = (const uint16_t *)xs[i]->data;
            for (; k < len; k++) {
                const double v = mu__f32_from_bf16(x[k]);
                acc[k % 8] += v * v;
            }
        }
        double s = 0.0;
        for (int j = 0; j < 8; j++) s += acc[j];
        out[i] = s;
    }
    return MU_OK;
}

static int check_batch(int n, mu_tensor *const *ts, const char *tname, const mu_tensor *batch,
                       const char *bname, const int64_t *offsets, int *dtype_out)
{
    mu_tensor *const *arrs[1] = { ts };
    const char *names[1] = { tname };
    int dtype, rc = check_arrays(n, 1, arrs, names, 0, &dtype);
    if (rc) return rc;
    if (!batch) return mu__fail(MU_EINVAL, "%s is NULL", bname);
    if ((rc = mu__tensor_check(batch, bname))) return rc;
    if (n > 0 && batch->scalar != dtype)
        return mu__fail(MU_EDTYPE, "%s has dtype %s but the %s are %s", bname,
                        mu_dtype_name(batch->scalar), tname, mu_dtype_name(dtype));
    if (!mu_tensor_is_contiguous(batch))
        return mu__fail(MU_EINVAL, "%s is not contiguous", bname);
    if (n > 0 && !offsets) return mu__fail(MU_EINVAL, "offsets is NULL");
    int64_t bn = mu_tensor_numel(batch);
    for (int i = 0; i < n; i++) {
        int64_t ne = mu_tensor_numel(ts[i]);
        if (offsets[i] < 0 || offsets[i] > bn || ne > bn - offsets[i])
            return mu__fail(MU_ESHAPE,
                            "index %d: offsets[%d] = %lld + %lld elements exceeds %s's %lld", i, i,
                            (long long)offsets[i], (long long)ne, bname, (long long)bn);
        if (ne > 0 && ts[i]->storage == batch->storage) {
            mu_tensor view = *batch;
            view.data = (char *)batch->data + offsets[i] * (int64_t)mu_dtype_size(dtype);
            view.ndim = 1;
            view.dims[0] = ne;
            view.strides[0] = 1;
            if (overlap_bad(ts[i], &view) || ts[i]->data == view.data)
                return mu__fail(MU_EINVAL, "%s[%d] overlaps its place in %s", tname, i, bname);
        }
    }
    *dtype_out = n > 0 ? dtype : batch->scalar;
    return MU_OK;
}

static int pack_job(int n, mu_tensor *const *ts, const mu_tensor *batch, const int64_t *offsets,
                    int dtype, int unpack)
{
    static const kernel copy = { pack_seg, 1 };
    pack_args a = { batch->data, offsets, mu_dtype_size(dtype), unpack };
    mu_tensor *const *arrs[1] = { ts };
    job J;
    memset(&J, 0, sizeof J);
    run(&J, n, 1, arrs, &a, copy, copy);
    return MU_OK;
}

int mu_foreach_pack(int n, mu_tensor *const *srcs, mu_tensor *dst, const int64_t *offsets)
{
    int dtype, rc = check_batch(n, srcs, "srcs", dst, "dst", offsets, &dtype);
    if (rc) return rc;
    return pack_job(n, srcs, dst, offsets, dtype, 0);
}

int mu_foreach_unpack(int n, const mu_tensor *src, mu_tensor *const *dsts, const int64_t *offsets)
{
    int dtype, rc = check_batch(n, dsts, "dsts", src, "src", offsets, &dtype);
    if (rc) return rc;
    return pack_job(n, dsts, src, offsets, dtype, 1);
}

int mu__foreach_triad(mu_tensor *dst, const mu_tensor *a, const mu_tensor *b, double s)
{
    mu_tensor *arr[3] = { dst, (mu_tensor *)a, (mu_tensor *)b };
    mu_tensor *const *arrs[3] = { &arr[0], &arr[1], &arr[2] };
    const char *names[3] = { "dst", "a", "b" };
    int dtype, rc = check_arrays(1, 3, arrs, names, 0, &dtype);
    if (rc) return rc;
    triad_args ta = { s };
    job J;
    run_op(&J, OP_TRIAD, dtype, 1, 3, arrs, &ta);
    return MU_OK;
}

int mu_foreach_lion_update(int n, mu_tensor *const *grads, mu_tensor *const *exp_avgs,
                           mu_tensor *const *new_exp_avgs, mu_tensor *const *updates,
                           double beta1, double beta2, mu_tensor *const *params, double decay,
                           double alpha, int *bad)
{
    if (bad) *bad = -1;
    mu_tensor *const *arrs[5] = { grads, exp_avgs, new_exp_avgs, updates, params };
    const char *names[4] = { "grads", "exp_avgs", "new_exp_avgs", "updates" };
    int dtype, rc = check_state_op(n, arrs, names, 0, "beta1", beta1, "beta2", beta2, &dtype);
    if (rc || (rc = check_params(n, params, grads, 2, arrs + 2, names + 2, decay, alpha))) return rc;
    lion_args a = { beta1, beta2, decay, alpha };
    job J;
    run_op(&J, OP_LION, dtype, n, 5, arrs, &a);
    return report(&J, bad);
}
