// What every reader of a QuantizedTensor (dequantize, dequantize_ref) does first: check that its
// fields agree (a struct filled in by hand may not), and get one usage's scales in the compact
// layout whatever layout it holds (defined in quantize.cpp, beside the shapes they check against),
// and look its scale bytes up (scale_byte_values, here).
#pragma once

#include <array>
#include <cstdint>

#include "microscale/format.hpp"
#include "microscale/quantize.hpp"

namespace microscale {

/// Throws Error unless q's fields agree for `usage`: a known scheme and layout, a blockable
/// [rows, cols], and u8 data and scales of the sizes quantize gives them. Reading it then stays
/// inside its tensors.
void check_consistent(const QuantizedTensor& q, Usage usage);

/// One usage's scales, compact: [rows, cols / block] (NVFP4 columnwise: of X^T), or [rows / block,
/// cols] for MX columnwise. q's own tensor when it holds them compact, else an unswizzled copy.
Tensor compact_scales(const QuantizedTensor& q, Usage usage);

/// Every scale byte's value for `scheme`, for readers to look up: E4M3 (NVFP4: a block's factor is
/// this times S_dec) or E8M0's 2^(byte - 127), NaN for 0xFF (MX). 2^-127 is subnormal: make it
/// where subnormals are kept (fp_environment.hpp).
inline std::array<float, 256> scale_byte_values(Scheme scheme) {
  const Format format = is_mx(scheme) ? Format::E8M0 : Format::E4M3;
  std::array<float, 256> values{};
  for (int byte = 0; byte < 256; ++byte) values[byte] = decode(format, static_cast<uint8_t>(byte));
  return values;
}

}  // namespace microscale
