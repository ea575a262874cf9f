/*
 * Kernels written once, compiled per dtype (Torch7's THGenerateFloatTypes):
 * src/tensor_math.c includes this file once for float and once for double,
 * with
 *   real      the element type
 *   R(name)   the per-type name: name_f32 / name_f64
 *   M(fn)     the libm function for real: sqrtf / sqrt
 *   GEMM      cblas_sgemm / cblas_dgemm
 *   KATTR     function attributes of the variant (a target ISA, or nothing)
 *
 * Every loop is an inner loop of the strided iterator (mu__loop_fn): n
 * elements, operand k at p[k] advancing s[k] bytes (p[0] is written). The
 * contiguous cases (every stride the element size, or one input a repeated
 * scalar) get loops over plain arrays; everything else goes through the
 * byte strides.
 */

#define AT(k, i) (*(const real *)(p[k] + (i) * s[k]))
#define OUT(i) (*(real *)(p[0] + (i) * s[0]))
#define E ((int64_t)sizeof(real))

/* The scalar parameters of an op, in the op's dtype. */
#define PARAMS                                                                                     \
    const map_ctx *c = vc;                                                                         \
    const real alpha = (real)c->alpha, value = (real)c->value, lo = (real)c->lo,                   \
               hi = (real)c->hi;                                                                   \
    (void)alpha, (void)value, (void)lo, (void)hi

/* One loop over arrays; IA/IB/IC are 1 (contiguous) or 0 (a scalar). */
#define LOOP1(EXPR)                                                                                \
    for (int64_t i = 0; i < n; i++) {                                                              \
        const real x = a[i];                                                                       \
        o[i] = (EXPR);                                                                             \
    }
#define LOOP2(EXPR, IA, IB)                                                                        \
    for (int64_t i = 0; i < n; i++) {                                                              \
        const real x = a[i * (IA)], y = b[i * (IB)];                                               \
        o[i] = (EXPR);                                                                             \
    }
#define LOOP3(EXPR, IA, IB, IC)                                                                    \
    for (int64_t i = 0; i < n; i++) {                                                              \
        const real x = a[i * (IA)], y = b[i * (IB)], z = cc[i * (IC)];                             \
        o[i] = (EXPR);                                                                             \
    }

#define UNARY(name, EXPR)                                                                          \
    static KATTR int R(name)(void *vc, int64_t n, char *const *p, const int64_t *s)                      \
    {                                                                                              \
        PARAMS;                                                                                    \
        real *o = (real *)p[0];                                                                    \
        const real *a = (const real *)p[1];                                                        \
        if (s[0] == E && s[1] == E) {                                                              \
            LOOP1(EXPR)                                                                            \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const real x = AT(1, i);                                                           \
                OUT(i) = (EXPR);                                                                   \
            }                                                                                      \
        }                                                                                          \
        return 0;                                                                                  \
    }

#define BINARY(name, EXPR)                                                                         \
    static KATTR int R(name)(void *vc, int64_t n, char *const *p, const int64_t *s)                      \
    {                                                                                              \
        PARAMS;                                                                                    \
        real *o = (real *)p[0];                                                                    \
        const real *a = (const real *)p[1], *b = (const real *)p[2];                               \
        if (s[0] == E && s[1] == E && s[2] == E) {                                                 \
            LOOP2(EXPR, 1, 1)                                                                      \
        } else if (s[0] == E && s[1] == E && s[2] == 0) {                                          \
            LOOP2(EXPR, 1, 0)                                                                      \
        } else if (s[0] == E && s[1] == 0 && s[2] == E) {                                          \
            LOOP2(EXPR, 0, 1)                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const real x = AT(1, i), y = AT(2, i);                                             \
                OUT(i) = (EXPR);                                                                   \
            }                                                                                      \
        }                                                                                          \
        return 0;                                                                                  \
    }

#define TERNARY(name, EXPR)                                                                        \
    static KATTR int R(name)(void *vc, int64_t n, char *const *p, const int64_t *s)                      \
    {                                                                                              \
        PARAMS;                                                                                    \
        real *o = (real *)p[0];                                                                    \
        const real *a = (const real *)p[1], *b = (const real *)p[2], *cc = (const real *)p[3];     \
        if (s[0] == E && s[1] == E && s[2] == E && s[3] == E) {                                    \
            LOOP3(EXPR, 1, 1, 1)                                                                   \
        } else if (s[0] == E && s[1] == E && s[2] == E && s[3] == 0) {                             \
            LOOP3(EXPR, 1, 1, 0)                                                                   \
        } else if (s[0] == E && s[1] == E && s[2] == 0 && s[3] == E) {                             \
            LOOP3(EXPR, 1, 0, 1)                                                                   \
        } else if (s[0] == E && s[1] == 0 && s[2] == E && s[3] == E) {                             \
            LOOP3(EXPR, 0, 1, 1)                                                                   \
        } else if (s[0] == E && s[1] == E && s[2] == 0 && s[3] == 0) {                             \
            LOOP3(EXPR, 1, 0, 0)                                                                   \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const real x = AT(1, i), y = AT(2, i), z = AT(3, i);                               \
                OUT(i) = (EXPR);                                                                   \
            }                                                                                      \
        }                                                                                          \
        return 0;                                                                                  \
    }

/* torch's clamp: a NaN input stays NaN; std::min/max ignore a NaN bound. */
static inline KATTR real R(clamp)(real x, real lo, real hi)
{
    if (x != x) return x;
    real t = x < lo ? lo : x;
    return hi < t ? hi : t;
}

/* add/sub: torch computes a + alpha*b as one fused multiply-add; with
 * alpha = 1 that is exactly a + b, which needs no libm call. */
BINARY(add1, x + y)
BINARY(sub1, x - y)
BINARY(addf, M(fma)(alpha, y, x))
BINARY(subf, M(fma)(-alpha, y, x))
static KATTR int R(map_add)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    return ((const map_ctx *)vc)->alpha == 1 ? R(add1)(vc, n, p, s) : R(addf)(vc, n, p, s);
}
static KATTR int R(map_sub)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    return ((const map_ctx *)vc)->alpha == 1 ? R(sub1)(vc, n, p, s) : R(subf)(vc, n, p, s);
}
BINARY(map_mul, x * y)
BINARY(map_div, x / y)
BINARY(map_gt, (real)(x > y))
BINARY(map_lt, (real)(x < y))
BINARY(map_ge, (real)(x >= y))
BINARY(map_le, (real)(x <= y))
BINARY(map_eq, (real)(x == y))
BINARY(map_ne, (real)(x != y))
TERNARY(map_addcmul, M(fma)(value * y, z, x))
TERNARY(map_addcdiv, x + (value * y) / z)
TERNARY(map_lerp, M(fabs)(z) < (real)0.5 ? M(fma)(z, y - x, x) : M(fma)(z - (real)1, y - x, y))
TERNARY(map_where, x != 0 ? y : z)
UNARY(map_neg, -x)
UNARY(map_abs, M(fabs)(x))
UNARY(map_sqrt, M(sqrt)(x))
UNARY(map_rsqrt, (real)1 / M(sqrt)(x))
UNARY(map_sign, (real)((x > 0) - (x < 0)))
UNARY(map_clamp, R(clamp)(x, lo, hi))
UNARY(map_exp, M(exp)(x))
UNARY(map_log, M(log)(x))
UNARY(map_tanh, M(tanh)(x))
UNARY(map_sigmoid, (real)1 / ((real)1 + M(exp)(-x)))

/* torch's tensor ** scalar: products and roots for a few exponents, else
 * the C library's pow (also for a tensor exponent). */
static inline KATTR real R(pow_scalar)(real x, real y)
{
    if (y == (real)2) return x * x;
    if (y == (real)3) return x * x * x;
    if (y == (real)-2) return (real)1 / (x * x);
    if (y == (real)0.5) return M(sqrt)(x);
    if (y == (real)-0.5) return (real)1 / M(sqrt)(x);
    if (y == (real)-1) return (real)1 / x;
    return M(pow)(x, y);
}
BINARY(pow_tensor, M(pow)(x, y))
BINARY(pow_number, R(pow_scalar)(x, y))
static KATTR int R(map_pow)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    return ((const map_ctx *)vc)->scalar_exponent ? R(pow_number)(vc, n, p, s) : R(pow_tensor)(vc, n, p, s);
}

/* copy with conversion: out real, input float, double or bfloat16 */
#define COPY_FROM(name, src_t, CONV)                                                               \
    static KATTR int R(name)(void *vc, int64_t n, char *const *p, const int64_t *s)                \
    {                                                                                              \
        (void)vc;                                                                                  \
        if (s[0] == E && s[1] == (int64_t)sizeof(src_t)) {                                         \
            real *o = (real *)p[0];                                                                \
            const src_t *a = (const src_t *)p[1];                                                  \
            for (int64_t i = 0; i < n; i++) o[i] = (real)CONV(a[i]);                               \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) OUT(i) = (real)CONV(*(const src_t *)(p[1] + i * s[1])); \
        }                                                                                          \
        return 0;                                                                                  \
    }
COPY_FROM(copy_from_f32, float, )
COPY_FROM(copy_from_f64, double, )
COPY_FROM(copy_from_bf16, uint16_t, mu__f32_from_bf16)

/* ----------------------------------------------------------- reductions */

/* Fold n elements (start x, byte stride st) into the double accumulator,
 * in order. */
static KATTR double R(fold)(int op, double acc, int64_t n, const char *x, int64_t st)
{
    const real *v = (const real *)x;
    int unit = st == E;
    switch (op) {
    case MU_REDUCE_SUM:
    case MU_REDUCE_MEAN:
        if (unit)
            for (int64_t i = 0; i < n; i++) acc += (double)v[i];
        else
            for (int64_t i = 0; i < n; i++) acc += (double)*(const real *)(x + i * st);
        break;
    case MU_REDUCE_NORM:
        if (unit)
            for (int64_t i = 0; i < n; i++) acc += (double)v[i] * (double)v[i];
        else
            for (int64_t i = 0; i < n; i++) {
                double e = (double)*(const real *)(x + i * st);
                acc += e * e;
            }
        break;
    case MU_REDUCE_AMAX:
        for (int64_t i = 0; i < n; i++) {
            double e = unit ? (double)v[i] : (double)*(const real *)(x + i * st);
            if (e > acc || e != e) acc = e; /* NaN sticks: nothing compares > NaN */
        }
        break;
    }
    return acc;
}

/* ARGMAX over n elements (start x, byte stride st): the first largest, a
 * NaN counting as largest (its first one); *at is first + its position. */
static KATTR void R(fold_argmax)(int64_t n, const char *x, int64_t st, int64_t first, double *best,
                                 int64_t *at)
{
    double b = *best;
    int64_t k = *at;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)*(const real *)(x + i * st);
        if (e > b || (e != e && b == b)) {
            b = e;
            k = first + i;
        }
    }
    *best = b;
    *at = k;
}

/* Reduce along the inner dim: one call per output element (p[0]), over the
 * whole reduced dim (p[1], n elements). */
static KATTR int R(reduce_dim)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    const reduce_ctx *c = vc;
    if (c->op == MU_REDUCE_ARGMAX) {
        double best = -INFINITY;
        int64_t at = 0;
        R(fold_argmax)(n, p[1], s[1], 0, &best, &at);
        *(real *)p[0] = (real)at;
        return 0;
    }
    double acc = R(fold)(c->op, reduce_init(c->op), n, p[1], s[1]);
    *(real *)p[0] = (real)reduce_finish(c->op, acc, n);
    return 0;
}

/* Reduce everything into c->acc (p[0] the input). */
static KATTR int R(reduce_all)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    reduce_ctx *c = vc;
    if (c->op == MU_REDUCE_ARGMAX)
        R(fold_argmax)(n, p[0], s[0], c->count, &c->best, &c->index);
    else
        c->acc = R(fold)(c->op, c->acc, n, p[0], s[0]);
    c->count += n;
    return 0;
}

/* Stops at the first NaN/Inf; c->count is then its flat index. */
static KATTR int R(finite)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    reduce_ctx *c = vc;
    for (int64_t i = 0; i < n; i++) {
        real v = *(const real *)(p[0] + i * s[0]);
        if (!isfinite(v)) {
            c->count += i;
            return 1;
        }
    }
    c->count += n;
    return 0;
}

/* ------------------------------------------------------ along one dim */

/* Softmax of one slice (p[1], n elements) into p[0], in double: the max
 * (NaN sticks), then exp(x - max) (kept in the output) and their sum in
 * order, then each one divided by the sum. (In place, p[0] == p[1]: each
 * element is read before it is written.) */
static KATTR int R(softmax)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    const softmax_ctx *c = vc;
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)AT(1, i);
        if (e > mx || e != e) mx = e;
    }
    if (c->log) {
        for (int64_t i = 0; i < n; i++) sum += exp((double)AT(1, i) - mx);
        double ls = log(sum);
        for (int64_t i = 0; i < n; i++) OUT(i) = (real)(((double)AT(1, i) - mx) - ls);
    } else {
        for (int64_t i = 0; i < n; i++) {
            double e = exp((double)AT(1, i) - mx);
            sum += e;
            OUT(i) = (real)e;
        }
        for (int64_t i = 0; i < n; i++) OUT(i) = (real)((double)OUT(i) / sum);
    }
    return 0;
}

/* Gather: p[0] out, p[1] the float64 index (checked), p[2] the tensor at
 * index 0 of the gathered dim. */
static KATTR int R(gather)(void *vc, int64_t n, char *const *p, const int64_t *s)
{
    const gather_ctx *c = vc;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = (int64_t) * (const double *)(p[1] + i * s[1]) - c->base;
        OUT(i) = *(const real *)(p[2] + i * s[2] + k * c->stride);
    }
    return 0;
}

/* ------------------------------------------------------------- products */

static KATTR void R(gemm)(const gemm_plan *g)
{
    for (int64_t b = 0; b < g->batch; b++)
        GEMM(CblasRowMajor, g->ta, g->tb, (blasint)g->n, (blasint)g->m, (blasint)g->k, (real)1,
             (const real *)g->a + b * g->bsa, (blasint)g->lda, (const real *)g->b + b * g->bsb,
             (blasint)g->ldb, (real)0, (real *)g->c + b * g->bsc, (blasint)g->ldc);
}

static const mu__loop_fn R(map_table)[MU_MAP_COUNT] = {
    [MU_MAP_ADD] = R(map_add),     [MU_MAP_SUB] = R(map_sub),     [MU_MAP_MUL] = R(map_mul),
    [MU_MAP_DIV] = R(map_div),     [MU_MAP_ADDCMUL] = R(map_addcmul),
    [MU_MAP_ADDCDIV] = R(map_addcdiv),                            [MU_MAP_LERP] = R(map_lerp),
    [MU_MAP_WHERE] = R(map_where), [MU_MAP_GT] = R(map_gt),       [MU_MAP_LT] = R(map_lt),
    [MU_MAP_GE] = R(map_ge),       [MU_MAP_LE] = R(map_le),       [MU_MAP_EQ] = R(map_eq),
    [MU_MAP_NE] = R(map_ne),       [MU_MAP_NEG] = R(map_neg),     [MU_MAP_ABS] = R(map_abs),
    [MU_MAP_SQRT] = R(map_sqrt),   [MU_MAP_RSQRT] = R(map_rsqrt), [MU_MAP_SIGN] = R(map_sign),
    [MU_MAP_CLAMP] = R(map_clamp), [MU_MAP_EXP] = R(map_exp),   [MU_MAP_LOG] = R(map_log),
    [MU_MAP_TANH] = R(map_tanh),   [MU_MAP_SIGMOID] = R(map_sigmoid),
    [MU_MAP_POW] = R(map_pow),
};

static const kernels R(kernels) = {
    .map = R(map_table),
    .copy_from = { [MU_F32] = R(copy_from_f32), [MU_F64] = R(copy_from_f64),
                   [MU_BF16] = R(copy_from_bf16) },
    .reduce_dim = R(reduce_dim),
    .reduce_all = R(reduce_all),
    .finite = R(finite),
    .softmax = R(softmax),
    .gather = R(gather),
    .gemm = R(gemm),
};

#undef AT
#undef OUT
#undef E
#undef PARAMS
#undef LOOP1
#undef LOOP2
#undef LOOP3
#undef UNARY
#undef BINARY
#undef TERNARY
#undef COPY_FROM
