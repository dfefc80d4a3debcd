// The 16-point random Hadamard transform of NVFP4's columnwise (wgrad) operands.
//
// y_j = 0.25 * sum_i s_i * (-1)^popcount(i & j) * x_i, with s_i = -1 where bit i of the sign mask
// is set (TE: 0xD7E8). Every product is exact and the sum is taken in double in i order (exact for
// any realistic range of 16 bf16 values). It then goes to bf16 the way TE's reference output does:
// truncated toward zero to fp32, then rounded to nearest even to bf16. Two golden cases pin this
// down and rule out both "fp32 RN, then bf16" and "one RN to bf16": nvfp4_23 has an exact sum of
// -171.49999618 (golden -171; fp32 RN would give the tie -171.5 and then -172) and nvfp4_31 has
// 150.50000083 (golden 150; a single rounding gives 151). A tensor-core fp32 accumulator, which
// truncates, behaves this way. Every backend calls these functions.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

#include "microscale/half.hpp"

namespace microscale {

/// Sign (+1 / -1) of Hadamard-with-signs entry (i, j).
/// NOTE: written with integer xor on purpose: GCC 12 at -O1/-O2 folds the equivalent
/// `bool != (popcount(i & j) & 1)` form to a constant once inlined (seen on Debian's 12.2).
inline double rht_sign(uint16_t sign_mask, int i, int j) {
  const unsigned parity = static_cast<unsigned>(std::popcount(static_cast<unsigned>(i & j)));
  const unsigned negative = (static_cast<unsigned>(sign_mask >> i) ^ parity) & 1u;
  return negative ? -1.0 : 1.0;
}

/// Narrows a double to fp32, rounding toward zero.
inline float truncate_to_f32(double d) {
  const float f = static_cast<float>(d);  // round to nearest
  if (std::fabs(static_cast<double>(f)) <= std::fabs(d)) return f;
  return bits_to_float(float_bits(f) - 1u);  // one ulp back toward zero
}

/// The exact 16-term sum of output j, narrowed as TE's reference does (see above).
inline float rht_output_to_bf16_value(double exact_sum) {
  return bf16_to_float(float_to_bf16(truncate_to_f32(exact_sum)));
}

/// The 16x16 matrix as the reference applies it: [i * 16 + j] = s_i (-1)^popcount(i & j) / 4.
/// Column j = 0 is s_i / 4, the input signs a butterfly applies before its stages.
using RhtCoefficients = std::array<double, 256>;

inline RhtCoefficients rht_coefficients(uint16_t sign_mask) {
  RhtCoefficients c{};
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) c[i * 16 + j] = rht_sign(sign_mask, i, j) * 0.25;
  }
  return c;
}

/// Output j of the RHT of x[0], x[stride], ..., x[15 * stride], summed in double in i order (the
/// reference's order) and rounded as TE's reference output (see above).
inline float rht_output_reference_order(const RhtCoefficients& c, const float* x, int64_t stride, int j) {
  double sum = 0.0;
  for (int i = 0; i < 16; ++i) sum += c[i * 16 + j] * x[i * stride];
  return rht_output_to_bf16_value(sum);
}

/// The 4-stage butterfly in place: z_j <- sum_i (-1)^popcount(i & j) z_i (Sylvester order), on
/// double, float or a GCC/Clang vector type (__m512, __m512d: + and - are the IEEE lane
/// operations). Equal to the reference's sums wherever every partial sum is exact.
template <typename T>
[[gnu::always_inline]] inline void fwht16(T z[16]) {
  // NOTE: unrolled, z stays in registers (rolled, GCC 12 kept it on the stack, indexed).
#pragma GCC unroll 4
  for (int h = 1; h < 16; h <<= 1) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if ((i & h) != 0) continue;
      const T p = z[i], q = z[i + h];
      z[i] = p + q;
      z[i + h] = p - q;
    }
  }
}

/// y = RHT(x) for one 16-vector, each output rounded to bf16 and returned as its exact fp32 value.
inline void rht16(const float x[16], uint16_t sign_mask, float y[16]) {
  const RhtCoefficients c = rht_coefficients(sign_mask);
  for (int j = 0; j < 16; ++j) y[j] = rht_output_reference_order(c, x, 1, j);
}

}  // namespace microscale
