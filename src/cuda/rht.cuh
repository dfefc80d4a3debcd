// The 16-point RHT of NVFP4's columnwise operand on the device, equal bit for bit to
// cpu/rht.hpp's rht16: the exact sum of the 16 signed products, truncated toward zero to fp32,
// then rounded to nearest even to bf16.
//
// The CPU reference sums in double in i order; wherever every partial sum is exact, any order and
// any precision that holds them gives that same value. Two forms:
// - rht16_fp32 (first, in both kernels): the 4-stage fast Walsh-Hadamard butterfly (64 adds) in
//   fp32, proven exact after the sums, as the CPU's fast path does (cpu/quantize_nvfp4_avx512.cpp,
//   rht_unit_bf16). With bf16 inputs (8-bit significands; subnormal ones are multiples of the
//   smallest normal's ulp) times +-1/4, every partial sum is a multiple of 2^(e - 9), e the
//   exponent of the smallest nonzero |x| (-126 for a subnormal), so exact in fp32 below
//   2^(e + 15). Every partial sum is a mean of final outputs (a stage (a, b) -> (a + b, a - b)
//   gives back a = (u + v) / 2), so none exceeds the exact max |y_j|. An inexact sum thus means an
//   exact max above 2^(e + 15), and the computed outputs are within 15 x 2^-24 of the exact ones
//   relative to it: a computed max that rounds to at most (1 - 2^-7) 2^(e + 15) in bf16 proves
//   every sum exact. The reference's i-order double sums are then exact too (each below
//   16 max |y_j|, within 28 bits of 2^(e - 9)), so the fp32 outputs are the exact sums it
//   truncates: truncation changes none. Inf or NaN inputs, and sums that overflow, give an Inf or
//   NaN output, which fails that test. The outputs are rounded by the hardware
//   (cvt.rn.bf16x2.f32) and tested on their bf16 patterns. The test fails for about 1 chunk in
//   1000 on Gaussian-like data (wide exponent spreads, Inf, NaN); those take the second form.
// - rht16_inplace: in double, the butterfly when the chunk's exponent spread is at most 40 (every
//   partial sum of up to 16 terms is then a multiple of the smallest term's ulp below
//   2^(spread + 12) of them: exact in a 53-bit double), else the CPU's i-order loop itself.
// The fp32 form took the amax pass from 112 to 78 us (CUDA v8) and the quantize kernel's RHT call
// from 279 to 257 us (v9; in v8, with the kernel's unrolled code waiting on instruction fetch, it
// had been slower there).
#pragma once

#include <cstdint>

#include "core/scale_math.hpp"
#include "microscale/half.hpp"

namespace microscale::cuda {

/// The 4-stage fast Walsh-Hadamard butterfly on 16 values in registers (unnormalised: z = H16 z).
/// In fp32 the adds are plain adds: there are no products to contract (and --fmad=false).
template <typename T>
__device__ __forceinline__ void butterfly16(T (&z)[16]) {
#pragma unroll
  for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if ((i & h) == 0) {
        const T a = z[i], b = z[i + h];
        z[i] = a + b;
        z[i + h] = a - b;
      }
    }
  }
}

/// v: 16 bf16-exact values in i order (rows of a column chunk); replaced by RHT(v) rounded to bf16,
/// summed in double (the butterfly where exact there, else the CPU's i-order loop).
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
    butterfly16(y);
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

/// The signed coefficient of input i in the transform's first step, s_i / 4: -1/4 where bit i of
/// the sign mask is set.
__device__ __forceinline__ float rht_input_coefficient(uint16_t sign_mask, int i) {
  return ((sign_mask >> i) & 1u) ? -0.25f : 0.25f;
}

/// The 16 coefficients, held per thread for rht16_max_abs.
__device__ __forceinline__ void rht_input_coefficients(uint16_t sign_mask, float (&coefficient)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) coefficient[i] = rht_input_coefficient(sign_mask, i);
}

/// RHT(v) in fp32 (see the file comment) for 16 bf16 values v, `coefficient(i)` giving s_i / 4:
/// the outputs rounded to bf16 as pairs (output 2w in the low half of pairs[w], 2w + 1 in the high
/// half) and *max_abs16 the bf16 pattern of their max |y|; true where the sums are proven exact.
/// kPositiveZero: a -0.0 sum becomes +0.0 before the rounding, as the reference's sums (which start
/// at +0.0) are never -0.0; a tiny negative sum still rounds to -0.0 in bf16, as there.
template <bool kPositiveZero, typename Coefficient>
__device__ __forceinline__ bool rht16_fp32(const float (&v)[16], Coefficient coefficient,
                                           uint32_t (&pairs)[8], uint32_t* max_abs16) {
  uint32_t min_less_one = 0xFFFFFFFFu;  // of |x| bits shifted left by one (the sign dropped) less one
  float y[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    min_less_one = min(min_less_one, (float_bits(v[i]) << 1) - 1u);  // a zero wraps to all ones
    y[i] = __fmul_rn(v[i], coefficient(i));                          // exact
  }
  butterfly16(y);
  if constexpr (kPositiveZero) {
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = y[i] + 0.0f;
  }
  uint32_t max_pair = 0;  // per 16-bit half, the max |y| as a bf16 pattern
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pairs[w]) : "f"(y[2 * w + 1]), "f"(y[2 * w]));
    max_pair = __vmaxu2(max_pair, pairs[w] & 0x7FFF7FFFu);
  }
  *max_abs16 = max(max_pair & 0xFFFFu, max_pair >> 16);
  // (1 - 2^-7) 2^(e + 15) as a bf16 pattern: exponent field of e, plus 14, significand 1.1111110b.
  // An all-zero chunk reads field 0 (its outputs are zeros, exact); a subnormal one counts as 1.
  const uint32_t field = max((min_less_one + 1u) >> 24, 1u);
  const uint32_t limit = field + 14u >= 255u ? 0x7F7Fu : ((field + 14u) << 7) | 0x7Eu;
  return *max_abs16 <= limit;
}

/// max |RHT(v)| in fp32 (rht16_fp32) for 16 bf16 values v: true where the sums are proven exact,
/// then *max_abs16 is the bf16 pattern of the max |y|; false otherwise.
__device__ __forceinline__ bool rht16_fp32_max_abs(const float (&v)[16], const float (&coefficient)[16],
                                                   uint32_t* max_abs16) {
  uint32_t pairs[8];
  return rht16_fp32<false>(
      v, [&](int i) { return coefficient[i]; }, pairs, max_abs16);
}

/// v replaced by RHT(v) rounded to bf16 (the quantize kernel's outputs): in fp32 (rht16_fp32)
/// where its sums are proven exact, else by rht16_inplace.
__device__ __forceinline__ void rht16_outputs(float (&v)[16], uint16_t sign_mask) {
  uint32_t pairs[8], max_abs16;
  // The coefficients from the mask in place, not an array of 16 held per thread (as the amax pass
  // holds): this kernel sits at its register bound (95 registers for 5 CTAs/SM).
  if (!rht16_fp32<true>(
          v, [=](int i) { return rht_input_coefficient(sign_mask, i); }, pairs, &max_abs16)) {
    rht16_inplace(v, sign_mask);
    return;
  }
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    v[2 * w] = bits_to_float(pairs[w] << 16);
    v[2 * w + 1] = bits_to_float(pairs[w] & 0xFFFF0000u);
  }
}

/// max |RHT(v)| of a chunk (v as for rht16_inplace; `coefficient`: rht_input_coefficients), rounded
/// to bf16 as rht16_inplace's outputs are, NaN outputs skipped as max_abs_skip_nan does.
__device__ __forceinline__ float rht16_max_abs(const float (&v)[16], const float (&coefficient)[16],
                                               uint16_t sign_mask) {
  uint32_t max_abs16;
  if (rht16_fp32_max_abs(v, coefficient, &max_abs16)) return bits_to_float(max_abs16 << 16);
  float y[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) y[i] = v[i];
  rht16_inplace(y, sign_mask);
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(y[i]));
  return m;
}

}  // namespace microscale::cuda
