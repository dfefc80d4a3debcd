// The portable MXFP8 kernel for bf16 and f16 inputs (quantize_mx16.cpp), used
// by the portable fast path (quantize_mx.cpp) band by band.
#pragma once

#include <cstdint>

#include "core/input_matrix.hpp"
#include "cpu/quantize_kernels.hpp"  // MxParams
#include "microscale/quantize.hpp"

namespace microscale::cpu {

/// Whether quantize_mx16_band takes inputs like `x` for `scheme`: MXFP8 (E4M3, E5M2), bf16 or f16
/// with contiguous rows.
bool mx16_applies(const InputMatrix& x, Scheme scheme);

/// Quantizes rows [first_row, first_row + rows) of `x` (rows <= 32; 32 when columnwise, and
/// first_row a multiple of 32) into the requested outputs of `out` (compact layout), as
/// quantize_mx_ref does. Only where mx16_applies.
void quantize_mx16_band(const InputMatrix& x, int64_t first_row, int rows, const QuantizeOptions& o,
                        const MxParams& p, QuantizedTensor& out);

}  // namespace microscale::cpu
