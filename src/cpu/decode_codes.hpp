// Vectorised decode of block-scaled codes into fp32 values (the CPU GEMM's K-panels, dequantize):
// each element is its code's value (core/element_codec.hpp, branch-free) times its block's scale,
// the same fp32 product as the reference paths' table lookups (OperandReader::at,
// dequantize_ref), so they agree bit for bit (a NaN's bits aside where a NaN code meets a NaN
// scale: which one a product passes on is the multiply's operand order). One decode per element,
// in vector registers, where a table lookup per element left the loops scalar.
#pragma once

#include <cstdint>

#include "microscale/quantize.hpp"

namespace microscale::cpu {

/// Rows of a transposed operand decoded together (decode_columns): a group's codes of one K index
/// are contiguous bytes.
constexpr int kColumnGroup = 16;

/// out[j] = value(code of element first + j) * block_scales[j / block] for j < count, where
/// `row` holds a K-major row's codes (one a byte; FP4: two a byte, the low nibble first), first
/// and count are multiples of the scheme's block, and block_scales has count / block values.
/// Returns the OR of the codes' bits that no code of the format sets (nonzero: invalid bytes).
unsigned decode_row(Scheme scheme, const uint8_t* row, int64_t first, int64_t count,
                    const float* block_scales, float* out);

/// Rows r0 + i (i < rows <= kColumnGroup) of a transposed operand, whose codes are stored
/// [K, stored row bytes] with logical row r in stored column r (FP4: nibble r % 2 of byte r / 2):
/// out[i][j] = value(code of (K index j, row r0 + i)) * block_scales[(j / block) * kColumnGroup + i]
/// for j < count (a multiple of the block). `codes` points at K index 0 of row r0 (r0 even for
/// FP4), consecutive K indices `stride` bytes apart. Returns the OR of the invalid bits, as
/// decode_row.
unsigned decode_columns(Scheme scheme, const uint8_t* codes, int64_t stride, int rows, int64_t count,
                        const float* block_scales, float* const* out);

/// out[j] = value(code j) * scales[j] for j < count: one scale per element (MX columnwise data,
/// whose blocks run along the rows, read a row at a time). `codes` as decode_row's `row` from
/// element 0 (count even for FP4). Returns the OR of the invalid bits, as decode_row.
unsigned decode_scaled(Scheme scheme, const uint8_t* codes, int64_t count, const float* scales, float* out);

}  // namespace microscale::cpu
