/*
 * The foreach kernels, written once (Torch7's THGenerateFloatTypes pattern):
 * src/foreach_vec.h includes this file once per instruction set and dtype,
 * with
 *   real        the element type of the arithmetic (float / double)
 *   R(name)     the per-variant name, e.g. momentum_f32_avx2
 *   KATTR       the variant's function attributes (a target ISA, or nothing)
 *   W           lanes per step (1 for the portable kernels)
 *   vec         W reals; VLD/VST/VSET load, store and broadcast them, and
 *               VADD VSUB VMUL VDIV VSQRT VFMA (a*b+c, one rounding) and
 *               VSEL_LT(a, b, x, y) (a < b ? x : y, false for NaN) are
 *               per-lane IEEE operations, the same in every variant
 *   facc        a non-finite flag: FACC0, FACC_ADD(acc, x), FACC_ANY(acc)
 *   state_t     the element type of optimizer state (real, or uint16_t for
 *               bfloat16 state when FE_BF16): SLD loads W of them as a vec
 *               (exactly), SST rounds a vec to them (once: to nearest even),
 *               SST_FIN(q, x, acc) stores as SST and returns acc with the
 *               stored values' non-finite flags added (the rounded ones)
 * With FE_BF16 only the kernels that touch state are compiled.
 * Each kernel runs over a whole number of steps of W elements (len is a
 * multiple of W); the driver in foreach.c hands the last len % W elements
 * to the portable kernel, which computes each element with the same
 * operations, so results do not depend on the variant or on the split.
 *
 * A kernel gets the op's argument struct (foreach.c), the tensor index i
 * (for per-tensor scales), the element offset k0 of this segment and the
 * segment's pointers p[] into the op's arrays (NULL for an unused one);
 * it returns 0 to report a bad value, else 1. The check-only kernels
 * (all_finite, apply's check) may stop at the first bad value; the kernels
 * that write (momentum, adamw, lion) write every element and report
 * whether every value they wrote is finite (the update, or the apply it
 * is checked against, and the state as stored): the step's checks fused
 * into its passes.
 */

/* Momentum: the update and the new buffer, each checked as written (the
 * buffer as stored: bfloat16 rounded). Without new_bufs (p[2] NULL: the
 * step's first part) the new buffer is checked as it would be stored but
 * not stored; without updates (p[3] NULL: the commit's part, in place)
 * only the new buffer is written and checked. */
static KATTR int R(momentum)(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const momentum_args *a = va;
    const real *g = (const real *)p[0];
    const state_t *b = (const state_t *)p[1];
    state_t *nb = (state_t *)p[2];
    real *u = (real *)p[3];
    const vec m1 = VSET((real)a->m1), m2 = VSET((real)a->m2);
    facc acc = FACC0;
    (void)i, (void)k0;
    for (int64_t k = 0; k < len; k += W) {
        vec gv = VLD(g + k), bv = SLD(b + k);
        vec uv = VFMA(m1, bv, gv);
        vec bn = VADD(VMUL(bv, m2), gv);
        if (a->nesterov) uv = VADD(VMUL(uv, m1), gv);
        if (nb) {
            acc = SST_FIN(nb + k, bn, acc);
        } else { /* checked as the state would hold it, not stored */
            state_t st[W];
            acc = SST_FIN(st, bn, acc);
        }
        if (u) {
            acc = FACC_ADD(acc, uv);
            VST(u + k, uv);
        }
    }
    return !FACC_ANY(acc);
}

#if !FE_BF16
/* cautious: q = p * decay only where (alpha * us) * p < 0, else q = p.
 * check: nothing is written; 0 if a result would be NaN or Inf (the same
 * operations, so exactly the values the apply would write). */
static KATTR int R(apply)(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const apply_args *a = va;
    real *x = (real *)p[0];
    const real *u = (const real *)p[1];
    const vec dec = VSET((real)a->decay), al = VSET((real)a->alpha), zero = VSET((real)0);
    const vec s = VSET((real)(a->scales ? a->scales[i] : 1.0));
    facc acc = FACC0;
    (void)k0;
    for (int64_t k = 0; k < len; k += W) {
        vec pv = VLD(x + k);
        vec t = VMUL(pv, dec);
        vec us = VMUL(VLD(u + k), s);
        if (a->cautious) t = VSEL_LT(VMUL(VMUL(al, us), pv), zero, t, pv);
        if (a->check) {
            acc = FACC_ADD(acc, VFMA(al, us, t));
            if ((k & 1023) == 0 && FACC_ANY(acc)) return 0;
        } else {
            VST(x + k, VFMA(al, us, t));
        }
    }
    return !FACC_ANY(acc);
}

static KATTR int R(scale)(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const scale_args *a = va;
    real *x = (real *)p[0];
    const vec s = VSET((real)(a->scales ? a->scales[i] : a->scale));
    (void)k0;
    for (int64_t k = 0; k < len; k += W) VST(x + k, VMUL(VLD(x + k), s));
    return 1;
}
#endif

/*
 * torch.optim.AdamW, single-tensor path (torch 2.x), in the tensor dtype:
 *   p.mul_(1 - lr*wd)                       p = p * decay
 *   m.lerp_(g, w = 1-b1)                    w < 0.5: m = fma(w, g-m, m)
 *                                           else:    m = fma(w-1, g-m, g)
 *   v.mul_(b2).addcmul_(g, g, value=1-b2)   v = v*b2 + (c2*g)*g
 *   denom = (v.sqrt() / sqrt(bc2)).add_(eps)
 *   p.addcdiv_(m, denom, value=-lr/bc1)     p = p + (nss*m)/denom
 * with bc1 = 1 - b1^step, bc2 = 1 - b2^step computed in double (adamw_args).
 * Reads g, m, v; writes the new moments to mo, vo (which may be m, v) and
 * either p = p*decay + upd (u NULL: the in-place step) or u = upd (the
 * update direction, applied later by mu_foreach_apply with decay and
 * alpha 1: fma(1, u*1, p*decay) rounds like p*decay + upd, the same bits).
 * With both p and u, p is read only: the value the apply would write,
 * fma(alpha, u, p*decay), is computed and checked, not stored.
 */
static KATTR int R(adamw)(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const adamw_args *a = va;
    real *x = (real *)p[0], *u = (real *)p[6];
    const real *g = (const real *)p[1];
    const state_t *m = (const state_t *)p[2], *v = (const state_t *)p[3];
    state_t *mo = (state_t *)p[4], *vo = (state_t *)p[5];
    const int small = a->w < 0.5;
    const real w = (real)a->w;
    const vec vw = VSET(small ? w : w - (real)1), b2 = VSET((real)a->b2);
    const vec c2 = VSET((real)(1.0 - a->b2)), bc2s = VSET((real)a->bc2s);
    const vec eps = VSET((real)a->eps), nss = VSET((real)a->nss), dec = VSET((real)a->decay);
    const vec al = VSET((real)a->alpha);
    facc acc = FACC0;
    (void)i, (void)k0;
    for (int64_t k = 0; k < len; k += W) {
        vec gv = VLD(g + k), mv = SLD(m + k);
        vec diff = VSUB(gv, mv);
        mv = VFMA(vw, diff, small ? mv : gv);
        vec vb = VMUL(SLD(v + k), b2);
        vec vv = VADD(vb, VMUL(VMUL(c2, gv), gv));
        vec den = VADD(VDIV(VSQRT(vv), bc2s), eps);
        vec upd = VDIV(VMUL(nss, mv), den);
        if (!u) {
            vec pv = VADD(VMUL(VLD(x + k), dec), upd);
            acc = FACC_ADD(acc, pv);
            VST(x + k, pv);
        } else {
            VST(u + k, upd);
            acc = FACC_ADD(acc, x ? VFMA(al, upd, VMUL(VLD(x + k), dec)) : upd);
        }
        acc = SST_FIN(mo + k, mv, acc);
        acc = SST_FIN(vo + k, vv, acc);
    }
    return !FACC_ANY(acc);
}

/* Lion: c = beta1*m + (1-beta1)*g, u = sign(c) (1, -1, +0 for either
 * zero, a NaN kept), m' = beta2*m + (1-beta2)*g, each sum one fused
 * multiply-add over the rounded product (lion-pytorch's
 * m.mul(beta1).add(g, alpha=1-beta1)). m' may be m. With params (p[4]),
 * read only: the apply's value fma(alpha, u, p*decay) is checked. */
static KATTR int R(lion)(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const lion_args *a = va;
    const real *g = (const real *)p[0];
    const state_t *m = (const state_t *)p[1];
    state_t *nm = (state_t *)p[2];
    real *u = (real *)p[3];
    const real *x = (const real *)p[4];
    const vec b1 = VSET((real)a->beta1), a1 = VSET((real)(1.0 - a->beta1));
    const vec b2 = VSET((real)a->beta2), a2 = VSET((real)(1.0 - a->beta2));
    const vec zero = VSET((real)0), one = VSET((real)1), mone = VSET((real)-1);
    const vec dec = VSET((real)a->decay), al = VSET((real)a->alpha);
    facc acc = FACC0;
    (void)i, (void)k0;
    for (int64_t k = 0; k < len; k += W) {
        vec gv = VLD(g + k), mv = SLD(m + k);
        vec c = VFMA(a1, gv, VMUL(mv, b1));
        vec uv = VSEL_LT(zero, c, one, VSEL_LT(c, zero, mone, VADD(c, zero)));
        VST(u + k, uv);
        acc = FACC_ADD(acc, x ? VFMA(al, uv, VMUL(VLD(x + k), dec)) : uv);
        acc = SST_FIN(nm + k, VFMA(a2, gv, VMUL(mv, b2)), acc);
    }
    return !FACC_ANY(acc);
}

/* 0 if an element is NaN or Inf (x is state_t: bfloat16 too). The flags
 * are folded every 1024 elements, so a long tensor with an early bad value
 * stops early. */
static KATTR int R(finite)(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const state_t *x = (const state_t *)p[0];
    facc acc = FACC0;
    (void)va, (void)i, (void)k0;
    for (int64_t k = 0; k < len; k += W) {
        acc = FACC_ADD(acc, SLD(x + k));
        if ((k & 1023) == 0 && FACC_ANY(acc)) return 0;
    }
    return !FACC_ANY(acc);
}

#if !FE_BF16
/* STREAM triad d = fma(s, b, a) (a benchmark's bandwidth probe). */
static KATTR int R(triad)(const void *va, int i, int64_t k0, int64_t len, char *const *p)
{
    const triad_args *a = va;
    real *d = (real *)p[0];
    const real *x = (const real *)p[1], *y = (const real *)p[2];
    const vec s = VSET((real)a->s);
    (void)i, (void)k0;
    for (int64_t k = 0; k < len; k += W) VST(d + k, VFMA(s, VLD(y + k), VLD(x + k)));
    return 1;
}
#endif

static const kernel R(kernels)[OP_COUNT] = {
    [OP_MOMENTUM] = { R(momentum), W }, [OP_ADAMW] = { R(adamw), W },
    [OP_LION] = { R(lion), W },         [OP_FINITE] = { R(finite), W },
#if !FE_BF16
    [OP_APPLY] = { R(apply), W },       [OP_SCALE] = { R(scale), W },
    [OP_TRIAD] = { R(triad), W },
#endif
};
