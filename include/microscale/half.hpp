// microscale/half.hpp — 16-bit float storage types (bfloat16, IEEE half) and exact conversions.
//
// Inputs and dequantized outputs can be bf16 or fp16. Widening to fp32 is exact; narrowing rounds
// to nearest even, keeps NaN a NaN and overflows to Inf, as torch and the CUDA intrinsics do.
#pragma once

#include <cstdint>
#include <cstring>

#include "microscale/host_device.hpp"

namespace microscale {

MICROSCALE_HOST_DEVICE uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

MICROSCALE_HOST_DEVICE float bits_to_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/// @brief bf16 bit pattern -> fp32 (exact).
MICROSCALE_HOST_DEVICE float bf16_to_float(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

/// @brief fp32 -> bf16 bit pattern, round to nearest even; NaN stays a (quiet) NaN.
MICROSCALE_HOST_DEVICE uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

/// @brief IEEE binary16 bit pattern -> fp32 (exact).
/// NOTE: branch-free (the three forms computed, then chosen by masks), so that loops converting
/// f16 rows vectorise (the CPU fast path's row loader).
MICROSCALE_HOST_DEVICE float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t magnitude = bits & 0x7FFFu;
  const uint32_t shifted = magnitude << 13;  // the mantissa in fp32's place
  // Normal: the exponent rebiased (15 -> 127). Inf/NaN: fp32's all-ones exponent, mantissa kept.
  const uint32_t normal = shifted + (112u << 23);
  const uint32_t special = shifted | 0x7F800000u;
  // Zero or subnormal, m * 2^-24: 2^-14 (1 + m / 1024) - 2^-14, both exact in fp32, as is the result.
  const uint32_t subnormal = float_bits(bits_to_float(shifted | (113u << 23)) - bits_to_float(113u << 23));
  const uint32_t is_special = 0u - static_cast<uint32_t>(magnitude >= 0x7C00u);
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(magnitude < 0x0400u);
  const uint32_t finite = (subnormal & is_subnormal) | (normal & ~is_subnormal);
  return bits_to_float(sign | (special & is_special) | (finite & ~is_special));
}

/// @brief fp32 -> IEEE binary16 bit pattern, round to nearest even, overflow to Inf.
MICROSCALE_HOST_DEVICE uint16_t float_to_half(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (a < 0x38800000u) {
    // result is subnormal or zero in half: round a / 2^-24 to an integer, ties to even
    const float scaled = bits_to_float(a) * 16777216.0f;  // exact: multiply by 2^24
    const float whole = static_cast<float>(static_cast<uint32_t>(scaled));
    float rounded = whole;
    const float frac = scaled - whole;
    if (frac > 0.5f || (frac == 0.5f && (static_cast<uint32_t>(whole) & 1u))) rounded += 1.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  const uint32_t rounding_bias = 0xFFFu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((a - 0x38000000u + rounding_bias) >> 13));
}

}  // namespace microscale
