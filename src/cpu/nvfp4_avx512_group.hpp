// The AVX-512 NVFP4 quantizer's unit of threading, a group of up to 256 input rows, with its
// direction scales and the stages that hold its outputs until whole 64-byte lines can be written;
// the band prefetch both passes use. Part of quantize_nvfp4_avx512.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/avx512.hpp"
#include "cpu/avx512_codecs.hpp"
#include "cpu/rht.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_nvfp4_avx512.cpp is the one translation
// unit that includes the nvfp4_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

constexpr int kBlock = 16;

// A direction's global-scale terms (see nvfp4_block_scales).
struct DirectionScales {
  float multiplier = 0.0f;  // RN(S_enc * RN(1/6))
  float s_dec = 0.0f;       // RN(1 / S_enc)
  Nvfp4EncodeScaleTable encode_scale;
};

DirectionScales direction_scales(float amax) {
  const float s_enc = nvfp4_global_encode_scale(amax);
  const float s_dec = 1.0f / s_enc;
  return {nvfp4_block_scale_multiplier(s_enc), s_dec, nvfp4_encode_scale_table(s_dec)};
}

// A group of up to 256 input rows (16 bands of 16) and everything it produces. Groups are the
// unit of threading; see kGroupBands for why 256.
struct Group {
  const std::byte* src = nullptr;  // row 0 of the group
  int64_t row_bytes = 0;           // input row stride in bytes
  int rows = 0;                    // <= 256; M % 16 rows in the last band of a rowwise-only input
  int64_t k = 0;
  bool tile_2d = false;
  const RhtCoefficients* rht = nullptr;    // columnwise through the RHT when set
  const float* rht_input_scale = nullptr;  // [16] with the RHT: s_i / 4 (column 0 of *rht) in fp32
  // Rowwise (row_data null: not requested): group row r at row_data + r * row_data_stride (K/2
  // bytes) and row_scale + r * row_scale_stride (K/16 bytes).
  uint8_t* row_data = nullptr;
  int64_t row_data_stride = 0;
  uint8_t* row_scale = nullptr;
  int64_t row_scale_stride = 0;
  DirectionScales row;
  // Columnwise (col_data null: not requested): band b of the group is block 16g + b of every
  // columnwise row c: its 8 bytes at col_data + c * col_data_stride + 8b, its scale at
  // col_scale + c * col_scale_stride + b (col_data and col_scale point at the group's block 0).
  uint8_t* col_data = nullptr;
  int64_t col_data_stride = 0;
  uint8_t* col_scale = nullptr;
  int64_t col_scale_stride = 0;
  DirectionScales col;
  // Whole 64-byte data lines bypass the caches (see quantize_with in
  // quantize_nvfp4_avx512.cpp).
  bool row_stream = false, col_stream = false;
  // 16x16 tiles: each unit's two tile maxes, kept by pass 1 for pass 2 (null: pass 2 computes
  // them; see unit_tile_maxes). Band b's unit u (columns 32u..32u+31) at
  // tile_maxes + 2 * (b * units_per_band + u).
  uint16_t* tile_maxes = nullptr;
  int64_t units_per_band = 0;
};

// 16 bands x 8 bytes: two 64-byte lines of each columnwise row, written one after the other
// (measured, 4096 x 4096: one line per row and group cost 1.2 ms of streaming stores, each line
// 2 KiB from the last).
constexpr int kGroupBands = 16;
constexpr int kLineBands = 8;  // bands per 64-byte columnwise data line
constexpr int kLineTiles = 8;  // 8 tiles x 8 bytes: one 64-byte line of each rowwise row
constexpr int kGroupRows = kGroupBands * kBlock;
// Outputs staged until their 64-byte lines are complete: the rowwise ones of the current band
// (fixed size), the columnwise ones of the whole group (K lines: per-thread heap buffers).
struct RowStage {
  alignas(64) uint8_t data[kBlock][kLineTiles * 8];  // [band row][tile of the line, 8 bytes]
  // [tile pair of the line][band row][tile of the pair]: a unit writes one 32-byte run (scattered
  // over 16 rows, 2-byte stores were ~3 % of a unit; flush_row_line puts the bytes in row order).
  alignas(64) uint8_t scale[kLineTiles / 2][kBlock][2];
};
// Band-major, so that a tile or unit writes whole lines (its columns are consecutive); the flush
// transposes (flush_column_lines).
struct ColumnStage {
  uint8_t* data;   // [kGroupBands][K][8]: band b's 8 bytes of columnwise row c at data + (b * K + c) * 8
  uint8_t* scale;  // [kGroupBands][K]: band b's scale of columnwise row c at scale + b * K + c
};

// At a line boundary of the band's column `col`, a prefetch of each of its `rows` rows
// kPrefetchCols columns ahead.
// NOTE: 16 rows read side by side are more streams than the hardware prefetchers follow; without
// this prefetch the loads wait on memory (both passes walk bands this way).
template <DType kDType, auto kHint>
MICROSCALE_AVX512_INLINE void prefetch_band_ahead(const Group& g, const std::byte* src, int rows,
                                                  int64_t col) {
  if ((col * element_bytes<kDType>()) % 64 != 0 || col + kPrefetchCols >= g.k) return;
  for (int i = 0; i < rows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i * g.row_bytes +
                                               (col + kPrefetchCols) * element_bytes<kDType>()),
                 kHint);
  }
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
