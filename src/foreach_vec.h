/*
 * The vector layer of the foreach kernels: for one instruction set (FE_ISA:
 * FE_PORTABLE, FE_AVX2, FE_AVX512) and one dtype (FE_F64 0 or 1; FE_BF16 1:
 * float32 with bfloat16 state), the
 * macros src/foreach_generic.h is written in; then that file, then every
 * macro undefined again. Included by src/foreach_types.h.
 *
 * The portable variant is plain C on one element (fmaf/fma from libm); the
 * vector variants use the same IEEE operations lane by lane (the same
 * intrinsic names at two widths), so every variant gives the same bits.
 */
#define FE_CAT_(a, b, c, d) a##b##c##d
#define FE_CAT(a, b, c, d) FE_CAT_(a, b, c, d)

#define R(name) FE_CAT(name##_, FE_T, _, FE_ISANAME)

#if FE_F64
#define real double
#define FE_T f64
#define FE_PS pd     /* intrinsic suffix */
#define FE_VSFX d    /* __m256d */
#define FE_EPI epi64 /* lanes as integers */
#define FE_EXP 0x7ff0000000000000LL /* exponent bits: all ones <=> NaN or Inf */
#define FE_SET1_256 _mm256_set1_epi64x
#define FE_SET1_512 _mm512_set1_epi64
#define FE_M(fn) fn
#else
#define real float
#if FE_BF16
#define FE_T f32_bf16
#else
#define FE_T f32
#endif
#define FE_PS ps
#define FE_VSFX
#define FE_EPI epi32
#define FE_EXP 0x7f800000
#define FE_SET1_256 _mm256_set1_epi32
#define FE_SET1_512 _mm512_set1_epi32
#define FE_M(fn) fn##f
#endif

#if FE_ISA == FE_PORTABLE
#define FE_ISANAME portable
#define KATTR
#define W 1
#define vec real
#define VLD(q) (*(q))
#define VST(q, x) (*(q) = (x))
#define VSET(x) (x)
#define VADD(x, y) ((x) + (y))
#define VSUB(x, y) ((x) - (y))
#define VMUL(x, y) ((x) * (y))
#define VDIV(x, y) ((x) / (y))
#define VSQRT(x) FE_M(sqrt)(x)
#define VFMA(x, y, z) FE_M(fma)(x, y, z)
#define VSEL_LT(a, b, x, y) ((a) < (b) ? (x) : (y))
#define facc int
#define FACC0 0
#define FACC_ADD(acc, x) ((acc) | !isfinite(x))
#define FACC_ANY(acc) (acc)
#if FE_BF16
#define SLD(q) mu__f32_from_bf16(*(q))
#define SST(q, x) (*(q) = mu__bf16_from_f32(x))
#define SST_FIN(q, x, acc) (SST(q, x), FACC_ADD(acc, mu__f32_from_bf16(*(q))))
#endif
#else
#if FE_ISA == FE_AVX2
#define FE_ISANAME avx2
#define KATTR __attribute__((target("avx2,fma")))
#define FE_MM _mm256_
#define FE_BITS 256
#define VSEL_LT(a, b, x, y) VOP(blendv_)(y, x, VOP(cmp_)(a, b, _CMP_LT_OQ))
#define facc __m256i
#define FACC0 _mm256_setzero_si256()
#define FACC_ANY(acc) (!_mm256_testz_si256(acc, acc))
#define FE_LD16(q) _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(q)))
#define FE_ST16(q, r)                                                                              \
    _mm_storeu_si128((__m128i *)(q),                                                               \
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)))
#define FE_NAN16(r, x)                                                                             \
    _mm256_blendv_epi8(r, _mm256_set1_epi32(0xffff), _mm256_castps_si256(VOP(cmp_)(x, x, _CMP_UNORD_Q)))
#define FE_EXPV FE_SET1_256(FE_EXP)
#define FACC_ADD(acc, x)                                                                           \
    _mm256_or_si256(acc, FE_CAT(_mm256_cmpeq_, FE_EPI, , )(                                        \
                             _mm256_and_si256(FE_CAT(_mm256_cast, FE_PS, _si256, )(x), FE_EXPV),   \
                             FE_EXPV))
#else
#define FE_ISANAME avx512
#define KATTR __attribute__((target("avx512f,avx2,fma")))
#define FE_MM _mm512_
#define FE_BITS 512
#define VSEL_LT(a, b, x, y)                                                                        \
    VOP(mask_blend_)(FE_CAT(_mm512_cmp_, FE_PS, _mask, )(a, b, _CMP_LT_OQ), y, x)
#define facc unsigned
#define FACC0 0u
#define FACC_ANY(acc) ((acc) != 0)
#define FE_LD16(q) _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(q)))
#define FE_ST16(q, r) _mm256_storeu_si256((__m256i *)(q), _mm512_cvtepi32_epi16(r))
#define FE_NAN16(r, x)                                                                             \
    _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, _mm512_set1_epi32(0xffff))
#define FE_EXPV FE_SET1_512(FE_EXP)
#define FACC_ADD(acc, x)                                                                           \
    ((acc) | FE_CAT(_mm512_cmpeq_, FE_EPI, _mask, )(                                               \
                 _mm512_and_si512(FE_CAT(_mm512_cast, FE_PS, _si512, )(x), FE_EXPV), FE_EXPV))
#endif
/* FE_MM op FE_PS: e.g. _mm256_add_ps, _mm512_fmadd_pd */
#define VOP(op) FE_CAT(FE_MM, op, FE_PS, )
#define W ((int)(FE_BITS / 8 / sizeof(real)))
#define vec FE_CAT(__m, FE_BITS, FE_VSFX, )
#define VLD(q) VOP(loadu_)(q)
#define VST(q, x) VOP(storeu_)(q, x)
#define VSET(x) VOP(set1_)(x)
#define VADD(x, y) VOP(add_)(x, y)
#define VSUB(x, y) VOP(sub_)(x, y)
#define VMUL(x, y) VOP(mul_)(x, y)
#define VDIV(x, y) VOP(div_)(x, y)
#define VSQRT(x) VOP(sqrt_)(x)
#define VFMA(x, y, z) VOP(fmadd_)(x, y, z)
#if FE_BF16
/* bfloat16 state: widened exactly (the upper half of a float32), rounded to
 * nearest even with NaN to 0xffff, as mu__bf16_from_f32, lane by lane. */
#define FE_I(op) FE_CAT(FE_MM, op, , )
#define SLD(q) FE_CAT(FE_MM, castsi, FE_BITS, _ps)(FE_I(slli_epi32)(FE_LD16(q), 16))
#define SST(q, x) FE_ST16(q, R(bf16_round)(x))
#define SST_FIN(q, x, acc) R(bf16_store_fin)(q, x, acc)
#define FE_IVEC FE_CAT(__m, FE_BITS, i, )
static inline KATTR FE_IVEC R(bf16_round)(vec x)
{
    const FE_IVEC u = FE_CAT(FE_MM, castps_si, FE_BITS, )(x);
    const FE_IVEC lsb = FE_CAT(FE_MM, and_si, FE_BITS, )(FE_I(srli_epi32)(u, 16), FE_I(set1_epi32)(1));
    const FE_IVEC r = FE_I(srli_epi32)(FE_I(add_epi32)(u, FE_I(add_epi32)(lsb, FE_I(set1_epi32)(0x7fff))), 16);
    return FE_NAN16(r, x);
}
/* SST, and acc with the stored (rounded) values' non-finite flags added. */
static inline KATTR facc R(bf16_store_fin)(uint16_t *q, vec x, facc acc)
{
    const FE_IVEC r = R(bf16_round)(x);
    FE_ST16(q, r);
    return FACC_ADD(acc, FE_CAT(FE_MM, castsi, FE_BITS, _ps)(FE_I(slli_epi32)(r, 16)));
}
#endif
#endif
#if FE_BF16
#define state_t uint16_t
#else
#define state_t real
#define SLD VLD
#define SST VST
#define SST_FIN(q, x, acc) (VST(q, x), FACC_ADD(acc, x))
#endif


#include "foreach_generic.h"

#undef FE_CAT_
#undef FE_CAT
#undef real
#undef FE_T
#undef FE_PS
#undef FE_VSFX
#undef FE_EPI
#undef FE_EXP
#undef FE_SET1_256
#undef FE_SET1_512
#undef FE_M
#undef FE_ISANAME
#undef KATTR
#undef FE_MM
#undef FE_BITS
#undef FE_EXPV
#undef W
#undef vec
#undef VOP
#undef VLD
#undef VST
#undef VSET
#undef VADD
#undef VSUB
#undef VMUL
#undef VDIV
#undef VSQRT
#undef VFMA
#undef VSEL_LT
#undef facc
#undef FACC0
#undef FACC_ADD
#undef FACC_ANY
#undef R
#undef FE_LD16
#undef FE_ST16
#undef FE_NAN16
#undef FE_I
#undef FE_IVEC
#undef SLD
#undef SST
#undef SST_FIN
#undef state_t
