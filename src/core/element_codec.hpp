// Branch-free fp32 <-> small-float codecs, shared by the CPU fast path and the CUDA kernels
// (MICROSCALE_HOST_DEVICE: one definition for both backends).
//
// Each equals encode_rn / encode_sr / decode of format.hpp bit for bit (tests/cpp/format_test.cpp,
// FastCodec checks every bf16 input, every grid point and midpoint and their neighbours, random
// fp32 bit patterns, and every code). Written with integer and compare/select operations only, so
// loops over a block vectorise.
#pragma once

#include <cstdint>
#include <cstring>

#include "microscale/format.hpp"
#include "microscale/half.hpp"  // float_bits, bits_to_float
#include "microscale/host_device.hpp"

namespace microscale {

/// a if `condition` else b, as a mask (branch-free, vectorisable).
MICROSCALE_HOST_DEVICE uint32_t select(bool condition, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}

/// Compile-time description of a signed element format (a FormatInfo row as template arguments).
template <int kBits, int kExponentBits, int kMantissaBits, int kBias, Specials kSpecials>
struct ElementCodec {
  static constexpr int kWidth = kBits;  // bits of a code, sign included
  static constexpr Specials kSpecialValues = kSpecials;
  static constexpr int kShift = 23 - kMantissaBits;  // fp32 mantissa bits dropped
  static constexpr uint32_t kSignBit = 1u << (kBits - 1);
  static constexpr int kEmin = 1 - kBias;
  // Largest finite code magnitude: all ones, minus one mantissa step when that pattern is NaN
  // (E4M3), minus the whole top binade when it is Inf/NaN (E5M2).
  static constexpr uint32_t kMaxCode =
      kSpecials == Specials::NanOnlyOnes ? (1u << (kBits - 1)) - 2
      : kSpecials == Specials::Ieee
          ? ((((1u << kExponentBits) - 2) << kMantissaBits) | ((1u << kMantissaBits) - 1))
          : (1u << (kBits - 1)) - 1;
  // fp32 bits of the smallest normal, 2^kEmin.
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(kEmin + 127) << 23;
  // fp32 bits of 2^(kEmin - kMantissaBits + 23): adding it rounds a subnormal to its grid.
  static constexpr uint32_t kMagicBits = static_cast<uint32_t>(kEmin - kMantissaBits + 23 + 127) << 23;
  // Exponent rebias between fp32 and the format, in code units.
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << kMantissaBits;

  /// Code of a NaN input with sign bit `sign` (0 or 1).
  MICROSCALE_HOST_DEVICE static uint32_t nan_code(uint32_t sign) {
    if constexpr (kSpecials == Specials::None) {
      return kMaxCode;  // no NaN: +max, as the hardware cvt does
    } else {
      return (kSignBit - 1) | (sign << (kBits - 1));  // all ones: 0x7F for FP8
    }
  }
  /// Magnitude code of an Inf input.
  static constexpr uint32_t kInfCode = kSpecials == Specials::Ieee
                                           ? (((1u << kExponentBits) - 1) << kMantissaBits)
                                       : kSpecials == Specials::NanOnlyOnes ? (kSignBit - 1)
                                                                            : kMaxCode;

  /// Round to nearest even, saturating finite values (see encode_rn).
  /// NOTE: every choice is a mask select (no branches), so loops over elements vectorise.
  MICROSCALE_HOST_DEVICE static uint8_t encode_rn(float x) {
    const uint32_t u = float_bits(x);
    const uint32_t sign = u >> 31;
    const uint32_t a = u & 0x7FFFFFFFu;
    // Normal range: round the fp32 mantissa to kMantissaBits bits (ties to even), then rebias.
    const uint32_t rounded = (a + ((1u << (kShift - 1)) - 1) + ((a >> kShift) & 1u)) >> kShift;
    const uint32_t normal = rounded - kRebias;
    // Subnormal range: one fp32 add rounds to the subnormal grid; the bit difference counts steps.
    const uint32_t subnormal = float_bits(bits_to_float(a) + bits_to_float(kMagicBits)) - kMagicBits;
    uint32_t code = select(a < kMinNormalBits, subnormal, normal);
    code = select(code > kMaxCode, kMaxCode, code);
    code = select(a == 0x7F800000u, kInfCode, code);
    const uint32_t with_sign = code | (sign << (kBits - 1));
    return static_cast<uint8_t>(select(a > 0x7F800000u, nan_code(sign), with_sign));
  }

  /// Stochastic rounding with 8 random bits (see encode_sr).
  MICROSCALE_HOST_DEVICE static uint8_t encode_sr(float x, uint32_t random_byte) {
    const uint32_t u = float_bits(x);
    const uint32_t sign = u >> 31;
    const uint32_t a = u & 0x7FFFFFFFu;
    // Normal range: add the random byte just below the last kept bit, then truncate.
    const uint32_t normal = (((a >> (kShift - 8)) + random_byte) >> 8) - kRebias;
    // Subnormal range: a / step < 2^kMantissaBits; the same on 1/256 steps, exact in fp32.
    const float steps_256 =
        bits_to_float(a) * bits_to_float(static_cast<uint32_t>(kMantissaBits - kEmin + 8 + 127) << 23);
    const uint32_t subnormal = (static_cast<uint32_t>(steps_256) + random_byte) >> 8;
    uint32_t code = select(a < kMinNormalBits, subnormal, normal);
    code = select((a >= 0x7F800000u) | (code > kMaxCode), kMaxCode, code);
    const uint32_t with_sign = code | (sign << (kBits - 1));
    return static_cast<uint8_t>(select(a > 0x7F800000u, nan_code(sign), with_sign));
  }

  /// Code -> value, exact (see decode). Bits above the code's width are ignored (a caller that
  /// reads codes from bytes checks them).
  MICROSCALE_HOST_DEVICE static float decode(uint32_t code) {
    const uint32_t magnitude = code & (kSignBit - 1);
    // Normal: the exponent and mantissa fields move into fp32's, rebiased. Subnormal (exponent
    // field 0, so magnitude = mantissa): magnitude steps of 2^(kEmin - kMantissaBits), as the
    // difference of two fp32 values whose last mantissa bits are those steps (exact).
    const uint32_t normal = (magnitude << kShift) + (kRebias << kShift);
    const uint32_t subnormal = float_bits(bits_to_float(kMagicBits | magnitude) - bits_to_float(kMagicBits));
    uint32_t bits = select(magnitude < (1u << kMantissaBits), subnormal, normal);
    if constexpr (kSpecials == Specials::NanOnlyOnes) {
      bits = select(magnitude == kSignBit - 1, 0x7FC00000u, bits);
    } else if constexpr (kSpecials == Specials::Ieee) {
      const uint32_t top = ((1u << kExponentBits) - 1) << kMantissaBits;  // the Inf/NaN binade
      bits = select(magnitude >= top, select(magnitude == top, 0x7F800000u, 0x7FC00000u), bits);
    }
    return bits_to_float(bits | ((code & kSignBit) << (32 - kBits)));
  }
};

using E2M1Codec = ElementCodec<4, 2, 1, 1, Specials::None>;
using E2M3Codec = ElementCodec<6, 2, 3, 1, Specials::None>;
using E3M2Codec = ElementCodec<6, 3, 2, 3, Specials::None>;
using E4M3Codec = ElementCodec<8, 4, 3, 7, Specials::NanOnlyOnes>;
using E5M2Codec = ElementCodec<8, 5, 2, 15, Specials::Ieee>;

}  // namespace microscale
