/*
 * The seed's bfloat16 Newton-Schulz iteration (mu_ns_opts.dtype = MU_BF16):
 * its tile plan, its prologue and its tiles, run by the scheduler of
 * src/ns.c; the products are oneDNN calls (src/dnnl.c) taking bfloat16
 * inputs into float32, and every elementwise pass rounds where the seed's
 * torch 1.13 code holds bfloat16 tensors (src/muon.h, mu_ns_opts).
 */
#include "ns_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The bfloat16 plan (mu_ns_opts.dtype = MU_BF16). X is held n x m
 * row-major in bfloat16 (a tall input transposed when converted), and
 * every product is a oneDNN call into float32, rounded by its tile:
 *   GRAM_A  A = X X^T: the tn(tn+1)/2 blocks on and above the diagonal of
 *           tn x tn blocks of nb (the others are their mirror images), each
 *           one call rounded to bfloat16 into A and its mirror block
 *   GRAM_B  B = b' A + c' A A over the same blocks (A A is symmetric)
 *   APPLY   X = a' X + B X in tm column blocks of mb, in place (a column
 *           block of B X reads only that block of X)
 * Blocks of about MU__NS_BF16_NB (one block below 2 * NS_BF16_MIN, none
 * split when n * m < NS_BF16_SPLIT), column blocks an even count of at most
 * MU__NS_BF16_MB: sizes from the shape only, so a lone matrix splits over
 * the workers with the calls a batch makes one worker at a time (no
 * separate threshold: the one-thread oneDNN calls on these blocks run at
 * the whole-matrix rate, ~400 GFLOP/s on the Zen 4 target). */
#ifndef MU__NS_BF16_NB
#define MU__NS_BF16_NB 192
#endif
#ifndef MU__NS_BF16_MB
#define MU__NS_BF16_MB 512
#endif
enum { NS_BF16_MIN = 128, NS_BF16_SPLIT = 128 * 256 };

void mu__ns_bf16_plan(mu__ns_plan *p)
{
    const int64_t n = p->n, m = p->m;
    p->tn = 1;
    p->nb = (int)n;
    p->tm = 1;
    p->mb = (int)m;
    if (n * m >= NS_BF16_SPLIT) {
        if (n >= 2 * NS_BF16_MIN) {
            int64_t t = (n + MU__NS_BF16_NB - 1) / MU__NS_BF16_NB, b = (n + t - 1) / t;
            b = (b + MU__NS_TILE_ALIGN - 1) / MU__NS_TILE_ALIGN * MU__NS_TILE_ALIGN;
            p->nb = (int)b;
            p->tn = (int)((n + b - 1) / b);
        }
        p->tm = mu__ns_split(m, MU__NS_BF16_MB, NS_BF16_MIN, &p->mb);
    }
    p->tiles[MU__NS_GRAM_A] = p->tiles[MU__NS_GRAM_B] = p->tn * (p->tn + 1) / 2;
    p->tiles[MU__NS_APPLY] = p->tm;
    p->nx = p->tiles[MU__NS_GRAM_A] + p->tiles[MU__NS_GRAM_B] + p->tm;
}

static inline float ns_bf(uint16_t h) { return mu__f32_from_bf16(h); }
static inline uint16_t ns_rb(float f) { return mu__bf16_from_f32(f); }
/* a bfloat16 scalar as torch makes it from a Python float */
static inline float ns_bfc(double v) { return ns_bf(mu__bf16_from_f64(v)); }
float mu__ns_bf16_coef(const mu_ns_opts *o, double v) { return o->coeffs_f32 ? (float)v : ns_bfc(v); }

/* The elementwise rows of the bfloat16 iteration, written once (NS_BF16_ROWS)
 * and compiled twice: for the build's baseline and, dispatched at run time,
 * for AVX-512 (vectorized); both compute the same roundings bit for bit.
 *   round: d = bf16(f)
 *   poly:  d = bf16(bf16(b' a) + bf16(c' bf16(f)))
 *   apply: x = bf16(bf16(a' x) + bf16(f)); with out, f = float32(x) too */
#define NS_BF16_ROWS(SFX, ATTR)                                                             \
    ATTR static void ns_row_round##SFX(uint16_t *restrict d, const float *restrict f,         \
                                       int64_t len)                                          \
    {                                                                                       \
        for (int64_t i = 0; i < len; i++) d[i] = ns_rb(f[i]);                                \
    }                                                                                       \
    ATTR static void ns_row_poly##SFX(uint16_t *restrict d, const uint16_t *restrict a,       \
                                      const float *restrict f, int64_t len, float bc, float cc) \
    {                                                                                       \
        for (int64_t i = 0; i < len; i++)                                                   \
            d[i] = ns_rb(ns_bf(ns_rb(bc * ns_bf(a[i]))) + ns_bf(ns_rb(cc * ns_bf(ns_rb(f[i]))))); \
    }                                                                                       \
    ATTR static void ns_row_apply##SFX(uint16_t *restrict x, float *restrict f, int64_t len,  \
                                       float ac, int out)                                    \
    {                                                                                       \
        if (!out)                                                                           \
            for (int64_t i = 0; i < len; i++)                                               \
                x[i] = ns_rb(ns_bf(ns_rb(ac * ns_bf(x[i]))) + ns_bf(ns_rb(f[i])));           \
        else                                                                                \
            for (int64_t i = 0; i < len; i++) {                                             \
                const uint16_t v = ns_rb(ns_bf(ns_rb(ac * ns_bf(x[i]))) + ns_bf(ns_rb(f[i]))); \
                x[i] = v;                                                                   \
                f[i] = ns_bf(v);                                                            \
            }                                                                               \
    }                                                                                       \
    ATTR static void ns_row_sumsq##SFX(double *restrict acc, const float *restrict x,         \
                                       int64_t len)                                          \
    {                                                                                       \
        for (int64_t i = 0; i + 8 <= len; i += 8)                                           \
            for (int k = 0; k < 8; k++) {                                                   \
                const double v = ns_bf(ns_rb(x[i + k]));                                     \
                acc[k] += v * v;                                                            \
            }                                                                               \
    }                                                                                       \
    ATTR static void ns_row_scale##SFX(uint16_t *restrict d, const float *restrict x,         \
                                       int64_t len, float s)                                 \
    {                                                                                       \
        for (int64_t i = 0; i < len; i++) d[i] = ns_rb(ns_bf(ns_rb(x[i])) / s);              \
    }

NS_BF16_ROWS(_base, )
#if defined(__x86_64__) && defined(__GNUC__)
#ifdef __clang__ /* (clang has no optimize attribute; it vectorizes these loops at -O2) */
#define NS_BF16_O3
#else
#define NS_BF16_O3 , optimize("O3")
#endif
NS_BF16_ROWS(_avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq") NS_BF16_O3)))
#define NS_ROW(name, ...)                                                                    \
    (__builtin_cpu_supports("avx512bw") ? ns_row_##name##_avx512(__VA_ARGS__)                \
                                        : ns_row_##name##_base(__VA_ARGS__))
#else
#define NS_ROW(name, ...) ns_row_##name##_base(__VA_ARGS__)
#endif

/* The buffers of a slot for the bfloat16 iteration: X (n x m bfloat16) in
 * x, the float32 products in a (n x n), A and B (bfloat16) in b. */
#define NS_BF16_BUFS(it, n)                                                                 \
    uint16_t *X = (uint16_t *)(it)->s->x;                                                   \
    float *F = (float *)(it)->s->a;                                                         \
    uint16_t *Ab = (uint16_t *)(it)->s->b, *Bb = Ab + (int64_t)(n) * (n)

double mu__ns_bf16_prescale(double norm)
{
    return norm <= 0x1p60 && norm >= 0x1p-60 ? 1.0 : ldexp(1.0, -ilogb(norm));
}

float mu__ns_bf16_divisor(const mu_ns_opts *o, double nrm, double c)
{
    const float nb = ns_bf(ns_rb((float)nrm));
    return ns_bf(ns_rb((float)(o->norm_scale * nb) + ns_bfc(c * o->eps)));
}

/* Prologue (bfloat16), the seed's normalization of its bfloat16 input:
 * x0 = bf16(x), d = bf16(norm_scale bf16(||x0||_F) + bf16(eps)) and
 * X = bf16(x0 / d) (the division in float32), transposed when tall; with 0
 * steps that is the output (as float32). At scales where the seed's
 * bfloat16 values would overflow (||x|| beyond bfloat16's range: it would
 * give zeros) or lose their bits (tiny x), the same formula runs on c x
 * with c eps, c a power of two bringing ||c x|| near 1: the seed's result,
 * scaled (rounding commutes with c); norm is ||x||_F, in double. */
void mu__ns_bf16_begin(mu__ns_iter *it, const char *src, double norm)
{
    const mu__ns_job *job = it->job;
    const mu__ns_plan *p = &job->plan;
    const mu_ns_opts *o = job->opts;
    const float *x = (const float *)src;
    float *out = (float *)it->dst;
    const int64_t n = p->n, m = p->m, len = n * m;
    const double c = mu__ns_bf16_prescale(norm);
    if (c != 1.0) { /* c x into the output (free until the end) */
        for (int64_t i = 0; i < len; i++) out[i] = (float)(c * x[i]);
        x = out;
    }
    double acc[8] = {0}, ss = 0.0;
    NS_ROW(sumsq, acc, x, len); /* 8 running sums of the groups of 8 */
    for (int64_t i8 = len / 8 * 8; i8 < len; i8++) ss += (double)ns_bf(ns_rb(x[i8])) * ns_bf(ns_rb(x[i8]));
    for (int k = 0; k < 8; k++) ss += acc[k];
    const float d = mu__ns_bf16_divisor(o, sqrt(ss), c);
    if (job->opts->steps == 0) {
        for (int64_t i = 0; i < len; i++) out[i] = ns_bf(ns_rb(ns_bf(ns_rb(x[i])) / d));
        return;
    }
    uint16_t *X = (uint16_t *)it->s->x;
    if (!p->tall) {
        NS_ROW(scale, X, x, len, d);
    } else { /* x is m x n: X[i][j] = x[j][i] */
        MU__NS_BLOCKED(n, 0, m, X[i * m + j] = ns_rb(ns_bf(ns_rb(x[j * n + i])) / d));
    }
    it->done = 0;
}

/* Mirror block rectangle rc of the n x n bfloat16 matrix M: (c, r) = (r, c)
 * for its positions above the diagonal (c > r). A plain copy: 8 x 8
 * squares wholly above the diagonal by an SSE2 transpose, the rest (the
 * diagonal's squares and ragged edges) element by element. */
void mu__ns_bf16_mirror(uint16_t *M, int64_t n, const mu__ns_rect *rc)
{
    for (int64_t c0 = rc->c0; c0 < rc->c1; c0 += 8)
        for (int64_t r0 = rc->r0; r0 < rc->r1 && r0 < c0 + 8; r0 += 8) {
            const int64_t c1 = c0 + 8 < rc->c1 ? c0 + 8 : rc->c1;
            const int64_t r1 = r0 + 8 < rc->r1 ? r0 + 8 : rc->r1;
#if defined(__SSE2__)
            if (c1 - c0 == 8 && r1 - r0 == 8 && r0 + 8 <= c0) {
                const uint16_t *q = M + r0 * n + c0;
                uint16_t *o = M + c0 * n + r0;
#define NS_LD(i) _mm_loadu_si128((const __m128i *)(q + (i) * n))
                const __m128i a0 = _mm_unpacklo_epi16(NS_LD(0), NS_LD(1));
                const __m128i a1 = _mm_unpackhi_epi16(NS_LD(0), NS_LD(1));
                const __m128i a2 = _mm_unpacklo_epi16(NS_LD(2), NS_LD(3));
                const __m128i a3 = _mm_unpackhi_epi16(NS_LD(2), NS_LD(3));
                const __m128i a4 = _mm_unpacklo_epi16(NS_LD(4), NS_LD(5));
                const __m128i a5 = _mm_unpackhi_epi16(NS_LD(4), NS_LD(5));
                const __m128i a6 = _mm_unpacklo_epi16(NS_LD(6), NS_LD(7));
                const __m128i a7 = _mm_unpackhi_epi16(NS_LD(6), NS_LD(7));
#undef NS_LD
                const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
                const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
                const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
                const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
#define NS_ST(i, v) _mm_storeu_si128((__m128i *)(o + (i) * n), v)
                NS_ST(0, _mm_unpacklo_epi64(b0, b4));
                NS_ST(1, _mm_unpackhi_epi64(b0, b4));
                NS_ST(2, _mm_unpacklo_epi64(b1, b5));
                NS_ST(3, _mm_unpackhi_epi64(b1, b5));
                NS_ST(4, _mm_unpacklo_epi64(b2, b6));
                NS_ST(5, _mm_unpackhi_epi64(b2, b6));
                NS_ST(6, _mm_unpacklo_epi64(b3, b7));
                NS_ST(7, _mm_unpackhi_epi64(b3, b7));
#undef NS_ST
                continue;
            }
#endif
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1 && r < c; r++) M[c * n + r] = M[r * n + c];
        }
}

/* Write v at (r, c) of an n x n matrix and at its mirror (c, r), for the
 * positions of block rectangle r (c >= r on a diagonal block). */
#define NS_BF16_SYM(M, n, rc, ROW)                                                           \
    for (int64_t r = (rc).r0; r < (rc).r1; r++) {                                            \
        const int64_t cs = (rc).c0 > r ? (rc).c0 : r, at = r * (n) + cs, len = (rc).c1 - cs; \
        if (len > 0) ROW;                                                                    \
    }                                                                                        \
    mu__ns_bf16_mirror(M, n, &(rc))

/* The oneDNN product of tile t of stage `stage` (MU__NS_GRAM_A, MU__NS_GRAM_B or
 * MU__NS_APPLY) of the bfloat16 plan: its sizes and strides (ns_bf16_tile
 * adds the pointers). */
void mu__ns_bf16_shape(const mu__ns_plan *p, int stage, int t, mu__dnnl_shape *s)
{
    const int64_t n = p->n, m = p->m;
    if (stage == MU__NS_APPLY) {
        const int64_t j0 = (int64_t)t * p->mb, nj = j0 + p->mb < m ? p->mb : m - j0;
        *s = (mu__dnnl_shape){.M = n, .N = nj, .K = n, .lda = n, .ldb = m,
                              .ldc = p->tall ? nj : m, .transb = 0};
        return;
    }
    mu__ns_rect rr;
    mu__ns_tri_rect(p, t, &rr);
    const int64_t kk = stage == MU__NS_GRAM_A ? m : n;
    *s = (mu__dnnl_shape){.M = rr.r1 - rr.r0, .N = rr.c1 - rr.c0, .K = kk, .lda = kk, .ldb = kk,
                          .ldc = n, .transb = 1};
}

/* Tile t of stage `stage` of step k (bfloat16; see ns_bf16_plan), on worker w. */
void mu__ns_bf16_tile(const mu__ns_iter *it, int k, int stage, int t, int w)
{
    const mu__ns_job *job = it->job;
    const mu__ns_plan *p = &job->plan;
    const int64_t n = p->n, m = p->m;
    const double *co = job->opts->coeffs + 3 * k;
    NS_BF16_BUFS(it, n);
    mu__dnnl_shape sh;
    mu__ns_bf16_shape(p, stage, t, &sh);
    mu__ns_rect rr;
    if (stage == MU__NS_GRAM_A || stage == MU__NS_GRAM_B) {
        mu__ns_tri_rect(p, t, &rr);
        const uint16_t *P = stage == MU__NS_GRAM_A ? X : Ab;
        const int64_t kk = sh.K;
        float *c = F + (int64_t)rr.r0 * n + rr.c0;
        const float bc = mu__ns_bf16_coef(job->opts, co[1]), cc = mu__ns_bf16_coef(job->opts, co[2]);
        if (stage == MU__NS_GRAM_A || cc != 0.0f) /* (c = 0: B = bf16(b' A), no A A) */
            mu__dnnl_gemm(job->dnnl, w, &sh, P + (int64_t)rr.r0 * kk, P + (int64_t)rr.c0 * kk, c);
        if (stage == MU__NS_GRAM_A) {
            NS_BF16_SYM(Ab, n, rr, NS_ROW(round, Ab + at, F + at, len));
        } else if (cc != 0.0f) {
            NS_BF16_SYM(Bb, n, rr, NS_ROW(poly, Bb + at, Ab + at, F + at, len, bc, cc));
        } else {
            NS_BF16_SYM(Bb, n, rr, for (int64_t i = 0; i < len; i++) Bb[at + i] = ns_rb(bc * ns_bf(Ab[at + i])));
        }
        return;
    }
    /* MU__NS_APPLY: X[:, j0:j1] = a' X + B X into float32 scratch C in the
     * output: its columns j0:j1 (ld m), or when tall its rows j0:j1 (the
     * same columns of X, transposed: compact n x nj). */
    const int64_t j0 = (int64_t)t * p->mb, nj = sh.N, ldc = sh.ldc;
    float *out = (float *)it->dst;
    float *C = p->tall ? out + j0 * n : out + j0;
    mu__dnnl_gemm(job->dnnl, w, &sh, Bb, X + j0, C);
    const float ac = mu__ns_bf16_coef(job->opts, co[0]);
    const int last = k == job->opts->steps - 1;
    for (int64_t i = 0; i < n; i++)
        NS_ROW(apply, X + i * m + j0, C + i * ldc, nj, ac, last && !p->tall);
    if (last && p->tall) /* out rows j0:j1 = X[:, j0:j1]^T */
        MU__NS_BLOCKED(n, 0, nj, C[j * n + i] = ns_bf(X[i * m + j0 + j]));
}

int mu__ns_bf16_want(const mu__ns_plan *p, mu__dnnl *d)
{
    static const int stages[] = {MU__NS_GRAM_A, MU__NS_GRAM_B, MU__NS_APPLY};
    int rc = MU_OK;
    for (int k = 0; rc == MU_OK && k < 3; k++)
        for (int t = 0; rc == MU_OK && t < p->tiles[stages[k]]; t++) {
            mu__dnnl_shape sh;
            mu__ns_bf16_shape(p, stages[k], t, &sh);
            rc = mu__dnnl_want(d, &sh);
        }
    return rc;
}

double mu__ns_bf16_flops(const mu__ns_plan *p, const mu_ns_opts *o)
{
    static const int stages[] = {MU__NS_GRAM_A, MU__NS_GRAM_B, MU__NS_APPLY};
    double per[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++)
        for (int t = 0; t < p->tiles[stages[k]]; t++) {
            mu__dnnl_shape sh;
            mu__ns_bf16_shape(p, stages[k], t, &sh);
            per[k] += 2.0 * (double)sh.M * (double)sh.N * (double)sh.K;
        }
    double f = 0;
    for (int k = 0; k < o->steps; k++) f += per[0] + (mu__ns_bf16_coef(o, o->coeffs[3 * k + 2]) != 0.0f) * per[1] + per[2];
    return f;
}

void mu__ns_bf16_round(uint16_t *d, const float *f, int64_t len) { NS_ROW(round, d, f, len); }

void mu__ns_bf16_poly(uint16_t *d, const uint16_t *a, const float *f, int64_t len, float bc, float cc)
{
    NS_ROW(poly, d, a, f, len, bc, cc);
}

void mu__ns_bf16_apply(uint16_t *x, float *f, int64_t len, float ac, int out)
{
    NS_ROW(apply, x, f, len, ac, out);
}

void mu__ns_bf16_scale(uint16_t *d, const float *x, int64_t len, float s) { NS_ROW(scale, d, x, len, s); }
