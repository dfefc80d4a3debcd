// The unit of work of the NVFP4 16-bit kernel (quantize_nvfp4_16.cpp) and what it reads and
// writes, shared by its two forms of a chunk: plain C++ (quantize_nvfp4_16.cpp) and AVX2
// (nvfp4_chunk_avx2.cpp).
#pragma once

#include <cfloat>
#include <cstdint>
#include <memory>

#include "core/element_codec.hpp"
#include "core/input_matrix.hpp"
#include "core/scale_math.hpp"
#include "cpu/avx2.hpp"  // MICROSCALE_HAVE_AVX2_KERNELS
#include "cpu/cpu_dispatch.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "cpu/rht.hpp"

namespace microscale::cpu::nvfp4_16 {

constexpr int kBlock = 16;                         // NVFP4 block; also the rows of a band
constexpr int kChunkCols = 256;                    // columns of a chunk
constexpr int kChunkBlocks = kChunkCols / kBlock;  // rowwise blocks per row of a chunk
constexpr int kGroupBands = 8;                     // 8 bytes per band: a 64-byte columnwise line
// A chunk prefetches the next chunk of its band, or the next band's first (the hardware
// prefetchers do not follow 16 rows read side by side): at most this much of each row.
constexpr int64_t kPrefetchBytes = kChunkCols * 2;

// One direction's global scales, from its amax (numerics-te.md §1.2).
struct Direction {
  float multiplier = 0.0f;  // RN(S_enc * RN(1/6))
  float s_dec = 0.0f;       // RN(1 / S_enc)
};

/// The rowwise thresholds widened for broadcasts (the AVX2 chunk).
using E2m1ThresholdPairs = E2m1ThresholdPairTable<128>;

// The call: input and outputs (data null when the direction is not requested).
struct Call {
  const uint16_t* src;  // [m, k], row stride `stride` (elements)
  int64_t stride, m, k;
  bool tile_2d;
  Direction row, col;
  const E2m1Thresholds* row_thresholds;  // of the rowwise global scale
  const E2m1Thresholds* col_thresholds;
  const E2m1ThresholdPairs* row_threshold_pairs;  // row_thresholds widened (the AVX2 chunk only)
  // The AVX2 chunk's doubling forms (build_e2m1_doubling_form), which hold from scale code
  // `doubling_from` on (127: for none) in each direction the call has: the rowwise one widened
  // for broadcasts, the columnwise one as a table.
  const E2m1ThresholdPairs* row_doubling_pairs;
  const E2m1Thresholds* col_doubling;
  int doubling_from;
  bool avx2;                    // the AVX2 forms: chunks, RHT (kernel_set.hpp)
  bool row_stream, col_stream;  // lines written by streaming stores (store_line)
  const InputMatrix* x;         // the input as a matrix (load_rows), for the plain RHT
  const RhtCoefficients* rht;   // columnwise through the RHT (bf16 input); null without
  uint8_t* row_data;            // (M, K/2)
  uint8_t* row_scale;           // (M, K/16)
  uint8_t* col_data;            // (K, M/2)
  uint8_t* col_scale;           // (K, M/16)
};

// A thread's columnwise outputs of its current group, [column][band of the group]: k x 8 each.
// Left uninitialised (new T[n]): a group's chunks write every entry that flush_columns reads.
// NOTE: zeroing them (std::vector) took ~0.3 M instructions per thread per call at k = 4096, a
// third of a 16 x 4096 call.
struct ColumnStage {
  std::unique_ptr<uint64_t[]> data;  // a column's 8 bytes of a band
  std::unique_ptr<uint8_t[]> scale;
};

// One chunk of a band.
struct Chunk {
  const uint16_t* src;  // row 0, column col0
  int rows;             // 16, or fewer in a rowwise-only call's last band
  int cols;             // a multiple of 16, <= kChunkCols
  int64_t first_row, col0;
  int band_in_group;
  // What to prefetch (the chunk's rows, `prefetch_bytes` of each from here, the input's row
  // stride): the band's next chunk, or after its last the next band's first, where a whole band
  // follows (the thread's next band, but after a thread's last group: another thread's, which
  // costs a prefetch); null where none follows.
  const uint16_t* prefetch;
  int prefetch_bytes;  // <= kPrefetchBytes
};

// A block's E4M3 scale code from its amax (numerics-te.md §1.3).
MICROSCALE_CPU_INLINE uint8_t block_scale_code(float amax, const Direction& d) {
  return E4M3Codec::encode_rn(min_nonnegative(amax * d.multiplier, FLT_MAX));  // amax >= 0
}

/// One chunk in AVX2 (nvfp4_chunk_avx2.cpp): the same bytes as quantize_nvfp4_16.cpp's
/// quantize_chunk. Only where the CPU has AVX2. kSameCodes: 16 x 16 tiles with one global scale
/// for both directions (an element's two codes are equal).
template <DType kIn, bool kRows, bool kCols, bool kSameCodes>
void quantize_chunk_avx2(const Call& call, const Chunk& c, ColumnStage& stage);

/// The columnwise blocks of one chunk through the RHT in AVX2 (nvfp4_rht_avx2.cpp; bf16 input,
/// call.rht set): the same bytes as quantize_nvfp4_16.cpp's rht_band_patterns and
/// encode_rht_columns give for the chunk's columns. Only where the CPU has AVX2.
void quantize_rht_chunk_avx2(const Call& call, const Chunk& c, ColumnStage& stage);

/// rht_band_max_abs (rht_band.hpp) of a band of bf16 rows in AVX2: max(at_least, the largest
/// |output| of the RHT of the 16 rows at `src` (row stride `stride` elements, k columns, k a
/// multiple of 16), NaN outputs ignored). Only where the CPU has AVX2.
float rht_band_max_abs_avx2(const uint16_t* src, int64_t stride, int64_t k, const RhtCoefficients& t,
                            float at_least);

}  // namespace microscale::cpu::nvfp4_16
