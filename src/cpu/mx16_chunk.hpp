// The unit of work of the MX 16-bit kernel (quantize_mx16.cpp) and the steps its two forms of a
// chunk (FP8 and FP6 by the 16-bit form, FP4 by thresholds or the two-step form) share: plain C++
// (quantize_mx16.cpp) and AVX2 (mx16_chunk_avx2.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/scale_math.hpp"
#include "cpu/avx2.hpp"  // MICROSCALE_HAVE_AVX2_KERNELS
#include "cpu/cpu_dispatch.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/input16.hpp"
#include "cpu/mx16_form.hpp"
#include "cpu/quantize_kernels.hpp"  // MxParams

namespace microscale::cpu::mx16 {

constexpr int kBlock = 32;                          // MX block; also the rows of a band
constexpr int kChunkCols = 256;                     // columns of a chunk
constexpr int kChunkBlocks = kChunkCols / kBlock;   // rowwise blocks per row of a chunk
constexpr int64_t kPrefetchBytes = kChunkCols * 2;  // one chunk ahead

// A block's E8M0 byte from the max |x| pattern of the block (a NaN pattern gives 0xFF).
template <DType kIn, MxScaleRule kRule>
MICROSCALE_CPU_INLINE uint8_t block_scale_byte(uint16_t max_bits, const MxParams& p) {
  return mx_scale_byte_branch_free<kRule>(widen16<kIn>(max_bits), p.emax, p.mantissa_bits, p.max_normal);
}

// Every scale byte's terms (mx16_terms; kMx16AllOutside's limit for 0xFF) and inverse scale
// (mx_inverse_scale), looked up per block: computed per block, their branches kept GCC 12 from
// vectorising the loops over blocks (about a fifth of the AVX2 chunk's time on Zen 3).
struct TermTable {
  uint16_t lower[256];
  uint16_t limit[256];
  float inverse[256];
};

template <typename Codec, DType kIn>
TermTable term_table() {
  TermTable table;
  for (int s = 0; s < 256; ++s) {
    const auto byte = static_cast<uint8_t>(s);
    const Mx16Terms t = mx16_terms<Codec, kIn>(byte);
    table.lower[s] = t.lower;
    table.limit[s] = byte == 0xFF ? kMx16AllOutside.limit : t.limit;
    table.inverse[s] = mx_inverse_scale(byte);
  }
  return table;
}

// One chunk of a band and where its outputs go (row_data / col_data null: not requested).
struct Chunk {
  const uint16_t* src;  // [rows, cols] at row stride `stride` (elements)
  int64_t stride;
  int rows;            // <= 32; 32 when columnwise
  int cols;            // a multiple of 32, <= kChunkCols
  bool prefetch_next;  // a chunk follows in this band
  bool stream;         // the outputs' rows are whole aligned lines, streamed (the AVX2 chunks)
  bool scale_tiles;    // 32x32 scale tiles: each block takes its tile's max (tile_maxes)
  MxParams p;
  // MXFP4 by thresholds: quantize_chunk_fp4, and the AVX2 chunk's columns where the two-step form
  // does not hold; widened, the AVX2 chunk's rows there.
  const MxE2m1Thresholds* fp4_thresholds;
  const E2m1ThresholdPairTable<256>* fp4_threshold_pairs;
  const TermTable* terms;  // FP8, FP6 (the 16-bit form)
  // Rowwise: chunk row i at row_data + i * data_stride, its block bytes at row_scale + i * row_scale_stride.
  uint8_t* row_data;
  uint8_t* row_scale;
  int64_t row_scale_stride;
  // Columnwise: chunk row i at col_data + i * data_stride; the band's scale row at col_scale.
  uint8_t* col_data;
  uint8_t* col_scale;
  int64_t data_stride;  // bytes: K, or K / 2 for FP4 codes (two per byte)
};

// The code of any lane, as the fp32 path encodes it (`inverse`: mx_inverse_scale of its block).
template <typename Codec, DType kIn>
MICROSCALE_CPU_INLINE uint8_t mx16_code_general(uint16_t x, float inverse) {
  return static_cast<uint8_t>(Codec::encode_rn(mx_scaled_element(widen16<kIn>(x), inverse)));
}

// Terms of blocks: the columnwise ones per lane of a chunk row, the rowwise ones per block of a
// chunk (q = row * kChunkBlocks + block).
struct Terms {
  alignas(64) uint16_t lower[kChunkCols];
  alignas(64) uint16_t limit[kChunkCols];
  alignas(64) uint8_t scale[kChunkCols];
  alignas(64) float inverse[kChunkCols];
};
static_assert(kBlock * kChunkBlocks <= kChunkCols);  // the rowwise terms of a chunk fit

// The lanes of a chunk row outside the normal form, encoded as the fp32 path does: rowwise with
// the terms of its blocks (from `first_block`), or columnwise (kPerLane) with each lane's. Blocks
// are tested first; a block holding such a lane is encoded whole in fp32 lanes and blended.
// NOTE: vectorised, not lane by lane: a scalar walk took 9 % of the MXFP8 time (a Gaussian row of
// 256 has a lane below the E4M3 normal range about one time in 14), and made MXFP4 6x slower than
// the fp32 kernel when this kernel took FP4 (see mx16_applies).
template <typename Codec, DType kIn, bool kPerLane>
MICROSCALE_CPU_INLINE void fix_outside(const uint16_t* __restrict x, int blocks, const Terms& t,
                                       int first_block, uint8_t* __restrict out) {
  for (int b = 0; b < blocks; ++b) {
    const int first = b * kBlock;
    const uint16_t block_limit = kPerLane ? 0 : t.limit[first_block + b];
    const float block_inverse = kPerLane ? 0.0f : t.inverse[first_block + b];
    uint8_t any = 0;
    for (int j = 0; j < kBlock; ++j)
      any |= static_cast<uint8_t>(mx16_outside(x[first + j], kPerLane ? t.limit[first + j] : block_limit));
    if (any == 0) continue;
    for (int j = 0; j < kBlock; ++j) {
      const int lane = first + j;
      const uint8_t general =
          mx16_code_general<Codec, kIn>(x[lane], kPerLane ? t.inverse[lane] : block_inverse);
      // A mask, not a `?:` (which GCC 12 left as a branch here).
      const auto take = static_cast<uint8_t>(
          0u - static_cast<unsigned>(mx16_outside(x[lane], kPerLane ? t.limit[lane] : block_limit)));
      out[lane] = static_cast<uint8_t>((general & take) | (out[lane] & ~take));
    }
  }
}

// 32x32 scale tiles: the chunk's rows are a band of a tile row, so a 32-column block's column
// maxes span its tile; each of the tile's column and row blocks takes the tile's max, and the
// steps after give every block of a tile the one scale, and the same codes in both directions.
MICROSCALE_CPU_INLINE void tile_maxes(const Chunk& c, uint16_t* __restrict col_max,
                                      uint16_t* __restrict row_max) {
  for (int b = 0; b < c.cols / kBlock; ++b) {
    uint16_t m = 0;
    for (int j = 0; j < kBlock; ++j) m = std::max(m, col_max[b * kBlock + j]);
    std::fill_n(col_max + b * kBlock, kBlock, m);
    for (int i = 0; i < c.rows; ++i) row_max[i * kChunkBlocks + b] = m;
  }
}

// Step 2 of a chunk: every block's scale byte (to the outputs), terms and inverse scale, from the
// maxes of step 1.
template <DType kIn, MxScaleRule kRule>
MICROSCALE_CPU_INLINE void chunk_terms(const Chunk& c, const uint16_t* __restrict col_max,
                                       const uint16_t* __restrict row_max, Terms& col, Terms& row) {
  const TermTable& table = *c.terms;
  const auto look_up = [&table](Terms& t, int n) {
    for (int q = 0; q < n; ++q) {
      const uint8_t s = t.scale[q];
      t.lower[q] = table.lower[s];
      t.limit[q] = table.limit[s];
      t.inverse[q] = table.inverse[s];
    }
  };
  if (c.col_data != nullptr) {
    for (int j = 0; j < c.cols; ++j) col.scale[j] = block_scale_byte<kIn, kRule>(col_max[j], c.p);
    look_up(col, c.cols);
    std::copy_n(col.scale, c.cols, c.col_scale);
  }
  if (c.row_data != nullptr) {
    const int n = c.rows * kChunkBlocks;
    for (int q = 0; q < n; ++q) row.scale[q] = block_scale_byte<kIn, kRule>(row_max[q], c.p);
    look_up(row, n);
    for (int i = 0; i < c.rows; ++i)
      std::copy_n(row.scale + i * kChunkBlocks, c.cols / kBlock, c.row_scale + i * c.row_scale_stride);
  }
}

// Step 2 of an MXFP4 chunk: the blocks' scale bytes (also to the outputs).
template <DType kIn, MxScaleRule kRule>
MICROSCALE_CPU_INLINE void fp4_scale_bytes(const Chunk& c, const uint16_t* __restrict col_max,
                                           const uint16_t* __restrict row_max, uint8_t* __restrict col_scale,
                                           uint8_t* __restrict row_scale) {
  if (c.col_data != nullptr) {
    for (int j = 0; j < c.cols; ++j) col_scale[j] = block_scale_byte<kIn, kRule>(col_max[j], c.p);
    std::copy_n(col_scale, c.cols, c.col_scale);
  }
  if (c.row_data != nullptr) {
    for (int q = 0; q < c.rows * kChunkBlocks; ++q)
      row_scale[q] = block_scale_byte<kIn, kRule>(row_max[q], c.p);
    for (int i = 0; i < c.rows; ++i)
      std::copy_n(row_scale + i * kChunkBlocks, c.cols / kBlock, c.row_scale + i * c.row_scale_stride);
  }
}

// The columnwise blocks' thresholds per lane (col_below[k][j]) of an MXFP4 chunk's scale bytes.
MICROSCALE_CPU_INLINE void fp4_column_thresholds(const Chunk& c, const uint8_t* col_scale,
                                                 int16_t (*col_below)[kChunkCols]) {
  for (int j = 0; j < c.cols; j += 8)
    transpose_thresholds<kChunkCols>(c.fp4_thresholds->below, col_scale + j, col_below, j);
}

/// One FP8 or FP6 chunk in AVX2 (mx16_chunk_avx2.cpp): the same bytes as quantize_mx16.cpp's
/// quantize_chunk. Only where the CPU has AVX2.
template <typename Codec, DType kIn, MxScaleRule kRule>
void quantize_chunk_avx2(const Chunk& c);

/// One MXFP4 chunk in AVX2 (mx16_chunk_avx2.cpp): the same bytes as quantize_mx16.cpp's
/// quantize_chunk_fp4. Only where the CPU has AVX2.
template <DType kIn, MxScaleRule kRule>
void quantize_chunk_fp4_avx2(const Chunk& c);

}  // namespace microscale::cpu::mx16
