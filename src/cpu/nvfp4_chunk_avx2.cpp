// One chunk of the NVFP4 16-bit kernel (quantize_nvfp4_16.cpp) in AVX2: the same bytes as its
// plain C++ quantize_chunk, for CPUs with AVX2 and without AVX-512 (kernel_set.hpp).
//
// Why: on Zen 3 (AVX2, no AVX-512) GCC's code for the plain chunk ran 7.8 instructions and ~4.2
// cycles per element with the input in cache (NVFP4 row + col of 4096 x 4096 bf16: 27 ms): it
// wrote each row's codes to memory and packed them in a second loop, read the columnwise
// thresholds and accumulators from memory for every row, reduced each rowwise block's max on its
// own, and encoded the E4M3 block scales with the scalar codec's ~35 instructions per 8 lanes
// (docs/perf.md, twenty-sixth session). Here a chunk goes block by block (16 columns, the band's
// 16 rows), and a register of 16 lanes is one block row:
//   1. maxes:  per column, the max over the 16 rows; per row, the max of its 16 lanes, for all 16
//              rows at once by a transposing max tree (45 operations);
//   2. scales: the E4M3 codes 8 blocks at a time (e4m3_codes), the rowwise ones turned into rows
//              of the scale output by a 16 x 16 byte transpose;
//   3. codes:  each block row against its rowwise thresholds (8 broadcasts from memory) and the
//              columnwise ones (per lane, the same for the block's 16 rows): 8 compares and 7
//              additions per direction (e2m1_code_by_thresholds). Rowwise codes of 4 rows are
//              packed two per byte by a multiply-add and two packs; columnwise codes of row i go
//              to nibble i % 4 of one of 4 accumulators, which an interleave turns into the
//              columns' 8 bytes of the band.
// 5.7 instructions per element instead of 7.8 (with the thresholds); whole bands only (a
// rowwise-only call's last band may be short: the plain chunk takes it).
// Where the call's thresholds have their doubling form (build_e2m1_doubling_form) for all of a
// chunk's scale codes, step 3 compares with 5 numbers per block scale instead of 8 (5 broadcasts)
// in 13 operations per direction instead of 16 (e2m1_codes_doubling). Paired, the thresholds took
// 1.04-1.08x the form's time at 4096 x 4096 in one run, 1.00-1.04x in another, 1.07x with the
// input in L2 (docs/perf.md, fifty-second session).
// Functions carry a target attribute (MICROSCALE_AVX2, avx2.hpp).
#include "cpu/nvfp4_16_chunk.hpp"

#ifdef MICROSCALE_HAVE_AVX2_KERNELS

#include <immintrin.h>

#include <cstring>

#include "cpu/avx2.hpp"  // lane_maxes, e2m1_codes(_doubling), copy_row, prefetch_line_of_rows
#include "cpu/input16.hpp"

namespace microscale::cpu::nvfp4_16 {
namespace {

// What both directions' codes need of 16 elements.
struct Lanes {
  __m256i a;     // |x| patterns (NaN patterns included)
  __m256i sign;  // 8 where x's sign is set and x is not a NaN (e2m1_code_by_thresholds' sign)
};

// As int16, the patterns of negative non-NaN values (-0 .. -Inf) are exactly those below that of
// the negative NaN nearest -Inf: one compare gives the sign's lanes.
template <DType kIn>
MICROSCALE_AVX2_INLINE Lanes lanes_of(__m256i x) {
  const auto first_negative_nan = static_cast<int16_t>(0x8000u | (kInf16Bits<kIn> + 1u));
  const __m256i negative = _mm256_cmpgt_epi16(_mm256_set1_epi16(first_negative_nan), x);
  return {_mm256_and_si256(x, _mm256_set1_epi16(0x7FFF)), _mm256_and_si256(negative, _mm256_set1_epi16(8))};
}

// |x| patterns with NaN as 0 (magnitude_bits of the plain chunk: a NaN is never an amax).
template <DType kIn>
MICROSCALE_AVX2_INLINE __m256i max_keys(__m256i x) {
  const __m256i a = _mm256_and_si256(x, _mm256_set1_epi16(0x7FFF));
  return _mm256_andnot_si256(_mm256_cmpgt_epi16(a, _mm256_set1_epi16(static_cast<int16_t>(kInf16Bits<kIn>))),
                             a);
}

// The numbers per block scale that a block's codes compare with: the thresholds (e2m1_codes), or
// their doubling form (e2m1_codes_doubling), which a chunk takes where it holds for all its scales.
template <bool kDoubling>
constexpr int kSteps = kDoubling ? 5 : 8;

// The codes of 16 elements (avx2.hpp).
template <DType kIn, bool kDoubling>
MICROSCALE_AVX2_INLINE __m256i codes(const Lanes& l, const __m256i (&t)[kSteps<kDoubling>]) {
  if constexpr (kDoubling) {
    return e2m1_codes_doubling<doubling_shift(kIn)>(l.a, l.sign, t);
  } else {
    return e2m1_codes(l.a, l.sign, t);
  }
}

// The rowwise codes of 4 rows (16 codes each, < 16) packed two per byte: row r's 8 bytes at
// rows[r] (the even column in the low nibble).
MICROSCALE_AVX2_INLINE void store_packed_rows(const __m256i (&code)[4], uint8_t* const (&rows)[4]) {
  const __m256i low_plus_16_high = _mm256_set1_epi32(0x00100001);
  __m256i pair[4];  // 32-bit lane q: code 2q + 16 x code 2q + 1, the byte
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) pair[r] = _mm256_madd_epi16(code[r], low_plus_16_high);
  // Per 128-bit half: rows 0-3's bytes of that half's 8 columns, as 32-bit lanes 0-3.
  const __m256i bytes =
      _mm256_packus_epi16(_mm256_packus_epi32(pair[0], pair[1]), _mm256_packus_epi32(pair[2], pair[3]));
  const __m256i in_order = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  const __m128i rows01 = _mm256_castsi256_si128(in_order), rows23 = _mm256_extracti128_si256(in_order, 1);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(rows[0]), rows01);
  _mm_storeh_pd(reinterpret_cast<double*>(rows[1]), _mm_castsi128_pd(rows01));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(rows[2]), rows23);
  _mm_storeh_pd(reinterpret_cast<double*>(rows[3]), _mm_castsi128_pd(rows23));
}

// acc[q] lane j holds rows 4q .. 4q + 3 of column j (row i in nibble i % 4): column j's 8 bytes
// of the band, acc[0][j] first, to column[j * kGroupBands].
MICROSCALE_AVX2_INLINE void store_column_words(const __m256i (&acc)[4], uint64_t* column) {
  const __m256i u0 = _mm256_unpacklo_epi16(acc[0], acc[1]), u1 = _mm256_unpackhi_epi16(acc[0], acc[1]);
  const __m256i v0 = _mm256_unpacklo_epi16(acc[2], acc[3]), v1 = _mm256_unpackhi_epi16(acc[2], acc[3]);
  // 64-bit lanes: q[n] holds columns 2n, 2n + 1 (low half) and 8 + 2n, 9 + 2n (high half).
  const __m256i q[4] = {_mm256_unpacklo_epi32(u0, v0), _mm256_unpackhi_epi32(u0, v0),
                        _mm256_unpacklo_epi32(u1, v1), _mm256_unpackhi_epi32(u1, v1)};
#pragma GCC unroll 4
  for (int n = 0; n < 4; ++n) {
    const __m128i low = _mm256_castsi256_si128(q[n]), high = _mm256_extracti128_si256(q[n], 1);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(column + (2 * n) * kGroupBands), low);
    _mm_storeh_pd(reinterpret_cast<double*>(column + (2 * n + 1) * kGroupBands), _mm_castsi128_pd(low));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(column + (8 + 2 * n) * kGroupBands), high);
    _mm_storeh_pd(reinterpret_cast<double*>(column + (9 + 2 * n) * kGroupBands), _mm_castsi128_pd(high));
  }
}

// E4M3Codec::encode_rn of 8 block scale products (>= 0, finite or +Inf), as the scalar chain
// min(amax x multiplier, FLT_MAX) then encode_rn: the normal code by rounding the mantissa bits
// (ties to even) and rebiasing, the subnormal one by an fp32 add onto the 2^-9 grid, saturated at
// 0x7E (448; +Inf and FLT_MAX land there too). The AVX-512 kernels' magnitude_code_rn, in 8 lanes.
MICROSCALE_AVX2_INLINE __m256i e4m3_codes(__m256 product) {
  constexpr int kShift = E4M3Codec::kShift;
  const __m256i a = _mm256_castps_si256(product);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, kShift), _mm256_set1_epi32(1));
  const __m256i biased =
      _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (kShift - 1)) - 1)), lsb);
  const __m256i normal =
      _mm256_sub_epi32(_mm256_srli_epi32(biased, kShift), _mm256_set1_epi32(E4M3Codec::kRebias));
  const auto magic_bits = static_cast<int>(E4M3Codec::kMagicBits);
  const __m256i subnormal = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(product, _mm256_castsi256_ps(_mm256_set1_epi32(magic_bits)))),
      _mm256_set1_epi32(magic_bits));
  // a < 2^31: a signed compare orders it
  const __m256i is_subnormal =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(E4M3Codec::kMinNormalBits)), a);
  return _mm256_min_epu32(_mm256_blendv_epi8(normal, subnormal, is_subnormal),
                          _mm256_set1_epi32(static_cast<int>(E4M3Codec::kMaxCode)));
}

// The E4M3 scale codes (block_scale_code) of 16 blocks from their max |x| patterns (NaN-free).
template <DType kIn>
MICROSCALE_AVX2_INLINE __m128i block_scale_codes(const uint16_t* max_bits, const Direction& d) {
  __m256 amax[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m128i bits = _mm_load_si128(reinterpret_cast<const __m128i*>(max_bits + 8 * h));
    if constexpr (kIn == DType::BF16) {
      amax[h] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    } else {
      amax[h] = _mm256_cvtph_ps(bits);  // exact, subnormals included
    }
  }
  const __m256 multiplier = _mm256_set1_ps(d.multiplier);
  // 32-bit codes (< 128) of blocks 0-7 and 8-15, packed to 16 bytes in block order: the packs
  // work per 128-bit half, so the 64-bit groups are put back in order in between.
  const __m256i words = _mm256_packus_epi32(e4m3_codes(_mm256_mul_ps(amax[0], multiplier)),
                                            e4m3_codes(_mm256_mul_ps(amax[1], multiplier)));
  const __m256i ordered = _mm256_permute4x64_epi64(words, 0xD8);
  return _mm_packus_epi16(_mm256_castsi256_si128(ordered), _mm256_extracti128_si256(ordered, 1));
}

// m[r][c] to m[c][r], 16 x 16 bytes: interleaves of 8-, 16-, 32- and 64-bit lanes.
MICROSCALE_AVX2_INLINE void transpose_16x16_bytes(__m128i (&m)[16]) {
  __m128i x[16], y[16], z[16];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {  // rows 2p, 2p + 1 as byte pairs: x[p] columns 0-7, x[p + 8] 8-15
    x[p] = _mm_unpacklo_epi8(m[2 * p], m[2 * p + 1]);
    x[p + 8] = _mm_unpackhi_epi8(m[2 * p], m[2 * p + 1]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 16; h += 8) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {  // rows 4q .. 4q + 3 per 32-bit lane: y[g + q] columns g .. g + 3
      y[h + q] = _mm_unpacklo_epi16(x[h + 2 * q], x[h + 2 * q + 1]);
      y[h + 4 + q] = _mm_unpackhi_epi16(x[h + 2 * q], x[h + 2 * q + 1]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < 16; g += 4) {  // z[g], z[g + 1]: rows 0-7 of columns (g, g + 1), (g + 2, g + 3)
    z[g] = _mm_unpacklo_epi32(y[g], y[g + 1]);
    z[g + 1] = _mm_unpackhi_epi32(y[g], y[g + 1]);
    z[g + 2] = _mm_unpacklo_epi32(y[g + 2], y[g + 3]);  // rows 8-15
    z[g + 3] = _mm_unpackhi_epi32(y[g + 2], y[g + 3]);
    m[g] = _mm_unpacklo_epi64(z[g], z[g + 2]);
    m[g + 1] = _mm_unpackhi_epi64(z[g], z[g + 2]);
    m[g + 2] = _mm_unpacklo_epi64(z[g + 1], z[g + 3]);
    m[g + 3] = _mm_unpackhi_epi64(z[g + 1], z[g + 3]);
  }
}

// Step 3 of chunk_avx2 (below): each block's element codes, against the thresholds or
// (kDoubling) the doubling forms of its scale codes (row_codes [block][row], col_codes
// [column]), to the outputs.
template <DType kIn, bool kRows, bool kCols, bool kSameCodes, bool kDoubling>
MICROSCALE_AVX2_INLINE void encode_chunk(const Call& call, const Chunk& c, ColumnStage& stage,
                                         const uint8_t* row_codes, const uint8_t* col_codes) {
  constexpr int kN = kSteps<kDoubling>;
  const int blocks = c.cols / kBlock;
  const int64_t stride = call.stride;
  // Columnwise: the blocks' numbers per lane, col_below[k][column].
  alignas(32) int16_t col_below[8][kChunkCols];
  if constexpr (kCols && !kSameCodes) {
    const E2m1Thresholds* table = kDoubling ? call.col_doubling : call.col_thresholds;
    for (int j = 0; j < blocks * kBlock; j += 8)
      transpose_thresholds<kChunkCols>(table->below, col_codes + j, col_below, j);
  }
  const E2m1ThresholdPairs* row_pairs = kDoubling ? call.row_doubling_pairs : call.row_threshold_pairs;

  // Block by block. row_lines: the chunk's rowwise bytes, a row's 128 bytes (two lines) at a time.
  alignas(64) uint8_t row_lines[kBlock][kChunkCols / 2];
  for (int b = 0; b < blocks; ++b) {
    const uint16_t* block = c.src + b * kBlock;
    // The next chunk's line at this pair of blocks, of each row.
    if (c.prefetch != nullptr && b % 2 == 0 && b * kBlock * 2 < c.prefetch_bytes)
      prefetch_line_of_rows(c.prefetch, stride, kBlock, b * kBlock);
    __m256i col_t[kN];
    if constexpr (kCols && !kSameCodes) {
#pragma GCC unroll 8
      for (int k = 0; k < kN; ++k)
        col_t[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&col_below[k][b * kBlock]));
    }
    __m256i acc[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {  // rows 4q .. 4q + 3
      __m256i row_code[4];
      acc[q] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const int i = 4 * q + r;
        const Lanes l =
            lanes_of<kIn>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * stride)));
        if constexpr (kRows) {
          const int32_t* pairs = row_pairs->pairs[row_codes[b * kBlock + i]];
          __m256i row_t[kN];
#pragma GCC unroll 8
          for (int k = 0; k < kN; ++k) row_t[k] = _mm256_set1_epi32(pairs[k]);
          row_code[r] = codes<kIn, kDoubling>(l, row_t);
        }
        if constexpr (kSameCodes) {
          acc[q] = _mm256_or_si256(acc[q], _mm256_slli_epi16(row_code[r], 4 * r));
        } else if constexpr (kCols) {
          acc[q] = _mm256_or_si256(acc[q], _mm256_slli_epi16(codes<kIn, kDoubling>(l, col_t), 4 * r));
        }
      }
      if constexpr (kRows) {
        uint8_t* const rows[4] = {row_lines[4 * q] + b * 8, row_lines[4 * q + 1] + b * 8,
                                  row_lines[4 * q + 2] + b * 8, row_lines[4 * q + 3] + b * 8};
        store_packed_rows(row_code, rows);
      }
    }
    if constexpr (kCols)
      store_column_words(acc, stage.data.get() + (c.col0 + b * kBlock) * kGroupBands + c.band_in_group);
  }
  // The next chunk's lines past this chunk's width (a row's last, narrower chunk before a band).
  for (int64_t at = (blocks + 1) / 2 * 2 * kBlock; c.prefetch != nullptr && at * 2 < c.prefetch_bytes;
       at += 2 * kBlock)
    prefetch_line_of_rows(c.prefetch, stride, kBlock, at);
  if constexpr (kRows) {
    for (int i = 0; i < kBlock; ++i) {
      uint8_t* out = call.row_data + (c.first_row + i) * (call.k / 2) + c.col0 / 2;
      // Streamed: two whole, aligned lines (streamable).
      copy_row(row_lines[i], blocks * (kBlock / 2), call.row_stream && blocks == kChunkBlocks, out);
    }
  }
}

// The smallest of the n (a multiple of 16) scale codes at `codes` (16-byte aligned), at most `at_most`.
MICROSCALE_AVX2_INLINE int min_code(const uint8_t* codes, int n, int at_most) {
  __m128i m = _mm_set1_epi8(static_cast<char>(at_most));
  for (int j = 0; j < n; j += 16)
    m = _mm_min_epu8(m, _mm_load_si128(reinterpret_cast<const __m128i*>(codes + j)));
  m = _mm_min_epu8(m, _mm_srli_si128(m, 8));
  m = _mm_min_epu8(m, _mm_srli_si128(m, 4));
  m = _mm_min_epu8(m, _mm_srli_si128(m, 2));
  m = _mm_min_epu8(m, _mm_srli_si128(m, 1));
  return _mm_cvtsi128_si32(m) & 0xFF;
}

// kDoubling: the call's doubling forms hold from some scale code on (call.doubling_from); a chunk
// with a block below it takes the thresholds.
template <DType kIn, bool kRows, bool kCols, bool kSameCodes, bool kDoubling>
MICROSCALE_AVX2 void chunk_avx2(const Call& call, const Chunk& c, ColumnStage& stage) {
  static_assert(!kSameCodes || (kRows && kCols));
  const int blocks = c.cols / kBlock;
  const int64_t stride = call.stride;

  // 1. Maxes: col_max[j] for column j, row_max[b * 16 + i] for row i of block b.
  alignas(32) uint16_t col_max[kChunkCols];
  alignas(32) uint16_t row_max[kChunkBlocks * kBlock];
  for (int b = 0; b < blocks; ++b) {
    const uint16_t* block = c.src + b * kBlock;
    __m256i m[kBlock];
    __m256i column = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int i = 0; i < kBlock; ++i) {
      m[i] = max_keys<kIn>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * stride)));
      column = _mm256_max_epi16(column, m[i]);
    }
    __m256i rows = lane_maxes(m);
    if (call.tile_2d) {  // every block of a 16 x 16 tile takes the tile's max
      __m256i tile = _mm256_max_epi16(rows, _mm256_permute2x128_si256(rows, rows, 0x01));
      tile = _mm256_max_epi16(tile, _mm256_shuffle_epi32(tile, 0x4E));
      tile = _mm256_max_epi16(tile, _mm256_shuffle_epi32(tile, 0xB1));
      tile = _mm256_max_epi16(tile, _mm256_srli_epi32(tile, 16));
      column = rows = _mm256_shuffle_epi8(tile, _mm256_set1_epi16(0x0100));  // word 0 to every lane
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(col_max + b * kBlock), column);
    _mm256_store_si256(reinterpret_cast<__m256i*>(row_max + b * kBlock), rows);
  }

  // 2. Scale codes, to the outputs.
  alignas(32) uint8_t row_codes[kChunkBlocks * kBlock];  // [block][row], as row_max
  alignas(32) uint8_t col_codes[kChunkCols];
  if constexpr (kRows) {
    __m128i codes[kChunkBlocks];  // codes[b] lane i: row i of block b; then codes[i] lane b
    for (int b = 0; b < kChunkBlocks; ++b) {
      codes[b] = b < blocks ? block_scale_codes<kIn>(row_max + b * kBlock, call.row) : _mm_setzero_si128();
      _mm_store_si128(reinterpret_cast<__m128i*>(row_codes + b * kBlock), codes[b]);
    }
    transpose_16x16_bytes(codes);
    uint8_t* scale = call.row_scale + c.first_row * (call.k / kBlock) + c.col0 / kBlock;
    for (int i = 0; i < kBlock; ++i) {
      uint8_t* row = scale + i * (call.k / kBlock);
      if (blocks == kChunkBlocks) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(row), codes[i]);
      } else {
        alignas(16) uint8_t bytes[kChunkBlocks];
        _mm_store_si128(reinterpret_cast<__m128i*>(bytes), codes[i]);
        std::memcpy(row, bytes, blocks);
      }
    }
  }
  if constexpr (kCols) {
    for (int b = 0; b < blocks; ++b) {
      _mm_store_si128(reinterpret_cast<__m128i*>(col_codes + b * kBlock),
                      block_scale_codes<kIn>(col_max + b * kBlock, call.col));
    }
    uint8_t* __restrict scale = stage.scale.get() + c.col0 * kGroupBands + c.band_in_group;
    for (int j = 0; j < blocks * kBlock; ++j) scale[j * kGroupBands] = col_codes[j];
  }

  // 3. The element codes.
  if constexpr (kDoubling) {
    int least = 126;
    if constexpr (kRows) least = min_code(row_codes, blocks * kBlock, least);
    if constexpr (kCols && !kSameCodes) least = min_code(col_codes, blocks * kBlock, least);
    if (least >= call.doubling_from) {
      encode_chunk<kIn, kRows, kCols, kSameCodes, true>(call, c, stage, row_codes, col_codes);
      return;
    }
  }
  encode_chunk<kIn, kRows, kCols, kSameCodes, false>(call, c, stage, row_codes, col_codes);
}

}  // namespace

// The target attribute is on chunk_avx2: GCC takes a template's attributes from its first
// declaration (nvfp4_16_chunk.hpp), which the rest of the library sees without one.
template <DType kIn, bool kRows, bool kCols, bool kSameCodes>
void quantize_chunk_avx2(const Call& call, const Chunk& c, ColumnStage& stage) {
  if (call.doubling_from < 127) {
    chunk_avx2<kIn, kRows, kCols, kSameCodes, true>(call, c, stage);
  } else {
    chunk_avx2<kIn, kRows, kCols, kSameCodes, false>(call, c, stage);
  }
}

// The forms quantize_nvfp4_16.cpp's quantize_groups calls.
#define MICROSCALE_NVFP4_CHUNK_AVX2(kIn)                                                               \
  template void quantize_chunk_avx2<kIn, true, true, false>(const Call&, const Chunk&, ColumnStage&);  \
  template void quantize_chunk_avx2<kIn, true, true, true>(const Call&, const Chunk&, ColumnStage&);   \
  template void quantize_chunk_avx2<kIn, true, false, false>(const Call&, const Chunk&, ColumnStage&); \
  template void quantize_chunk_avx2<kIn, false, true, false>(const Call&, const Chunk&, ColumnStage&);
MICROSCALE_NVFP4_CHUNK_AVX2(DType::BF16)
MICROSCALE_NVFP4_CHUNK_AVX2(DType::F16)
#undef MICROSCALE_NVFP4_CHUNK_AVX2

}  // namespace microscale::cpu::nvfp4_16

#endif  // MICROSCALE_HAVE_AVX2_KERNELS
