// NVFP4 codes to exact fp16 values on the device, for the GEMM kernels that multiply them with
// fp16 tensor-core instructions (gemm_nvfp4.cu: wgmma from shared memory; gemm_nvfp4_skinny.cu:
// mma.sync from registers). Hopper has no FP4 and no block-scaled MMA.
//
// Exactness: an E2M1 code c with magnitude bits m (3 bits) and sign s becomes the fp16 bit pattern
// s<<15 | m<<9, whose value is e2m1(c) * 2^-14 (the code's exponent and mantissa bits land in
// fp16's, and the subnormal code 0.5 lands on fp16's subnormal 2^-15). One fp16 multiply by the
// block scale (E4M3 -> fp16 is exact) then gives e2m1 * scale * 2^-14, which fp16 holds exactly:
// the product has at most 6 significant bits, its smallest step is 0.5 * 2^-9 * 2^-14 = 2^-24
// (fp16's subnormal step) and its largest value 6 * 448 * 2^-14 < 1. The tensor cores multiply
// those fp16 values exactly and accumulate in fp32, so an accumulator holds sum(a * b) * 2^-28;
// the kernels scale it back by 2^28 (exact) before alpha, as core/gemm.cpp does on the CPU. A NaN
// scale (E4M3 0x7F / 0xFF) becomes an fp16 NaN and reaches the sum.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace microscale::cuda {

/// 8 codes (one 32-bit word, code q in bits 4q..4q+3) times a block scale -> 4 fp16 pairs, pair q
/// = (code q, code q + 4) * scale * 2^-14, exactly. Per pair: `t` holds each code's 4 bits at
/// fp16 bits 9-12 (magnitude at 9-11, sign at 12); adding 7 times the sign bit carries it from
/// bit 12 to bit 15 and leaves bits 12-14 clear: s<<15 | m<<9. Both GEMM kernels permute K alike
/// in their two operands (code q beside code q + 4), so the sum over K is the same.
__device__ __forceinline__ uint4 nvfp4_word_to_fp16_pairs(uint32_t w, __half2 scale) {
  uint32_t out[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t shifted = q < 3 ? w << (9 - 4 * q) : w >> 3;  // code q at bits 9-12, q + 4 at 25-28
    const uint32_t t = shifted & 0x1E001E00u;
    const uint32_t bits = t + (t & 0x10001000u) * 7u;
    __half2 h = __hmul2(*reinterpret_cast<const __half2*>(&bits), scale);
    out[q] = *reinterpret_cast<uint32_t*>(&h);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

/// Two E4M3 block scale codes (`low` byte, `high` byte) as fp16 pairs that broadcast each: the
/// multipliers of nvfp4_word_to_fp16_pairs.
struct ScalePair {
  __half2 low, high;
};
__device__ __forceinline__ ScalePair e4m3_scale_pair(uint32_t low, uint32_t high) {
  const auto pair = static_cast<__nv_fp8x2_storage_t>(low | (high << 8));
  const __half2 both = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
  return {__low2half2(both), __high2half2(both)};
}

}  // namespace microscale::cuda
