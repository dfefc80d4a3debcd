// microscale/layout.hpp — scale layouts: compact and the cuBLAS 128x4 swizzled ("blocked") layout.
//
// A compact scale matrix S is [R, C] row-major, one byte per block. The GEMM-facing layout pads it
// to [Rp, Cp] = [roundup(R, 128), roundup(C, 4)] with zero bytes and stores 128x4 tiles, row tile
// major; inside a tile, row r and column c land at (r % 32) * 16 + (r / 32) * 4 + c. As a CuTe-style
// layout of the padded matrix:
//   (R, C) = ((32, 4, Rp/128), (4, Cp/4)) : ((16, 4, 512 * Cp/4), (1, 512))
// This is cuBLAS's "1D block scaling factors layout", TE's gemm_swizzled_scale_idx and torchao's
// to_blocked (numerics-te.md §5, numerics-mx.md §5).
#pragma once

#include <cstdint>

#include "microscale/tensor.hpp"

namespace microscale {

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

/// @brief Padded scale shape for the swizzled layout: [roundup(rows, 128), roundup(cols, 4)].
inline int64_t swizzled_rows(int64_t rows) { return round_up(rows, 128); }
inline int64_t swizzled_cols(int64_t cols) { return round_up(cols, 4); }

/// @brief Byte offset of compact entry (r, c) in the swizzled buffer of a matrix with `cols` columns.
inline int64_t swizzled_offset(int64_t r, int64_t c, int64_t cols) {
  const int64_t tiles_per_row = swizzled_cols(cols) / 4;
  return ((r / 128) * tiles_per_row + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

/// @brief Compact u8 [R, C] -> swizzled u8 [roundup(R,128), roundup(C,4)] (zero padding).
Tensor swizzle_scales(const TensorView& compact);

/// @brief Swizzled u8 buffer of a [rows, cols] scale matrix -> compact u8 [rows, cols].
Tensor unswizzle_scales(const TensorView& swizzled, int64_t rows, int64_t cols);

}  // namespace microscale
