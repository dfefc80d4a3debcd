// AVX-512 element and scale encoders of the hand-vectorised CPU quantizers: 16 lanes at a time,
// each lane equal bit for bit to the scalar codecs of core/element_codec.hpp and the scale
// formulas of core/scale_math.hpp (tests/cpp/quantize_test.cpp runs both kernel sets against the
// reference on random, special and boundary inputs).
#pragma once

#include "cpu/avx512.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

#include <cfloat>

#include "core/element_codec.hpp"
#include "core/scale_math.hpp"
#include "cpu/mx16_form.hpp"

namespace microscale::cpu::avx512 {

/// |x| bits `a` with the format's mantissa rounded to nearest even in bits kShift and up (the bits
/// below are left over): the normal code plus Codec::kRebias is this >> kShift.
template <typename Codec>
MICROSCALE_AVX512_INLINE __m512i round_mantissa_bits(__m512i a) {
  constexpr int kShift = Codec::kShift;
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, kShift), _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (kShift - 1)) - 1)), lsb);
}

/// The magnitude code of |x| bits `a` (no NaN; Inf saturates): round the mantissa to the format's
/// width (ties to even) and rebias in the normal range, an fp32 add onto the subnormal grid below
/// it, clamped to the max code.
template <typename Codec>
MICROSCALE_AVX512_INLINE __m512i magnitude_code_rn(__m512i a) {
  constexpr int kShift = Codec::kShift;
  const __m512i biased = round_mantissa_bits<Codec>(a);
  const __m512i normal =
      _mm512_sub_epi32(_mm512_srli_epi32(biased, kShift), _mm512_set1_epi32(Codec::kRebias));
  const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(Codec::kMagicBits)));
  const __m512i subnormal =
      _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), magic)),
                       _mm512_set1_epi32(static_cast<int>(Codec::kMagicBits)));
  const __mmask16 is_subnormal = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(Codec::kMinNormalBits));
  return _mm512_min_epu32(_mm512_mask_blend_epi32(is_subnormal, normal, subnormal),
                          _mm512_set1_epi32(Codec::kMaxCode));
}

/// ElementCodec<...>::encode_rn on 16 lanes: the code of each lane in the low bits of an int32.
/// The same steps as the scalar form, each select a mask blend.
template <typename Codec>
MICROSCALE_AVX512_INLINE __m512i encode_rn(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  __m512i code = magnitude_code_rn<Codec>(a);
  const __m512i inf = _mm512_set1_epi32(0x7F800000);
  if constexpr (Codec::kInfCode != Codec::kMaxCode) {
    code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(a, inf), _mm512_set1_epi32(Codec::kInfCode));
  }
  // Sign: bit 31 moved down to the format's sign bit.
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 32 - Codec::kWidth),
                                        _mm512_set1_epi32(static_cast<int>(Codec::kSignBit)));
  const __m512i with_sign = _mm512_or_si512(code, sign);
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(a, inf);
  if constexpr (Codec::kSpecialValues == Specials::None) {  // no NaN code: +max, whatever the sign
    return _mm512_mask_mov_epi32(with_sign, is_nan, _mm512_set1_epi32(Codec::kMaxCode));
  } else {  // NaN keeps its sign: all-ones magnitude
    return _mm512_mask_or_epi32(with_sign, is_nan, sign, _mm512_set1_epi32(Codec::kSignBit - 1));
  }
}

/// NVFP4's E2M1 magnitudes as table indices (see nvfp4_e2m1_table). With a = min(|s|, 6), the
/// fp32 add a + M rounds a to the E2M1 grid of its binade (ties to even, as encode_rn), M taken by
/// the low 4 bits of a's exponent field:
///   a in [1, 2) and below (exponent 127, ...):  M = 2^22       (step 1/2): low 4 bits 2a (0..4)
///   a in [2, 4) (exponent 128):                 M = 2^23 + 6   (step 1):   6 + a (8..10)
///   a in [4, 6] (exponent 129):                 M = 2^24 + 24  (step 2):   12 + a/2 (14, 15)
/// Each offset is even in its step, so the sum's last bit keeps the parity that the tie rule needs.
/// Below 2^-13 an exponent can share those low bits (112, 113, 96, ...); such an a vanishes in the
/// sum (index 6 or 12), which maps to code 0 like every a below 1/4. Four operations.
/// kNanFree: s holds no NaN, and |s| clamped to 6 is one vrangeps (it would keep a signalling NaN);
/// otherwise a NaN lane reads as 6 (code 7, as the scalar codec: E2M1 has no NaN).
/// kBounded: s holds no NaN and |s| < 7 (a block whose amax times its encode scale is below 7):
/// a = s, neither clamped nor made positive, three operations. A negative a subtracts its
/// magnitude from M, so M's offsets are chosen for both signs to land on distinct 5-bit indices
/// of one 32-entry table (nvfp4_e2m1_codes<true>), and large enough that M - |a| stays in M's
/// binade (step and parity unchanged): M = 2^22 + 2 (index 4 -+ 2|a|), 2^23 + 14 (14 -+ |a|),
/// 2^24 + 44 (22 -+ |a| / 2). A search over all even offsets found these (there is none for a
/// 16-entry table). |a| >= 7 would round onto an index of the next step.
template <bool kNanFree, bool kBounded = false>
MICROSCALE_AVX512_INLINE __m512i nvfp4_e2m1_index(__m512 s) {
  static_assert(kNanFree || !kBounded);
  const __m512 six = _mm512_set1_ps(6.0f);
  // NOTE: min_ps returns its second operand for a NaN first one.
  const __m512 a = kBounded   ? s
                   : kNanFree ? _mm512_range_ps(s, six, 0x0A)
                              : _mm512_min_ps(_mm512_abs_ps(s), six);
  constexpr float k1 = kBounded ? 0x1p22f + 2.0f : 0x1p22f;
  constexpr float k2 = kBounded ? 0x1p23f + 14.0f : 0x1p23f + 6.0f;
  constexpr float k4 = kBounded ? 0x1p24f + 44.0f : 0x1p24f + 24.0f;
  // M by exponent % 16 (a sign bit lands on bit 8 of the index, which the permute ignores).
  const __m512 m =
      _mm512_permutexvar_ps(_mm512_srli_epi32(_mm512_castps_si512(a), 23),
                            _mm512_setr_ps(k2, k4, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1, k1));
  return _mm512_castps_si512(_mm512_add_ps(a, m));
}

/// The E2M1 code of each nvfp4_e2m1_index value (low 4 bits), shifted left by `shift` bits (so
/// that codes land in their nibble of a packed output word).
MICROSCALE_AVX512_INLINE __m512i nvfp4_e2m1_table(int shift) {
  return _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 0, 0, 0, 4, 5, 6, 0, 0, 0, 6, 7), shift);
}

/// The magnitude codes of nvfp4_e2m1_index<true, true> values (low 5 bits): entries 0-15 and 16-31,
/// shifted left by `shift` bits.
MICROSCALE_AVX512_INLINE __m512i nvfp4_e2m1_bounded_table_low(int shift) {
  return _mm512_slli_epi32(_mm512_setr_epi32(4, 3, 2, 1, 0, 1, 2, 3, 4, 0, 6, 5, 4, 0, 0, 0), shift);
}
MICROSCALE_AVX512_INLINE __m512i nvfp4_e2m1_bounded_table_high(int shift) {
  return _mm512_slli_epi32(_mm512_setr_epi32(4, 5, 6, 7, 6, 0, 0, 0, 6, 7, 0, 0, 0, 0, 0, 0), shift);
}

/// Lanes below zero: an ordered compare, false for NaN and for -0 (which stay unsigned).
MICROSCALE_AVX512_INLINE __mmask16 is_negative(__m512 v) {
  return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
}

/// The codes of nvfp4_e2m1_index values (kBounded: of nvfp4_e2m1_index<true, true> values) shifted
/// left by `shift`, the sign bit set where `negative`.
template <bool kBounded = false>
MICROSCALE_AVX512_INLINE __m512i nvfp4_e2m1_codes(__m512i index, __mmask16 negative, int shift) {
  const __m512i code = kBounded ? _mm512_permutex2var_epi32(nvfp4_e2m1_bounded_table_low(shift), index,
                                                            nvfp4_e2m1_bounded_table_high(shift))
                                : _mm512_permutexvar_epi32(index, nvfp4_e2m1_table(shift));
  return _mm512_mask_or_epi32(code, negative, code, _mm512_set1_epi32(0x8 << shift));
}

/// NVFP4's element encoder: E2M1Codec::encode_rn(s), except that any zero (also -0) gives code 0
/// (TE's reference).
MICROSCALE_AVX512_INLINE __m512i nvfp4_encode_e2m1(__m512 s) {
  return nvfp4_e2m1_codes(nvfp4_e2m1_index<false>(s), is_negative(s), 0);
}

/// A direction's NVFP4 block encode scale of every E4M3 scale code:
/// nvfp4_block_encode_scale(e4m3_code_value(code), S_dec) for codes 0x00..0x7E (0x7F, NaN, is
/// never a block scale). Looked up instead of divided per block: a 512-bit division costs about
/// as much as the rest of the scale chain, and the element encoding waits on it.
///
/// A normal code (0x08..0x7E) 16 above another has a block scale 4 times larger, so (powers of two
/// passing through both roundings) an encode scale 4 times smaller: a bit pattern 1 << 24 lower,
/// unless one of the two is subnormal, infinite or clamped to FLT_MAX. So each normal code's encode
/// scale is one of 16 base patterns (normal_base, by the low 4 bits of t = code + kRebias) less
/// (t >> 4) << 24; nvfp4_block_scales computes it so where `normal_exact`, checked on every code.
struct Nvfp4EncodeScaleTable {
  alignas(64) float value[128];
  alignas(64) uint32_t normal_base[16];
  bool normal_exact;
};

inline Nvfp4EncodeScaleTable nvfp4_encode_scale_table(float s_dec) {
  Nvfp4EncodeScaleTable t;
  for (uint32_t code = 0; code < 128; ++code)
    t.value[code] = nvfp4_block_encode_scale(e4m3_code_value(code < 0x7F ? code : 0x7E), s_dec);
  constexpr uint32_t kFirstNormal = 0x08, kLastCode = 0x7E;
  for (uint32_t code = kFirstNormal; code < kFirstNormal + 16; ++code) {
    const uint32_t biased_t = code + E4M3Codec::kRebias;
    t.normal_base[biased_t % 16] = float_bits(t.value[code]) + ((biased_t >> 4) << 24);
  }
  t.normal_exact = true;
  for (uint32_t code = kFirstNormal; code <= kLastCode; ++code) {
    const uint32_t biased_t = code + E4M3Codec::kRebias;
    t.normal_exact =
        t.normal_exact && t.normal_base[biased_t % 16] - ((biased_t >> 4) << 24) == float_bits(t.value[code]);
  }
  return t;
}

/// NVFP4 block scales of 16 blocks from their amaxes (as |x| bits, NaN-free): the E4M3 scale codes
/// and the fp32 encode scales, as the scalar chain of quantize_nvfp4.cpp. `multiplier` is
/// nvfp4_block_scale_multiplier (finite, > 0), `table` the direction's encode scales.
/// Where every code is normal (the usual case: a block amax above 2^-6 / 448 of the tensor's), the
/// code is rounded as magnitude_code_rn's normal branch, from the product clamped to 448 (the
/// saturated code, as the scalar chain's RN then clamp), and the encode scale is a normal_base
/// pattern less k << 24: twelve operations instead of twenty-one.
MICROSCALE_AVX512_INLINE __m512 nvfp4_block_scales(__m512i amax_bits, float multiplier,
                                                   const Nvfp4EncodeScaleTable& table, __m512i* scale_codes) {
  // NOTE: the product is >= 0 and not NaN. The scalar chain clamps it to FLT_MAX first; an +Inf
  // product saturates to the same code 0x7E here.
  const __m512 product = _mm512_mul_ps(_mm512_castsi512_ps(amax_bits), _mm512_set1_ps(multiplier));
  if (table.normal_exact &&
      _mm512_cmp_ps_mask(product, _mm512_set1_ps(0x1p-6f), _CMP_GE_OQ) == __mmask16{0xFFFF}) {
    const __m512i biased =
        round_mantissa_bits<E4M3Codec>(_mm512_castps_si512(_mm512_min_ps(product, _mm512_set1_ps(448.0f))));
    const __m512i biased_t = _mm512_srli_epi32(biased, E4M3Codec::kShift);  // code + kRebias
    *scale_codes = _mm512_sub_epi32(biased_t, _mm512_set1_epi32(E4M3Codec::kRebias));
    const __m512i base = _mm512_permutexvar_epi32(biased_t, _mm512_load_si512(table.normal_base));
    // (biased_t >> 4) << 24, as biased's bits 24-30
    return _mm512_castsi512_ps(
        _mm512_sub_epi32(base, _mm512_and_si512(biased, _mm512_set1_epi32(0x7F000000))));
  }
  const __m512i code = magnitude_code_rn<E4M3Codec>(_mm512_castps_si512(product));
  *scale_codes = code;
  // 128 entries: four 32-entry two-register permutes, then code bits 5 and 6 pick among them.
  const float* v = table.value;
  const __mmask16 bit5 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(32));
  const __m512 low =
      _mm512_mask_blend_ps(bit5, _mm512_permutex2var_ps(_mm512_load_ps(v), code, _mm512_load_ps(v + 16)),
                           _mm512_permutex2var_ps(_mm512_load_ps(v + 32), code, _mm512_load_ps(v + 48)));
  const __m512 high =
      _mm512_mask_blend_ps(bit5, _mm512_permutex2var_ps(_mm512_load_ps(v + 64), code, _mm512_load_ps(v + 80)),
                           _mm512_permutex2var_ps(_mm512_load_ps(v + 96), code, _mm512_load_ps(v + 112)));
  return _mm512_mask_blend_ps(_mm512_test_epi32_mask(code, _mm512_set1_epi32(64)), low, high);
}

/// mx_scale_byte on 16 lanes: amax given as |x| bits (NaN patterns when a block holds NaN).
template <MxScaleRule kRule>
MICROSCALE_AVX512_INLINE __m512i mx_scale_bytes(__m512i amax_bits, int emax, int mantissa_bits,
                                                float max_normal) {
  const __m512i inf = _mm512_set1_epi32(0x7F800000);
  const __m512i ff = _mm512_set1_epi32(0xFF);
  if constexpr (kRule == MxScaleRule::RCeil) {
    const __m512 d = _mm512_mul_ps(_mm512_castsi512_ps(amax_bits), _mm512_set1_ps(1.0f / max_normal));
    const __m512i u = _mm512_castps_si512(d);
    const __m512i exponent = _mm512_and_si512(_mm512_srli_epi32(u, 23), ff);
    const __m512i mantissa = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFF));
    // exponent + (mantissa != 0); 254 + 1 gives 255 (NaN) as the scalar form.
    __m512i byte = _mm512_mask_add_epi32(exponent, _mm512_test_epi32_mask(mantissa, mantissa), exponent,
                                         _mm512_set1_epi32(1));
    const __m512i sub = _mm512_maskz_mov_epi32(_mm512_cmpgt_epu32_mask(mantissa, _mm512_set1_epi32(0x400000)),
                                               _mm512_set1_epi32(1));
    byte = _mm512_mask_mov_epi32(byte, _mm512_cmpeq_epi32_mask(exponent, _mm512_setzero_si512()), sub);
    return _mm512_mask_mov_epi32(byte, _mm512_cmpeq_epi32_mask(exponent, ff), ff);
  } else {
    __m512i u = amax_bits;
    if constexpr (kRule == MxScaleRule::Even)
      u = _mm512_add_epi32(u, _mm512_set1_epi32(1 << (22 - mantissa_bits)));
    // NOTE: Even's add can only raise u, so one test after it also catches Inf/NaN amaxes.
    const __mmask16 special = _mm512_cmpge_epu32_mask(u, inf);
    __m512i unbiased = _mm512_sub_epi32(_mm512_srli_epi32(u, 23), _mm512_set1_epi32(127 + emax));
    if constexpr (kRule == MxScaleRule::Ceil) {
      const __m512i mantissa = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFF));
      unbiased = _mm512_mask_add_epi32(unbiased, _mm512_test_epi32_mask(mantissa, mantissa), unbiased,
                                       _mm512_set1_epi32(1));
    }
    unbiased = _mm512_min_epi32(_mm512_max_epi32(unbiased, _mm512_set1_epi32(-127)), _mm512_set1_epi32(128));
    const __m512i byte = _mm512_add_epi32(unbiased, _mm512_set1_epi32(127));
    return _mm512_mask_mov_epi32(byte, special, ff);
  }
}

/// mx_inverse_scale on 16 lanes.
MICROSCALE_AVX512_INLINE __m512 mx_inverse_scales(__m512i byte) {
  __m512i v = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), byte), 23);
  v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(byte, _mm512_set1_epi32(0xFE)),
                            _mm512_set1_epi32(0x00400000));  // 2^-127, an fp32 subnormal
  v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(byte, _mm512_set1_epi32(0xFF)),
                            _mm512_set1_epi32(0x7FC00000));  // NaN
  return _mm512_castsi512_ps(v);
}

// ---- MX element codes of 16-bit inputs (bf16 or f16) on 32 lanes of 16 bits, without widening
// to fp32: the 16-bit form of mx16_form.hpp (its constants: Mx16Format). Lanes outside the normal
// form take mx_bf16_codes or mx_f16_codes (bf16 from S = B on, see mx_bf16_codes). ----

/// code | (x >> kSignShift & sign bit): the sign of each 16-bit lane of `x_shifted` on its code.
template <typename Codec>
MICROSCALE_AVX512_INLINE __m512i with_input_sign(__m512i code, __m512i x_shifted) {
  return _mm512_ternarylogic_epi32(code, x_shifted, _mm512_set1_epi16(static_cast<int16_t>(Codec::kSignBit)),
                                   0xF8);  // A | (B & C)
}

/// mx16_terms (mx16_form.hpp, which says why) on 32 lanes of scale bytes S: `lower` and `limit`
/// of each lane's block; lanes with |x| - 1 <= limit need the general form.
template <typename Codec, DType kIn>
MICROSCALE_AVX512_INLINE void mx16_normal_terms(__m512i scale_bytes, __m512i* lower, __m512i* limit) {
  using F = Mx16Format<Codec, kIn>;
  const __m512i d = _mm512_sub_epi16(scale_bytes, _mm512_set1_epi16(F::kScaleBase));
  const __m512i shifted = _mm512_slli_epi16(d, F::kInputMantissaBits);
  // d << mantissa bits minus the rounding's half step less one: |x| + lsb - lower = the rebased
  // |x| pattern + (2^(kDrop - 1) - 1).
  *lower = _mm512_sub_epi16(shifted, _mm512_set1_epi16((1 << (F::kDrop - 1)) - 1));
  // e >= 1 <=> |x| >= (d + 1) << mantissa bits <=> |x| - 1 <= (d << mantissa bits) + 2^bits - 2.
  const __m512i top = _mm512_set1_epi16((1 << F::kInputMantissaBits) - 2);
  const __mmask32 positive = _mm512_cmpgt_epi16_mask(d, _mm512_setzero_si512());
  const __m512i otherwise = kIn == DType::BF16 ? _mm512_set1_epi16(-1) : top;
  *limit = _mm512_mask_blend_epi16(positive, otherwise, _mm512_add_epi16(shifted, top));
}

/// MX codes of lanes in the normal form's range or zero (see mx16_normal_terms):
/// `abs_plus_lsb` = |x| + (|x| >> kDrop & 1), `x_shifted` = x >> kSignShift, `nonzero` the lanes
/// with |x| != 0 (f16 only: there `lower` may be negative, so a zero lane is zeroed by the mask
/// instead of by a saturating subtract).
template <typename Codec, DType kIn>
MICROSCALE_AVX512_INLINE __m512i mx16_codes_normal(__m512i abs_plus_lsb, __m512i x_shifted, __m512i lower,
                                                   __mmask32 nonzero) {
  using F = Mx16Format<Codec, kIn>;
  // bf16: saturating, a zero lane becomes 0 (lower > 0 wherever this form is used).
  const __m512i rebased = kIn == DType::BF16 ? _mm512_subs_epu16(abs_plus_lsb, lower)
                                             : _mm512_maskz_sub_epi16(nonzero, abs_plus_lsb, lower);
  const __m512i rounded = _mm512_srli_epi16(rebased, F::kDrop);
  return with_input_sign<Codec>(
      _mm512_min_epu16(rounded, _mm512_set1_epi16(static_cast<int16_t>(Codec::kMaxCode))), x_shifted);
}

/// MX codes of any finite f16 lanes `x` (raw patterns) with scale bytes S per lane (16-bit): each
/// half widened exactly to fp32 and encoded as the fp32 kernel does. Used for the few registers
/// with an input subnormal or a format subnormal.
template <typename Codec>
MICROSCALE_AVX512_INLINE __m512i mx_f16_codes(__m512i x, __m512i scale_bytes) {
  __m256i half_codes[2];
  for (int h = 0; h < 2; ++h) {
    const __m256i x_half = h == 0 ? _mm512_castsi512_si256(x) : _mm512_extracti64x4_epi64(x, 1);
    const __m256i s_half =
        h == 0 ? _mm512_castsi512_si256(scale_bytes) : _mm512_extracti64x4_epi64(scale_bytes, 1);
    const __m512 y = _mm512_mul_ps(_mm512_cvtph_ps(x_half), mx_inverse_scales(_mm512_cvtepu16_epi32(s_half)));
    half_codes[h] = _mm512_cvtepi32_epi16(encode_rn<Codec>(y));
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(half_codes[0]), half_codes[1], 1);
}

/// MX codes of any finite bf16 lanes with S >= B: `abs` = |x| bits, `x_shifted` = x >> kSignShift,
/// `scale_bytes` = S per lane.
/// NOTE: S >= B keeps every bf16 subnormal x in binade 1 or below, where the format's grid is
/// linear; smaller scales (blocks of amax below ~2^(B - 127 + emax)) go to the fp32 encoders.
template <typename Codec>
MICROSCALE_AVX512_INLINE __m512i mx_bf16_codes(__m512i abs, __m512i x_shifted, __m512i scale_bytes) {
  using F = Mx16Format<Codec, DType::BF16>;
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i exponent = _mm512_srli_epi16(abs, 7);
  const __m512i e_eff = _mm512_max_epu16(exponent, one);  // bf16 subnormals sit in binade 1
  // The mantissa with its leading bit (none for bf16 subnormals and zeros): 8 bits.
  const __m512i mantissa = _mm512_ternarylogic_epi32(abs, _mm512_set1_epi16(0x7F),
                                                     _mm512_slli_epi16(_mm512_min_epu16(exponent, one), 7),
                                                     0xEA);  // (A & B) | C
  // Binades below the format's normal range: w = max(1 - e, 0), with 1 - e = S + 1 - B - e_eff.
  const __m512i below =
      _mm512_subs_epu16(_mm512_subs_epu16(scale_bytes, _mm512_set1_epi16(F::kBias - 1)), e_eff);
  // Right shift kDrop + w, capped at 9 (8 mantissa bits: from 9 on every lane rounds to 0), as
  // 9 - u; the rounding adds 2^(shift - 1) - 1 = 255 >> u.
  const __m512i u = _mm512_subs_epu16(_mm512_set1_epi16(9 - F::kDrop), below);
  const __m512i shift = _mm512_sub_epi16(_mm512_set1_epi16(9), u);
  const __m512i half_less_one = _mm512_srlv_epi16(_mm512_set1_epi16(255), u);
  // The value in steps of the format's smallest subnormal times 2^kDrop: (e - 1) << 7 + mantissa
  // in the normal range (e - 1 = e_eff - (S + 1 - B), offset by 32 to stay unsigned), the
  // mantissa alone below it.
  const __m512i binade = _mm512_subs_epu16(_mm512_add_epi16(e_eff, _mm512_set1_epi16(32)),
                                           _mm512_add_epi16(scale_bytes, _mm512_set1_epi16(33 - F::kBias)));
  const __m512i v = _mm512_add_epi16(_mm512_slli_epi16(binade, 7), mantissa);
  const __m512i lsb = _mm512_and_si512(_mm512_srlv_epi16(v, shift), one);
  const __m512i rounded = _mm512_srlv_epi16(_mm512_add_epi16(_mm512_add_epi16(v, half_less_one), lsb), shift);
  return with_input_sign<Codec>(
      _mm512_min_epu16(rounded, _mm512_set1_epi16(static_cast<int16_t>(Codec::kMaxCode))), x_shifted);
}

}  // namespace microscale::cpu::avx512

#endif
