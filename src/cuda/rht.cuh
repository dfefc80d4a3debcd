// The 16-point RHT of NVFP4's columnwise operand on the device, equal bit for bit to
// cpu/rht.hpp's rht16: the exact sum of the 16 signed products, truncated toward zero to fp32,
// then rounded to nearest even to bf16.
//
// The CPU sums in double in i order. When every partial sum is exact, any order gives that same
// double, so the device runs the 4-stage fast Walsh-Hadamard butterfly (64 adds, not 256) when the
// chunk's exponents guarantee exactness, and the CPU's i-order loop otherwise (wide exponent
// spread, Inf or NaN): with bf16 inputs (8-bit significands) every partial sum of up to 16 terms
// is an integer multiple of the smallest term's ulp below 2^(spread + 12) of them, exact in a
// 53-bit double while the spread of exponent fields is <= 41 (we use 40).
#pragma once

#include <cstdint>

#include "core/scale_math.hpp"
#include "microscale/half.hpp"

namespace microscale::cuda {

/// v: 16 bf16-exact values in i order (rows of a column chunk); replaced by RHT(v) rounded to bf16.
__device__ __forceinline__ void rht16_inplace(float (&v)[16], uint16_t sign_mask) {
  int emax = 0, emin = 255;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t u = float_bits(v[i]) & 0x7FFFFFFFu;
    const int e = static_cast<int>(u >> 23);
    const int e_eff = e > 1 ? e : 1;  // subnormals share the ulp of exponent field 1
    emax = e > emax ? e : emax;
    emin = (u != 0 && e_eff < emin) ? e_eff : emin;
  }
  double y[16];
  if (emax < 255 && emax - emin <= 40) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float signed_x = ((sign_mask >> i) & 1u) ? -v[i] : v[i];
      y[i] = static_cast<double>(signed_x);
    }
#pragma unroll
    for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        if ((i & h) == 0) {
          const double a = y[i], b = y[i + h];
          y[i] = a + b;
          y[i + h] = a - b;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) y[j] = y[j] * 0.25;  // exact
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      double sum = 0.0;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const unsigned negative =
            ((static_cast<unsigned>(sign_mask) >> i) ^ static_cast<unsigned>(__popc(i & j))) & 1u;
        const double coefficient = (negative ? -1.0 : 1.0) * 0.25;
        sum = sum + coefficient * static_cast<double>(v[i]);
      }
      y[j] = sum;
    }
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    // + 0.0f: the CPU's sum starts at +0.0 and so is never -0.0; the butterfly can give -0.0.
    const float truncated = __double2float_rz(y[j]) + 0.0f;
    v[j] = bf16_to_float(float_to_bf16(truncated));
  }
}

}  // namespace microscale::cuda
