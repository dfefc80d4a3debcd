// What every reader of a QuantizedTensor (dequantize, dequantize_ref) does first: check that its
// fields agree (a struct filled in by hand may not), and get one usage's scales in the compact
// layout whatever layout it holds. Defined in quantize.cpp, beside the shapes they check against.
#pragma once

#include "microscale/quantize.hpp"

namespace microscale {

/// Throws Error unless q's fields agree for `usage`: a known scheme and layout, a blockable
/// [rows, cols], and u8 data and scales of the sizes quantize gives them. Reading it then stays
/// inside its tensors.
void check_consistent(const QuantizedTensor& q, Usage usage);

/// One usage's scales, compact: [rows, cols / block] (NVFP4 columnwise: of X^T), or [rows / block,
/// cols] for MX columnwise. q's own tensor when it holds them compact, else an unswizzled copy.
Tensor compact_scales(const QuantizedTensor& q, Usage usage);

}  // namespace microscale
