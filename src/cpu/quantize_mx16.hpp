// The portable MXFP8 and MXFP4 kernel for bf16 and f16 inputs (quantize_mx16.cpp), also MXFP6 where
// the CPU has AVX2, which the portable fast path (quantize_mx.cpp) runs where it applies.
#pragma once

#include <cstdint>

#include "core/input_matrix.hpp"
#include "cpu/quantize_kernels.hpp"  // MxParams
#include "microscale/quantize.hpp"

namespace microscale::cpu {

/// Whether quantize_mx16 takes inputs like `x` for `scheme` (1-D blocks or 32x32 tiles): MXFP8
/// (E4M3, E5M2), MXFP4, or MXFP6 (E2M3, E3M2) where kernel_set() says Avx2 or better; bf16 or f16
/// with contiguous rows, the last dim a multiple of 32.
bool mx16_applies(const InputMatrix& x, Scheme scheme);

/// Quantizes `x` into the requested outputs of `out` (compact layout), as quantize_mx_ref does.
/// Only where mx16_applies.
void quantize_mx16(const InputMatrix& x, const QuantizeOptions& o, const MxParams& p, QuantizedTensor& out);

}  // namespace microscale::cpu
