// Cheaper exact encoders for the device kernels, each equal bit for bit to a codec of
// core/element_codec.hpp on the inputs it is used for:
//  - e2m1x8_rn: eight E2M1Codec::encode_rn codes packed into a word (NaN: 0x7 without sign; for
//    NVFP4 any zero unsigned), about 9 instructions per element in the kernels
//    (tests/cpp/device_codec_test.cpp checks it on every tie and its neighbours; every fp32 input
//    was checked once).
//  - fp8x4_rn (device only): Hopper's cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32, equal to
//    E4M3Codec/E5M2Codec::encode_rn on FINITE inputs (both round to nearest even and saturate to
//    the largest finite code, and keep the sign of zero); they differ on Inf (encode_rn: E4M3 NaN
//    0x7F, E5M2 Inf 0x7C; satfinite: max) and NaN, which the MX kernels only meet in blocks whose
//    E8M0 scale is 0xFF (NaN amax or an overflowing scale), and those keep the software encoder.
//  - e4m3_scale (device only): the same E4M3 conversion for an NVFP4 block scale (finite, >= 0),
//    with the code's exact value back through f16.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#include "core/element_codec.hpp"
#include "microscale/host_device.hpp"

namespace microscale::cuda {

/// The fp32 sum whose bits r give the E2M1 magnitude code of |x| as (r + (r >> 22)) & 7, round to
/// nearest even. |x| is first clamped to 6 (the largest code: everything above rounds or
/// saturates to it; NaN becomes 6 too: its compare is false). The E2M1 magnitudes
/// {0, .5, 1, 1.5, 2, 3, 4, 6} are three uniform grids: step 0.5 below 2, 1 in [2, 4), 2 in
/// [4, 6]. Adding M = P + 6 ulp(P), P = 2^22 times the binade of max(|x|, 1) (2^22, 2^23 or 2^24),
/// rounds |x| to its grid, ties to even, in one fp32 add: the sum is P + (6 + k) ulp(P), k the
/// grid steps. The code is k plus 0, 2 or 4 by grid; the exponent of the sum tells the grid, and
/// (r + (r >> 22)) & 7 adds twice that exponent (149, 150 or 151 for P) to 6 + k, which is the
/// code modulo 8. Code parity is step parity, so ties to even agree. A clamp, a mask, an
/// add-and-max and the fp32 add (the kernels' instruction count is what limits them;
/// docs/perf.md, CUDA v9).
MICROSCALE_HOST_DEVICE float e2m1_grid_addend(float a) {                  // M for a = |x| clamped to 6
  const uint32_t m = (float_bits(a) & 0x7F800000u) + (0x0B000000u + 6u);  // P + 6 ulp for a >= 1
  return bits_to_float(m < 0x4A800006u ? 0x4A800006u : m);                // 2^22 + 6 ulp below 1
}

MICROSCALE_HOST_DEVICE uint32_t e2m1_grid_sum(float x) {
  const float a = fabsf(x) < 6.0f ? fabsf(x) : 6.0f;  // NaN -> 6
  return float_bits(a + e2m1_grid_addend(a));
}

/// The bits of 1.0f (0x3F800000) when x < 0 (so not for -0.0 nor NaN), else 0: what PTX's
/// set.lt.f32.f32 computes, one FSET on the device (the C++ compare and select takes two).
MICROSCALE_HOST_DEVICE uint32_t one_if_negative(float x) {
#ifdef __CUDA_ARCH__
  uint32_t one;
  asm("set.lt.f32.f32 %0, %1, 0f00000000;" : "=r"(one) : "f"(x));
  return one;
#else
  return x < 0.0f ? 0x3F800000u : 0u;
#endif
}

/// E2M1Codec::encode_rn's code of x with NVFP4's rule (any zero, -0.0 too, is code 0; NaN is
/// 0x7) and the value that code decodes to (E2M1Codec::decode's, -0.0 for code 0x8), for 4over6,
/// which needs both. The grid sum is M + k ulp(P), so sum - M = k ulp(P) is |x| rounded to its
/// grid, exactly (the two are in one binade).
MICROSCALE_HOST_DEVICE uint32_t e2m1_code_and_value(float x, float& value) {
  // |x| clamped to 6 on the bits (NaN patterns are above 6's): an integer min, which CPU loops
  // vectorise (a `?:` between floats stays a branch there).
  const uint32_t abs_bits = float_bits(x) & 0x7FFFFFFFu;
  const float a = bits_to_float(abs_bits < 0x40C00000u ? abs_bits : 0x40C00000u);
  const float m = e2m1_grid_addend(a);
  const float sum = a + m;
  const uint32_t r = float_bits(sum);
  const uint32_t sign = (one_if_negative(x) >> 26) & 8u;  // 0x3F800000 >> 26 = 0xF
  value = bits_to_float(float_bits(sum - m) | (sign << 28));
  return ((r + (r >> 22)) & 7u) | sign;
}

/// Eight E2M1 codes, round to nearest even, packed into one word with x[0] in the low nibble:
/// E2M1Codec::encode_rn of each x (saturating; NaN gives 0x7 without sign) and, with
/// kZeroUnsigned (the NVFP4 kernels' rule), any zero (-0.0 too) code 0. One code at a time, the
/// code, its sign and its packing took ~11 instructions per element in the kernels' SASS, these
/// take ~9 (8 per element, 3 per word; docs/perf.md, CUDA v10): here magnitudes and signs
/// are each shifted in from the top of a word (x[7] first: one funnel shift each), then one select
/// takes bit 3 of every nibble from the signs and bits 0-2 from the magnitudes:
///  - magnitude: the top 4 bits of r * (2^28 + 2^6) = (r << 28) + (r << 6), r = e2m1_grid_sum(x),
///    are (r + (r >> 22)) & 15 (no carry reaches bit 28 from below: r << 28 is zero there);
///  - sign, kZeroUnsigned: the top 4 bits of one_if_negative(x), 0b0011 (moved onto bit 3 at the
///    end), none for -0.0 and NaN;
///  - sign, otherwise: x's sign bit. Precondition: no x is a NaN with its sign bit set (the MX
///    kernels pass products, and the device's products with a NaN operand are the positive
///    canonical NaN).
template <bool kZeroUnsigned>
MICROSCALE_HOST_DEVICE uint32_t e2m1x8_rn(const float* x) {
  uint32_t magnitudes = 0, signs = 0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 7; i >= 0; --i) {
    magnitudes = (magnitudes << 4) | ((e2m1_grid_sum(x[i]) * 0x10000040u) >> 28);
    signs = (signs << 4) | ((kZeroUnsigned ? one_if_negative(x[i]) : float_bits(x[i])) >> 28);
  }
  if constexpr (kZeroUnsigned) signs <<= 2;  // 0b0011 -> 0b1100: the sign on bit 3
  return (signs & 0x88888888u) | (magnitudes & 0x77777777u);
}

#ifdef __CUDACC__
/// Four fp8 codes (element 0 in the low byte) of FINITE inputs, E4M3 (kE5M2 false) or E5M2.
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8x4_rn(float a0, float a1, float a2, float a3) {
  uint32_t w;
  if constexpr (kE5M2) {
    asm("{\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};\n\t}"
        : "=r"(w)
        : "f"(a0), "f"(a1), "f"(a2), "f"(a3));
  } else {
    asm("{\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};\n\t}"
        : "=r"(w)
        : "f"(a0), "f"(a1), "f"(a2), "f"(a3));
  }
  return w;
}

/// The E4M3 block scale code of a finite v >= 0 (RN, saturating at 448) and its exact value, by the
/// hardware conversions: cvt.rn.satfinite.e4m3x2.f32 is E4M3Codec::encode_rn on finite inputs
/// (fp8x4_rn above), and every E4M3 value is an f16 value (2^-9 .. 448), so the way back through
/// f16 is exact. Two conversions and a widening instead of ~20 integer operations per block.
__device__ __forceinline__ uint32_t e4m3_scale(float v, float& value) {
  uint16_t pair;  // the code in the low byte (the high one converts 0)
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(v));
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(pair));
  value = __half2float(__ushort_as_half(static_cast<unsigned short>(halves & 0xFFFFu)));
  return pair & 0xFFu;
}
#endif

}  // namespace microscale::cuda
