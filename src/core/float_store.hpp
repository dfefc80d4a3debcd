// store_float: an fp32 value written into an f32, bf16 or f16 buffer, rounded once (RNE).
#pragma once

#include <cstdint>

#include "microscale/half.hpp"
#include "microscale/tensor.hpp"

namespace microscale {

/// Writes v, rounded to `dtype`, as element i of `data`. False (nothing written) for any dtype but
/// f32, bf16 and f16: each caller says in its own words what it needed.
inline bool store_float(DType dtype, void* data, int64_t i, float v) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(data)[i] = v; return true;
    case DType::BF16: static_cast<uint16_t*>(data)[i] = float_to_bf16(v); return true;
    case DType::F16: static_cast<uint16_t*>(data)[i] = float_to_half(v); return true;
    default: return false;
  }
}

/// v rounded once to `dtype` (f32, bf16 or f16; any other dtype leaves v as it is) and read back.
inline float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::BF16: return bf16_to_float(float_to_bf16(v));
    case DType::F16: return half_to_float(float_to_half(v));
    default: return v;
  }
}

}  // namespace microscale
