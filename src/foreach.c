/*
 * Fused multi-tensor ops (mu_foreach_*): one pass over memory per op, over
 * arrays of contiguous tensors, split across threads by the total element
 * range, no allocation.
 *
 * Rounding. The ops reproduce the float32 (float64) rounding of the PyTorch
 * sequences they replace, on CPUs with AVX2+FMA (vector kernels below) and on
 * others (scalar kernels with fmaf/fma from libm, same results, slower):
 *   momentum  u  = fma(m1, buf, g)          torch._foreach_add(g, buf, alpha=m1)
 *             b' = (buf * m2) + g           _foreach_mul_(bufs, m2); _foreach_add_(bufs, g)
 *             nesterov: u = (u * m1) + g    _foreach_mul_(us, m1); _foreach_add_(us, g)
 *   apply     p  = fma(alpha, u * s, p * decay)
 *                                           update.mul_(s); p.mul_(decay);
 *                                           p.add_(update, alpha=alpha)
 *   scale     x  = x * s
 *   adamw     see adamw_f32 below (torch.optim.AdamW single-tensor path).
 * Scalars are rounded to the tensor dtype first, as torch does for a Python
 * scalar applied to a float32 tensor. torch's CPU add-with-alpha is a fused
 * multiply-add (Vectorized fmadd; checked against torch 1.13: 100% equal
 * with fma, 71% with separate multiply and add), so those steps use an
 * explicit fma and every other step must NOT be contracted: GCC in ISO C
 * mode (-std=c11, as the Makefile builds) defaults to -ffp-contract=off;
 * the pragmas below enforce it for clang and GNU dialects as well. Never
 * build this file with -ffast-math.
 *
 * Threads: a call whose total element count reaches MU__FOREACH_MT_MIN runs
 * on up to the CPUs in the process affinity mask (capped at
 * MU__FOREACH_MAX_THREADS; the environment variable MU_FOREACH_THREADS
 * overrides the count, e.g. 1 for MPI ranks that fill the cores, and
 * MU_FOREACH_MT_MIN the threshold; MU_FOREACH_NOSIMD=1 selects the portable
 * kernels, for tests), spawning the extra threads per call (measured:
 * ~25-50 us for one thread, small next to the >= 1 ms of such a pass) so no
 * pool, no global state and no idle threads that could steal cycles from
 * OpenBLAS. Each element is computed by the same code whatever the split, so
 * results are bitwise independent of the thread count.
 */
#define _GNU_SOURCE
#include "tensor_internal.h"

#include <math.h>
#include <stdio.h>
#include <pthread.h>
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
#define MU__AVX2 __attribute__((target("avx2,fma")))
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

enum { OP_MOMENTUM, OP_APPLY, OP_SCALE, OP_ADAMW, OP_FINITE, OP_PACK, OP_UNPACK, OP_TRIAD };

typedef struct job {
    int op;
    int dtype;
    int n;
    int use_simd;
    mu_tensor *const *a; /* grads / params / xs / srcs / dsts */
    mu_tensor *const *b; /* bufs / updates / grads */
    mu_tensor *const *c; /* new_bufs / exp_avgs */
    mu_tensor *const *d; /* updates / exp_avg_sqs */
    mu_tensor *const *e; /* adamw_update: new_exp_avgs */
    mu_tensor *const *f; /* adamw_update: new_exp_avg_sqs */
    mu_tensor *const *u; /* adamw_update: updates (NULL: in place on params) */
    const mu_tensor *batch; /* pack dst / unpack src */
    const int64_t *offsets;
    const double *scales;
    double s0, s1, s2, s3, s4, s5; /* op scalars, see the callers */
    int flag;                      /* nesterov */
    int64_t total;
    int nthreads;
    int bad[MU__FOREACH_MAX_THREADS]; /* all_finite: first bad tensor per thread */
} job;

/* ------------------------------------------------------------ scalar ops */

static inline void mom_f32(const float *g, const float *b, float *nb, float *u, int64_t k,
                           float m1, float m2, int nest)
{
    float gv = g[k], bv = b[k];
    float uv = fmaf(m1, bv, gv);
    float t = bv * m2;
    float bn = t + gv;
    if (nest) {
        float w = uv * m1;
        uv = w + gv;
    }
    nb[k] = bn;
    u[k] = uv;
}

static inline void mom_f64(const double *g, const double *b, double *nb, double *u, int64_t k,
                           double m1, double m2, int nest)
{
    double gv = g[k], bv = b[k];
    double uv = fma(m1, bv, gv);
    double t = bv * m2;
    double bn = t + gv;
    if (nest) {
        double w = uv * m1;
        uv = w + gv;
    }
    nb[k] = bn;
    u[k] = uv;
}

/* cautious (weight_decay_mode = "cautious"): the decay applies only where
 * the update moves the weight towards zero, i.e. where the update the seed
 * subtracts, -alpha * us, has the sign of p: p = fma(alpha, us, q) with
 * q = p * decay there and q = p elsewhere (so with the mask all ones it is
 * the decoupled apply, bit for bit). */
static inline void apply_f32(float *p, const float *u, int64_t k, float decay, float s, float alpha,
                             int cautious)
{
    float pv = p[k];
    float t = pv * decay;
    float us = u[k] * s;
    if (cautious) {
        float w = alpha * us;
        if (!(w * pv < 0.0f)) t = pv;
    }
    p[k] = fmaf(alpha, us, t);
}

static inline void apply_f64(double *p, const double *u, int64_t k, double decay, double s,
                             double alpha, int cautious)
{
    double pv = p[k];
    double t = pv * decay;
    double us = u[k] * s;
    if (cautious) {
        double w = alpha * us;
        if (!(w * pv < 0.0)) t = pv;
    }
    p[k] = fma(alpha, us, t);
}

/*
 * torch.optim.AdamW, single-tensor path (torch 2.x), in the tensor dtype:
 *   p.mul_(1 - lr*wd)                       p = p * decay
 *   m.lerp_(g, w = 1-b1)                    w < 0.5: m = fma(w, g-m, m)
 *                                           else:    m = fma(w-1, g-m, g)
 *   v.mul_(b2).addcmul_(g, g, value=1-b2)   v = v*b2 + (c2*g)*g
 *   denom = (v.sqrt() / sqrt(bc2)).add_(eps)
 *   p.addcdiv_(m, denom, value=-lr/bc1)     p = p + (nss*m)/denom
 * with bc1 = 1 - b1^step, bc2 = 1 - b2^step computed in double.
 * Scalars: s0 decay, s1 lerp weight w, s2 b2, s3 c2, s4 sqrt(bc2), s5 nss;
 * eps in the job's flag-adjacent field (see adamw_seg).
 */
typedef struct adam_f32 { float decay, w, wm1, b2, c2, bc2s, eps, nss; int small; } adam_f32;
typedef struct adam_f64 { double decay, w, wm1, b2, c2, bc2s, eps, nss; int small; } adam_f64;

/* One element of AdamW: reads g, m, v at k, writes the new moments to
 * mo, vo (which may be m, v) and either p = p*decay + upd (u == NULL, the
 * in-place step) or u = upd (the update direction, applied later by
 * mu_foreach_apply with decay and alpha 1: fma(1, u*1, p*decay) rounds
 * like p*decay + upd, so both forms give the same bits). */
static inline void adamw_f32(float *p, const float *g, const float *m, const float *v, float *mo,
                             float *vo, float *u, int64_t k, const adam_f32 *h)
{
    float gv = g[k], mv = m[k];
    float diff = gv - mv;
    mv = h->small ? fmaf(h->w, diff, mv) : fmaf(h->wm1, diff, gv);
    float vb = v[k] * h->b2;
    float gc = h->c2 * gv;
    float vv = vb + gc * gv;
    float den = sqrtf(vv) / h->bc2s + h->eps;
    float num = h->nss * mv;
    float upd = num / den;
    if (u) u[k] = upd;
    else p[k] = p[k] * h->decay + upd;
    mo[k] = mv;
    vo[k] = vv;
}

static inline void adamw_f64(double *p, const double *g, const double *m, const double *v, double *mo,
                             double *vo, double *u, int64_t k, const adam_f64 *h)
{
    double gv = g[k], mv = m[k];
    double diff = gv - mv;
    mv = h->small ? fma(h->w, diff, mv) : fma(h->wm1, diff, gv);
    double vb = v[k] * h->b2;
    double gc = h->c2 * gv;
    double vv = vb + gc * gv;
    double den = sqrt(vv) / h->bc2s + h->eps;
    double num = h->nss * mv;
    double upd = num / den;
    if (u) u[k] = upd;
    else p[k] = p[k] * h->decay + upd;
    mo[k] = mv;
    vo[k] = vv;
}

/* ------------------------------------------------------ AVX2+FMA kernels */

#if MU__X86
MU__AVX2 static void mom_f32_avx2(const float *g, const float *b, float *nb, float *u,
                                  int64_t len, float m1, float m2, int nest)
{
    const __m256 vm1 = _mm256_set1_ps(m1), vm2 = _mm256_set1_ps(m2);
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
        __m256 gv = _mm256_loadu_ps(g + k), bv = _mm256_loadu_ps(b + k);
        __m256 uv = _mm256_fmadd_ps(vm1, bv, gv);
        __m256 bn = _mm256_add_ps(_mm256_mul_ps(bv, vm2), gv);
        if (nest) uv = _mm256_add_ps(_mm256_mul_ps(uv, vm1), gv);
        _mm256_storeu_ps(nb + k, bn);
        _mm256_storeu_ps(u + k, uv);
    }
    for (; k < len; k++) mom_f32(g, b, nb, u, k, m1, m2, nest);
}

MU__AVX2 static void mom_f64_avx2(const double *g, const double *b, double *nb, double *u,
                                  int64_t len, double m1, double m2, int nest)
{
    const __m256d vm1 = _mm256_set1_pd(m1), vm2 = _mm256_set1_pd(m2);
    int64_t k = 0;
    for (; k + 4 <= len; k += 4) {
        __m256d gv = _mm256_loadu_pd(g + k), bv = _mm256_loadu_pd(b + k);
        __m256d uv = _mm256_fmadd_pd(vm1, bv, gv);
        __m256d bn = _mm256_add_pd(_mm256_mul_pd(bv, vm2), gv);
        if (nest) uv = _mm256_add_pd(_mm256_mul_pd(uv, vm1), gv);
        _mm256_storeu_pd(nb + k, bn);
        _mm256_storeu_pd(u + k, uv);
    }
    for (; k < len; k++) mom_f64(g, b, nb, u, k, m1, m2, nest);
}

MU__AVX2 static void apply_f32_avx2(float *p, const float *u, int64_t len, float decay, float s,
                                    float alpha, int cautious)
{
    const __m256 vd = _mm256_set1_ps(decay), vs = _mm256_set1_ps(s), va = _mm256_set1_ps(alpha);
    const __m256 zero = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
        __m256 pv = _mm256_loadu_ps(p + k);
        __m256 t = _mm256_mul_ps(pv, vd);
        __m256 us = _mm256_mul_ps(_mm256_loadu_ps(u + k), vs);
        if (cautious) {
            __m256 towards = _mm256_cmp_ps(_mm256_mul_ps(_mm256_mul_ps(va, us), pv), zero, _CMP_LT_OQ);
            t = _mm256_blendv_ps(pv, t, towards);
        }
        _mm256_storeu_ps(p + k, _mm256_fmadd_ps(va, us, t));
    }
    for (; k < len; k++) apply_f32(p, u, k, decay, s, alpha, cautious);
}

MU__AVX2 static void apply_f64_avx2(double *p, const double *u, int64_t len, double decay,
                                    double s, double alpha, int cautious)
{
    const __m256d vd = _mm256_set1_pd(decay), vs = _mm256_set1_pd(s), va = _mm256_set1_pd(alpha);
    const __m256d zero = _mm256_setzero_pd();
    int64_t k = 0;
    for (; k + 4 <= len; k += 4) {
        __m256d pv = _mm256_loadu_pd(p + k);
        __m256d t = _mm256_mul_pd(pv, vd);
        __m256d us = _mm256_mul_pd(_mm256_loadu_pd(u + k), vs);
        if (cautious) {
            __m256d towards = _mm256_cmp_pd(_mm256_mul_pd(_mm256_mul_pd(va, us), pv), zero, _CMP_LT_OQ);
            t = _mm256_blendv_pd(pv, t, towards);
        }
        _mm256_storeu_pd(p + k, _mm256_fmadd_pd(va, us, t));
    }
    for (; k < len; k++) apply_f64(p, u, k, decay, s, alpha, cautious);
}

MU__AVX2 static void adamw_f32_avx2(float *p, const float *g, const float *m, const float *v,
                                    float *mo, float *vo, float *u, int64_t len, const adam_f32 *h)
{
    const __m256 vdec = _mm256_set1_ps(h->decay), vw = _mm256_set1_ps(h->small ? h->w : h->wm1);
    const __m256 vb2 = _mm256_set1_ps(h->b2), vc2 = _mm256_set1_ps(h->c2);
    const __m256 vbc = _mm256_set1_ps(h->bc2s), veps = _mm256_set1_ps(h->eps);
    const __m256 vnss = _mm256_set1_ps(h->nss);
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
        __m256 gv = _mm256_loadu_ps(g + k), mv = _mm256_loadu_ps(m + k);
        __m256 diff = _mm256_sub_ps(gv, mv);
        mv = _mm256_fmadd_ps(vw, diff, h->small ? mv : gv);
        __m256 vb = _mm256_mul_ps(_mm256_loadu_ps(v + k), vb2);
        __m256 vv = _mm256_add_ps(vb, _mm256_mul_ps(_mm256_mul_ps(vc2, gv), gv));
        __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), vbc), veps);
        __m256 upd = _mm256_div_ps(_mm256_mul_ps(vnss, mv), den);
        if (u) _mm256_storeu_ps(u + k, upd);
        else _mm256_storeu_ps(p + k, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(p + k), vdec), upd));
        _mm256_storeu_ps(mo + k, mv);
        _mm256_storeu_ps(vo + k, vv);
    }
    for (; k < len; k++) adamw_f32(p, g, m, v, mo, vo, u, k, h);
}

MU__AVX2 static void adamw_f64_avx2(double *p, const double *g, const double *m, const double *v,
                                    double *mo, double *vo, double *u, int64_t len, const adam_f64 *h)
{
    const __m256d vdec = _mm256_set1_pd(h->decay), vw = _mm256_set1_pd(h->small ? h->w : h->wm1);
    const __m256d vb2 = _mm256_set1_pd(h->b2), vc2 = _mm256_set1_pd(h->c2);
    const __m256d vbc = _mm256_set1_pd(h->bc2s), veps = _mm256_set1_pd(h->eps);
    const __m256d vnss = _mm256_set1_pd(h->nss);
    int64_t k = 0;
    for (; k + 4 <= len; k += 4) {
        __m256d gv = _mm256_loadu_pd(g + k), mv = _mm256_loadu_pd(m + k);
        __m256d diff = _mm256_sub_pd(gv, mv);
        mv = _mm256_fmadd_pd(vw, diff, h->small ? mv : gv);
        __m256d vb = _mm256_mul_pd(_mm256_loadu_pd(v + k), vb2);
        __m256d vv = _mm256_add_pd(vb, _mm256_mul_pd(_mm256_mul_pd(vc2, gv), gv));
        __m256d den = _mm256_add_pd(_mm256_div_pd(_mm256_sqrt_pd(vv), vbc), veps);
        __m256d upd = _mm256_div_pd(_mm256_mul_pd(vnss, mv), den);
        if (u) _mm256_storeu_pd(u + k, upd);
        else _mm256_storeu_pd(p + k, _mm256_add_pd(_mm256_mul_pd(_mm256_loadu_pd(p + k), vdec), upd));
        _mm256_storeu_pd(mo + k, mv);
        _mm256_storeu_pd(vo + k, vv);
    }
    for (; k < len; k++) adamw_f64(p, g, m, v, mo, vo, u, k, h);
}

MU__AVX2 static void scale_f32_avx2(float *x, int64_t len, float s)
{
    const __m256 vs = _mm256_set1_ps(s);
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) _mm256_storeu_ps(x + k, _mm256_mul_ps(_mm256_loadu_ps(x + k), vs));
    for (; k < len; k++) x[k] = x[k] * s;
}

MU__AVX2 static void scale_f64_avx2(double *x, int64_t len, double s)
{
    const __m256d vs = _mm256_set1_pd(s);
    int64_t k = 0;
    for (; k + 4 <= len; k += 4) _mm256_storeu_pd(x + k, _mm256_mul_pd(_mm256_loadu_pd(x + k), vs));
    for (; k < len; k++) x[k] = x[k] * s;
}

MU__AVX2 static void triad_f32_avx2(float *d, const float *a, const float *b, int64_t len, float s)
{
    const __m256 vs = _mm256_set1_ps(s);
    int64_t k = 0;
    for (; k + 8 <= len; k += 8)
        _mm256_storeu_ps(d + k, _mm256_fmadd_ps(vs, _mm256_loadu_ps(b + k), _mm256_loadu_ps(a + k)));
    for (; k < len; k++) d[k] = fmaf(s, b[k], a[k]);
}

MU__AVX2 static void triad_f64_avx2(double *d, const double *a, const double *b, int64_t len,
                                    double s)
{
    const __m256d vs = _mm256_set1_pd(s);
    int64_t k = 0;
    for (; k + 4 <= len; k += 4)
        _mm256_storeu_pd(d + k, _mm256_fmadd_pd(vs, _mm256_loadu_pd(b + k), _mm256_loadu_pd(a + k)));
    for (; k < len; k++) d[k] = fma(s, b[k], a[k]);
}

/* 1 if all finite. Exponent bits all ones <=> NaN or Inf. */
MU__AVX2 static int finite_f32_avx2(const float *x, int64_t len)
{
    const __m256i em = _mm256_set1_epi32(0x7f800000);
    __m256i acc = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
        __m256i e = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + k)), em);
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(e, em));
        if ((k & 1023) == 0 && !_mm256_testz_si256(acc, acc)) return 0;
    }
    if (!_mm256_testz_si256(acc, acc)) return 0;
    for (; k < len; k++)
        if (!isfinite(x[k])) return 0;
    return 1;
}

MU__AVX2 static int finite_f64_avx2(const double *x, int64_t len)
{
    const __m256i em = _mm256_set1_epi64x(0x7ff0000000000000LL);
    __m256i acc = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 4 <= len; k += 4) {
        __m256i e = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + k)), em);
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi64(e, em));
        if ((k & 1023) == 0 && !_mm256_testz_si256(acc, acc)) return 0;
    }
    if (!_mm256_testz_si256(acc, acc)) return 0;
    for (; k < len; k++)
        if (!isfinite(x[k])) return 0;
    return 1;
}
#endif

static int have_simd(void)
{
#if MU__X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* ------------------------------------------------- per-segment dispatch */

static void *tdata(const mu_tensor *t, int64_t k)
{
    return (char *)t->data + k * (int64_t)mu_dtype_size(t->scalar);
}

/* Run op on elements [k0, k0+len) of tensor index i. Returns 0 if the
 * all_finite scan found a bad value, else 1. */
static int segment(job *J, int i, int64_t k0, int64_t len)
{
    const int f32 = J->dtype == MU_F32, simd = J->use_simd;
    MU__UNUSED(simd);
    switch (J->op) {
    case OP_MOMENTUM: {
        void *g = tdata(J->a[i], k0), *b = tdata(J->b[i], k0);
        void *nb = tdata(J->c[i], k0), *u = tdata(J->d[i], k0);
        if (f32) {
            float m1 = (float)J->s0, m2 = (float)J->s1;
#if MU__X86
            if (simd) { mom_f32_avx2(g, b, nb, u, len, m1, m2, J->flag); break; }
#endif
            for (int64_t k = 0; k < len; k++) mom_f32(g, b, nb, u, k, m1, m2, J->flag);
        } else {
#if MU__X86
            if (simd) { mom_f64_avx2(g, b, nb, u, len, J->s0, J->s1, J->flag); break; }
#endif
            for (int64_t k = 0; k < len; k++) mom_f64(g, b, nb, u, k, J->s0, J->s1, J->flag);
        }
        break;
    }
    case OP_APPLY:
    case OP_SCALE: {
        void *p = tdata(J->a[i], k0);
        double s = J->scales ? J->scales[i] : J->s1;
        if (J->op == OP_SCALE) {
            if (f32) {
                float *x = p, sf = (float)s;
#if MU__X86
                if (simd) { scale_f32_avx2(x, len, sf); break; }
#endif
                for (int64_t k = 0; k < len; k++) x[k] = x[k] * sf;
            } else {
                double *x = p;
#if MU__X86
                if (simd) { scale_f64_avx2(x, len, s); break; }
#endif
                for (int64_t k = 0; k < len; k++) x[k] = x[k] * s;
            }
            break;
        }
        void *u = tdata(J->b[i], k0);
        if (f32) {
            float dec = (float)J->s0, sf = (float)s, al = (float)J->s2;
#if MU__X86
            if (simd) { apply_f32_avx2(p, u, len, dec, sf, al, J->flag); break; }
#endif
            for (int64_t k = 0; k < len; k++) apply_f32(p, u, k, dec, sf, al, J->flag);
        } else {
#if MU__X86
            if (simd) { apply_f64_avx2(p, u, len, J->s0, s, J->s2, J->flag); break; }
#endif
            for (int64_t k = 0; k < len; k++) apply_f64(p, u, k, J->s0, s, J->s2, J->flag);
        }
        break;
    }
    case OP_ADAMW: {
        void *p = J->u ? NULL : tdata(J->a[i], k0), *g = tdata(J->b[i], k0);
        void *m = tdata(J->c[i], k0), *v = tdata(J->d[i], k0);
        void *mo = tdata(J->e[i], k0), *vo = tdata(J->f[i], k0);
        void *u = J->u ? tdata(J->u[i], k0) : NULL;
        /* s0 decay, s1 w (= 1-b1), s2 b2, s3 sqrt(bc2), s4 eps, s5 -step_size */
        int small = J->s1 < 0.5;
        if (f32) {
            adam_f32 h = { (float)J->s0, (float)J->s1, 0, (float)J->s2, 0, (float)J->s3,
                           (float)J->s4, (float)J->s5, small };
            h.wm1 = h.w - 1.0f;
            h.c2 = (float)(1.0 - J->s2);
#if MU__X86
            if (simd) { adamw_f32_avx2(p, g, m, v, mo, vo, u, len, &h); break; }
#endif
            for (int64_t k = 0; k < len; k++) adamw_f32(p, g, m, v, mo, vo, u, k, &h);
        } else {
            adam_f64 h = { J->s0, J->s1, J->s1 - 1.0, J->s2, 1.0 - J->s2, J->s3, J->s4, J->s5,
                           small };
#if MU__X86
            if (simd) { adamw_f64_avx2(p, g, m, v, mo, vo, u, len, &h); break; }
#endif
            for (int64_t k = 0; k < len; k++) adamw_f64(p, g, m, v, mo, vo, u, k, &h);
        }
        break;
    }
    case OP_FINITE: {
        const void *x = tdata(J->a[i], k0);
        if (f32) {
#if MU__X86
            if (simd) return finite_f32_avx2(x, len);
#endif
            const float *xf = x;
            for (int64_t k = 0; k < len; k++)
                if (!isfinite(xf[k])) return 0;
        } else {
#if MU__X86
            if (simd) return finite_f64_avx2(x, len);
#endif
            const double *xd = x;
            for (int64_t k = 0; k < len; k++)
                if (!isfinite(xd[k])) return 0;
        }
        break;
    }
    case OP_TRIAD: {
        void *d = tdata(J->a[i], k0), *a = tdata(J->b[i], k0), *b = tdata(J->c[i], k0);
        if (f32) {
            float sf = (float)J->s0, *df = d;
            const float *af = a, *bf = b;
#if MU__X86
            if (simd) { triad_f32_avx2(df, af, bf, len, sf); break; }
#endif
            for (int64_t k = 0; k < len; k++) df[k] = fmaf(sf, bf[k], af[k]);
        } else {
            double *dd = d;
            const double *ad = a, *bd = b;
#if MU__X86
            if (simd) { triad_f64_avx2(dd, ad, bd, len, J->s0); break; }
#endif
            for (int64_t k = 0; k < len; k++) dd[k] = fma(J->s0, bd[k], ad[k]);
        }
        break;
    }
    case OP_PACK:
    case OP_UNPACK: {
        size_t es = mu_dtype_size(J->dtype);
        char *t = tdata(J->a[i], k0);
        char *bt = (char *)J->batch->data + (J->offsets[i] + k0) * (int64_t)es;
        if (J->op == OP_PACK)
            memcpy(bt, t, (size_t)len * es);
        else
            memcpy(t, bt, (size_t)len * es);
        break;
    }
    }
    return 1;
}

/* ------------------------------------------------------------- threading */

typedef struct worker_arg {
    job *J;
    int tid;
} worker_arg;

static int64_t range_edge(const job *J, int tid)
{
    if (tid >= J->nthreads) return J->total;
    int64_t e = (int64_t)((double)J->total * tid / J->nthreads);
    e -= e % MU__FOREACH_ALIGN;
    return e;
}

static void run_range(job *J, int tid)
{
    int64_t lo = range_edge(J, tid), hi = range_edge(J, tid + 1), base = 0;
    J->bad[tid] = -1;
    for (int i = 0; i < J->n && base < hi; i++) {
        int64_t ne = mu_tensor_numel(J->a[i]);
        int64_t s = lo > base ? lo - base : 0, e = hi - base < ne ? hi - base : ne;
        if (s < e && !segment(J, i, s, e - s)) {
            J->bad[tid] = i;
            return; /* later tensors of this range cannot be "first" */
        }
        base += ne;
    }
}

static void *worker(void *p)
{
    worker_arg *w = p;
    run_range(w->J, w->tid);
    return NULL;
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
    J->total = 0;
    for (int i = 0; i < J->n; i++) J->total += mu_tensor_numel(J->a[i]);
    const char *nosimd = getenv("MU_FOREACH_NOSIMD"); /* tests: the portable kernels */
    J->use_simd = have_simd() && !(nosimd && *nosimd && *nosimd != '0');
    int64_t mt_min = MU__FOREACH_MT_MIN;
    const char *env = getenv("MU_FOREACH_MT_MIN"); /* benchmarks measure the threshold */
    if (env && *env) mt_min = atoll(env);
    int want = J->total >= mt_min ? cpu_count() : 1;
    pthread_t th[MU__FOREACH_MAX_THREADS];
    worker_arg args[MU__FOREACH_MAX_THREADS];
    int started = 0;
    J->nthreads = want;
    if (want > 1) {
        pthread_attr_t attr;
        int attr_ok = pthread_attr_init(&attr) == 0;
        if (attr_ok) pthread_attr_setstacksize(&attr, 1 << 16);
        for (int t = 1; t < want; t++) {
            args[t].J = J;
            args[t].tid = t;
            if (pthread_create(&th[t], attr_ok ? &attr : NULL, worker, &args[t]) != 0) break;
            started = t;
        }
        if (attr_ok) pthread_attr_destroy(&attr);
    }
    /* This thread takes range 0 and the ranges of any thread that could not
     * be started (element-wise results do not depend on who computes them). */
    run_range(J, 0);
    for (int t = started + 1; t < want; t++) run_range(J, t);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
}

/* ------------------------------------------------------------ validation */

static int check_tensor(const mu_tensor *t, const char *what, int i, int dtype)
{
    if (!t) return mu__fail(MU_EINVAL, "%s[%d] is NULL", what, i);
    char name[48];
    snprintf(name, sizeof name, "%s[%d]", what, i);
    int rc = mu__tensor_check(t, name); /* inside its storage */
    if (rc) return rc;
    if (t->scalar != dtype)
        return mu__fail(MU_EDTYPE, "%s[%d] has dtype %s, expected %s", what, i,
                        t->scalar == MU_F64 ? "float64" : "float32",
                        dtype == MU_F64 ? "float64" : "float32");
    if (!mu_tensor_is_contiguous(t))
        return mu__fail(MU_EINVAL, "%s[%d] is not contiguous (pass contiguous tensors)", what, i);
    return MU_OK;
}

/* Two tensors of one index either are the same memory or do not overlap
 * (exact aliasing is fine element-wise; partial overlap is not). */
static int overlap_bad(const mu_tensor *x, const mu_tensor *y)
{
    if (x->data == y->data) return 0;
    size_t es = mu_dtype_size(x->scalar);
    const char *xa = x->data, *xb = xa + mu_tensor_numel(x) * (int64_t)es;
    const char *ya = y->data, *yb = ya + mu_tensor_numel(y) * (int64_t)es;
    return xa < yb && ya < xb;
}

/* Validate n arrays of tensors (names[k], arrays[k]) for equal numel per
 * index, one dtype, contiguity and overlap. The dtype is taken from
 * arrays[0][0]. */
static int check_arrays(int n, int narr, mu_tensor *const *const *arrays, const char *const *names,
                        int *dtype_out)
{
    if (n < 0) return mu__fail(MU_EINVAL, "n = %d is negative", n);
    for (int k = 0; k < narr; k++)
        if (n > 0 && !arrays[k]) return mu__fail(MU_EINVAL, "%s is NULL", names[k]);
    int dtype = n > 0 && arrays[0][0] ? arrays[0][0]->scalar : MU_F32;
    if (dtype != MU_F32 && dtype != MU_F64)
        return mu__fail(MU_EDTYPE, "%s[0] has unsupported dtype %d", names[0], dtype);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < narr; k++) {
            int rc = check_tensor(arrays[k][i], names[k], i, dtype);
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
    *dtype_out = dtype;
    return MU_OK;
}

static int finite_scalar(const char *what, double v)
{
    if (!isfinite(v)) return mu__fail(MU_EINVAL, "%s = %g is not finite", what, v);
    return MU_OK;
}

static void job_init(job *J, int op, int n, int dtype)
{
    memset(J, 0, sizeof *J);
    J->op = op;
    J->n = n;
    J->dtype = dtype;
}

/* ------------------------------------------------------------ public API */

int mu_foreach_momentum(int n, mu_tensor *const *grads, mu_tensor *const *bufs,
                        mu_tensor *const *new_bufs, mu_tensor *const *updates, double m1,
                        double m2, int nesterov)
{
    mu_tensor *const *arrs[4] = { grads, bufs, new_bufs, updates };
    const char *names[4] = { "grads", "bufs", "new_bufs", "updates" };
    int dtype, rc = check_arrays(n, 4, arrs, names, &dtype);
    if (rc) return rc;
    if ((rc = finite_scalar("m1", m1)) || (rc = finite_scalar("m2", m2))) return rc;
    for (int i = 0; i < n; i++)
        if (mu_tensor_numel(updates[i]) > 0 &&
            (updates[i]->data == grads[i]->data || updates[i]->data == bufs[i]->data ||
             updates[i]->data == new_bufs[i]->data))
            return mu__fail(MU_EINVAL, "updates[%d] aliases an input or new_bufs[%d]", i, i);
    job J;
    job_init(&J, OP_MOMENTUM, n, dtype);
    J.a = grads, J.b = bufs, J.c = new_bufs, J.d = updates;
    J.s0 = m1, J.s1 = m2, J.flag = nesterov != 0;
    run_job(&J);
    return MU_OK;
}

static int apply_job(int n, mu_tensor *const *params, mu_tensor *const *updates,
                     const double *scales, double decay, double alpha, int cautious)
{
    mu_tensor *const *arrs[2] = { params, updates };
    const char *names[2] = { "params", "updates" };
    int dtype, rc = check_arrays(n, 2, arrs, names, &dtype);
    if (rc) return rc;
    if ((rc = finite_scalar("decay", decay)) || (rc = finite_scalar("alpha", alpha))) return rc;
    if (scales)
        for (int i = 0; i < n; i++)
            if (!isfinite(scales[i]))
                return mu__fail(MU_EINVAL, "scales[%d] = %g is not finite", i, scales[i]);
    job J;
    job_init(&J, OP_APPLY, n, dtype);
    J.a = params, J.b = updates, J.scales = scales;
    J.s0 = decay, J.s1 = 1.0, J.s2 = alpha, J.flag = cautious;
    run_job(&J);
    return MU_OK;
}

int mu_foreach_apply(int n, mu_tensor *const *params, mu_tensor *const *updates,
                     const double *scales, double decay, double alpha)
{
    return apply_job(n, params, updates, scales, decay, alpha, 0);
}

int mu_foreach_apply_cautious(int n, mu_tensor *const *params, mu_tensor *const *updates,
                              const double *scales, double decay, double alpha)
{
    return apply_job(n, params, updates, scales, decay, alpha, 1);
}

int mu_foreach_scale(int n, mu_tensor *const *xs, const double *scales, double scale)
{
    mu_tensor *const *arrs[1] = { xs };
    const char *names[1] = { "xs" };
    int dtype, rc = check_arrays(n, 1, arrs, names, &dtype);
    if (rc) return rc;
    if (scales) {
        for (int i = 0; i < n; i++)
            if (!isfinite(scales[i]))
                return mu__fail(MU_EINVAL, "scales[%d] = %g is not finite", i, scales[i]);
    } else if ((rc = finite_scalar("scale", scale))) {
        return rc;
    }
    job J;
    job_init(&J, OP_SCALE, n, dtype);
    J.a = xs, J.scales = scales, J.s1 = scale;
    run_job(&J);
    return MU_OK;
}

/* AdamW's scalars, checked; J gets s0..s5 (see OP_ADAMW in segment()). */
static int adamw_scalars(job *J, double lr, double beta1, double beta2, double eps,
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
    J->s0 = 1.0 - lr * weight_decay;
    J->s1 = 1.0 - beta1;
    J->s2 = beta2;
    J->s3 = sqrt(bc2);
    J->s4 = eps;
    J->s5 = -(lr / bc1);
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
    int dtype, rc = check_arrays(n, 4, arrs, names, &dtype);
    if (rc) return rc;
    job J;
    job_init(&J, OP_ADAMW, n, dtype);
    if ((rc = adamw_scalars(&J, lr, beta1, beta2, eps, weight_decay, step))) return rc;
    if ((rc = adamw_distinct(n, 4, arrs, names))) return rc;
    J.a = params, J.b = grads, J.c = exp_avgs, J.d = exp_avg_sqs;
    J.e = exp_avgs, J.f = exp_avg_sqs, J.u = NULL;
    run_job(&J);
    return MU_OK;
}

int mu_foreach_adamw_update(int n, mu_tensor *const *grads, mu_tensor *const *exp_avgs,
                            mu_tensor *const *exp_avg_sqs, mu_tensor *const *new_exp_avgs,
                            mu_tensor *const *new_exp_avg_sqs, mu_tensor *const *updates,
                            double lr, double beta1, double beta2, double eps, int64_t step)
{
    mu_tensor *const *arrs[6] = { grads, exp_avgs, exp_avg_sqs, new_exp_avgs, new_exp_avg_sqs,
                                  updates };
    const char *names[6] = { "grads", "exp_avgs", "exp_avg_sqs", "new_exp_avgs",
                             "new_exp_avg_sqs", "updates" };
    int dtype, rc = check_arrays(n, 6, arrs, names, &dtype);
    if (rc) return rc;
    job J;
    job_init(&J, OP_ADAMW, n, dtype);
    if ((rc = adamw_scalars(&J, lr, beta1, beta2, eps, 0.0, step))) return rc;
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
    J.b = grads, J.c = exp_avgs, J.d = exp_avg_sqs;
    J.e = new_exp_avgs, J.f = new_exp_avg_sqs, J.u = updates;
    J.a = grads; /* the range split walks J.a's element counts */
    run_job(&J);
    return MU_OK;
}

int mu_foreach_all_finite(int n, mu_tensor *const *xs, int *bad)
{
    if (bad) *bad = -1;
    mu_tensor *const *arrs[1] = { xs };
    const char *names[1] = { "xs" };
    int dtype, rc;
    if ((rc = check_arrays(n, 1, arrs, names, &dtype))) return rc;
    job J;
    job_init(&J, OP_FINITE, n, dtype);
    J.a = xs;
    run_job(&J);
    int first = -1;
    for (int t = 0; t < J.nthreads; t++)
        if (J.bad[t] >= 0 && (first < 0 || J.bad[t] < first)) first = J.bad[t];
    if (bad) *bad = first;
    return first < 0 ? 1 : 0;
}

static int check_batch(int n, mu_tensor *const *ts, const char *tname, const mu_tensor *batch,
                       const char *bname, const int64_t *offsets, int *dtype_out)
{
    mu_tensor *const *arrs[1] = { ts };
    const char *names[1] = { tname };
    int dtype, rc = check_arrays(n, 1, arrs, names, &dtype);
    if (rc) return rc;
    if (!batch) return mu__fail(MU_EINVAL, "%s is NULL", bname);
    if ((rc = mu__tensor_check(batch, bname))) return rc;
    if (n > 0 && batch->scalar != dtype)
        return mu__fail(MU_EDTYPE, "%s has dtype %s but the %s are %s", bname,
                        batch->scalar == MU_F64 ? "float64" : "float32", tname,
                        dtype == MU_F64 ? "float64" : "float32");
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

int mu_foreach_pack(int n, mu_tensor *const *srcs, mu_tensor *dst, const int64_t *offsets)
{
    int dtype, rc = check_batch(n, srcs, "srcs", dst, "dst", offsets, &dtype);
    if (rc) return rc;
    job J;
    job_init(&J, OP_PACK, n, dtype);
    J.a = srcs, J.batch = dst, J.offsets = offsets;
    run_job(&J);
    return MU_OK;
}

int mu_foreach_unpack(int n, const mu_tensor *src, mu_tensor *const *dsts, const int64_t *offsets)
{
    int dtype, rc = check_batch(n, dsts, "dsts", src, "src", offsets, &dtype);
    if (rc) return rc;
    job J;
    job_init(&J, OP_UNPACK, n, dtype);
    J.a = dsts, J.batch = src, J.offsets = offsets;
    run_job(&J);
    return MU_OK;
}

int mu__foreach_triad(mu_tensor *dst, const mu_tensor *a, const mu_tensor *b, double s)
{
    mu_tensor *arr[3] = { dst, (mu_tensor *)a, (mu_tensor *)b };
    mu_tensor *const *arrs[3] = { &arr[0], &arr[1], &arr[2] };
    const char *names[3] = { "dst", "a", "b" };
    int dtype, rc = check_arrays(1, 3, arrs, names, &dtype);
    if (rc) return rc;
    job J;
    job_init(&J, OP_TRIAD, 1, dtype);
    J.a = arrs[0], J.b = arrs[1], J.c = arrs[2];
    J.s0 = s;
    run_job(&J);
    return MU_OK;
}

/* ------------------------------------------------------------------ Lion */

/* One pass on the calling thread, self-contained (a kernel of its own, not
 * a job of segment()): Lion's pass is one read of g and m and one write of
 * m' and u per element. */
int mu_foreach_lion_update(int n, mu_tensor *const *grads, mu_tensor *const *exp_avgs,
                           mu_tensor *const *new_exp_avgs, mu_tensor *const *updates,
                           double beta1, double beta2)
{
    mu_tensor *const *arrs[4] = { grads, exp_avgs, new_exp_avgs, updates };
    const char *names[4] = { "grads", "exp_avgs", "new_exp_avgs", "updates" };
    int dtype, rc = check_arrays(n, 4, arrs, names, &dtype);
    if (rc) return rc;
    if ((rc = finite_scalar("beta1", beta1)) || (rc = finite_scalar("beta2", beta2))) return rc;
    for (int i = 0; i < n; i++)
        if (mu_tensor_numel(updates[i]) > 0 &&
            (updates[i]->data == grads[i]->data || updates[i]->data == exp_avgs[i]->data ||
             updates[i]->data == new_exp_avgs[i]->data))
            return mu__fail(MU_EINVAL, "updates[%d] aliases an input or new_exp_avgs[%d]", i, i);
    for (int i = 0; i < n; i++) {
        int64_t len = mu_tensor_numel(grads[i]);
        if (dtype == MU_F32) {
            const float *g = grads[i]->data, *m = exp_avgs[i]->data;
            float *nm = new_exp_avgs[i]->data, *u = updates[i]->data;
            const float b1 = (float)beta1, a1 = (float)(1.0 - beta1);
            const float b2 = (float)beta2, a2 = (float)(1.0 - beta2);
            for (int64_t k = 0; k < len; k++) {
                float gv = g[k], mv = m[k];
                float c = fmaf(a1, gv, mv * b1);
                u[k] = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c == 0.0f ? 0.0f : c; /* NaN stays */
                nm[k] = fmaf(a2, gv, mv * b2);
            }
        } else {
            const double *g = grads[i]->data, *m = exp_avgs[i]->data;
            double *nm = new_exp_avgs[i]->data, *u = updates[i]->data;
            const double a1 = 1.0 - beta1, a2 = 1.0 - beta2;
            for (int64_t k = 0; k < len; k++) {
                double gv = g[k], mv = m[k];
                double c = fma(a1, gv, mv * beta1);
                u[k] = c > 0.0 ? 1.0 : c < 0.0 ? -1.0 : c == 0.0 ? 0.0 : c;
                nm[k] = fma(a2, gv, mv * beta2);
            }
        }
    }
    return MU_OK;
}
