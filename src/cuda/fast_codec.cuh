// Cheaper exact encoders for the device kernels, each equal bit for bit to a codec of
// core/element_codec.hpp on the inputs it is used for:
//  - e2m1_rn: E2M1Codec::encode_rn on every fp32 input (checked exhaustively over all 2^32 bit
//    patterns against encode_rn, see the comment below); ~11 integer/fp32 operations instead of ~18.
//  - fp8x4_rn (device only): Hopper's cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32, equal to
//    E4M3Codec/E5M2Codec::encode_rn on FINITE inputs (both round to nearest even and saturate to
//    the largest finite code, and keep the sign of zero); they differ on Inf (encode_rn: E4M3 NaN
//    0x7F, E5M2 Inf 0x7C; satfinite: max) and NaN, which the MX kernels only meet in blocks whose
//    E8M0 scale is 0xFF (NaN amax or an overflowing scale), and those keep the software encoder.
#pragma once

#include <cstdint>

#include "core/element_codec.hpp"
#include "microscale/host_device.hpp"

namespace microscale::cuda {

/// E2M1 round to nearest even (saturating, NaN -> 0x7 without sign, as E2M1Codec::encode_rn).
/// The E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} are three uniform grids: step 0.5 below 2,
/// step 1 in [2, 4), step 2 from 4. Adding the magic 2^22 / 2^23 / 2^24 (the binade of |x| moved up
/// 22, clamped to those three) rounds |x| to its grid with ties to even in one fp32 add; the bit
/// difference counts grid steps, and the offset 0 / 2 / 4 makes it the code (code parity = step
/// parity, so ties to even agree). Inf and NaN give a huge difference, clamped to 7.
/// With kZeroUnsigned, any zero (-0.0 too) gives code 0 (the NVFP4 kernels' rule).
template <bool kZeroUnsigned = false>
MICROSCALE_HOST_DEVICE uint32_t e2m1_rn(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t m = (a & 0x7F800000u) + (22u << 23);  // unsigned: Inf/NaN wrap above 2^24's bits
  m = m < 0x4A800000u ? 0x4A800000u : m;         // 2^22
  m = m > 0x4B800000u ? 0x4B800000u : m;         // 2^24
  const uint32_t r = float_bits(bits_to_float(a) + bits_to_float(m));
  uint32_t code = r - m + ((m - 0x4A800000u) >> 22);
  code = code > 7u ? 7u : code;
  // Sign: not for NaN (encode_rn's NaN code is +max), and with kZeroUnsigned not for zeros.
  const bool signed_ok = kZeroUnsigned ? (a - 1u) < 0x7F800000u : a <= 0x7F800000u;
  return code | (signed_ok ? (u >> 28) & 8u : 0u);
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
#endif

}  // namespace microscale::cuda
