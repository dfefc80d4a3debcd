// One NVFP4 block on the device: E4M3 block scale from the block amax, then 16 E2M1 codes (RN or
// SR), packed two per byte. The same fp32 operations, in the same order, as the CPU backend
// (cpu/quantize_nvfp4.cpp): the formulas come from core/scale_math.hpp, the encoders from
// core/element_codec.hpp.
#pragma once

#include <cfloat>
#include <cstdint>

#include "core/element_codec.hpp"
#include "core/scale_math.hpp"
#include "cuda/fast_codec.cuh"
#include "microscale/philox.hpp"

namespace microscale::cuda {

/// Global scale state of one direction.
struct Nvfp4Global {
  float multiplier;  // RN(S_enc * RN(1/6))
  float s_dec;       // RN(1 / S_enc)
};

__device__ __forceinline__ Nvfp4Global nvfp4_global(float amax) {
  const float s_enc = nvfp4_global_encode_scale(amax);
  return {nvfp4_block_scale_multiplier(s_enc), 1.0f / s_enc};
}

/// Encodes the 16 values `v` of a block with amax `block_amax` into words[0..1] (8 bytes, even
/// element in the low nibble); returns the E4M3 scale code. With `sr`, `random` holds the block's
/// Philox words; otherwise round to nearest even.
__device__ __forceinline__ uint32_t nvfp4_encode_block(const float (&v)[16], float block_amax,
                                                       const Nvfp4Global& g, bool sr,
                                                       const uint32_t (&random)[4], uint32_t (&words)[2]) {
  // Finite and >= 0: block_amax is >= 0 and never NaN, an Inf product is clamped.
  float scale_value;
  const uint32_t scale_code = e4m3_scale(fminf(block_amax * g.multiplier, FLT_MAX), scale_value);
  const float encode_scale = nvfp4_block_encode_scale(scale_value, g.s_dec);
  if (!sr) {  // round to nearest even: encode_rn with the same zero rule (fast_codec.cuh)
    float scaled[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) scaled[i] = v[i] * encode_scale;
    words[0] = e2m1x8_rn<true>(scaled);
    words[1] = e2m1x8_rn<true>(scaled + 8);
    return scale_code;
  }
  words[0] = words[1] = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float scaled = v[i] * encode_scale;
    uint32_t code = E2M1Codec::encode_sr(scaled, (random[i / 4] >> (8 * (i % 4))) & 0xFFu);
    code = scaled == 0.0f ? 0u : code;  // any zero (-0.0 too) is code 0
    words[i / 8] |= code << (4 * (i % 8));
  }
  return scale_code;
}

}  // namespace microscale::cuda
