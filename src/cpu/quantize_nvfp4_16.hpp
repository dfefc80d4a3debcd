// The portable NVFP4 kernel for bf16 and f16 inputs (quantize_nvfp4_16.cpp), which the portable
// fast path (quantize_nvfp4.cpp) runs where it applies.
#pragma once

#include "core/input_matrix.hpp"
#include "microscale/quantize.hpp"

namespace microscale::cpu {

/// Whether quantize_nvfp4_16 takes this call: bf16 or f16 input with contiguous rows, the last dim
/// a multiple of 16, round to nearest (no stochastic rounding); the RHT for bf16.
bool nvfp4_16_applies(const InputMatrix& x, const QuantizeOptions& o);

/// Quantizes `x` into the requested outputs of `out` (compact layout) and sets its amaxes, as
/// quantize_nvfp4_ref does. Only where nvfp4_16_applies.
void quantize_nvfp4_16(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out);

}  // namespace microscale::cpu
