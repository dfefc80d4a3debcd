// The 16-bit form of MX encoding: bf16 and f16 inputs with byte-sized codes (FP8 E4M3/E5M2, FP6
// E2M3/E3M2; E2M1 by the two-step form at the end) encoded on their 16-bit patterns, without
// widening to fp32. The AVX-512 kernel runs it on 32 lanes per register (avx512_codecs.hpp); the
// portable MXFP8 kernel (quantize_mx16.cpp) runs the per-lane functions below in loops that GCC
// vectorises; the AVX2 chunks (mx16_chunk_avx2.cpp) run them in AVX2.
//
// With the E8M0 block scale byte S the element is y = x * 2^(127 - S) (exact: a power of two),
// whose biased exponent in the element format (bias B, m mantissa bits) is e = exp(x) - d,
// d = S - kScaleBase. Where e >= 1 (the format's normal range) and x is a normal input, the code
// is x's 15-bit |x| pattern with the exponent field moved by d and the input's mantissa bits
// rounded to m, ties to even: one subtract and one shift (the carry of the rounding moves into the
// exponent, as in encode_rn). Elsewhere (format subnormals, input subnormals, blocks whose scale
// is NaN) the kernels encode the lane as the fp32 path does, or (FP6 in AVX2) by the subnormal
// form below; E2M1 in AVX2 takes the two-step form at the end. Each code equals
// encode_rn(mx_scaled_element(x, mx_inverse_scale(S))) for finite x and S < 0xFF whenever
// |y| < 2^(emax + 1), which every MX scale rule guarantees for the block's elements
// (tests/cpp/mx16_form_test.cpp and avx512_codec_test.cpp check every bf16 and f16 pattern against
// every scale byte a block of such inputs can have).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/element_codec.hpp"  // E2M1Codec
#include "cpu/input16.hpp"
#include "microscale/tensor.hpp"  // DType

namespace microscale::cpu {

/// The constants of the 16-bit form for element codec `Codec` and input type kIn.
template <typename Codec, DType kIn>
struct Mx16Format {
  static_assert(kIn == DType::BF16 || kIn == DType::F16);
  static constexpr int kInputMantissaBits = kIn == DType::BF16 ? 7 : 10;
  static constexpr int kInputBias = kIn == DType::BF16 ? 127 : 15;
  static constexpr int kBias = 1 - Codec::kEmin;
  static constexpr int kMantissaBits = 23 - Codec::kShift;
  static constexpr int kDrop = kInputMantissaBits - kMantissaBits;  // input mantissa bits dropped
  static constexpr int kScaleBase = kBias + 127 - kInputBias;       // d = S - kScaleBase
  static constexpr int kSignShift = 16 - Codec::kWidth;             // input sign bit -> the code's
};

/// The per-block terms of the normal form for one scale byte S: `lower`, the amount subtracted
/// from |x| + rounding bit, and `limit`: lanes with |x| - 1 <= limit (16-bit unsigned; a zero
/// wraps to 0xFFFF, above every limit but 0xFFFF) are outside the normal form (mx16_outside).
/// bf16: blocks with d <= 0 have every lane outside (limit 0xFFFF): their zeros would not
/// subtract to 0. f16: there d <= 0 leaves only the input subnormals outside (e = exp(x) - d >= 1
/// for every normal x), and mx16_code_normal zeroes zero lanes itself.
/// NOTE: d << 10 fits 16 bits for f16 wherever a lane uses it: d < 32 (the largest f16 is below
/// 2^16, so S <= 16 - emax + 128), and a block holding a normal f16 has d >= 1 - emax - B (-29 for
/// E5M2). Lower d (blocks of zeros and f16 subnormals only) wraps, but those lanes are zeroed by
/// the zero test or are outside.
struct Mx16Terms {
  uint16_t lower;
  uint16_t limit;
};

template <typename Codec, DType kIn>
constexpr Mx16Terms mx16_terms(uint8_t scale_byte) {
  using F = Mx16Format<Codec, kIn>;
  const int d = int{scale_byte} - F::kScaleBase;
  const auto shifted = static_cast<uint16_t>(static_cast<uint32_t>(d) << F::kInputMantissaBits);
  // d << mantissa bits minus the rounding's half step less one: |x| + lsb - lower = the rebased
  // |x| pattern + (2^(kDrop - 1) - 1).
  const auto lower = static_cast<uint16_t>(shifted - ((1 << (F::kDrop - 1)) - 1));
  // e >= 1 <=> |x| >= (d + 1) << mantissa bits <=> |x| - 1 <= (d << mantissa bits) + 2^bits - 2.
  constexpr uint16_t kTop = (1 << F::kInputMantissaBits) - 2;
  const uint16_t otherwise = kIn == DType::BF16 ? uint16_t{0xFFFF} : kTop;
  return {lower, d > 0 ? static_cast<uint16_t>(shifted + kTop) : otherwise};
}

/// Terms under which every lane is outside the normal form (blocks whose scale byte is 0xFF: an
/// Inf or NaN in the block).
constexpr Mx16Terms kMx16AllOutside = {0, 0xFFFF};

/// Whether the 16-bit input `x` is outside the normal form of a block with `limit` (mx16_terms).
constexpr bool mx16_outside(uint16_t x, uint16_t limit) {
  return static_cast<uint16_t>((x & 0x7FFF) - 1) <= limit;
}

/// The code of a 16-bit input `x` in the normal form's range (or zero) of a block with `lower`
/// (mx16_terms). Branch-free, so loops over a row vectorise.
template <typename Codec, DType kIn>
constexpr uint8_t mx16_code_normal(uint16_t x, uint16_t lower) {
  using F = Mx16Format<Codec, kIn>;
  const auto abs = static_cast<uint16_t>(x & 0x7FFF);
  const auto abs_plus_lsb = static_cast<uint16_t>(abs + ((abs >> F::kDrop) & 1));
  uint16_t rebased;
  if constexpr (kIn == DType::BF16) {
    // lower > 0 wherever this form is used: a zero lane saturates to 0.
    rebased = static_cast<uint16_t>(std::max(abs_plus_lsb, lower) - lower);
  } else {
    // lower may be negative (d <= 0): a zero lane is zeroed by a mask (a `?:` here left a branch
    // that kept GCC 12 from vectorising the row loop).
    const auto nonzero = static_cast<uint16_t>(0u - static_cast<unsigned>(abs != 0));
    rebased = static_cast<uint16_t>((abs_plus_lsb - lower) & nonzero);
  }
  const auto magnitude =
      std::min(static_cast<uint16_t>(rebased >> F::kDrop), static_cast<uint16_t>(Codec::kMaxCode));
  return static_cast<uint8_t>(magnitude | ((x >> F::kSignShift) & Codec::kSignBit));
}

/// The subnormal form (FP6 in AVX2, mx16_chunk_avx2.cpp): where a block's d = S - kScaleBase is
/// at least 1, the lanes outside the normal form (mx16_outside) are exactly the nonzero ones with
/// e <= 0, i.e. |y| < 2^emin: the format's subnormals, input subnormals among them. Their code
/// magnitude is |y| in steps of the format's smallest subnormal, 2^(emin - m), rounded to an
/// integer (ties to even; a carry to 2^m is the code of 2^emin, the smallest normal): |x| times
/// 2^(127 - S + m - emin), exact where it matters (a power of two; only products below 2^-126,
/// whose codes are 0, round), then rounded to an integer, as encode_rn's fp32 add onto the grid
/// rounds it (under the same rounding mode). The multiplier is finite from kMinScale on.
template <typename Codec, DType kIn>
struct Mx16Subnormals {
  using F = Mx16Format<Codec, kIn>;
  static constexpr int kGridShift = F::kMantissaBits - Codec::kEmin;  // log2 of 1 / the step
  /// The least scale byte of the form: d >= 1, and 2^(127 - S + kGridShift) below fp32's Inf.
  static constexpr int kMinScale = std::max(F::kScaleBase + 1, kGridShift);
  /// The inverse scale 2^(127 - kMinScale), the largest the form takes.
  static constexpr float kMaxInverse = std::bit_cast<float>(static_cast<uint32_t>(254 - kMinScale) << 23);
  /// The multiplier of a block from its mx_inverse_scale, 2^(127 - S) (exact for S >= kMinScale:
  /// from 2^-127 up, a power of two times a power of two). Capped at kMinScale's: a block of
  /// zeros (amax 0) has a lower byte, and its codes are 0 under any finite multiplier.
  static constexpr float multiplier(float inverse) {
    return std::min(inverse, kMaxInverse) * static_cast<float>(1 << kGridShift);
  }
};

/// The code magnitude of a lane in the subnormal form (mx16_outside in a block with scale byte
/// S >= Mx16Subnormals::kMinScale, S < 0xFF; or any lane of a block of zeros): `multiplier` =
/// Mx16Subnormals::multiplier of the block. std::nearbyint rounds as the AVX2 kernel's _mm256_cvtps_epi32
/// does (the current rounding mode: to nearest, ties to even, unless a caller changed it).
template <typename Codec, DType kIn>
inline uint8_t mx16_code_subnormal(uint16_t x, float multiplier) {
  return static_cast<uint8_t>(std::nearbyint(widen16<kIn>(static_cast<uint16_t>(x & 0x7FFF)) * multiplier));
}

/// The two-step form of E2M1 (MXFP4 in AVX2, mx16_chunk_avx2.cpp): below 2^emin (y < 1) E2M1
/// has one subnormal, 0.5, so a lane there has code 0, 1 or 2 (the carry to 1.0): the count of
/// the block's two lowest steps its |x| pattern is above, y > 0.25 and y >= 0.75 (ties to even:
/// 0.25 to 0, 0.75 to 1.0). Where the block's d = S - kScaleBase is at least 1, the normal form's
/// magnitude, with the subtract saturating at 0, is the code for lanes with y >= 1 (which pass
/// both steps: 2, at most their code) and at most the code for lanes with y < 1 (0 below 0.5; in
/// [0.5, 1) the rounded one-bit mantissa of that binade: at most 1 below 0.75, where the code is
/// 1, at most 2 from 0.75, where it is 2). So the code magnitude is the larger of the two, without
/// a mask of the lanes outside the normal form.
///
/// Each of a block's three terms is its scale byte shifted to the input's exponent field, less a
/// constant (y = x * 2^(127 - S) is exact): `lower` as mx16_terms; `step1` the pattern of
/// x = 2^(S - 129) (y = 0.25: codes >= 1 above it); `step2` one below that of 1.5 * 2^(S - 128)
/// (y = 0.75). Both are normal inputs from kMinScale to kMaxScale (f16: 143; no MX rule gives a
/// block of f16 inputs a byte above 141). A block of zeros has codes 0 (and the sign) under any
/// terms with steps >= 0: bytes outside that range take the terms of its nearer end.
template <DType kIn>
struct Mx16Fp4TwoStep {
  using F = Mx16Format<E2M1Codec, kIn>;
  static constexpr int kMantissaBits = F::kInputMantissaBits;
  /// The least scale byte of the form: 2^(S - 129) a normal input (and d >= 1).
  static constexpr int kMinScale = 130 - F::kInputBias;
  /// The largest: 1.5 * 2^(S - 128) below the input's Inf (its largest exponent field is twice its bias).
  static constexpr int kMaxScale = std::min(254, F::kInputBias + 128);
  /// (S << kMantissaBits) less these: the terms.
  static constexpr int kLowerOffset = (F::kScaleBase << kMantissaBits) + (1 << (F::kDrop - 1)) - 1;
  static constexpr int kStep1Offset = (129 - F::kInputBias) << kMantissaBits;
  static constexpr int kStep2Offset =
      ((128 - F::kInputBias) << kMantissaBits) - (1 << (kMantissaBits - 1)) + 1;

  struct Terms {
    uint16_t lower;
    int16_t step1, step2;
  };
  static constexpr Terms terms(uint8_t scale_byte) {
    const int base = std::clamp(int{scale_byte}, kMinScale, kMaxScale) << kMantissaBits;
    return {static_cast<uint16_t>(base - kLowerOffset), static_cast<int16_t>(base - kStep1Offset),
            static_cast<int16_t>(base - kStep2Offset)};
  }
};

/// The E2M1 code (sign in bit 3) of a 16-bit input `x` in the two-step form of a block with terms
/// `t` (Mx16Fp4TwoStep::terms of its scale byte).
template <DType kIn>
constexpr uint8_t mx16_fp4_code(uint16_t x, typename Mx16Fp4TwoStep<kIn>::Terms t) {
  using F = Mx16Format<E2M1Codec, kIn>;
  const auto abs = static_cast<uint16_t>(x & 0x7FFF);
  const auto abs_plus_lsb = static_cast<uint16_t>(abs + ((abs >> F::kDrop) & 1));
  const auto rebased = static_cast<uint16_t>(std::max(abs_plus_lsb, t.lower) - t.lower);
  const int normal = std::min(rebased >> F::kDrop, static_cast<int>(E2M1Codec::kMaxCode));
  const int steps = int{static_cast<int16_t>(abs) > t.step1} + int{static_cast<int16_t>(abs) > t.step2};
  return static_cast<uint8_t>(std::max(normal, steps) | ((x >> F::kSignShift) & E2M1Codec::kSignBit));
}

}  // namespace microscale::cpu
