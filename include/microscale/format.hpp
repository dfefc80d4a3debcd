// microscale/format.hpp — element and scale formats as one table.
//
// Every small float format used by the OCP MX and NVFP4 schemes is described by one FormatInfo row
// (sign, exponent and mantissa widths, bias, special-value policy). Decoding, round-to-nearest-even
// encoding with saturation (satfinite) and 8-bit stochastic rounding are derived from that row, so
// adding a format is adding a line. See docs/formats.md for the per-format tables and
// ../shared/spec/numerics-{te,mx}.md for where each rule comes from.
#pragma once

#include <cstdint>
#include <string_view>

namespace microscale {

/// @brief The small float formats, by their bit layout.
enum class Format : uint8_t {
  E2M1,   ///< FP4: 1.2.1, bias 1, max 6, no Inf/NaN (MXFP4, NVFP4 elements)
  E2M3,   ///< FP6: 1.2.3, bias 1, max 7.5, no Inf/NaN
  E3M2,   ///< FP6: 1.3.2, bias 3, max 28, no Inf/NaN
  E4M3,   ///< FP8 "fn": 1.4.3, bias 7, max 448, NaN = S.1111.111, no Inf
  E5M2,   ///< FP8: 1.5.2, bias 15, max 57344, IEEE-style Inf and NaN
  E8M0,   ///< MX scale: 8 exponent bits, bias 127, value 2^(code-127), 0xFF = NaN, no zero
  UE4M3,  ///< NVFP4 block scale as cuBLAS names it: E4M3 with the sign bit fixed to 0
};

/// @brief How a format spends its top codes on special values.
enum class Specials : uint8_t {
  None,         ///< every code is finite (E2M1, E2M3, E3M2)
  NanOnlyOnes,  ///< exponent and mantissa all ones = NaN, no Inf (E4M3 fn, UE4M3)
  Ieee,         ///< exponent all ones: mantissa 0 = Inf, else NaN (E5M2)
  NanCodeFF,    ///< unsigned exponent-only format, code 0xFF = NaN (E8M0)
};

/// @brief One row of the format table.
struct FormatInfo {
  std::string_view name;  ///< "e2m1", "e4m3", ...
  int bits;               ///< code width in bits (4, 6, 8; 7 for UE4M3); one code per byte
  bool has_sign;          ///< sign bit at position bits-1
  int exponent_bits;
  int mantissa_bits;
  int bias;
  Specials specials;
  float max_normal;     ///< largest finite magnitude
  float min_normal;     ///< smallest normal magnitude
  float min_subnormal;  ///< smallest nonzero magnitude (== min_normal when there are no subnormals)
  int emax;             ///< exponent of max_normal (the OCP "emax_elem")
  uint8_t max_code;     ///< code of +max_normal
  uint8_t nan_code;     ///< positive NaN code, or the code a NaN input maps to when there is no NaN
};

/// @brief The table row of a format.
const FormatInfo& format_info(Format format);

/// @brief Parses "e2m1", "e4m3", ... (case-insensitive); throws microscale::Error otherwise.
Format parse_format(std::string_view name);

/// @brief Exact value of a code (NaN for NaN codes, +-Inf for E5M2 Inf). Codes beyond the format's
/// width throw microscale::Error.
float decode(Format format, uint8_t code);

/// @brief Round-to-nearest-even with saturation to +-max (satfinite).
///
/// Finite values beyond max saturate; Infs are not clamped (OCP MX, torch's casts): E5M2 keeps
/// +-Inf, E4M3/UE4M3 (no Inf) give NaN, E2M1/E2M3/E3M2 (no specials) give +-max. NaN maps to the NaN code
/// (sign kept) where the format has one; E2M1/E2M3/E3M2 have none and map NaN to +max, as the
/// Hopper/Blackwell cvt instructions do. The sign of zero is kept (-0.0 -> the negative-zero code). E8M0
/// (unsigned) rounds the exponent to nearest, ties up; zero, negatives and values below 2^-127 give code 0.
uint8_t encode_rn(Format format, float x);

/// @brief Stochastic rounding with 8 random bits, TransformerEngine's rule (numerics-te.md §4).
///
/// With a = |x| and q the grid spacing at a, the result is the grid point at or below
/// a + (random_bits / 256) * q, saturated to max, with the sign of x. P(round up) is the fraction
/// of the way from the lower grid point, quantised to 1/256. NaN maps as in encode_rn; +-Inf
/// saturates to +-max (TE's SR emulation).
/// Only meaningful for the element formats (not E8M0/UE4M3, which throw).
uint8_t encode_sr(Format format, float x, uint8_t random_bits);

}  // namespace microscale
