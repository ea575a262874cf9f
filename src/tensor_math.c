/*
 * Tensor maths: elementwise ops with broadcasting (mu_tensor_map), copy and
 * fill, reductions, and matrix products through OpenBLAS. Every loop runs
 * under the strided iterator of tensor.c; the kernels are written once in
 * tensor_math_generic.h and compiled for float and double, then picked from
 * a per-dtype table.
 *
 * Rounding. Float32 ops compute in float32, as torch does, and every step is
 * rounded separately except where torch's CPU kernels fuse a multiply-add.
 * Measured against Debian's torch 1.13 (float32, 100k elements, contiguous
 * and transposed; every element equal):
 *   add/sub(a, b, alpha)   fma(+-alpha, b, a)   (alpha = 1: exactly a +- b)
 *   addcmul(s, t1, t2, v)  fma(v*t1, t2, s)     (unfused s + (v*t1)*t2: 79%)
 *   addcdiv(s, t1, t2, v)  s + (v*t1)/t2
 *   lerp(a, b, w)          |w| < 0.5 ? fma(w, b-a, a) : fma(w-1, b-a, b)
 *   rsqrt(x)               1/sqrt(x);  x / scalar: a true division
 * Scalars are rounded to the dtype first, as torch does for Python numbers.
 * Every other step must NOT be contracted, so neither may this file be:
 * GCC in ISO C mode (-std=c11) defaults to -ffp-contract=off; the pragmas
 * enforce it for clang and GNU dialects. Never build it with -ffast-math.
 * Reductions accumulate in double in row-major order of the reduced
 * elements and round once when the result is stored.
 */
#include "tensor_internal.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Scalar parameters of an elementwise op (rounded to the dtype in the
 * kernels). */
typedef struct map_ctx {
    double alpha, value, lo, hi;
    int scalar_exponent; /* POW: x[1] is a scalar (torch's tensor ** scalar) */
} map_ctx;

typedef struct reduce_ctx {
    int op;
    double acc;
    int64_t count;
    double best;   /* ARGMAX: the largest so far (NaN once one was seen) */
    int64_t index; /* ARGMAX: its flat index */
} reduce_ctx;

/* Softmax: log-softmax instead? */
typedef struct softmax_ctx {
    int log;
} softmax_ctx;

/* Gather: t's byte stride along dim, and the base of the indices. */
typedef struct gather_ctx {
    int64_t stride, base;
} gather_ctx;

/* One (batched) ?gemm call, row-major: c = op(a) op(b). */
typedef struct gemm_plan {
    int64_t batch, n, m, k;
    enum CBLAS_TRANSPOSE ta, tb;
    const void *a, *b;
    void *c;
    int64_t lda, ldb, ldc;
    int64_t bsa, bsb, bsc; /* batch strides in elements (0: the same matrix) */
} gemm_plan;

static double reduce_init(int op) { return op == MU_REDUCE_AMAX ? -INFINITY : 0.0; }

static double reduce_finish(int op, double acc, int64_t n)
{
    switch (op) {
    case MU_REDUCE_MEAN: return n ? acc / (double)n : NAN;
    case MU_REDUCE_NORM: return sqrt(acc);
    default: return acc;
    }
}

typedef struct kernels {
    const mu__loop_fn *map;  /* by mu_map_op */
    mu__loop_fn copy_from[MU_DTYPE_COUNT]; /* by source dtype */
    mu__loop_fn reduce_dim, reduce_all, finite, softmax, gather;
    void (*gemm)(const gemm_plan *g);
} kernels;

/* The kernels, per dtype and per instruction set: the portable build, and
 * on x86-64 an AVX2+FMA build (wider vector loops, fma inline instead of a
 * libm call), picked per call (pick_kernels). Both compute every element
 * with the same IEEE operations (fma is exact in both, reductions keep
 * their order), so results do not depend on the choice; tests compare the
 * two (MU_TENSOR_NOSIMD=1 selects the portable kernels). */
#define KATTR
#define real float
#define R(name) name##_f32
#define M(fn) fn##f
#define GEMM cblas_sgemm
#include "tensor_math_generic.h"
#undef real
#undef R
#undef M
#undef GEMM

#define real double
#define R(name) name##_f64
#define M(fn) fn
#define GEMM cblas_dgemm
#include "tensor_math_generic.h"
#undef real
#undef R
#undef M
#undef GEMM
#undef KATTR

/* bfloat16 is a storage dtype: conversions, the finite scan and whole-tensor
 * reductions (each element widened to float, exactly); no map, reduce_dim
 * or gemm (callers check arith_dtype first). */
#define TO_BF16(name, src_t, CONV)                                                                 \
    static int name(void *vc, int64_t n, char *const *p, const int64_t *s)                         \
    {                                                                                              \
        (void)vc;                                                                                  \
        for (int64_t i = 0; i < n; i++)                                                            \
            *(uint16_t *)(p[0] + i * s[0]) = CONV(*(const src_t *)(p[1] + i * s[1]));              \
        return 0;                                                                                  \
    }
TO_BF16(bf16_from_f32, float, mu__bf16_from_f32)
TO_BF16(bf16_from_f64, double, mu__bf16_from_f64)
TO_BF16(bf16_from_bf16, uint16_t, )
#undef TO_BF16

/* Widen up to 256 elements (start x, byte stride st) into buf. */
static int64_t bf16_widen(float *buf, int64_t n, const char *x, int64_t st)
{
    int64_t m = n < 256 ? n : 256;
    for (int64_t i = 0; i < m; i++) buf[i] = mu__f32_from_bf16(*(const uint16_t *)(x + i * st));
    return m;
}

/* Chunks widened to float, reduced by the float kernel (argmax included). */
static int bf16_reduce_all(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    float buf[256];
    char *q[1] = { (char *)buf };
    const int64_t st[1] = { 4 };
    for (int64_t i = 0; i < n;) {
        int64_t m = bf16_widen(buf, n - i, p[0] + i * s[0], s[0]);
        reduce_all_f32(vc, m, q, st);
        i += m;
    }
    return 0;
}

static int bf16_finite(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    reduce_ctx *c = vc;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(mu__f32_from_bf16(*(const uint16_t *)(p[0] + i * s[0])))) {
            c->count += i;
            return 1;
        }
    c->count += n;
    return 0;
}

static const kernels kernels_bf16 = {
    .copy_from = { [MU_F32] = bf16_from_f32, [MU_F64] = bf16_from_f64, [MU_BF16] = bf16_from_bf16 },
    .reduce_all = bf16_reduce_all,
    .finite = bf16_finite,
};

static const kernels *const KERNELS[MU_DTYPE_COUNT] = {
    [MU_F32] = &kernels_f32, [MU_F64] = &kernels_f64, [MU_BF16] = &kernels_bf16 };

#if defined(__x86_64__) && defined(__GNUC__)
#define MU__MATH_SIMD 1
#define KATTR __attribute__((target("avx2,fma")))
#define real float
#define R(name) name##_f32_avx2
#define M(fn) fn##f
#define GEMM cblas_sgemm
#include "tensor_math_generic.h"
#undef real
#undef R
#undef M
#undef GEMM

#define real double
#define R(name) name##_f64_avx2
#define M(fn) fn
#define GEMM cblas_dgemm
#include "tensor_math_generic.h"
#undef real
#undef R
#undef M
#undef GEMM
#undef KATTR

static const kernels *const KERNELS_AVX2[MU_DTYPE_COUNT] = {
    [MU_F32] = &kernels_f32_avx2, [MU_F64] = &kernels_f64_avx2, [MU_BF16] = &kernels_bf16 };
#else
#define MU__MATH_SIMD 0
#endif

/* The kernel table for a dtype: AVX2+FMA when the CPU has it, unless the
 * environment sets MU_TENSOR_NOSIMD (read per call, like foreach's
 * MU_FOREACH_NOSIMD, so tests can switch). */
static const kernels *pick_kernels(int dtype)
{
#if MU__MATH_SIMD
    __builtin_cpu_init();
    const char *off = getenv("MU_TENSOR_NOSIMD");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        !(off && *off && *off != '0'))
        return KERNELS_AVX2[dtype];
#endif
    return KERNELS[dtype];
}

static const char *dtype_name(int dtype)
{
    const char *s = mu_dtype_name(dtype);
    return s ? s : "unknown";
}

/* MU_EDTYPE unless t's dtype is one the maths compute in. */
static int arith_dtype(const mu_tensor *t, const char *what)
{
    if (t->scalar == MU_F32 || t->scalar == MU_F64) return MU_OK;
    return mu__fail(MU_EDTYPE, "%s is %s, a storage dtype: convert it first (clone(\"float32\"))",
                    what, dtype_name(t->scalar));
}

/* ------------------------------------------------------------ elementwise */

/* Name, arity and operand roles (torch's argument names) of each op. */
#define SO { "self", "other" }
static const struct map_op {
    const char *name;
    int arity;
    const char *roles[3];
} MAP_OPS[MU_MAP_COUNT] = {
    [MU_MAP_ADD] = { "add", 2, SO },
    [MU_MAP_SUB] = { "sub", 2, SO },
    [MU_MAP_MUL] = { "mul", 2, SO },
    [MU_MAP_DIV] = { "div", 2, SO },
    [MU_MAP_ADDCMUL] = { "addcmul", 3, { "self", "tensor1", "tensor2" } },
    [MU_MAP_ADDCDIV] = { "addcdiv", 3, { "self", "tensor1", "tensor2" } },
    [MU_MAP_LERP] = { "lerp", 3, { "self", "end", "weight" } },
    [MU_MAP_WHERE] = { "where", 3, { "condition", "input", "other" } },
    [MU_MAP_GT] = { "gt", 2, SO },
    [MU_MAP_LT] = { "lt", 2, SO },
    [MU_MAP_GE] = { "ge", 2, SO },
    [MU_MAP_LE] = { "le", 2, SO },
    [MU_MAP_EQ] = { "eq", 2, SO },
    [MU_MAP_NE] = { "ne", 2, SO },
    [MU_MAP_NEG] = { "neg", 1, { "self" } },
    [MU_MAP_ABS] = { "abs", 1, { "self" } },
    [MU_MAP_SQRT] = { "sqrt", 1, { "self" } },
    [MU_MAP_RSQRT] = { "rsqrt", 1, { "self" } },
    [MU_MAP_SIGN] = { "sign", 1, { "self" } },
    [MU_MAP_CLAMP] = { "clamp", 1, { "self" } },
    [MU_MAP_EXP] = { "exp", 1, { "self" } },
    [MU_MAP_LOG] = { "log", 1, { "self" } },
    [MU_MAP_TANH] = { "tanh", 1, { "self" } },
    [MU_MAP_SIGMOID] = { "sigmoid", 1, { "self" } },
    [MU_MAP_POW] = { "pow", 2, { "self", "exponent" } },
};
#undef SO

/* Validate out (written): layout, no two elements in one place. */
static int check_out(const mu_tensor *out, const char *what)
{
    int rc = mu__tensor_check(out, what);
    if (rc) return rc;
    if (mu__tensor_self_overlap(out))
        return mu__fail(MU_EINVAL, "%s has several elements in one memory location", what);
    return MU_OK;
}

int mu_tensor_map(const mu_map_args *args, mu_tensor *out)
{
    if (!args) return mu__fail(MU_EINVAL, "args is NULL");
    if (args->op < 0 || args->op >= MU_MAP_COUNT)
        return mu__fail(MU_EINVAL, "unknown elementwise op %d", args->op);
    const struct map_op *op = &MAP_OPS[args->op];
    char what[64];
    snprintf(what, sizeof what, "%s: output", op->name);
    int rc = check_out(out, what);
    if (rc || (rc = arith_dtype(out, what))) return rc;
    for (int i = 0; i < op->arity; i++) {
        const mu_tensor *x = args->x[i];
        if (!x) continue;
        snprintf(what, sizeof what, "%s: %s (x[%d])", op->name, op->roles[i], i);
        if ((rc = mu__tensor_check(x, what)) || (rc = mu__check_broadcast(x, out->ndim, out->dims, what)) ||
            (rc = mu__check_overlap(out, x, what)))
            return rc;
        if (x->scalar != out->scalar)
            return mu__fail(MU_EDTYPE, "%s is %s but the output is %s", what, dtype_name(x->scalar),
                            dtype_name(out->scalar));
    }
    map_ctx ctx = { args->alpha, args->value, args->lo, args->hi, args->x[1] == NULL };
    union {
        float f;
        double d;
    } sv[3];
    mu__iter it;
    mu__iter_init(&it, out->ndim, out->dims, 0);
    mu__iter_add(&it, out);
    for (int i = 0; i < op->arity; i++) {
        if (args->x[i]) {
            mu__iter_add(&it, args->x[i]);
            continue;
        }
        if (out->scalar == MU_F32) sv[i].f = (float)args->s[i];
        else sv[i].d = args->s[i];
        mu__iter_add_scalar(&it, &sv[i]);
    }
    mu__iter_run(&it, pick_kernels(out->scalar)->map[args->op], &ctx);
    return MU_OK;
}

static int same_shape(const mu_tensor *a, const mu_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

int mu_tensor_copy(mu_tensor *dst, const mu_tensor *src)
{
    int rc;
    if ((rc = check_out(dst, "copy: destination")) || (rc = mu__tensor_check(src, "copy: source")))
        return rc;
    int flat = !same_shape(dst, src);
    if (flat && !(mu_tensor_numel(dst) == mu_tensor_numel(src) && mu_tensor_is_contiguous(dst) &&
                  mu_tensor_is_contiguous(src))) {
        char b1[160], b2[160];
        return mu__fail(MU_ESHAPE, "copy between different shapes (%s from %s)",
                        mu__shape_str(dst->ndim, dst->dims, b1, sizeof b1),
                        mu__shape_str(src->ndim, src->dims, b2, sizeof b2));
    }
    if ((rc = mu__check_overlap(dst, src, "copy: source"))) return rc;
    mu_tensor d = *dst, s = *src;
    if (flat) { /* contiguous, same numel: copy in flat order */
        d.ndim = s.ndim = 1;
        d.dims[0] = s.dims[0] = mu_tensor_numel(dst);
        d.strides[0] = s.strides[0] = 1;
    }
    mu__iter it;
    mu__iter_init(&it, d.ndim, d.dims, 0);
    mu__iter_add(&it, &d);
    mu__iter_add(&it, &s);
    mu__iter_run(&it, pick_kernels(d.scalar)->copy_from[s.scalar], NULL);
    return MU_OK;
}

int mu_tensor_fill(mu_tensor *t, double value)
{
    int rc = check_out(t, "fill: tensor");
    if (rc) return rc;
    mu__iter it;
    mu__iter_init(&it, t->ndim, t->dims, 0);
    mu__iter_add(&it, t);
    mu__iter_add_scalar(&it, &value);
    mu__iter_run(&it, pick_kernels(t->scalar)->copy_from[MU_F64], NULL);
    return MU_OK;
}

int mu_tensor_all_finite(const mu_tensor *t, int64_t *where)
{
    int rc = mu__tensor_check(t, "all_finite: tensor");
    if (rc) return rc;
    reduce_ctx ctx = { 0, 0, 0, 0, 0 };
    mu__iter it;
    mu__iter_init(&it, t->ndim, t->dims, 0);
    mu__iter_add(&it, t);
    if (!mu__iter_run(&it, pick_kernels(t->scalar)->finite, &ctx)) return 1;
    if (where) *where = ctx.count;
    return 0;
}

/* Walk n dims (the last the inner loop, kept whole) with out and t stepping
 * by the element strides os and ts, calling t's dtype's kernel fn (reduce_dim,
 * softmax) with ctx. */
static void run_out_in(int n, const int64_t *dims, mu_tensor *out, const int64_t *os, const mu_tensor *t,
                       const int64_t *ts, mu__loop_fn fn, void *ctx)
{
    mu__iter it;
    mu__iter_init(&it, n, dims, MU__ITER_KEEP_INNER);
    mu__iter_add_strided(&it, out->data, os, mu_dtype_size(out->scalar));
    mu__iter_add_strided(&it, t->data, ts, mu_dtype_size(t->scalar));
    mu__iter_run(&it, fn, ctx);
}

/* ------------------------------------------------------------- reductions */

static const char *const REDUCE_NAMES[MU_REDUCE_COUNT] = {
    [MU_REDUCE_SUM] = "sum", [MU_REDUCE_MEAN] = "mean", [MU_REDUCE_AMAX] = "amax",
    [MU_REDUCE_NORM] = "norm", [MU_REDUCE_ARGMAX] = "argmax",
};

/* The largest n such that every integer 0..n is exact in dtype (ARGMAX
 * stores indices as numbers of the tensor's dtype). */
static int64_t exact_integers(int dtype)
{
    switch (dtype) {
    case MU_F64: return (int64_t)1 << 53;
    case MU_F32: return (int64_t)1 << 24;
    default: return 256; /* the narrowest: 8 significant bits */
    }
}

int mu_tensor_reduce_all(const mu_tensor *t, int op, double *out)
{
    if (op < 0 || op >= MU_REDUCE_COUNT) return mu__fail(MU_EINVAL, "unknown reduction %d", op);
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    char what[64];
    snprintf(what, sizeof what, "%s: tensor", REDUCE_NAMES[op]);
    int rc = mu__tensor_check(t, what);
    if (rc) return rc;
    reduce_ctx ctx = { op, reduce_init(op), 0, -INFINITY, 0 };
    mu__iter it;
    mu__iter_init(&it, t->ndim, t->dims, 0);
    mu__iter_add(&it, t);
    mu__iter_run(&it, pick_kernels(t->scalar)->reduce_all, &ctx);
    if ((op == MU_REDUCE_AMAX || op == MU_REDUCE_ARGMAX) && ctx.count == 0)
        return mu__fail(MU_ESHAPE, "%s of an empty tensor (no identity)", REDUCE_NAMES[op]);
    *out = op == MU_REDUCE_ARGMAX ? (double)ctx.index : reduce_finish(op, ctx.acc, ctx.count);
    if (*out != *out) *out = NAN; /* one NaN, as mu_tensor_get */
    return MU_OK;
}

int mu_tensor_norm(const mu_tensor *t, double *out)
{
    return mu_tensor_reduce_all(t, MU_REDUCE_NORM, out);
}

int mu_tensor_reduce(const mu_tensor *t, int op, int dim, mu_tensor *out)
{
    if (op < 0 || op >= MU_REDUCE_COUNT) return mu__fail(MU_EINVAL, "unknown reduction %d", op);
    const char *name = REDUCE_NAMES[op];
    char what[64];
    snprintf(what, sizeof what, "%s: tensor", name);
    int rc = mu__tensor_check(t, what);
    if (rc) return rc;
    if ((rc = arith_dtype(t, what))) return rc;
    snprintf(what, sizeof what, "%s: output", name);
    if ((rc = check_out(out, what))) return rc;
    if (dim < 0 || dim >= t->ndim)
        return mu__fail(MU_EINVAL, "%s: dim %d out of range for %d dims", name, dim, t->ndim);
    if (out->scalar != t->scalar)
        return mu__fail(MU_EDTYPE, "%s: output is %s but the tensor is %s", name,
                        dtype_name(out->scalar), dtype_name(t->scalar));
    /* out: t's shape with dim of size 1 (keepdim) or without dim */
    int keep = out->ndim == t->ndim, ok = keep || out->ndim == t->ndim - 1;
    for (int i = 0, j = 0; ok && i < t->ndim; i++) {
        if (i == dim) {
            if (keep && out->dims[j++] != 1) ok = 0;
        } else if (out->dims[j++] != t->dims[i]) {
            ok = 0;
        }
    }
    if (!ok) {
        char b1[160], b2[160];
        return mu__fail(MU_ESHAPE, "%s: output shape %s is not %s reduced along dim %d", name,
                        mu__shape_str(out->ndim, out->dims, b1, sizeof b1),
                        mu__shape_str(t->ndim, t->dims, b2, sizeof b2), dim);
    }
    if (mu__ranges_overlap(out, t))
        return mu__fail(MU_EINVAL, "%s: the output shares memory with the input", name);
    if ((op == MU_REDUCE_AMAX || op == MU_REDUCE_ARGMAX) && t->dims[dim] == 0 && mu_tensor_numel(out) > 0)
        return mu__fail(MU_ESHAPE, "%s: cannot reduce dim %d of size 0 (no identity)", name, dim);
    if (op == MU_REDUCE_ARGMAX && t->dims[dim] > exact_integers(t->scalar))
        return mu__fail(MU_EINVAL, "argmax: dim %d has %lld elements, but %s holds exact indices only up to %lld",
                        dim, (long long)t->dims[dim], dtype_name(t->scalar),
                        (long long)exact_integers(t->scalar));
    /* Walk t's other dims in order, then dim as the inner loop; out steps
     * along the other dims and stays put along dim. */
    int64_t dims[MU_MAX_DIMS], ts[MU_MAX_DIMS], os[MU_MAX_DIMS];
    int n = 0;
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == dim) {
            if (keep) j++;
            continue;
        }
        dims[n] = t->dims[i];
        ts[n] = t->strides[i];
        os[n++] = out->strides[j++];
    }
    dims[n] = t->dims[dim];
    ts[n] = t->strides[dim];
    os[n++] = 0;
    reduce_ctx ctx = { op, 0, 0, 0, 0 };
    run_out_in(n, dims, out, os, t, ts, pick_kernels(t->scalar)->reduce_dim, &ctx);
    return MU_OK;
}

/* ------------------------------------------------------ along one dim */

/* Validate dim (0-based) of t; a 0-D tensor has the one dim 0 of size 1. */
static int check_dim(const mu_tensor *t, int dim, const char *name)
{
    int nd = t->ndim > 0 ? t->ndim : 1;
    if (dim < 0 || dim >= nd)
        return mu__fail(MU_EINVAL, "%s: dim %d out of range for %d dims", name, dim, (int)t->ndim);
    return MU_OK;
}

int mu_tensor_softmax(const mu_tensor *t, int dim, int log, mu_tensor *out)
{
    const char *name = log ? "log_softmax" : "softmax";
    char what[64];
    snprintf(what, sizeof what, "%s: tensor", name);
    int rc = mu__tensor_check(t, what);
    if (rc || (rc = arith_dtype(t, what))) return rc;
    snprintf(what, sizeof what, "%s: output", name);
    if ((rc = check_out(out, what)) || (rc = check_dim(t, dim, name))) return rc;
    if (!same_shape(out, t)) {
        char b1[160], b2[160];
        return mu__fail(MU_ESHAPE, "%s: output shape %s is not the input's %s", name,
                        mu__shape_str(out->ndim, out->dims, b1, sizeof b1),
                        mu__shape_str(t->ndim, t->dims, b2, sizeof b2));
    }
    if (out->scalar != t->scalar)
        return mu__fail(MU_EDTYPE, "%s: output is %s but the tensor is %s", name,
                        dtype_name(out->scalar), dtype_name(t->scalar));
    if ((rc = mu__check_overlap(out, t, what))) return rc;
    /* t's other dims in order, then dim as the inner loop: one kernel call
     * per slice along dim, out stepping with t */
    int64_t dims[MU_MAX_DIMS], ts[MU_MAX_DIMS], os[MU_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == dim) continue;
        dims[n] = t->dims[i];
        ts[n] = t->strides[i];
        os[n++] = out->strides[i];
    }
    dims[n] = t->ndim ? t->dims[dim] : 1;
    ts[n] = t->ndim ? t->strides[dim] : 0;
    os[n++] = t->ndim ? out->strides[dim] : 0;
    softmax_ctx ctx = { log != 0 };
    run_out_in(n, dims, out, os, t, ts, pick_kernels(t->scalar)->softmax, &ctx);
    return MU_OK;
}

/* Gather's index check: every value an integer in [lo, hi]; stops at the
 * first bad one (c->count is then its flat index, c->bad its value). */
typedef struct index_check {
    double lo, hi, bad;
    int64_t count;
} index_check;

static int check_indices(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    index_check *c = vc;
    for (int64_t i = 0; i < n; i++) {
        double v = *(const double *)(p[0] + i * s[0]);
        if (!(v >= c->lo && v <= c->hi && v == floor(v))) {
            c->count += i;
            c->bad = v;
            return 1;
        }
    }
    c->count += n;
    return 0;
}

int mu_tensor_gather(const mu_tensor *t, int dim, const mu_tensor *index, int64_t base,
                     mu_tensor *out)
{
    int rc;
    if ((rc = mu__tensor_check(t, "gather: tensor")) || (rc = mu__tensor_check(index, "gather: index")) ||
        (rc = check_out(out, "gather: output")) || (rc = check_dim(t, dim, "gather")) ||
        (rc = arith_dtype(t, "gather: tensor")))
        return rc;
    char b1[160], b2[160];
    if (index->scalar != MU_F32 && index->scalar != MU_F64)
        return mu__fail(MU_EDTYPE, "gather: index is %s; float32 or float64 integers are supported",
                        dtype_name(index->scalar));
    if (index->ndim != t->ndim)
        return mu__fail(MU_ESHAPE, "gather: index %s and tensor %s must have the same number of dims",
                        mu__shape_str(index->ndim, index->dims, b1, sizeof b1),
                        mu__shape_str(t->ndim, t->dims, b2, sizeof b2));
    for (int d = 0; d < t->ndim; d++)
        if (d != dim && index->dims[d] > t->dims[d])
            return mu__fail(MU_ESHAPE, "gather: index %s is larger than the tensor %s in dim %lld",
                            mu__shape_str(index->ndim, index->dims, b1, sizeof b1),
                            mu__shape_str(t->ndim, t->dims, b2, sizeof b2), (long long)(d + base));
    if (!same_shape(out, index))
        return mu__fail(MU_ESHAPE, "gather: output shape %s is not the index's %s",
                        mu__shape_str(out->ndim, out->dims, b1, sizeof b1),
                        mu__shape_str(index->ndim, index->dims, b2, sizeof b2));
    if (out->scalar != t->scalar)
        return mu__fail(MU_EDTYPE, "gather: output is %s but the tensor is %s", dtype_name(out->scalar),
                        dtype_name(t->scalar));
    if (mu__ranges_overlap(out, t) || mu__ranges_overlap(out, index))
        return mu__fail(MU_EINVAL, "gather: the output shares memory with an input");
    if (base < -((int64_t)1 << 52) || base > ((int64_t)1 << 52))
        return mu__fail(MU_EINVAL, "gather: base %lld out of range", (long long)base);
    int64_t size = t->ndim ? t->dims[dim] : 1;
    /* The indices as float64 (a converted copy for float32), all checked
     * before anything is written. */
    mu_tensor *copy = NULL;
    const mu_tensor *idx = index;
    if (index->scalar != MU_F64) {
        if ((rc = mu_tensor_clone(index, MU_F64, &copy))) return rc;
        idx = copy;
    }
    index_check ic = { (double)base, (double)(base + size - 1), 0, 0 };
    mu__iter it;
    mu__iter_init(&it, idx->ndim, idx->dims, 0);
    mu__iter_add(&it, idx);
    if (mu__iter_run(&it, check_indices, &ic)) {
        char pos[160];
        int64_t where[MU_MAX_DIMS], r = ic.count;
        for (int d = idx->ndim - 1; d >= 0; d--) {
            where[d] = r % idx->dims[d] + base;
            r /= idx->dims[d];
        }
        mu__shape_str(idx->ndim, where, pos, sizeof pos);
        mu_tensor_free(copy);
        char bad[32];
        if (isnan(ic.bad)) snprintf(bad, sizeof bad, "nan");
        else snprintf(bad, sizeof bad, "%.17g", ic.bad);
        if (size == 0)
            return mu__fail(MU_EINVAL, "gather: index%s is %s, but dim %lld of the tensor has size 0", pos,
                            bad, (long long)(dim + base));
        return mu__fail(MU_EINVAL, "gather: index%s is %s, not an integer in %lld..%lld (dim %lld of the tensor)",
                        pos, bad, (long long)base, (long long)(base + size - 1), (long long)(dim + base));
    }
    int64_t st[MU_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) st[d] = d == dim ? 0 : t->strides[d];
    size_t es = mu_dtype_size(t->scalar);
    gather_ctx ctx = { t->ndim ? t->strides[dim] * (int64_t)es : 0, base };
    mu__iter_init(&it, idx->ndim, idx->dims, 0);
    mu__iter_add(&it, out);
    mu__iter_add(&it, idx);
    mu__iter_add_strided(&it, t->data, st, es);
    mu__iter_run(&it, pick_kernels(t->scalar)->gather, &ctx);
    mu_tensor_free(copy);
    return MU_OK;
}

/* --------------------------------------------------------------- products */

/* How BLAS reads the (rows x cols) matrix at the last two dims of t:
 * row-major with leading dim *ld, or column-major (transposed). 0 when
 * neither fits (then it is copied to contiguous). */
static int blas_layout(const mu_tensor *t, int64_t *ld, enum CBLAS_TRANSPOSE *tr)
{
    int nd = t->ndim;
    int64_t r = t->dims[nd - 2], c = t->dims[nd - 1];
    int64_t s0 = t->strides[nd - 2], s1 = t->strides[nd - 1];
    int64_t rr = r > 1 ? r : 1, cc = c > 1 ? c : 1;
    if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= cc)) {
        *ld = r <= 1 ? cc : s0;
        *tr = CblasNoTrans;
    } else if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= rr)) {
        *ld = c <= 1 ? rr : s1;
        *tr = CblasTrans;
    } else {
        return 0;
    }
    return *ld <= INT_MAX;
}

static int64_t batch_stride(const mu_tensor *t)
{
    return t->ndim == 3 && t->dims[0] > 1 ? t->strides[0] : 0;
}

int mu_tensor_matmul(const mu_tensor *a, const mu_tensor *b, mu_tensor *out)
{
    int rc;
    if ((rc = mu__tensor_check(a, "matmul: a")) || (rc = mu__tensor_check(b, "matmul: b")) ||
        (rc = check_out(out, "matmul: output")))
        return rc;
    char b1[160], b2[160], b3[160];
    const char *sa = mu__shape_str(a->ndim, a->dims, b1, sizeof b1);
    const char *sb = mu__shape_str(b->ndim, b->dims, b2, sizeof b2);
    const char *so = mu__shape_str(out->ndim, out->dims, b3, sizeof b3);
    int nd = a->ndim;
    if ((nd != 2 && nd != 3) || b->ndim != nd || out->ndim != nd)
        return mu__fail(MU_ESHAPE, "matmul: a %s, b %s and output %s must be all 2-D or all 3-D",
                        sa, sb, so);
    if ((rc = arith_dtype(a, "matmul: a"))) return rc;
    if (a->scalar != b->scalar || out->scalar != a->scalar)
        return mu__fail(MU_EDTYPE, "matmul: a is %s, b %s and the output %s", dtype_name(a->scalar),
                        dtype_name(b->scalar), dtype_name(out->scalar));
    int64_t n = a->dims[nd - 2], k = a->dims[nd - 1], m = b->dims[nd - 1];
    int64_t ba = nd == 3 ? a->dims[0] : 1, bb = nd == 3 ? b->dims[0] : 1;
    int64_t batch = ba > bb ? ba : bb;
    if (b->dims[nd - 2] != k)
        return mu__fail(MU_ESHAPE, "matmul: shapes %s and %s cannot be multiplied (%lld != %lld)",
                        sa, sb, (long long)k, (long long)b->dims[nd - 2]);
    if ((ba != batch && ba != 1) || (bb != batch && bb != 1))
        return mu__fail(MU_ESHAPE, "matmul: batch sizes of %s and %s differ", sa, sb);
    if (out->dims[nd - 2] != n || out->dims[nd - 1] != m || (nd == 3 && out->dims[0] != batch))
        return mu__fail(MU_ESHAPE, "matmul: output shape %s does not match %s @ %s", so, sa, sb);
    if (n > INT_MAX || m > INT_MAX || k > INT_MAX)
        return mu__fail(MU_EINVAL, "matmul: sizes beyond BLAS's 32-bit range");
    if (mu_tensor_same_storage(out, a) || mu_tensor_same_storage(out, b))
        return mu__fail(MU_EINVAL, "matmul: the output shares storage with an input");
    gemm_plan g = { .batch = batch, .n = n, .m = m, .k = k, .c = out->data,
                    .bsc = nd == 3 ? out->strides[0] : 0 };
    enum CBLAS_TRANSPOSE tc;
    if (!blas_layout(out, &g.ldc, &tc) || tc != CblasNoTrans)
        return mu__fail(MU_EINVAL, "matmul: the output's rows must be unit-stride (contiguous)");
    if (batch == 0 || n == 0 || m == 0) return MU_OK;
    if (k == 0) return mu_tensor_fill(out, 0);
    mu_tensor *ca = NULL, *cb = NULL;
    if (!blas_layout(a, &g.lda, &g.ta)) {
        if ((rc = mu_tensor_clone(a, -1, &ca))) return rc;
        a = ca;
        blas_layout(a, &g.lda, &g.ta);
    }
    if (!blas_layout(b, &g.ldb, &g.tb)) {
        if ((rc = mu_tensor_clone(b, -1, &cb))) {
            mu_tensor_free(ca);
            return rc;
        }
        b = cb;
        blas_layout(b, &g.ldb, &g.tb);
    }
    g.a = a->data;
    g.b = b->data;
    g.bsa = batch_stride(a);
    g.bsb = batch_stride(b);
    pick_kernels(out->scalar)->gemm(&g);
    mu_tensor_free(ca);
    mu_tensor_free(cb);
    return MU_OK;
}
