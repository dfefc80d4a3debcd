// CPU quantization kernels: the reference (_ref, plain loops) and the fast path (threads + SIMD).
//
// The caller (src/core/quantize.cpp) has validated the options and shapes and allocated every
// requested output in the compact layout (see quantize.hpp for shapes); kernels fill them in and
// set the NVFP4 amaxes. Scale swizzling happens afterwards in the core.
#pragma once

#include "core/input_matrix.hpp"
#include "core/scale_math.hpp"
#include "microscale/quantize.hpp"

namespace microscale::cpu {

inline MxScaleRule mx_scale_rule(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::Floor: return MxScaleRule::Floor;
    case ScaleMode::Ceil: return MxScaleRule::Ceil;
    case ScaleMode::Even: return MxScaleRule::Even;
    case ScaleMode::RCeil: break;
  }
  return MxScaleRule::RCeil;
}

void quantize_nvfp4_ref(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);
void quantize_mx_ref(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);

void quantize_nvfp4(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);
void quantize_mx(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);

}  // namespace microscale::cpu
