// NVFP4 quantizer written with AVX-512 intrinsics: round to nearest, 1x16 or 16x16 scaling, the
// RHT, rowwise and columnwise; equal bit for bit to quantize_nvfp4_ref.cpp (tests/cpp/
// quantize_test.cpp runs it on random, special and boundary inputs, golden_test.cpp on the golden
// cases). Stochastic rounding and inputs with strided columns take the portable fast path.
//
// bf16 and f16 inputs go by units of 16 rows x 32 columns (quantize_unit16: one 512-bit load per
// row, 16-bit amaxes, codes looked up already in their packed nibbles; with the RHT (bf16 only),
// the transform of each column in fp32 or double, rht_unit_bf16). The rest (f32, NaN units, RHT
// columns exact in neither, a last odd tile, a last partial band) goes by tiles of 16 input
// rows x 16 columns in 16 registers (register i = row i, lane j = column j), loaded once for both
// directions:
//   rowwise:    block amax per register: one transposing max tree (16 -> 1 register);
//               scales per lane of that result; elements times their row's scale (a broadcast).
//   columnwise: block amax per lane: a vertical max over the 16 registers; element i of the
//               column blocks is register i, so the quantized transpose needs no data transpose,
//               only the final nibble packing (8 bytes per column).
//   RHT:        the 16-point transform runs down the registers as a 4-stage butterfly in fp32
//               or double (two halves of 8 lanes), exact where the reference's sum is (rht_tile).
// Pass 1 computes the global amaxes (both directions' when the RHT is on); pass 2 quantizes.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/fp_environment.hpp"
#include "cpu/avx512.hpp"
#include "cpu/avx512_codecs.hpp"
#include "cpu/kernel_set.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/rht.hpp"
#include "cpu/row_loader.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {

#ifdef MICROSCALE_HAVE_AVX512_KERNELS
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
  // Whole 64-byte data lines bypass the caches (see quantize_with).
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

// The tile at `col` of a band of `rows` (<= 16) rows from `src`; missing rows read as zeros.
template <DType kDType>
MICROSCALE_AVX512_INLINE void load_tile(const std::byte* src, int64_t row_bytes, int rows, int64_t col,
                                        __m512 x[16]) {
  const std::byte* p = src + col * element_bytes<kDType>();
  for (int i = 0; i < kBlock; ++i) x[i] = i < rows ? load16<kDType>(p + i * row_bytes) : _mm512_setzero_ps();
}

// |x| bits of a tile: `raw` (NaN patterns kept, for the RHT's exactness test) and `a` with NaN
// dropped so that maxes ignore NaN (as fmaxf in TE); their per-lane maxes alongside.
struct TileAbs {
  __m512i a[16];
  __m512i col_max;      // NaN dropped
  __m512i col_max_raw;  // NaN patterns kept
};

MICROSCALE_AVX512_INLINE void tile_abs(const __m512 x[16], TileAbs& t) {
  for (int i = 0; i < kBlock; ++i) t.a[i] = abs_bits(x[i]);
  t.col_max_raw = t.col_max = vertical_max(t.a, kBlock);
  // A NaN is rare: test the whole tile once, clean it only then.
  if (_mm512_cmpgt_epu32_mask(t.col_max_raw, _mm512_set1_epi32(0x7F800000)) != 0) {
    for (int i = 0; i < kBlock; ++i) t.a[i] = drop_nan(t.a[i]);
    t.col_max = vertical_max(t.a, kBlock);
  }
}

// y[j] (lane c) = RHT of column c's 16 values, rounded as rht16 does: the exact sum truncated to
// fp32, then rounded to nearest even bf16. The reference sums in double in i order. Where a
// column's nonzero inputs are normal, finite and within 40 binades, every partial sum of either
// order is exact in double, so the butterfly in double gives the same bits. Where, further, the
// inputs have at most 8 significant bits (bf16 values), lie within 12 binades and below 2^121,
// every partial sum is a multiple of 2^(emin - 9) below 2^(emax + 3): exact in fp32, so the
// butterfly runs in fp32 (half the lanes' cost, no conversions) and needs no truncation. Other
// columns (rare: NaN, Inf, subnormals, huge spreads) are summed in the reference order.
MICROSCALE_AVX512 void rht_tile(const __m512 x[16], const TileAbs& t, const RhtCoefficients& c,
                                __m512 y[16]) {
  __m512i min_nonzero = _mm512_set1_epi32(-1), low_bits = _mm512_setzero_si512();
  for (int i = 0; i < kBlock; ++i) {
    min_nonzero =
        _mm512_mask_min_epu32(min_nonzero, _mm512_test_epi32_mask(t.a[i], t.a[i]), min_nonzero, t.a[i]);
    low_bits = _mm512_or_si512(low_bits, t.a[i]);
  }
  const __m512i spread =
      _mm512_sub_epi32(_mm512_srli_epi32(t.col_max_raw, 23), _mm512_srli_epi32(min_nonzero, 23));
  const __mmask16 exact_in_double = _mm512_cmplt_epu32_mask(t.col_max_raw, _mm512_set1_epi32(0x7F800000)) &
                                    _mm512_cmpge_epu32_mask(min_nonzero, _mm512_set1_epi32(0x00800000)) &
                                    _mm512_cmple_epi32_mask(spread, _mm512_set1_epi32(40));  // all-zero: < 0
  const __mmask16 exact_in_float = exact_in_double & _mm512_cmple_epi32_mask(spread, _mm512_set1_epi32(12)) &
                                   _mm512_cmplt_epu32_mask(t.col_max_raw, _mm512_set1_epi32(0x7C000000)) &
                                   _mm512_testn_epi32_mask(low_bits, _mm512_set1_epi32(0xFFFF));
  if (exact_in_float == 0xFFFF) {
    for (int i = 0; i < kBlock; ++i)
      y[i] = _mm512_mul_ps(x[i], _mm512_set1_ps(static_cast<float>(c[i * 16])));
    fwht16(y);
    for (int j = 0; j < kBlock; ++j) y[j] = round_to_bf16(y[j]);
    return;
  }
  __m256 half[2][16];
  for (int h = 0; h < 2; ++h) {
    __m512d z[16];
    for (int i = 0; i < kBlock; ++i) {
      const __m256 part = h == 0 ? _mm512_castps512_ps256(x[i])
                                 : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x[i]), 1));
      z[i] = _mm512_mul_pd(_mm512_cvtps_pd(part), _mm512_set1_pd(c[i * 16]));  // exact
    }
    fwht16(z);
    for (int j = 0; j < kBlock; ++j)
      half[h][j] = _mm512_cvt_roundpd_ps(z[j], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  }
  for (int j = 0; j < kBlock; ++j) {
    y[j] = round_to_bf16(_mm512_insertf32x8(_mm512_castps256_ps512(half[0][j]), half[1][j], 1));
  }
  if (exact_in_double != 0xFFFF) {
    alignas(64) float xs[16][16], ys[16][16];
    for (int i = 0; i < kBlock; ++i) {
      _mm512_store_ps(xs[i], x[i]);
      _mm512_store_ps(ys[i], y[i]);
    }
    for (int lane = 0; lane < kBlock; ++lane) {
      if ((exact_in_double >> lane) & 1) continue;
      for (int j = 0; j < kBlock; ++j) ys[j][lane] = rht_output_reference_order(c, &xs[0][lane], 16, j);
    }
    for (int j = 0; j < kBlock; ++j) y[j] = _mm512_load_ps(ys[j]);
  }
}

// The 16 column blocks' amax (lanes) of the RHT output, NaN dropped.
MICROSCALE_AVX512_INLINE __m512i rht_col_max(const __m512 y[16]) {
  __m512i m = _mm512_setzero_si512();
  for (int j = 0; j < kBlock; ++j) m = _mm512_max_epu32(m, drop_nan(abs_bits(y[j])));
  return m;
}

// Codes c[i] of element i of 16 column blocks (lane j = columnwise row j) -> their 8 bytes each,
// element 2t in the low nibble of byte t, to dst (128 bytes, columnwise row j at dst + 8j).
MICROSCALE_AVX512_INLINE void store_fp4_columns(const __m512i c[16], uint8_t* dst) {
  __m512i lo = c[0], hi = c[8];
  for (int i = 1; i < 8; ++i) {
    lo = _mm512_or_si512(lo, _mm512_slli_epi32(c[i], 4 * i));
    hi = _mm512_or_si512(hi, _mm512_slli_epi32(c[8 + i], 4 * i));
  }
  // Column j's 8 bytes are lo[j], hi[j]: interleaving pairs them into qwords, per 128-bit chunk k
  // columns 4k, 4k + 1 (unpacklo) and 4k + 2, 4k + 3 (unpackhi).
  const __m512i a = _mm512_unpacklo_epi32(lo, hi), b = _mm512_unpackhi_epi32(lo, hi);
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), b));
  _mm512_storeu_si512(dst + 64,
                      _mm512_permutex2var_epi64(a, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), b));
}

MICROSCALE_AVX512_INLINE __m512i broadcast_max(__m512i v) {
  return _mm512_set1_epi32(static_cast<int>(_mm512_reduce_max_epu32(v)));
}

// One tile of pass 2 (see quantize_group): rowwise codes and scales into the band's stage at tile
// `line_tile` of its line, columnwise ones into the group's stage.
template <DType kDType>
MICROSCALE_AVX512_INLINE void quantize_tile(const Group& g, const std::byte* src, int rows, int64_t col,
                                            int band, RowStage& stage, ColumnStage cs) {
  const int line_tile = static_cast<int>(col / kBlock) % kLineTiles;
  __m512 x[16];
  load_tile<kDType>(src, g.row_bytes, rows, col, x);
  TileAbs t;
  tile_abs(x, t);
  if (g.row_data != nullptr) {
    const __m512i amax = g.tile_2d ? broadcast_max(t.col_max) : transpose_max16(t.a);
    __m512i scale_codes;
    const __m512 enc = nvfp4_block_scales(amax, g.row.multiplier, g.row.encode_scale, &scale_codes);
    scatter_bytes(scale_codes, &stage.scale[line_tile / 2][0][line_tile % 2], 2, rows);
    alignas(64) float row_enc[16];
    _mm512_store_ps(row_enc, enc);
    for (int i = 0; i < rows; ++i) {
      const __m512i codes = nvfp4_encode_e2m1(_mm512_mul_ps(x[i], _mm512_set1_ps(row_enc[i])));
      store_fp4_row(codes, &stage.data[i][line_tile * 8]);
    }
  }
  if (g.col_data != nullptr) {
    __m512 y[16];
    const __m512* values = x;
    __m512i amax = t.col_max;
    if (g.rht != nullptr) {
      rht_tile(x, t, *g.rht, y);
      values = y;
      amax = rht_col_max(y);
    }
    if (g.tile_2d) amax = broadcast_max(amax);
    __m512i scale_codes;
    const __m512 enc = nvfp4_block_scales(amax, g.col.multiplier, g.col.encode_scale, &scale_codes);
    store_bytes(scale_codes, cs.scale + band * g.k + col);
    __m512i codes[16];
    for (int i = 0; i < kBlock; ++i) codes[i] = nvfp4_encode_e2m1(_mm512_mul_ps(values[i], enc));
    store_fp4_columns(codes, cs.data + (band * g.k + col) * 8);
  }
}

// ---- bf16 and f16 units: 16 rows x 32 columns (two tiles side by side) ----
//
// A 512-bit load of a 16-bit row gives 32 columns; its 32-bit lane j holds column 2j (low half)
// and 2j + 1 (high half), so widen_half_lanes gives the "even" and the "odd" columns as fp32 (bf16:
// a shift and a mask, no conversion instructions; f16: two conversions), and the two share each
// lane's block. Amaxes come from the packed 16-bit |x| (32 lanes per operation; f16 patterns order
// as their magnitudes, as bf16's do). Codes are looked up already shifted to their nibble of the
// packed output (nvfp4_e2m1_table), so packing is a few ORs: rowwise, the codes of 4 rows fill one
// register (byte q of lane j = row q, columns 2j and 2j + 1); columnwise, rows 0-7 and 8-15 of a
// column fill the two 32-bit halves of its 8 output bytes.

constexpr int kUnitColumns = 32;

// In a unit's row loop: row i (at `row`) kPrefetchCols columns ahead, the unit's line 4 units
// on. Near a row's end this reaches into the next row or past the tensor: a prefetch never faults,
// so no bounds test (prefetch_band_ahead's would cost a branch per row step).
// NOTE: one prefetch per row step, spread over the unit's work. Issued together at each line
// boundary (prefetch_band_ahead), the 16 prefetches stalled the loads behind them (perf: ~40 % of
// quantize_group's own samples on them); spread, pass 2 took 2-3 % less time (paired, 4096 x 4096).
template <auto kHint>
MICROSCALE_AVX512_INLINE void prefetch_unit_row(const std::byte* row) {
  _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchCols * 2), kHint);
}

// ---- 16x16 tiles: the tile maxes from pass 1 ----
//
// Pass 1 waits on memory (a read of the whole input before any block scale can be known); pass 2
// is bound by its vector operations. A 16x16 unit's two tile maxes do not depend on the global
// amax, so where pass 1 reads a 16-bit input without the RHT it computes them as it reads each
// unit and keeps them (2 x 16 bits per unit: 128 KiB for 4096 x 4096), and pass 2 starts from
// them instead of loading the unit's 16 rows once more for their max. Measured on Zen 4 (docs/
// perf.md, thirty-second session): the call -11 to -15 %. The same for 1x16 blocks (their 64
// block maxes, transpose_max16x2 moved into pass 1: 128 bytes per unit) gained nothing: pass 1
// grew by what pass 2 saved.

// Pass 1 on a unit of a full band of 16-bit inputs (16 rows x 32 columns at src): max |x| into
// *max16 (16-bit lanes, NaN ignored), and the two tiles' |x| maxes (16-bit patterns) into
// record[0] and record[1]; 0xFFFF for a unit holding a NaN, which sends pass 2 to the unit's
// tiles as before.
// NOTE: not inlined: inlined into the band's loop, GCC kept the 16 row offsets in stack slots.
MICROSCALE_AVX512 __attribute__((noinline)) void unit_tile_maxes(const std::byte* src, int64_t row_bytes,
                                                                 __m512i inf16, uint16_t* record,
                                                                 __m512i* max16) {
  __m512i a[16];
  __m512i col_max = _mm512_setzero_si512();
  for (int i = 0; i < kBlock; ++i) {
    prefetch_unit_row<_MM_HINT_T1>(src + i * row_bytes);
    a[i] = _mm512_and_si512(_mm512_loadu_si512(src + i * row_bytes), _mm512_set1_epi16(0x7FFF));
    col_max = _mm512_max_epu16(col_max, a[i]);
  }
  if (_mm512_cmpgt_epu16_mask(col_max, inf16) != 0) [[unlikely]] {  // a NaN: dropped from max |x|
    __m512i m = _mm512_setzero_si512();
    for (const __m512i& v : a)
      m = _mm512_max_epu16(m, _mm512_maskz_mov_epi16(_mm512_cmple_epu16_mask(v, inf16), v));
    *max16 = _mm512_max_epu16(*max16, m);
    record[0] = record[1] = 0xFFFF;
    return;
  }
  *max16 = _mm512_max_epu16(*max16, col_max);
  // Each 256-bit half's max: 128-bit chunks, 64-bit halves, 32-bit pairs, then 16-bit halves.
  __m512i m = _mm512_max_epu16(col_max, _mm512_shuffle_i32x4(col_max, col_max, _MM_SHUFFLE(2, 3, 0, 1)));
  m = _mm512_max_epu16(m, _mm512_shuffle_epi32(m, _MM_PERM_BADC));
  m = _mm512_max_epu16(m, _mm512_shuffle_epi32(m, _MM_PERM_CDAB));
  m = _mm512_max_epu16(m, _mm512_srli_epi32(m, 16));
  record[0] = static_cast<uint16_t>(_mm_cvtsi128_si32(_mm512_castsi512_si128(m)));
  record[1] = static_cast<uint16_t>(_mm_cvtsi128_si32(_mm512_extracti32x4_epi32(m, 2)));
}

// Lanes of a transpose_max16x2 output holding row r's two blocks, 8 lanes each: the rowwise
// scale of every even/odd lane of row r (r = 0..7 and 8..15 share an index).
MICROSCALE_AVX512_INLINE __m512i row_scale_index(int r) {
  alignas(64) int32_t index[16];
  for (int j = 0; j < 16; ++j) index[j] = transpose_max16x2_lane(r, j / 8);
  return _mm512_load_si512(index);
}

// Rows 8h..8h+7 of a transpose_max16x2 output in row order: lane 2r + b holds (8h + r, b).
MICROSCALE_AVX512_INLINE __m512i rows_in_order(__m512i tree) {
  return _mm512_permutexvar_epi32(
      _mm512_setr_epi32(
          transpose_max16x2_lane(0, 0), transpose_max16x2_lane(0, 1), transpose_max16x2_lane(1, 0),
          transpose_max16x2_lane(1, 1), transpose_max16x2_lane(2, 0), transpose_max16x2_lane(2, 1),
          transpose_max16x2_lane(3, 0), transpose_max16x2_lane(3, 1), transpose_max16x2_lane(4, 0),
          transpose_max16x2_lane(4, 1), transpose_max16x2_lane(5, 0), transpose_max16x2_lane(5, 1),
          transpose_max16x2_lane(6, 0), transpose_max16x2_lane(6, 1), transpose_max16x2_lane(7, 0),
          transpose_max16x2_lane(7, 1)),
      tree);
}

// 4 rows' packed codes (byte q of lane j: row q, columns 2j and 2j + 1) -> each row's 16 bytes,
// to its row of the stage at byte `offset`.
MICROSCALE_AVX512_INLINE void store_row_quad(__m512i packed, RowStage& stage, int first_row, int offset) {
  // Transpose the 4x4 bytes of each 128-bit chunk, then the 4x4 32-bit words across chunks.
  const __m512i bytes = _mm512_shuffle_epi8(
      packed, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)));
  const __m512i rows = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), bytes);
  _mm_store_si128(reinterpret_cast<__m128i*>(&stage.data[first_row][offset]), _mm512_castsi512_si128(rows));
  _mm_store_si128(reinterpret_cast<__m128i*>(&stage.data[first_row + 1][offset]),
                  _mm512_extracti32x4_epi32(rows, 1));
  _mm_store_si128(reinterpret_cast<__m128i*>(&stage.data[first_row + 2][offset]),
                  _mm512_extracti32x4_epi32(rows, 2));
  _mm_store_si128(reinterpret_cast<__m128i*>(&stage.data[first_row + 3][offset]),
                  _mm512_extracti32x4_epi32(rows, 3));
}

// The RHT of a unit's columns (each lane of the even and odd halves) down its 16 rows, rounded to
// bf16 values, as rht_tile gives them: in fp32, proven exact after the sums (rht_unit_bf16), else
// per half in fp32 where rht_tile's test passes (bf16 inputs carry no low bits; the rest is tested
// on the 16-bit |x|) or in double with the sum truncated to fp32 (rht_unit_bf16_tested). Columns
// exact in neither (Inf, subnormal inputs, more than 40 binades: rare) make these return false,
// and the unit goes by tiles.
struct RhtUnit {
  // [even / odd columns][output j]: the outputs, bf16 values as fp32 (lane l: column 2l or 2l + 1,
  // as unit_half gives the input), kept only where asked (pass 2).
  __m512 y[2][16];
  __m512i max[2];  // per even / odd lane the max |y_j| (fp32 bits)
};

// The even (half 0) or odd (half 1) columns of a bf16 row as fp32.
MICROSCALE_AVX512_INLINE __m512 unit_half(const std::byte* row, int half) {
  const __m512i raw = _mm512_loadu_si512(row);
  return half == 0 ? widen_half_lanes<DType::BF16, false>(raw) : widen_half_lanes<DType::BF16, true>(raw);
}

// One half's 16 outputs before the bf16 rounding, the sums in double (exact within 40 binades),
// truncated to fp32; lanes 0-7 and 8-15 in turn.
MICROSCALE_AVX512_INLINE void rht_half_double(const std::byte* src, int64_t row_bytes, int half,
                                              const RhtCoefficients& c, __m512 out[16]) {
  __m256 part[2][16];
  for (int h = 0; h < 2; ++h) {
    __m512d z[16];
    for (int i = 0; i < kBlock; ++i) {
      const __m512 x = unit_half(src + i * row_bytes, half);
      const __m256 lanes = h == 0 ? _mm512_castps512_ps256(x)
                                  : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
      z[i] = _mm512_mul_pd(_mm512_cvtps_pd(lanes), _mm512_set1_pd(c[i * 16]));  // exact
    }
    fwht16(z);
    for (int j = 0; j < kBlock; ++j)
      part[h][j] = _mm512_cvt_roundpd_ps(z[j], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  }
  for (int j = 0; j < kBlock; ++j)
    out[j] = _mm512_insertf32x8(_mm512_castps256_ps512(part[0][j]), part[1][j], 1);
}

// Rounds both halves' outputs to bf16 values into out.y and takes their maxes: by two FMAs where
// `normal_range` (rht_outputs_in_normal_range), else in integer steps.
MICROSCALE_AVX512_INLINE void round_rht_outputs(const __m512 even[16], const __m512 odd[16],
                                                bool normal_range, RhtUnit& out) {
  __m512 max[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int j = 0; j < kBlock; ++j) {
    for (int half = 0; half < 2; ++half) {
      const __m512 y = half == 0 ? even[j] : odd[j];
      const __m512 r = normal_range ? round_to_bf16_normal(y) : round_to_bf16(y);
      out.y[half][j] = r;
      max[half] = _mm512_range_ps(max[half], r, 0x0B);  // max |.|, sign cleared
    }
  }
  out.max[0] = _mm512_castps_si512(max[0]);
  out.max[1] = _mm512_castps_si512(max[1]);
}

// Per lane the max |y_j| of one half's outputs before rounding, rounded to bf16 (fp32 bits), for
// pass 1, which keeps no outputs: rounding is monotone, so this is the max of the rounded values.
MICROSCALE_AVX512_INLINE __m512i rounded_max(const __m512 y[16]) {
  __m512i m = _mm512_setzero_si512();
  for (int j = 0; j < kBlock; ++j) m = _mm512_max_epu32(m, abs_bits(y[j]));
  return _mm512_castps_si512(round_to_bf16(_mm512_castsi512_ps(m)));
}

// Columns whose outputs are zero or normal below 2^111 (round_to_bf16_normal): nonzero inputs
// >= 2^-100 make the exact sums multiples of 2^-109, inputs below 2^109 keep them below 2^111.
MICROSCALE_AVX512_INLINE __mmask32 rht_outputs_in_normal_range(__m512i col_max, __m512i min_less_one) {
  return _mm512_cmpge_epu16_mask(min_less_one, _mm512_set1_epi16(0x0D7F)) &
         _mm512_cmplt_epu16_mask(col_max, _mm512_set1_epi16(0x7600));
}

// The smallest nonzero |x| of each column minus one (16-bit lanes), updated with a row's |x|:
// |x| - 1 wraps zeros to 0xFFFF (an all-zero column keeps 0xFFFF, whose "exponent" in the tests
// reads 0: exact, its outputs are zeros). Starts from all ones.
MICROSCALE_AVX512_INLINE __m512i min_nonzero_less_one(__m512i min_less_one, __m512i abs_row) {
  return _mm512_min_epu16(min_less_one, _mm512_sub_epi16(abs_row, _mm512_set1_epi16(1)));
}

// min_nonzero_less_one over the 16 rows of a unit.
MICROSCALE_AVX512_INLINE __m512i unit_min_nonzero_less_one(const std::byte* src, int64_t row_bytes) {
  __m512i min_less_one = _mm512_set1_epi16(-1);
  for (int i = 0; i < kBlock; ++i) {
    min_less_one = min_nonzero_less_one(
        min_less_one, _mm512_and_si512(_mm512_loadu_si512(src + i * row_bytes), _mm512_set1_epi16(0x7FFF)));
  }
  return min_less_one;
}

// Per column, the exponent of its max |x| less that of its smallest nonzero |x| (in binades).
MICROSCALE_AVX512_INLINE __m512i exponent_spread(__m512i col_max, __m512i min_less_one) {
  return _mm512_sub_epi16(_mm512_srli_epi16(col_max, 7),
                          _mm512_srli_epi16(_mm512_add_epi16(min_less_one, _mm512_set1_epi16(1)), 7));
}

// One half's outputs in fp32: the input signs and 1/4 (input_scale), then the butterfly.
MICROSCALE_AVX512_INLINE void rht_half_float(const std::byte* src, int64_t row_bytes, int half,
                                             const float* input_scale, __m512 z[16]) {
  for (int i = 0; i < kBlock; ++i)
    z[i] = _mm512_mul_ps(unit_half(src + i * row_bytes, half), _mm512_set1_ps(input_scale[i]));
  fwht16(z);
}

// rht_unit_bf16 for units whose fp32 sums are not known to be exact: each half in fp32 where
// every column passes rht_tile's test, else in double. Out of line: rare, and its double path
// kept alongside the common form made that slower.
template <bool kKeep>
MICROSCALE_AVX512 __attribute__((noinline)) bool rht_unit_bf16_tested(const std::byte* src, int64_t row_bytes,
                                                                      __m512i col_max, __m512i min_less_one,
                                                                      const RhtCoefficients& c,
                                                                      const float* input_scale,
                                                                      RhtUnit& out) {
  const __m512i spread = exponent_spread(col_max, min_less_one);
  const __mmask32 in_double = _mm512_cmplt_epu16_mask(col_max, _mm512_set1_epi16(0x7F80)) &     // finite
                              _mm512_cmpge_epu16_mask(min_less_one, _mm512_set1_epi16(0x7F)) &  // normal
                              _mm512_cmple_epi16_mask(spread, _mm512_set1_epi16(40));
  if (in_double != ~__mmask32{0}) return false;
  const __mmask32 in_float = _mm512_cmplt_epu16_mask(col_max, _mm512_set1_epi16(0x7C00)) &  // < 2^121
                             _mm512_cmple_epi16_mask(spread, _mm512_set1_epi16(12));
  const bool normal_range =
      kKeep && (in_float & rht_outputs_in_normal_range(col_max, min_less_one)) == ~__mmask32{0};
  __m512 z[2][16];  // [even / odd columns][output j]
  // NOTE: unrolled, z can stay in registers (rolled, GCC 12 keeps it on the stack, indexed).
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {
    const __mmask32 columns = half == 0 ? 0x55555555u : 0xAAAAAAAAu;  // lane l: column l
    if ((in_float & columns) == columns) {
      rht_half_float(src, row_bytes, half, input_scale, z[half]);
    } else {
      rht_half_double(src, row_bytes, half, c, z[half]);
    }
    if constexpr (!kKeep) out.max[half] = rounded_max(z[half]);
  }
  if constexpr (kKeep) round_rht_outputs(z[0], z[1], normal_range, out);
  return true;
}

// The RHT of a unit's columns (see RhtUnit), as rht_unit_bf16_tested gives it, computed in fp32
// first and checked after. Why the check suffices:
// - every partial sum of the butterfly is a multiple of 2^(e - 9), e the exponent of the column's
//   smallest nonzero |x| (8-bit significands, times 1/4): exact in fp32 while below 2^(e + 15);
// - every partial sum is a mean of final outputs (a stage (a, b) -> (a + b, a - b) gives back
//   a = (u + v) / 2), so none exceeds the exact max_j |y_j|;
// - so an inexact sum means an exact max above 2^(e + 15), and the computed outputs are within
//   15 x 2^-24 of the exact ones relative to it: a computed max that rounds to at most
//   (1 - 2^-7) 2^(e + 15) in bf16 proves every sum exact;
// - the reference's double sums in i order are then exact too (each below 16 max |y_j|, so
//   within 28 bits of 2^(e - 9)): the exact sum is what it rounds.
// This takes columns within ~14 binades of their outputs' max in fp32, where the test before
// computing (rht_unit_bf16_tested) can only take 12 binades of the inputs' max: on Gaussian data,
// 1 unit in 7 failed that test (one |x| below max / 2^12 in a column) and went to double, 1 in 26
// fails this check.
template <bool kKeep>
MICROSCALE_AVX512_INLINE bool rht_unit_bf16(const std::byte* src, int64_t row_bytes, __m512i col_max,
                                            __m512i min_less_one, const RhtCoefficients& c,
                                            const float* input_scale, RhtUnit& out) {
  // fp32 needs normal inputs (subnormal ones carry fewer bits) below 2^121 (no sum overflows).
  // A column over 16 binades fails the check anyway (the outputs' max is at least max |x| / 4:
  // the inputs are the butterfly's first partial sums), so the tested form goes first there and
  // data of a wide range do not pay for both forms.
  const __m512i spread = exponent_spread(col_max, min_less_one);
  const __mmask32 fp32 = _mm512_cmplt_epu16_mask(col_max, _mm512_set1_epi16(0x7C00)) &
                         _mm512_cmpge_epu16_mask(min_less_one, _mm512_set1_epi16(0x7F)) &
                         _mm512_cmple_epi16_mask(spread, _mm512_set1_epi16(16));
  if (fp32 != ~__mmask32{0})
    return rht_unit_bf16_tested<kKeep>(src, row_bytes, col_max, min_less_one, c, input_scale, out);
  const bool normal_range = kKeep && rht_outputs_in_normal_range(col_max, min_less_one) == ~__mmask32{0};
  __m512 z[2][16];  // [even / odd columns][output j]
  rht_half_float(src, row_bytes, 0, input_scale, z[0]);
  rht_half_float(src, row_bytes, 1, input_scale, z[1]);
  if constexpr (kKeep) {
    round_rht_outputs(z[0], z[1], normal_range, out);
  } else {
    out.max[0] = rounded_max(z[0]);
    out.max[1] = rounded_max(z[1]);
  }
  // The check, on bf16 patterns (word l: column l): max |y| <= (1 - 2^-7) 2^(e + 15), that is
  // exponent e + 14 and significand at most 1.1111110b.
  const __m512i max16 = _mm512_or_si512(_mm512_srli_epi32(out.max[0], 16), out.max[1]);
  const __m512i limit = _mm512_add_epi16(
      _mm512_and_si512(_mm512_add_epi16(min_less_one, _mm512_set1_epi16(1)), _mm512_set1_epi16(0x7F80)),
      _mm512_set1_epi16((14 << 7) | 0x7E));
  if (_mm512_cmple_epu16_mask(max16, limit) != ~__mmask32{0})
    return rht_unit_bf16_tested<kKeep>(src, row_bytes, col_max, min_less_one, c, input_scale, out);
  return true;
}

// Each 32-bit lane of v shifted left by `bits` (right where negative; v unchanged at 0). Codes held
// in nibbles move between nibble positions without losing bits.
MICROSCALE_AVX512_INLINE __m512i shift_lanes(__m512i v, int bits) {
  if (bits > 0) return _mm512_slli_epi32(v, static_cast<unsigned>(bits));
  if (bits < 0) return _mm512_srli_epi32(v, static_cast<unsigned>(-bits));
  return v;
}

// The scales of a unit, per direction: rowwise in transpose_max16x2 order (row_scale[h] for rows
// 8h..8h+7), columnwise per even and odd lane.
struct UnitScales {
  __m512 row_scale[2];
  __m512 col_even, col_odd;
};

// A unit's maxes as its first step computes them: the 16-bit |x| column maxes and
// transpose_max16x2's row pairs. With 1x16 blocks a unit's element loop computes the next
// unit's as it goes, so that its loads and maxes overlap the encoding instead of opening the next
// unit with 16 loads and a reduction that everything after waits on (measured on Zen 4: -4 to -5 %
// for the call, -2 to -5 % with the RHT; docs/perf.md, thirty-second session).
struct UnitMaxes {
  __m512i col_max;
  __m512i pairs[8];
  __m512i min_less_one;  // with the RHT: min_nonzero_less_one over the rows
};

// The element loop of a unit: each row loaded once (mostly from L1: the amax step or the unit
// before read it; after pass 1's tile maxes, from where the prefetches left it), both directions
// encoded. kSharedSign: no product underflows to -0, so a lane's sign is its input's, one compare
// for both directions. kSameCodes (16x16 tiles, both directions on the same global amax): the two
// directions' scales are equal, so are their codes: encoded once (with their signs, at the
// rowwise nibbles), then shifted to the columnwise ones. kNext: also reads the next unit's rows
// (64 bytes on) and leaves its maxes in *next.
template <DType kIn, bool kRows, bool kCols, bool kSharedSign, bool kSameCodes, bool kRht, bool kBounded,
          bool kNext>
MICROSCALE_AVX512_INLINE void encode_unit(const Group& g, const std::byte* src, const UnitScales& s,
                                          const RhtUnit* rht, RowStage& stage, int line_tile,
                                          __m512i col_words[4], UnitMaxes* next) {
  [[maybe_unused]] __m512i next_col_max, next_pairs[8], next_held, next_min_less_one;
  __m512i row_packed = _mm512_setzero_si512();
  __m512i col_packed[2][2];     // [rows 0-7 / 8-15][even / odd lanes]
  __m512i held_even, held_odd;  // an even row's columnwise codes, ORed in with the next row's
  // NOTE: fully unrolled, every table, shift and scale index is a constant (GCC does not unroll
  // this body by itself: rolled, it computes them per row and keeps col_packed on the stack).
#pragma GCC unroll 16
  for (int i = 0; i < kBlock; ++i) {
    prefetch_unit_row<_MM_HINT_T1>(src + i * g.row_bytes);
    if constexpr (kNext) {  // the next unit's row i
      const __m512i v =
          _mm512_and_si512(_mm512_loadu_si512(src + 64 + i * g.row_bytes), _mm512_set1_epi16(0x7FFF));
      next_col_max = i == 0 ? v : _mm512_max_epu16(next_col_max, v);
      if constexpr (kRht)
        next_min_less_one = min_nonzero_less_one(i == 0 ? _mm512_set1_epi16(-1) : next_min_less_one, v);
      if (i % 2 == 0) {
        next_held = v;
      } else {
        next_pairs[i / 2] = transpose_max_row_pair(next_held, v);
      }
    }
    const __m512i raw = _mm512_loadu_si512(src + i * g.row_bytes);
    const __m512 even = widen_half_lanes<kIn, false>(raw), odd = widen_half_lanes<kIn, true>(raw);
    __mmask16 even_negative = 0, odd_negative = 0;
    if constexpr (kSharedSign) {
      even_negative = is_negative(even);
      odd_negative = is_negative(odd);
    }
    __m512i row_even_index, row_odd_index;
    __mmask16 row_even_negative = 0, row_odd_negative = 0;
    __m512i row_even_codes, row_odd_codes;  // signed codes at their rowwise nibbles (kSameCodes reuses them)
    if constexpr (kRows) {
      const __m512 scale =
          kSameCodes ? s.col_even : _mm512_permutexvar_ps(row_scale_index(i % 8), s.row_scale[i / 8]);
      const __m512 pe = _mm512_mul_ps(even, scale), po = _mm512_mul_ps(odd, scale);
      row_even_index = nvfp4_e2m1_index<true, kBounded>(pe);
      row_odd_index = nvfp4_e2m1_index<true, kBounded>(po);
      row_even_negative = kSharedSign ? even_negative : is_negative(pe);
      row_odd_negative = kSharedSign ? odd_negative : is_negative(po);
      const int shift = 8 * (i % 4);  // byte i % 4 of each lane; odd columns in its high nibble
      row_even_codes = nvfp4_e2m1_codes<kBounded>(row_even_index, row_even_negative, shift);
      row_odd_codes = nvfp4_e2m1_codes<kBounded>(row_odd_index, row_odd_negative, shift + 4);
      row_packed = _mm512_ternarylogic_epi32(row_packed, row_even_codes, row_odd_codes, 0xFE);  // a | b | c
      if (i % 4 == 3) {
        store_row_quad(row_packed, stage, i - 3, line_tile * 8);
        row_packed = _mm512_setzero_si512();
      }
    }
    if constexpr (kCols) {
      const int shift = 4 * (i % 8);  // element i of the column block: nibble i % 8 of word i / 8
      __m512i ce, co;
      if constexpr (kSameCodes) {  // the rowwise codes moved from nibble 2 (i % 4) (+ 1 if odd) to i % 8
        static_assert(kRows);
        ce = shift_lanes(row_even_codes, shift - 8 * (i % 4));
        co = shift_lanes(row_odd_codes, shift - 8 * (i % 4) - 4);
      } else if constexpr (kRht) {  // the transformed values: their own signs
        const __m512 pe = _mm512_mul_ps(rht->y[0][i], s.col_even),
                     po = _mm512_mul_ps(rht->y[1][i], s.col_odd);
        ce = nvfp4_e2m1_codes<kBounded>(nvfp4_e2m1_index<true, kBounded>(pe), is_negative(pe), shift);
        co = nvfp4_e2m1_codes<kBounded>(nvfp4_e2m1_index<true, kBounded>(po), is_negative(po), shift);
      } else {
        const __m512 pe = _mm512_mul_ps(even, s.col_even), po = _mm512_mul_ps(odd, s.col_odd);
        ce = nvfp4_e2m1_codes<kBounded>(nvfp4_e2m1_index<true, kBounded>(pe),
                                        kSharedSign ? even_negative : is_negative(pe), shift);
        co = nvfp4_e2m1_codes<kBounded>(nvfp4_e2m1_index<true, kBounded>(po),
                                        kSharedSign ? odd_negative : is_negative(po), shift);
      }
      // Rows paired: one three-way OR per two codes.
      if (i % 2 == 0) {
        held_even = ce;
        held_odd = co;
      } else if (i % 8 == 1) {
        col_packed[i / 8][0] = _mm512_or_si512(held_even, ce);
        col_packed[i / 8][1] = _mm512_or_si512(held_odd, co);
      } else {
        col_packed[i / 8][0] = _mm512_ternarylogic_epi32(col_packed[i / 8][0], held_even, ce, 0xFE);
        col_packed[i / 8][1] = _mm512_ternarylogic_epi32(col_packed[i / 8][1], held_odd, co, 0xFE);
      }
    }
  }
  if constexpr (kNext) {
    next->col_max = next_col_max;
    for (int p = 0; p < 8; ++p) next->pairs[p] = next_pairs[p];
    if constexpr (kRht) next->min_less_one = next_min_less_one;
  }
  if constexpr (kCols) {
    // Column 2j + p's 8 bytes: word j of col_packed[0][p] (rows 0-7), then of col_packed[1][p].
    // Interleaving even and odd columns, then rows 0-7 and 8-15, leaves in 128-bit chunk l of
    // col_words[w] the qwords of columns 8l + 2w and 8l + 2w + 1.
    const __m512i lo_a = _mm512_unpacklo_epi32(col_packed[0][0], col_packed[0][1]);  // 8l + 0..3
    const __m512i lo_b = _mm512_unpackhi_epi32(col_packed[0][0], col_packed[0][1]);  // 8l + 4..7
    const __m512i hi_a = _mm512_unpacklo_epi32(col_packed[1][0], col_packed[1][1]);
    const __m512i hi_b = _mm512_unpackhi_epi32(col_packed[1][0], col_packed[1][1]);
    col_words[0] = _mm512_unpacklo_epi32(lo_a, hi_a);
    col_words[1] = _mm512_unpackhi_epi32(lo_a, hi_a);
    col_words[2] = _mm512_unpacklo_epi32(lo_b, hi_b);
    col_words[3] = _mm512_unpackhi_epi32(lo_b, hi_b);
  }
}

// Within each 8-lane half (a tile's even or odd columns), every lane set to the half's max.
MICROSCALE_AVX512_INLINE __m512i half_max(__m512i v) {
  v = _mm512_max_epu32(v, _mm512_shuffle_i32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_max_epu32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  return _mm512_max_epu32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
}

// Blocks whose amax times encode scale may reach 7 (or is NaN: an Inf amax): their products are
// beyond nvfp4_e2m1_index<true, true>. A normal E4M3 block scale rounds amax / 6 by at most 1/16,
// so only subnormal or saturated block scales (an amax override below the data's) get there.
MICROSCALE_AVX512_INLINE __mmask16 block_may_reach_seven(__m512i amax_bits, __m512 encode_scale) {
  return _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_castsi512_ps(amax_bits), encode_scale), _mm512_set1_ps(7.0f),
                            _CMP_NLT_UQ);
}

// encode_unit in the fastest form the unit allows: kSharedSign unless a scale is tiny, kBounded
// unless a block may reach 7 (block_may_reach_seven).
template <DType kIn, bool kRows, bool kCols, bool kSameCodes, bool kRht, bool kNext>
MICROSCALE_AVX512_INLINE void encode_unit_form(bool tiny, bool unbounded, const Group& g,
                                               const std::byte* src, const UnitScales& s, const RhtUnit* rht,
                                               RowStage& stage, int line_tile, __m512i col_words[4],
                                               UnitMaxes* next) {
  if (tiny) {
    encode_unit<kIn, kRows, kCols, false, kSameCodes, kRht, false, kNext>(g, src, s, rht, stage, line_tile,
                                                                          col_words, next);
  } else if (unbounded) {
    encode_unit<kIn, kRows, kCols, true, kSameCodes, kRht, false, kNext>(g, src, s, rht, stage, line_tile,
                                                                         col_words, next);
  } else {
    encode_unit<kIn, kRows, kCols, true, kSameCodes, kRht, true, kNext>(g, src, s, rht, stage, line_tile,
                                                                        col_words, next);
  }
}

// Pass 2 on the unit at `col` of a full band (16 rows of kIn, bf16 or f16, at src). Returns false,
// having written nothing, when the unit holds a NaN (quantize_tile handles it). `given`: the unit's
// maxes from the unit before (null: computed here); `next` (1x16 blocks; null: not asked):
// where the element loop leaves the next unit's, filled whenever this returns true.
template <DType kIn, bool kRows, bool kCols, bool kRht>
MICROSCALE_AVX512 bool quantize_unit16(const Group& g, const std::byte* src, int64_t col, int band,
                                       RowStage& stage, ColumnStage cs, const UnitMaxes* given,
                                       UnitMaxes* next) {
  static_assert(!kRht || kIn == DType::BF16);  // as in TransformerEngine, the RHT takes bf16 only
  src += col * 2;
  __m512i a[16];
  __m512i col_max = _mm512_setzero_si512();
  [[maybe_unused]] __m512i min_less_one = _mm512_set1_epi16(-1);  // with the RHT
  if (!kRht && g.tile_maxes != nullptr) {  // pass 1's (unit_tile_maxes), each across its tile's lanes
    const uint16_t* record = g.tile_maxes + 2 * (band * g.units_per_band + col / kUnitColumns);
    col_max = _mm512_mask_blend_epi16(0xFFFF0000, _mm512_set1_epi16(static_cast<int16_t>(record[0])),
                                      _mm512_set1_epi16(static_cast<int16_t>(record[1])));
  } else if (given != nullptr) {
    col_max = given->col_max;
    if constexpr (kRht) min_less_one = given->min_less_one;
  } else {
    for (int i = 0; i < kBlock; ++i) {
      a[i] = _mm512_and_si512(_mm512_loadu_si512(src + i * g.row_bytes), _mm512_set1_epi16(0x7FFF));
      col_max = _mm512_max_epu16(col_max, a[i]);
      if constexpr (kRht) min_less_one = min_nonzero_less_one(min_less_one, a[i]);
    }
  }
  // NaN: back to the tiles (Inf goes on).
  if (_mm512_cmpgt_epu16_mask(col_max, _mm512_set1_epi16(kInf16Bits<kIn>)) != 0) return false;
  __m512i even_max = _mm512_castps_si512(widen_half_lanes<kIn, false>(col_max));  // fp32 bits
  __m512i odd_max = _mm512_castps_si512(widen_half_lanes<kIn, true>(col_max));
  // The RHT (columnwise only; never with 16x16 tiles): the columnwise values and their maxes.
  [[maybe_unused]] RhtUnit rht;
  if constexpr (kRht) {
    if (!rht_unit_bf16<true>(src, g.row_bytes, col_max, min_less_one, *g.rht, g.rht_input_scale, rht))
      return false;
    even_max = rht.max[0];
    odd_max = rht.max[1];
  }
  // 16x16: the tile's max in each lane (lanes 0-7: columns 0-15, lanes 8-15: columns 16-31).
  const __m512i tile_max = g.tile_2d ? half_max(_mm512_max_epu32(even_max, odd_max)) : _mm512_setzero_si512();
  const int line_tile = static_cast<int>(col / kBlock) % kLineTiles;

  UnitScales s;
  __mmask16 tiny = 0;  // scales so small that a product may underflow to -0 (sign lost)
  // Scales at least this: a nonzero product is >= 2^-149 (bf16 |x| >= 2^-133; f16 |x| >= 2^-24,
  // whose products are then >= 2^-40), so no product underflows to a zero of the wrong sign.
  const __m512 min_shared = _mm512_set1_ps(0x1p-16f);
  __mmask16 unbounded = 0;  // blocks where block_may_reach_seven
  if constexpr (kRows) {
    __m512i amax[2], codes[2];
    if (g.tile_2d) {  // tile_max laid out as the tree's lanes: block (d / 4) % 2
      amax[0] = amax[1] = _mm512_permutexvar_epi32(
          _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 0, 0, 0, 0, 8, 8, 8, 8), tile_max);
    } else {
      if (given != nullptr) {
        transpose_max16x2_from_pairs(given->pairs, amax);
      } else {
        transpose_max16x2(a, amax);  // each 16-bit max shifted up: bf16's fp32 bits
      }
      if constexpr (kIn == DType::F16) {
        for (__m512i& m : amax) m = _mm512_castps_si512(widen_half_lanes<kIn, true>(m));
      }
    }
    for (int h = 0; h < 2; ++h) {  // rows 8h..8h+7, 2 bytes each (line_tile is even)
      s.row_scale[h] = nvfp4_block_scales(amax[h], g.row.multiplier, g.row.encode_scale, &codes[h]);
      tiny |= _mm512_cmp_ps_mask(s.row_scale[h], min_shared, _CMP_LT_OQ);
      unbounded |= block_may_reach_seven(amax[h], s.row_scale[h]);
      _mm_store_si128(reinterpret_cast<__m128i*>(stage.scale[line_tile / 2][8 * h]),
                      _mm512_cvtepi32_epi8(rows_in_order(codes[h])));
    }
  }
  if constexpr (kCols) {
    __m512i even_codes, odd_codes;
    if (g.tile_2d) {
      s.col_even = s.col_odd =
          nvfp4_block_scales(tile_max, g.col.multiplier, g.col.encode_scale, &even_codes);
      odd_codes = even_codes;
    } else {
      s.col_even = nvfp4_block_scales(even_max, g.col.multiplier, g.col.encode_scale, &even_codes);
      s.col_odd = nvfp4_block_scales(odd_max, g.col.multiplier, g.col.encode_scale, &odd_codes);
    }
    tiny |= _mm512_cmp_ps_mask(s.col_even, min_shared, _CMP_LT_OQ) |
            _mm512_cmp_ps_mask(s.col_odd, min_shared, _CMP_LT_OQ);
    unbounded |= block_may_reach_seven(g.tile_2d ? tile_max : even_max, s.col_even) |
                 block_may_reach_seven(g.tile_2d ? tile_max : odd_max, s.col_odd);
    const __m128i e = _mm512_cvtepi32_epi8(even_codes), o = _mm512_cvtepi32_epi8(odd_codes);
    uint8_t* scale = cs.scale + band * g.k + col;  // 32 bytes in column order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scale), _mm_unpacklo_epi8(e, o));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scale + 16), _mm_unpackhi_epi8(e, o));
  }

  __m512i col_words[4];
  const bool same_codes =
      kRows && kCols && g.tile_2d && g.row.multiplier == g.col.multiplier && g.row.s_dec == g.col.s_dec;
  // The RHT's outputs (null without it) are what its units encode columnwise. `next` comes only
  // with 1x16 blocks (quantize_group), and same_codes only with 16x16 tiles, which never have the
  // RHT.
  const RhtUnit* rht_values = kRht ? &rht : nullptr;
  if (next != nullptr) {
    encode_unit_form<kIn, kRows, kCols, false, kRht, true>(tiny != 0, unbounded != 0, g, src, s, rht_values,
                                                           stage, line_tile, col_words, next);
  } else if (same_codes) {
    encode_unit_form<kIn, kRows, kCols, kRows && kCols && !kRht, kRht, false>(
        tiny != 0, unbounded != 0, g, src, s, rht_values, stage, line_tile, col_words, nullptr);
  } else {
    encode_unit_form<kIn, kRows, kCols, false, kRht, false>(tiny != 0, unbounded != 0, g, src, s, rht_values,
                                                            stage, line_tile, col_words, nullptr);
  }
  if constexpr (kCols) {  // 32 columns x 8 bytes, in column order
    // col_words[w], 128-bit chunk l: columns 8l + 2w, 8l + 2w + 1; a 4x4 transpose of the chunks.
    const __m512i x0 = _mm512_shuffle_i64x2(col_words[0], col_words[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i x1 = _mm512_shuffle_i64x2(col_words[0], col_words[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i y0 = _mm512_shuffle_i64x2(col_words[2], col_words[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i y1 = _mm512_shuffle_i64x2(col_words[2], col_words[3], _MM_SHUFFLE(3, 2, 3, 2));
    uint8_t* data = cs.data + (band * g.k + col) * 8;
    _mm512_storeu_si512(data, _mm512_shuffle_i64x2(x0, y0, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_si512(data + 64, _mm512_shuffle_i64x2(x0, y0, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_si512(data + 128, _mm512_shuffle_i64x2(x1, y1, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_si512(data + 192, _mm512_shuffle_i64x2(x1, y1, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return true;
}

// The band's staged rowwise line starting at column `line_col`, its first `tiles` tiles filled:
// one 64-byte store per row when whole.
MICROSCALE_AVX512_INLINE void flush_row_line(const Group& g, const RowStage& stage, int band, int rows,
                                             int64_t line_col, int tiles) {
  // The scales in row order: 16-bit word 16p + i of the stage is row i's tile pair p; row i's 8
  // bytes go to qword i % 8 of ordered[i / 8].
  alignas(64) uint8_t ordered[2][64];
  for (int h = 0; h < 2; ++h) {
    alignas(64) int16_t index[32];
    for (int w = 0; w < 32; ++w) index[w] = static_cast<int16_t>(16 * (w % 4) + 8 * h + w / 4);
    _mm512_store_si512(ordered[h],
                       _mm512_permutex2var_epi16(_mm512_load_si512(stage.scale[0]), _mm512_load_si512(index),
                                                 _mm512_load_si512(stage.scale[2])));
  }
  for (int i = 0; i < rows; ++i) {
    const int64_t r = band * kBlock + i;
    uint8_t* data = g.row_data + r * g.row_data_stride + line_col / 2;
    uint8_t* scale = g.row_scale + r * g.row_scale_stride + line_col / kBlock;
    if (tiles == kLineTiles) {
      store_line(data, _mm512_load_si512(stage.data[i]), g.row_stream);
      std::memcpy(scale, &ordered[i / 8][8 * (i % 8)], kLineTiles);
    } else {
      std::memcpy(data, stage.data[i], tiles * 8);
      std::memcpy(scale, &ordered[i / 8][8 * (i % 8)], tiles);
    }
  }
}

// 8 registers of 8 qwords -> their transpose (v[j] lane b = old v[b] lane j).
MICROSCALE_AVX512_INLINE void transpose8x8_epi64(__m512i v[8]) {
  __m512i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm512_unpacklo_epi64(v[2 * p], v[2 * p + 1]);      // chunk k: v2p[2k], v2p+1[2k]
    t[2 * p + 1] = _mm512_unpackhi_epi64(v[2 * p], v[2 * p + 1]);  // ... [2k + 1]
  }
  for (int q = 0; q < 2; ++q) {
    for (int h = 0; h < 2; ++h) {  // lanes 2k + h of rows 4q..4q+3: chunks (0, 2), then (1, 3)
      u[4 * q + h] = _mm512_shuffle_i64x2(t[4 * q + h], t[4 * q + 2 + h], _MM_SHUFFLE(2, 0, 2, 0));
      u[4 * q + 2 + h] = _mm512_shuffle_i64x2(t[4 * q + h], t[4 * q + 2 + h], _MM_SHUFFLE(3, 1, 3, 1));
    }
  }
  // u[4q + m], by chunk: rows (4q, 4q + 1) of lanes m and m + 4, then rows (4q + 2, 4q + 3).
  for (int m = 0; m < 4; ++m) {
    v[m] = _mm512_shuffle_i64x2(u[m], u[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
    v[m + 4] = _mm512_shuffle_i64x2(u[m], u[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Groups of at most this many bands (inputs of up to 64 rows) copy their columnwise outputs
// qword by qword (flush_column_lines).
constexpr int kFewBands = 4;

// The first n (0..8) qwords of a register.
MICROSCALE_AVX512_INLINE __mmask8 qword_mask(int n) { return static_cast<__mmask8>((1u << n) - 1); }

// The group's columnwise lines from the band-major stage: 8 bytes of each of `bands` bands per
// columnwise row (two whole 64-byte lines when bands == 16), and its `bands` scale bytes.
MICROSCALE_AVX512 void flush_column_lines(const Group& g, ColumnStage cs, int bands) {
  if (bands <= kFewBands) {
    // The transposes below would move mostly zeros: each columnwise row's few qwords and scale
    // bytes copied as they are (a 16-row call: 9 -> ~2 us of its ~40 us at K = 4096).
    for (int64_t c = 0; c < g.k; ++c) {
      for (int b = 0; b < bands; ++b) {
        std::memcpy(g.col_data + c * g.col_data_stride + 8 * b, cs.data + (b * g.k + c) * 8, 8);
        g.col_scale[c * g.col_scale_stride + b] = cs.scale[b * g.k + c];
      }
    }
    return;
  }
  const int lines = bands > kLineBands ? 2 : 1;  // lines holding bands
  for (int64_t c0 = 0; c0 < g.k; c0 += 8) {
    __m512i v[2][8];  // [line][band of the line], then transposed: [line][column c0 + j]
    for (int line = 0; line < lines; ++line) {
      for (int b = 0; b < kLineBands; ++b) {
        const int band = line * kLineBands + b;
        v[line][b] =
            band < bands ? _mm512_loadu_si512(cs.data + (band * g.k + c0) * 8) : _mm512_setzero_si512();
      }
      transpose8x8_epi64(v[line]);
    }
    for (int j = 0; j < 8; ++j) {
      uint8_t* data = g.col_data + (c0 + j) * g.col_data_stride;
      if (bands == kGroupBands) {
        store_line(data, v[0][j], g.col_stream);
        store_line(data + 64, v[1][j], g.col_stream);
      } else {  // a partial group: its bands' qwords by masked stores (a memcpy call per row was
                // most of a 16-row call's time)
        _mm512_mask_storeu_epi64(data, qword_mask(std::min(bands, kLineBands)), v[0][j]);
        if (lines == 2) _mm512_mask_storeu_epi64(data + 64, qword_mask(bands - kLineBands), v[1][j]);
      }
    }
  }
  // Scales: 64 columns and 8 bands at a time, an 8 x 64 byte transpose (per 128-bit chunk l:
  // bands paired, then 4, then 8), leaving column 16l + 2o + t in qword 2l + t of out[o].
  for (int64_t c0 = 0; c0 < g.k; c0 += 64) {
    const __mmask64 in_range = g.k - c0 >= 64 ? ~__mmask64{0} : (__mmask64{1} << (g.k - c0)) - 1;
    alignas(64) uint64_t out[2][8][8];  // [8 bands][o][qword]
    for (int half = 0; half < kGroupBands / kLineBands; ++half) {
      __m512i v[8];
      for (int b = 0; b < kLineBands; ++b) {
        const int band = kLineBands * half + b;
        v[b] = band < bands ? _mm512_maskz_loadu_epi8(in_range, cs.scale + band * g.k + c0)
                            : _mm512_setzero_si512();
      }
      __m512i w[2][4];  // [columns 0..7 / 8..15 of each chunk][band pair]: 16-bit words
      for (int p = 0; p < 4; ++p) {
        w[0][p] = _mm512_unpacklo_epi8(v[2 * p], v[2 * p + 1]);
        w[1][p] = _mm512_unpackhi_epi8(v[2 * p], v[2 * p + 1]);
      }
      for (int h = 0; h < 2; ++h) {
        __m512i d[2][2];  // [bands 0-3 / 4-7][columns 8h + 0..3 / 8h + 4..7]: 32-bit words
        for (int q = 0; q < 2; ++q) {
          d[q][0] = _mm512_unpacklo_epi16(w[h][2 * q], w[h][2 * q + 1]);
          d[q][1] = _mm512_unpackhi_epi16(w[h][2 * q], w[h][2 * q + 1]);
        }
        for (int x = 0; x < 2; ++x) {  // columns 8h + 4x + {0, 1} and + {2, 3}
          _mm512_store_si512(out[half][4 * h + 2 * x], _mm512_unpacklo_epi32(d[0][x], d[1][x]));
          _mm512_store_si512(out[half][4 * h + 2 * x + 1], _mm512_unpackhi_epi32(d[0][x], d[1][x]));
        }
      }
    }
    const int64_t columns = std::min<int64_t>(64, g.k - c0);
    for (int c = 0; c < columns; ++c) {
      uint8_t* scale = g.col_scale + (c0 + c) * g.col_scale_stride;
      const int o = (c % 16) / 2, q = 2 * (c / 16) + c % 2;
      if (bands == kGroupBands) {  // constant sizes: two 8-byte stores
        std::memcpy(scale, &out[0][o][q], 8);
        std::memcpy(scale + 8, &out[1][o][q], 8);
      } else {
        const __m128i bytes =
            _mm_set_epi64x(static_cast<int64_t>(out[1][o][q]), static_cast<int64_t>(out[0][o][q]));
        _mm_mask_storeu_epi8(scale, static_cast<__mmask16>((1u << bands) - 1), bytes);
      }
    }
  }
}

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

// quantize_unit16 in the form the group asks for: its directions, and the RHT (bf16 only: for other
// inputs validate_quantize rejects the RHT before any kernel runs, so g.rht is null here).
template <DType kIn>
MICROSCALE_AVX512_INLINE bool quantize_unit_as_asked(const Group& g, const std::byte* src, int64_t col,
                                                     int band, RowStage& stage, ColumnStage cs,
                                                     const UnitMaxes* given, UnitMaxes* next) {
  const bool rowwise = g.row_data != nullptr, columnwise = g.col_data != nullptr;
  if constexpr (kIn == DType::BF16) {
    if (g.rht != nullptr) {
      return rowwise ? quantize_unit16<kIn, true, true, true>(g, src, col, band, stage, cs, given, next)
                     : quantize_unit16<kIn, false, true, true>(g, src, col, band, stage, cs, given, next);
    }
  }
  if (!rowwise) return quantize_unit16<kIn, false, true, false>(g, src, col, band, stage, cs, given, next);
  return columnwise ? quantize_unit16<kIn, true, true, false>(g, src, col, band, stage, cs, given, next)
                    : quantize_unit16<kIn, true, false, false>(g, src, col, band, stage, cs, given, next);
}

// Pass 2 for one group, band after band (16 input rows: few enough read streams for the
// hardware prefetcher). Outputs are staged and written a whole 64-byte line at a time: 8 tiles
// fill a line of each of the band's 16 rowwise rows, and the group's 16 bands two lines of each
// of the K columnwise rows.
// NOTE: writing each tile's 8-byte pieces straight to the outputs (rows 2 KiB apart for a
// 4096 x 4096 input) was 3x slower: partial lines, all in two L1 sets, evicted and re-read.
// Walking all rows of a group per tile column was slower still (128 read streams).
template <DType kDType>
MICROSCALE_AVX512 void quantize_group(const Group& g, ColumnStage cs) {
  const int bands = (g.rows + kBlock - 1) / kBlock;
  const bool rowwise = g.row_data != nullptr, columnwise = g.col_data != nullptr;
  // bf16 and f16 full bands go by units of two tiles.
  constexpr bool kUnits = kDType == DType::BF16 || kDType == DType::F16;
  for (int band = 0; band < bands; ++band) {
    const int rows = std::min(kBlock, g.rows - band * kBlock);
    const std::byte* src = g.src + band * kBlock * g.row_bytes;
    RowStage stage;
    // 1x16 blocks: each unit's element loop computes the maxes of the unit after it (UnitMaxes).
    const bool carry = !g.tile_2d;
    UnitMaxes carried[2];
    bool have_carried = false;
    int current = 0;
    for (int64_t col = 0; col < g.k;) {
      const bool unit = kUnits && rows == kBlock && col + kUnitColumns <= g.k;
      if (!unit) prefetch_band_ahead<kDType, _MM_HINT_T1>(g, src, rows, col);  // units: prefetch_unit_row
      int64_t next = col + kBlock;
      if (unit) {
        next = col + kUnitColumns;
        bool done = false;
        const bool next_unit = carry && col + 2 * kUnitColumns <= g.k;
        if constexpr (kUnits) {
          done = quantize_unit_as_asked<kDType>(g, src, col, band, stage, cs,
                                                have_carried ? &carried[current] : nullptr,
                                                next_unit ? &carried[current ^ 1] : nullptr);
        }
        have_carried = done && next_unit;
        current ^= 1;
        if (!done) {
          quantize_tile<kDType>(g, src, rows, col, band, stage, cs);
          quantize_tile<kDType>(g, src, rows, col + kBlock, band, stage, cs);
        }
      } else {
        quantize_tile<kDType>(g, src, rows, col, band, stage, cs);
      }
      const int line_tile = static_cast<int>((next - 1) / kBlock) % kLineTiles;  // of the last tile
      if (rowwise && (line_tile == kLineTiles - 1 || next == g.k)) {
        flush_row_line(g, stage, band, rows, (next - 1) / kBlock / kLineTiles * kLineTiles * kBlock,
                       line_tile + 1);
      }
      col = next;
    }
  }
  if (columnwise) flush_column_lines(g, cs, bands);
  if (g.row_stream || g.col_stream) _mm_sfence();  // streamed stores are weakly ordered
}

template <bool kWide>  // 32-bit lanes, else 16-bit
MICROSCALE_AVX512_INLINE __m512i max_unsigned(__m512i a, __m512i b) {
  return kWide ? _mm512_max_epu32(a, b) : _mm512_max_epu16(a, b);
}

// m = max(m, |v|) on the stored bits (`magnitude` masks the sign).
template <bool kWide>
MICROSCALE_AVX512_INLINE void max_abs_in(__m512i magnitude, __m512i& m, __m512i v) {
  m = max_unsigned<kWide>(m, _mm512_and_si512(v, magnitude));
}

// max |x| (on the stored bits, `magnitude` masking the sign) of the first `bytes` bytes of rows a
// and b, read side by side, into acc[0..1] (row a) and acc[2..3] (row b).
template <bool kWide>
MICROSCALE_AVX512_INLINE void row_pair_abs_max(const std::byte* a, const std::byte* b, int64_t bytes,
                                               __m512i magnitude, __m512i acc[4]) {
  int64_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    max_abs_in<kWide>(magnitude, acc[0], _mm512_loadu_si512(a + i));
    max_abs_in<kWide>(magnitude, acc[1], _mm512_loadu_si512(a + i + 64));
    max_abs_in<kWide>(magnitude, acc[2], _mm512_loadu_si512(b + i));
    max_abs_in<kWide>(magnitude, acc[3], _mm512_loadu_si512(b + i + 64));
  }
  for (; i < bytes; i += 32) {  // 32-byte steps: rows are multiples of 16 elements
    max_abs_in<kWide>(magnitude, acc[0],
                      _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i))));
    max_abs_in<kWide>(magnitude, acc[2],
                      _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i))));
  }
}

// The max of |x| over `rows` rows of k elements as fp32 bits, max-ed into *max_bits; false (and
// nothing max-ed in) when they hold a NaN. On the stored bits, without widening: 32 lanes of a
// 16-bit type per operation, so that the pass runs at the speed of the read.
// NOTE: two read streams, the band's first and second half of rows, each one row after the
// other (a band of packed rows: two sequential reads of 64 KiB). Measured on 4096 x 4096 bf16,
// paired against 16 streams side by side (one per row, 128 bytes a step, as pass 2 reads): the
// whole row+col call 0.96 on Zen 4 (a scratch read of 32 MiB: 1-2 streams 1.3-1.8 ms, 16 streams
// 2.1-2.3), 1.00 on an Intel Xeon host (1-16 streams all 1.3-1.6 ms); one stream alone was
// as fast on Zen 4 but 1 % slower there (docs/perf.md, thirty-third session).
template <DType kDType>
MICROSCALE_AVX512_INLINE bool raw_abs_max(const std::byte* src, int64_t row_bytes, int rows, int64_t k,
                                          __m512i* max_bits) {
  constexpr bool kWide = kDType == DType::F32;
  const int64_t bytes = k * element_bytes<kDType>();  // a multiple of 32
  const __m512i magnitude = kWide ? _mm512_set1_epi32(0x7FFFFFFF) : _mm512_set1_epi16(0x7FFF);
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
  // Rows [0, first_half) beside [first_half, rows); an odd count's last row beside itself.
  const int first_half = (rows + 1) / 2;
  for (int r = 0; r < first_half; ++r) {
    const int beside = r + first_half < rows ? r + first_half : r;
    row_pair_abs_max<kWide>(src + r * row_bytes, src + beside * row_bytes, bytes, magnitude, acc);
  }
  const __m512i m0 = max_unsigned<kWide>(acc[0], acc[1]), m1 = max_unsigned<kWide>(acc[2], acc[3]);
  const __m512i m = max_unsigned<kWide>(m0, m1);
  uint32_t bits;
  if constexpr (kWide) {
    bits = _mm512_reduce_max_epu32(m);
    if (bits > 0x7F800000u) return false;
  } else {
    const uint32_t half = _mm512_reduce_max_epu32(
        _mm512_max_epu32(_mm512_and_si512(m, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(m, 16)));
    if (half > kInf16Bits<kDType>) return false;
    bits = kDType == DType::BF16 ? half << 16 : float_bits(half_to_float(static_cast<uint16_t>(half)));
  }
  *max_bits = _mm512_max_epu32(*max_bits, _mm512_set1_epi32(static_cast<int>(bits)));
  return true;
}

// Pass 1 with the RHT on a bf16 unit of a full band (16 rows x 32 columns at src): max |x| into
// *max16 (16-bit lanes), max |RHT(x)| into *rht_max, and *rht_floor raised to that. False, nothing
// max-ed in, when the unit has a NaN or a column rht_unit_bf16 cannot transform exactly (its tiles
// then go by rht_tile).
// The transform is skipped where it cannot raise the max: every output of a column, rounded or
// not, has |y_j| <= sum_i |x_i| / 4 (its coefficients are +-1/4; truncation and round to nearest
// are monotone, and *rht_floor is a bf16 value). Only the pass-2 outputs need every column; for
// the max, most Gaussian-like columns fall below the running max after a few units (a column sum
// of 16 |x| is ~3.2 sigma / 4 below the ~5 sigma max of a large tensor).
MICROSCALE_AVX512_INLINE bool rht_unit_amaxes(const std::byte* src, int64_t row_bytes,
                                              const RhtCoefficients& c, const float* input_scale,
                                              __m512i* max16, __m512i* rht_max, float* rht_floor) {
  __m512i col_max = _mm512_setzero_si512();
  __m512 sum[2][2] = {{_mm512_setzero_ps(), _mm512_setzero_ps()},
                      {_mm512_setzero_ps(), _mm512_setzero_ps()}};  // [even / odd][row parity]
  for (int i = 0; i < kBlock; ++i) {
    prefetch_unit_row<_MM_HINT_T1>(src + i * row_bytes);
    const __m512i a = _mm512_and_si512(_mm512_loadu_si512(src + i * row_bytes), _mm512_set1_epi16(0x7FFF));
    col_max = _mm512_max_epu16(col_max, a);
    sum[0][i % 2] = _mm512_add_ps(sum[0][i % 2], _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)));
    sum[1][i % 2] = _mm512_add_ps(sum[1][i % 2], _mm512_castsi512_ps(_mm512_and_si512(
                                                     a, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)))));
  }
  if (_mm512_cmpgt_epu16_mask(col_max, _mm512_set1_epi16(0x7F80)) != 0) return false;
  // The fp32 sums of 16 terms are within 15 * 2^-24 of the exact ones (exact where subnormal), so
  // sum * (1 + 2^-18), rounded, bounds them from above, with room for the reference's own double
  // rounding where it sums in its order (relative error below 2^-49). An Inf sum never passes.
  const __m512 bound =
      _mm512_mul_ps(_mm512_max_ps(_mm512_add_ps(sum[0][0], sum[0][1]), _mm512_add_ps(sum[1][0], sum[1][1])),
                    _mm512_set1_ps(1.0f + 0x1p-18f));
  const float limit = *rht_floor < 0x1p124f ? 4.0f * *rht_floor : -1.0f;  // 4 x the floor, exact
  if (_mm512_cmp_ps_mask(bound, _mm512_set1_ps(limit), _CMP_LE_OQ) == 0xFFFF) {
    *max16 = _mm512_max_epu16(*max16, col_max);
    return true;
  }
  RhtUnit rht;  // the smallest |x| re-read only here: most units skip the transform
  if (!rht_unit_bf16<false>(src, row_bytes, col_max, unit_min_nonzero_less_one(src, row_bytes), c,
                            input_scale, rht))
    return false;
  *max16 = _mm512_max_epu16(*max16, col_max);
  *rht_max = _mm512_max_epu32(*rht_max, _mm512_max_epu32(rht.max[0], rht.max[1]));
  *rht_floor = bits_to_float(_mm512_reduce_max_epu32(*rht_max));
  return true;
}

// Pass 1 for one group: max |x| (NaN ignored) and, with the RHT, max |RHT(x)| over its tiles
// (bf16 full bands: units, where they can) and the calling thread's earlier groups, whose max
// comes in and goes out as *rht_floor (see rht_unit_amaxes).
template <DType kDType>
MICROSCALE_AVX512 void group_amaxes(const Group& g, bool want_rht, float* amax_x, float* amax_rht,
                                    float* rht_floor) {
  __m512i mx = _mm512_setzero_si512(), mr = _mm512_setzero_si512();
  __m512i mx16 = _mm512_setzero_si512();  // units (bf16 RHT, 16-bit 16x16): max |x| on 16-bit lanes
  for (int band = 0; band * kBlock < g.rows; ++band) {
    const std::byte* src = g.src + band * kBlock * g.row_bytes;
    const int rows = std::min(kBlock, g.rows - band * kBlock);
    if (!want_rht) {
      int64_t first = 0;  // columns [first, K) by raw_abs_max
      if constexpr (kDType != DType::F32) {
        if (g.tile_maxes != nullptr && rows == kBlock) {  // unit by unit, keeping the tile maxes
          uint16_t* record = g.tile_maxes + 2 * band * g.units_per_band;
          const __m512i inf16 = _mm512_set1_epi16(kInf16Bits<kDType>);
          for (; first + kUnitColumns <= g.k; first += kUnitColumns, record += 2)
            unit_tile_maxes(src + first * 2, g.row_bytes, inf16, record, &mx16);
          if (first == g.k) continue;
        }
      }
      // Row by row: a sequential read.
      const std::byte* rest = src + first * element_bytes<kDType>();
      if (raw_abs_max<kDType>(rest, g.row_bytes, rows, g.k - first, &mx)) continue;
      for (int r = 0; r < rows; ++r) {  // the band holds a NaN: again, ignoring NaN
        for (int64_t col = 0; col < g.k - first; col += kBlock) {
          const __m512 v = load16<kDType>(rest + r * g.row_bytes + col * element_bytes<kDType>());
          mx = _mm512_max_epu32(mx, drop_nan(abs_bits(v)));
        }
      }
      continue;
    }
    for (int64_t col = 0; col < g.k;) {
      const bool unit = kDType == DType::BF16 && rows == kBlock && col + kUnitColumns <= g.k;
      if (!unit) prefetch_band_ahead<kDType, _MM_HINT_T1>(g, src, rows, col);  // units: prefetch_unit_row
      if (unit &&
          rht_unit_amaxes(src + col * 2, g.row_bytes, *g.rht, g.rht_input_scale, &mx16, &mr, rht_floor)) {
        col += kUnitColumns;
        continue;
      }
      const int64_t end =
          kDType == DType::BF16 && rows == kBlock ? std::min(col + kUnitColumns, g.k) : col + kBlock;
      for (; col < end; col += kBlock) {
        __m512 x[16];
        load_tile<kDType>(src, g.row_bytes, rows, col, x);
        TileAbs t;
        tile_abs(x, t);
        mx = _mm512_max_epu32(mx, t.col_max);
        __m512 y[16];
        rht_tile(x, t, *g.rht, y);
        mr = _mm512_max_epu32(mr, rht_col_max(y));
      }
    }
  }
  // The units' 16-bit maxes as fp32 bits.
  const uint32_t half = _mm512_reduce_max_epu32(
      _mm512_max_epu32(_mm512_and_si512(mx16, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(mx16, 16)));
  const uint32_t half_bits =
      kDType == DType::F16 ? float_bits(half_to_float(static_cast<uint16_t>(half))) : half << 16;
  mx = _mm512_max_epu32(mx, _mm512_set1_epi32(static_cast<int>(half_bits)));
  *amax_x = bits_to_float(_mm512_reduce_max_epu32(mx));
  // Units skipped against *rht_floor held nothing above it: the max so far is the larger one.
  *amax_rht = *rht_floor = std::max(*rht_floor, bits_to_float(_mm512_reduce_max_epu32(mr)));
}

// Bytes [from, to) of `count` 64-byte lines -> dst + i * stride (a whole line: one store,
// streamed when `stream`; see store_line).
MICROSCALE_AVX512 void copy_line_bytes(const uint8_t* lines, int64_t count, int64_t from, int64_t to,
                                       uint8_t* dst, int64_t stride, bool stream) {
  for (int64_t i = 0; i < count; ++i) {
    if (to - from == 64) {
      store_line(dst + i * stride, _mm512_loadu_si512(lines + i * 64), stream);
    } else {  // masked: a memcpy call per row cost more than the row's bytes
      const __mmask64 part = (~__mmask64{0}) >> (64 - (to - from));
      _mm512_mask_storeu_epi8(dst + i * stride, part, _mm512_maskz_loadu_epi8(part, lines + i * 64 + from));
    }
  }
  if (stream) _mm_sfence();
}

// Columnwise scale lines for columnwise rows [c_begin, c_end), gathered from every group's pieces
// (group_scales: [groups][K][16], band b of group j for row c at (j * K + c) * 16 + b): each
// 64-byte line of a row (4 groups) assembled in a local buffer and written once, to dst + c * stride.
MICROSCALE_AVX512 void gather_scale_lines(const uint8_t* group_scales, int64_t groups, int64_t k,
                                          int64_t row_bytes, int64_t c_begin, int64_t c_end, uint8_t* dst,
                                          int64_t stride, bool stream) {
  constexpr int64_t kLineGroups = 64 / kGroupBands;
  for (int64_t c = c_begin; c < c_end; ++c) {
    for (int64_t from = 0; from < row_bytes; from += 64) {
      alignas(64) uint8_t line[64] = {};
      const int64_t first = from / kGroupBands;  // the line's first group
      const int64_t count = std::min(kLineGroups, groups - first);
      for (int64_t j = 0; j < count; ++j)
        std::memcpy(line + kGroupBands * j, group_scales + ((first + j) * k + c) * kGroupBands, kGroupBands);
      if (row_bytes - from >= 64) {
        store_line(dst + c * stride + from, _mm512_load_si512(line), stream);
      } else {
        std::memcpy(dst + c * stride + from, line, row_bytes - from);
      }
    }
  }
  if (stream) _mm_sfence();
}

// The groups of the calling thread of an OpenMP team: a contiguous share.
struct GroupRange {
  int64_t begin, end;
};
GroupRange thread_groups(int64_t groups) {
  const int64_t team = omp_get_num_threads(), member = omp_get_thread_num();
  return {groups * member / team, groups * (member + 1) / team};
}

template <DType kDType>
void quantize_with(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const int64_t m = x.rows, k = x.cols;
  const int threads = thread_count(o.num_threads);
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  const bool rht = o.columnwise && o.rht;
  const RhtCoefficients coefficients = rht_coefficients(o.rht_sign_mask);
  alignas(64) float input_scale[16];
  for (int i = 0; i < kBlock; ++i) input_scale[i] = static_cast<float>(coefficients[i * 16]);
  const int64_t row_bytes = x.row_stride * element_bytes<kDType>();

  Group base;
  base.row_bytes = row_bytes;
  base.k = k;
  base.tile_2d = o.tile == Tile::k16x16;
  base.rht = rht ? &coefficients : nullptr;
  base.rht_input_scale = input_scale;
  // Pass 1: the global amaxes (those not given).
  const bool need_x = (o.rowwise && !o.amax_rowwise) || (o.columnwise && !rht && !o.amax_columnwise);
  const bool need_rht = rht && !o.amax_columnwise;
  // 16x16 tiles of a 16-bit input: pass 1, where it runs without the RHT (16x16 never has it),
  // keeps each unit's tile maxes for pass 2 (unit_tile_maxes). Left uninitialised: pass 1 writes
  // every record pass 2 reads.
  const bool keep_tile_maxes = kDType != DType::F32 && base.tile_2d && need_x && !rht;
  base.units_per_band = k / kUnitColumns;
  const int64_t group_records = kGroupBands * base.units_per_band * 2;
  const std::unique_ptr<uint16_t[]> tile_maxes(keep_tile_maxes ? new uint16_t[groups * group_records]
                                                               : nullptr);
  auto group = [&](int64_t index) {
    Group g = base;
    g.src = static_cast<const std::byte*>(x.data) + index * kGroupRows * row_bytes;
    g.rows = static_cast<int>(std::min<int64_t>(kGroupRows, m - index * kGroupRows));
    if (keep_tile_maxes) g.tile_maxes = tile_maxes.get() + index * group_records;  // (groups, 16, K/32, 2)
    return g;
  };

  // NOTE: reduced as bit patterns (amaxes are >= 0, so the integer order is the float order): an
  // OpenMP reduction combines after the region's body, outside its IeeeSubnormals, where a caller's
  // DAZ would compare subnormal amaxes as equal (fp_environment.hpp).
  uint32_t amax_x_bits = 0, amax_rht_bits = 0;
  if (need_x || need_rht) {
#pragma omp parallel num_threads(threads) reduction(max : amax_x_bits, amax_rht_bits)
    {
      const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
      // Each thread reads the groups it quantizes in pass 2, last first: pass 2 starts on what
      // is still in its caches.
      const GroupRange range = thread_groups(groups);
      float rht_floor = 0.0f;  // this thread's max |RHT(x)| so far
      for (int64_t i = range.end - 1; i >= range.begin; --i) {
        float gx = 0.0f, gr = 0.0f;
        group_amaxes<kDType>(group(i), need_rht, &gx, &gr, &rht_floor);
        amax_x_bits = std::max(amax_x_bits, float_bits(gx));
        amax_rht_bits = std::max(amax_rht_bits, float_bits(gr));
      }
    }
  }
  const float amax_x = bits_to_float(amax_x_bits), amax_rht = bits_to_float(amax_rht_bits);
  if (o.rowwise) out.rowwise_amax = o.amax_rowwise ? *o.amax_rowwise : amax_x;
  if (o.columnwise) out.columnwise_amax = o.amax_columnwise ? *o.amax_columnwise : (rht ? amax_rht : amax_x);

  // Pass 2: each group once, both directions.
  if (o.rowwise) {
    base.row = direction_scales(out.rowwise_amax);
    base.row_data_stride = k / 2;
    base.row_scale_stride = k / kBlock;
  }
  if (o.columnwise) {
    base.col = direction_scales(out.columnwise_amax);
    base.col_data_stride = m / 2;
    base.col_scale_stride = m / kBlock;
  }
  // Large outputs are written with streaming stores: they cannot stay in the caches anyway, and a
  // streamed whole line skips the read for ownership of a plain store (measured: 4096 x 4096 bf16
  // rowwise, 9.5 -> 7 ms). Needs the lines aligned; small outputs stay cached for their reader.
  const bool big = (int64_t{o.rowwise} + int64_t{o.columnwise}) * m * (k / 2) >= kStreamBytes;
  base.row_stream = big && o.rowwise && k % (2 * 64) == 0 && line_aligned(out.rowwise_data);
  base.col_stream = big && o.columnwise && m % (2 * 64) == 0 && line_aligned(out.columnwise_data);
  // The columnwise scale lines too (measured, 4096 x 4096: their plain stores waited on reads for
  // ownership, ~0.4 ms).
  const bool col_scale_stream =
      big && o.columnwise && (m / kBlock) % 64 == 0 && line_aligned(out.columnwise_scale);
  // Columnwise scales: a group has 16 bytes of each columnwise row (stride M/16 bytes); written
  // straight, each is a partial line that costs a read for ownership (measured with 8-byte pieces:
  // 1.2 of 4 ms for 4096 x 4096). So each thread stages the scales of 4 consecutive groups (one
  // 64-byte line of every columnwise row) and writes whole lines.
  // With more threads than lines of groups (16 threads on 16 groups), 2-4 threads would write the
  // pieces of each line and its plain stores would bounce between their cores (measured on a
  // 16-core server, 4096 x 4096: 0.2 of 0.85 ms). Then each group's pieces go to a shared
  // [group][K][16] stage instead, and after a barrier each thread writes the whole lines of a
  // share of the columnwise rows (gather_scale_lines).
  constexpr int kLineGroups = 64 / kGroupBands;
  // A call of one group (M <= 256) writes its columnwise scales straight to the output: no other
  // group shares their lines, and staging them cost a 16-row call a fifth of its time.
  const bool scales_direct = groups == 1;
  std::vector<uint8_t> group_scales;  // [groups][K][16] when lines are shared between threads
#pragma omp parallel num_threads(threads)
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
    // This thread's groups: a contiguous range, so that its scale lines fill up.
    const auto [begin, end] = thread_groups(groups);
    const int team = omp_get_num_threads();
    bool lines_shared = false;  // the same answer in every thread of the team
    for (int member = 1; member < team; ++member) lines_shared |= groups * member / team % kLineGroups != 0;
    lines_shared &= o.columnwise;
    if (lines_shared) {
#pragma omp single
      group_scales.resize(static_cast<size_t>(groups) * k * kGroupBands);
    }
    // Left uninitialised (new T[n], not a vector): every byte is written before it is read, and
    // zeroing ~0.8 MiB per call for K = 4096 was a tenth of a 16-row call.
    const auto stage = [&](int64_t bytes) {
      return std::unique_ptr<uint8_t[]>(o.columnwise ? new uint8_t[bytes] : nullptr);
    };
    const std::unique_ptr<uint8_t[]> stage_data = stage(k * kGroupBands * 8);
    const std::unique_ptr<uint8_t[]> stage_scale = stage(k * kGroupBands);
    const std::unique_ptr<uint8_t[]> scale_lines =
        stage(lines_shared || scales_direct ? 0 : k * 64);  // [K][64]
    for (int64_t i = begin; i < end; ++i) {
      Group g = group(i);
      if (o.rowwise) {
        g.row_data = out.rowwise_data.data_as<uint8_t>() + i * kGroupRows * g.row_data_stride;  // (M, K/2)
        g.row_scale =
            out.rowwise_scale.data_as<uint8_t>() + i * kGroupRows * g.row_scale_stride;  // (M, K/16)
      }
      if (o.columnwise) {
        g.col_data = out.columnwise_data.data_as<uint8_t>() + i * kGroupBands * 8;  // (K, M/2)
        if (scales_direct) {
          g.col_scale = out.columnwise_scale.data_as<uint8_t>();  // (K, M/16)
          g.col_scale_stride = base.col_scale_stride;
        } else {
          g.col_scale = lines_shared ? group_scales.data() + i * k * kGroupBands
                                     : scale_lines.get() + (i % kLineGroups) * kGroupBands;
          g.col_scale_stride = lines_shared ? kGroupBands : 64;
        }
      }
      quantize_group<kDType>(g, ColumnStage{stage_data.get(), stage_scale.get()});
      if (o.columnwise && !lines_shared && !scales_direct &&
          (i % kLineGroups == kLineGroups - 1 || i == end - 1)) {
        const int64_t first = std::max(begin, i - i % kLineGroups);  // the line's first group here
        const int64_t from = (first % kLineGroups) * kGroupBands;
        const int64_t to = (i % kLineGroups) * kGroupBands + (g.rows + kBlock - 1) / kBlock;
        uint8_t* dst = out.columnwise_scale.data_as<uint8_t>() + first * kGroupBands;  // (K, M/16)
        copy_line_bytes(scale_lines.get(), k, from, to, dst, base.col_scale_stride, col_scale_stream);
      }
    }
    if (lines_shared) {
#pragma omp barrier
      const int member = omp_get_thread_num();
      gather_scale_lines(group_scales.data(), groups, k, m / kBlock, k * member / team,
                         k * (member + 1) / team, out.columnwise_scale.data_as<uint8_t>(),
                         base.col_scale_stride, col_scale_stream);
    }
  }
}

}  // namespace

bool quantize_nvfp4_avx512(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  // Tiles are 16 columns wide: a columnwise-only call may have any last dim, and then the portable
  // kernel runs.
  if (kernel_set() != KernelSet::Avx512 || o.stochastic_rounding || !x.contiguous_rows() ||
      x.cols % kBlock != 0)
    return false;
  switch (x.dtype) {
    case DType::BF16: quantize_with<DType::BF16>(x, o, out); return true;
    case DType::F16: quantize_with<DType::F16>(x, o, out); return true;
    case DType::F32: quantize_with<DType::F32>(x, o, out); return true;
    default: return false;
  }
}

#else

bool quantize_nvfp4_avx512(const InputMatrix&, const QuantizeOptions&, QuantizedTensor&) { return false; }

#endif

}  // namespace microscale::cpu
