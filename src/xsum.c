/*
 * Exact sums: the reductions of hooks (ctx.allreduce, ctx.global_norm in
 * lua/muon/reduce.lua) must give the same bits however a parameter is cut
 * into pieces, and float addition is not associative. So every value is
 * added into a fixed-point accumulator that covers the whole float64 range
 * exactly (the least subnormal 2^-1074 up to 2^1152, room for 2^60 values
 * of the largest magnitude), and the sum is rounded once, to nearest (ties
 * to even), when it is read. The sum of any split of the same values, in
 * any order, is the same exact number and so the same double.
 *
 * Limbs: limb i weighs 2^(32 i - MU__XSUM_BIAS). While values are added a
 * limb takes up to 2^29 additions of 32-bit pieces before the carries are
 * propagated (mu__xsum_normalize); a normalized accumulator has every limb
 * but the last in [0, 2^32) and the sign in the last one. Normalized limbs
 * are exact as doubles, which is how ranks exchange them (muon.reduce).
 * Squares: float32 (and bfloat16) values square exactly in double; a float64 square is
 * rounded to double first (the same rounding wherever the value lives), and
 * overflows to +Inf above ~1.3e154.
 */
#include "tensor_internal.h"

#include <stdio.h>

#include <math.h>
#include <string.h>

#define MU__XSUM_BIAS 1088 /* 34 limbs below 2^0: 2^-1088 < 2^-1074 */
#define MU__XSUM_FLUSH (1 << 29)

void mu_xsum_zero(mu_xsum *s)
{
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->max = -INFINITY;
    s->min = INFINITY;
}

static void xsum_normalize(mu_xsum *s)
{
    const int64_t base = (int64_t)1 << 32;
    for (int i = 0; i < MU_XSUM_LIMBS - 1; i++) {
        int64_t r = s->limb[i] % base;
        if (r < 0) r += base;
        const int64_t carry = (s->limb[i] - r) / base;
        s->limb[i] = r;
        s->limb[i + 1] += carry;
    }
    s->pending = 0;
}

/* Add v (finite or not) with sign. */
static void xsum_add(mu_xsum *s, double v)
{
    if (v != v) {
        s->nan++;
        return;
    }
    if (v > s->max) s->max = v;
    if (v < s->min) s->min = v;
    if (isinf(v)) {
        if (v > 0) s->pinf++;
        else s->ninf++;
        return;
    }
    if (v == 0.0) return;
    int e;
    const double f = frexp(fabs(v), &e);         /* |v| = f 2^e, f in [0.5, 1) */
    uint64_t mant = (uint64_t)ldexp(f, 53);      /* 53-bit integer: |v| = mant 2^(e - 53) */
    int p = e - 53 + MU__XSUM_BIAS;              /* bit position of mant's lsb */
    if (p < 0) { /* subnormal: the low bits of mant are 0 (multiples of 2^-1074) */
        mant >>= -p;
        p = 0;
    }
    const int li = p / 32, sh = p % 32;
    const uint64_t lo = (mant & 0xffffffffu) << sh, hi = (mant >> 32) << sh;
    const int64_t sign = v < 0 ? -1 : 1;
    s->limb[li] += sign * (int64_t)(lo & 0xffffffffu);
    s->limb[li + 1] += sign * (int64_t)((lo >> 32) + (hi & 0xffffffffu));
    s->limb[li + 2] += sign * (int64_t)(hi >> 32);
    if (++s->pending >= MU__XSUM_FLUSH) xsum_normalize(s);
}

typedef struct xsum_ctx {
    mu_xsum *s;
    int dt, squares;
} xsum_ctx;

static int xsum_loop(void *vctx, int64_t n, char *const *p, const int64_t *st)
{
    xsum_ctx *c = vctx;
    const char *x = p[0];
    for (int64_t i = 0; i < n; i++, x += st[0]) {
        double v = c->dt == MU_F32    ? (double)*(const float *)x
                   : c->dt == MU_F64  ? *(const double *)x
                                      : (double)mu__f32_from_bf16(*(const uint16_t *)x);
        xsum_add(c->s, c->squares ? v * v : v);
    }
    return 0;
}

int mu_xsum_add_tensor(mu_xsum *s, const mu_tensor *x, int squares)
{
    if (!s) return mu__fail(MU_EINVAL, "xsum: accumulator is NULL");
    int rc = mu__tensor_check(x, "xsum: x");
    if (rc != MU_OK) return rc;
    if (x->scalar != MU_F32 && x->scalar != MU_F64 && x->scalar != MU_BF16)
        return mu__fail(MU_EDTYPE, "xsum: x must be float32, float64 or bfloat16");
    mu__iter it;
    mu__iter_init(&it, x->ndim, x->dims, 0);
    mu__iter_add(&it, x);
    xsum_ctx c = {s, x->scalar, squares != 0};
    mu__iter_run(&it, xsum_loop, &c);
    return MU_OK;
}

int mu_xsum_add_tensors(mu_xsum *s, int n, mu_tensor *const *xs, int squares)
{
    if (!s) return mu__fail(MU_EINVAL, "xsum: accumulator is NULL");
    if (n < 0 || (n > 0 && !xs)) return mu__fail(MU_EINVAL, "xsum: bad tensor count %d or NULL array", n);
    for (int i = 0; i < n; i++) {
        char what[32];
        mu__name_index(what, sizeof what, "xsum: xs", "[", i, "]");
        int rc = mu__tensor_check(xs[i], what);
        if (rc != MU_OK) return rc;
        if (xs[i]->scalar != MU_F32 && xs[i]->scalar != MU_F64 && xs[i]->scalar != MU_BF16)
            return mu__fail(MU_EDTYPE, "xsum: xs[%d] must be float32, float64 or bfloat16", i);
    }
    for (int i = 0; i < n; i++) {
        int rc = mu_xsum_add_tensor(s, xs[i], squares);
        if (rc != MU_OK) return rc;
    }
    return MU_OK;
}

int mu_xsum_merge(mu_xsum *s, const mu_xsum *other)
{
    if (!s || !other) return mu__fail(MU_EINVAL, "xsum: accumulator is NULL");
    mu_xsum o = *other;
    xsum_normalize(s);
    xsum_normalize(&o);
    for (int i = 0; i < MU_XSUM_LIMBS; i++) s->limb[i] += o.limb[i];
    s->nan += o.nan;
    s->pinf += o.pinf;
    s->ninf += o.ninf;
    if (o.max > s->max) s->max = o.max;
    if (o.min < s->min) s->min = o.min;
    xsum_normalize(s);
    return MU_OK;
}

void mu_xsum_normalize(mu_xsum *s)
{
    if (s) xsum_normalize(s);
}

/* The normalized magnitude limbs (every one in [0, 2^32)) of a normalized
 * accumulator into m; returns -1 for a negative value, else 1. */
static int xsum_magnitude(const mu_xsum *s, int64_t *m)
{
    memcpy(m, s->limb, sizeof s->limb);
    if (m[MU_XSUM_LIMBS - 1] >= 0) return 1;
    const int64_t base = (int64_t)1 << 32;
    for (int i = 0; i < MU_XSUM_LIMBS; i++) m[i] = -m[i];
    for (int i = 0; i < MU_XSUM_LIMBS - 1; i++) {
        int64_t r = m[i] % base;
        if (r < 0) r += base;
        m[i + 1] += (m[i] - r) / base;
        m[i] = r;
    }
    return -1;
}

double mu_xsum_value(mu_xsum *s)
{
    if (!s) return NAN;
    if (s->nan > 0 || (s->pinf > 0 && s->ninf > 0)) return NAN;
    if (s->pinf > 0) return INFINITY;
    if (s->ninf > 0) return -INFINITY;
    xsum_normalize(s);
    int64_t m[MU_XSUM_LIMBS];
    const int sign = xsum_magnitude(s, m);
    int h = MU_XSUM_LIMBS - 1;
    while (h >= 0 && m[h] == 0) h--;
    if (h < 0) return 0.0;
    int nb = 0; /* bit length of the top limb */
    while (nb < 32 && (m[h] >> nb) != 0) nb++;
    const uint64_t l1 = h >= 1 ? (uint64_t)m[h - 1] : 0, l2 = h >= 2 ? (uint64_t)m[h - 2] : 0;
    /* 64 bits from the top one down, msb at bit 63 */
    uint64_t w = ((uint64_t)m[h] << (64 - nb)) | (l1 << (32 - nb)) | (nb < 32 ? l2 >> nb : 0);
    int sticky = nb < 32 && (l2 & (((uint64_t)1 << nb) - 1)) != 0;
    for (int i = h - 3; i >= 0 && !sticky; i--) sticky = m[i] != 0;
    uint64_t mant = w >> 11;
    const int round = (int)((w >> 10) & 1);
    sticky = sticky || (w & 0x3ff) != 0;
    int e = 32 * h - MU__XSUM_BIAS + nb - 1 - 52; /* weight of mant's lsb */
    if (round && (sticky || (mant & 1))) {
        mant++;
        if (mant == ((uint64_t)1 << 53)) {
            mant >>= 1;
            e++;
        }
    }
    return sign * ldexp((double)mant, e);
}
