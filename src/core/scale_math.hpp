// Scale formulas shared by every backend (host and device): the NVFP4 two-level scales and the
// MX E8M0 exponent per scale mode. Each line is an fp32 operation in the order the references
// perform it, since a different order can move a result by one ulp and flip a rounding.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "microscale/half.hpp"    // float_bits, bits_to_float
#include "microscale/philox.hpp"  // MICROSCALE_HOST_DEVICE

namespace microscale {

/// min(a, limit) for a >= 0 (+Inf included) and a finite limit >= 0, compared on the bits (for
/// such floats the integer order is the float order). NOTE: branch-free on purpose: GCC keeps a
/// branch for a `?:` between floats (-ftrapping-math), and CPU loops over blocks then vectorise
/// only with AVX-512's masked operations, not with AVX2.
MICROSCALE_HOST_DEVICE float min_nonnegative(float a, float limit) {
  const uint32_t ua = float_bits(a), ul = float_bits(limit);
  const uint32_t below = 0u - static_cast<uint32_t>(ua < ul);
  return bits_to_float((ua & below) | (ul & ~below));
}

// ---- NVFP4 (numerics-te.md §1.1-1.4, TE >= 2.14) ------------------------------------------------

/// Global encode scale S_enc = 6 * e4m3_max / amax (2688 / amax; 1536 / amax for 4over6's 256),
/// clamped to FLT_MAX; 1 when amax is 0 or S_enc is 0.
MICROSCALE_HOST_DEVICE float nvfp4_global_encode_scale(float amax, int e4m3_max = 448) {
  float s_enc = static_cast<float>(6 * e4m3_max) / amax;  // exact: 2688 or 1536
  s_enc = s_enc < FLT_MAX ? s_enc : FLT_MAX;              // +Inf (amax = 0) and NaN clamp to FLT_MAX
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  return s_enc;
}

/// Multiplier turning a block amax into the fp32 block decode scale: RN(S_enc * RN(1/6)).
MICROSCALE_HOST_DEVICE float nvfp4_block_scale_multiplier(float s_enc) {
  const float one_sixth = 1.0f / 6.0f;  // 0x3E2AAAAB
  return s_enc * one_sixth;
}

/// Value of a non-negative, non-NaN E4M3 code (0x00..0x7E), computed rather than looked up so that
/// loops over blocks vectorise: 2^(e-7) (1 + m/8) for e > 0, m 2^-9 for subnormals (both exact).
MICROSCALE_HOST_DEVICE float e4m3_code_value(uint32_t code) {
  const uint32_t e = code >> 3, m = code & 7u;
  const uint32_t normal = ((e + 120u) << 23) | (m << 20);
  const uint32_t subnormal = float_bits(static_cast<float>(m) * 0.001953125f);
  const uint32_t mask = 0u - static_cast<uint32_t>(e == 0u);
  return bits_to_float((subnormal & mask) | (normal & ~mask));
}

/// max(m, |v|) with v skipped when it is a NaN, quiet or signalling (m is not NaN): the amax of
/// TE's kernels, whose fmaxf returns the other operand for either kind. NOTE: not std::fmax alone:
/// glibc's returns NaN for a signalling NaN operand (IEEE 754-2008 maxNum; seen with glibc 2.36),
/// and bf16 and f16 signalling NaNs widen to fp32 ones. Host only (std::isnan).
inline float max_abs_skipping_nan(float m, float v) { return std::isnan(v) ? m : std::fmax(m, std::fabs(v)); }

/// Block encode scale from the decoded E4M3 block scale: min(1 / RN(scale * S_dec), FLT_MAX).
/// A zero scale gives FLT_MAX, so the block's nonzero elements saturate (as TE does).
MICROSCALE_HOST_DEVICE float nvfp4_block_encode_scale(float block_scale, float s_dec) {
  const float product = block_scale * s_dec;  // >= 0: a decoded scale times 1 / S_enc
  return min_nonnegative(1.0f / product, FLT_MAX);
}

/// TE's GEMM alpha with both operands' NVFP4 global scales: ((alpha * amax_a) * amax_b) times
/// RN(1 / (6 * 6 * e4m3_max_a * e4m3_max_b)) (the product exact: 7225344 for 448 and 448).
MICROSCALE_HOST_DEVICE float nvfp4_gemm_alpha(float alpha, float amax_a, int e4m3_max_a, float amax_b,
                                              int e4m3_max_b) {
  const float factor = 1.0f / (36.0f * static_cast<float>(e4m3_max_a) * static_cast<float>(e4m3_max_b));
  return ((alpha * amax_a) * amax_b) * factor;
}

/// The same with one NVFP4 operand (mixed with a dense one): (alpha * amax) * RN(1 / (6 * e4m3_max)).
MICROSCALE_HOST_DEVICE float nvfp4_gemm_alpha(float alpha, float amax, int e4m3_max) {
  return (alpha * amax) * (1.0f / (6.0f * static_cast<float>(e4m3_max)));
}

// ---- NVFP4 4over6 (TE's quantize_4over6_nvfp4.cuh and reference_nvfp4.py) ----------------------

/// The fp32 block scale both 4over6 candidates start from: RN(RN(amax / 6) * S_enc). NOTE: a true
/// division, where the plain NVFP4 path multiplies by RN(S_enc * RN(1/6)): the two differ by an
/// ulp for some amaxes, and TE's 4over6 kernel divides.
MICROSCALE_HOST_DEVICE float four_over_six_base_scale(float block_amax, float s_enc) {
  return block_amax / 6.0f * s_enc;
}

/// Map to 4's fp32 scale, before the E4M3 rounding: 1.5 times the base, at most 448 (map to 6's is
/// min(base, 448)).
MICROSCALE_HOST_DEVICE float four_over_six_map4_scale(float base) {
  return min_nonnegative(base * 1.5f, 448.0f);
}

/// A candidate element in the domain its error is measured in: by default its dequantized value
/// RN(RN(RN(code * scale) * amax) / (6 * e4m3_max)) (TE divides; `denominator` is 6 * e4m3_max);
/// `scaled_error`, TE's NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH: RN(code * scale) (exact: a 3-bit by
/// 4-bit product). Odd in code_value (every rounding is symmetric), so a kernel may take it per
/// magnitude and negate.
MICROSCALE_HOST_DEVICE float four_over_six_candidate_value(float code_value, float block_scale, float amax,
                                                           float denominator, bool scaled_error) {
  const float product = code_value * block_scale;
  return scaled_error ? product : product * amax / denominator;
}

/// x in that domain: x itself, or RN(x * S_enc) with `scaled_error`.
MICROSCALE_HOST_DEVICE float four_over_six_input_value(float x, float s_enc, bool scaled_error) {
  return scaled_error ? x * s_enc : x;
}

/// One element's term of a candidate's error: |d| (MAE) or RN(d * d) (MSE), d = RN(candidate - input)
/// of the two values above.
MICROSCALE_HOST_DEVICE float four_over_six_error_term(float candidate_value, float input_value,
                                                      bool squared) {
  const float diff = candidate_value - input_value;
  return squared ? diff * diff : fabsf(diff);
}

/// A 16x16 tile's error from its 16 rows' errors, added in the order of TE's warp reduction
/// (shuffles down by 8, 4, 2, 1): e[i] + e[i + 8], then + the sums 4 and 2 and 1 away.
MICROSCALE_HOST_DEVICE float four_over_six_tile_error(const float* e, int stride) {
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = e[i * stride] + e[(i + 8) * stride];
  for (int i = 0; i < 4; ++i) a[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) a[i] = a[i] + a[i + 2];
  return a[0] + a[1];
}

// ---- MX E8M0 scale (numerics-mx.md §3.3-3.4, torchao main) --------------------------------------

enum class MxScaleRule : uint8_t { Floor, Ceil, Even, RCeil };

/// E8M0 byte of a block with amax `amax` (NaN if any element is NaN), for an element format with
/// max exponent `emax`, `mantissa_bits` and max value `max_normal`.
MICROSCALE_HOST_DEVICE uint8_t mx_scale_byte(float amax, MxScaleRule rule, int emax, int mantissa_bits,
                                             float max_normal) {
  if (rule == MxScaleRule::RCeil) {
    const float d = amax * (1.0f / max_normal);  // reciprocal rounded to fp32 first, one multiply
    const uint32_t u = float_bits(d);
    const uint32_t exponent = (u >> 23) & 0xFFu, mantissa = u & 0x7FFFFFu;
    if (exponent == 0xFFu) return 0xFF;
    if (exponent == 0) return mantissa > 0x400000u ? 1 : 0;  // round up to 2^-126 or down to 2^-127
    return static_cast<uint8_t>(exponent + (mantissa != 0 ? 1u : 0u));  // 254 + 1 -> 255 = NaN
  }
  uint32_t u = float_bits(amax) & 0x7FFFFFFFu;
  if (u >= 0x7F800000u) return 0xFF;  // Inf or NaN amax
  if (rule == MxScaleRule::Even) {
    u += 1u << (22 - mantissa_bits);  // round the amax to the element's mantissa width
    if (u >= 0x7F800000u) return 0xFF;
  }
  const int exponent = static_cast<int>(u >> 23) - 127;  // -127 for zero and subnormals
  int unbiased = exponent - emax;
  if (rule == MxScaleRule::Ceil && (u & 0x7FFFFFu) != 0) unbiased += 1;
  unbiased = unbiased < -127 ? -127 : (unbiased > 128 ? 128 : unbiased);
  return static_cast<uint8_t>(unbiased + 127);
}

/// mx_scale_byte for a rule fixed at compile time, without branches (integer selects), so that CPU
/// loops over blocks vectorise (the portable bf16/f16 MX kernel); equal to mx_scale_byte for every
/// amax (tests/cpp/mx16_form_test.cpp).
template <MxScaleRule kRule>
MICROSCALE_HOST_DEVICE uint8_t mx_scale_byte_branch_free(float amax, int emax, int mantissa_bits,
                                                         float max_normal) {
  if constexpr (kRule == MxScaleRule::RCeil) {
    const uint32_t u = float_bits(amax * (1.0f / max_normal));
    const uint32_t exponent = (u >> 23) & 0xFFu, mantissa = u & 0x7FFFFFu;
    // Rounded up to the next power of two; 254 + 1 and Inf/NaN (255, or 256) give 255 = NaN.
    uint32_t rounded_up = exponent + static_cast<uint32_t>(mantissa != 0);
    rounded_up -= rounded_up >> 8;  // 256 -> 255
    // fp32 subnormal: up to 2^-126 or down to 2^-127. Chosen by a mask (GCC 12 kept a `?:` here
    // as a branch).
    const uint32_t subnormal = static_cast<uint32_t>(mantissa > 0x400000u);
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(exponent == 0);
    return static_cast<uint8_t>((subnormal & is_subnormal) | (rounded_up & ~is_subnormal));
  } else {
    uint32_t u = float_bits(amax) & 0x7FFFFFFFu;
    bool special = u >= 0x7F800000u;  // Inf or NaN amax
    if constexpr (kRule == MxScaleRule::Even) {
      u += 1u << (22 - mantissa_bits);  // round the amax to the element's mantissa width
      special = special || u >= 0x7F800000u;
    }
    int unbiased = static_cast<int>(u >> 23) - 127 - emax;  // exponent -127 for zero and subnormals
    if constexpr (kRule == MxScaleRule::Ceil) unbiased += static_cast<int>((u & 0x7FFFFFu) != 0);
    unbiased = unbiased < -127 ? -127 : (unbiased > 128 ? 128 : unbiased);
    return static_cast<uint8_t>(special ? 0xFF : unbiased + 127);
  }
}

/// An MX element times its block's inverse scale. A NaN element stays itself, sign included (x86's
/// product of two NaNs returns the first; a GPU returns a canonical +NaN): stated here, since a
/// compiler may swap a product's operands and the inverse of a block holding a NaN is NaN too.
/// NOTE: the product is computed for every x and chosen by a mask on the bits: GCC keeps a branch
/// for a `?:` between floats (-ftrapping-math), and then the CPU loops over a block vectorise only
/// with AVX-512's masked operations, not with AVX2.
MICROSCALE_HOST_DEVICE float mx_scaled_element(float x, float inverse) {
  const uint32_t product = float_bits(x * inverse), u = float_bits(x);
  const uint32_t is_nan = 0u - static_cast<uint32_t>((u & 0x7FFFFFFFu) > 0x7F800000u);
  return bits_to_float((u & is_nan) | (product & ~is_nan));
}

/// fp32 2^(127 - byte): the multiplier applied to a block's elements; NaN for byte 0xFF.
/// NOTE: chosen on the bits, without branches, so that CPU loops over blocks vectorise.
MICROSCALE_HOST_DEVICE float mx_inverse_scale(uint8_t byte) {
  uint32_t bits = static_cast<uint32_t>(254 - byte) << 23;  // (garbage for 0xFF, replaced below)
  bits = byte == 0xFE ? 0x00400000u : bits;                 // 2^-127, an fp32 subnormal
  bits = byte == 0xFF ? 0x7FC00000u : bits;                 // NaN
  return bits_to_float(bits);
}

}  // namespace microscale
