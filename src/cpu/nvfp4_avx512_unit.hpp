// The AVX-512 NVFP4 quantizer's fast path for bf16 and f16: a unit of 16 rows x 32 columns,
// its maxes, block scales and element loop (quantize_unit16). Part of quantize_nvfp4_avx512.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/nvfp4_avx512_group.hpp"
#include "cpu/nvfp4_avx512_rht_unit.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_nvfp4_avx512.cpp is the one translation
// unit that includes the nvfp4_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

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

// Each 32-bit lane of v shifted left by `bits` (right where negative; v unchanged at 0). Codes held
// in nibbles move between nibble positions without losing bits.
MICROSCALE_AVX512_INLINE __m512i shift_lanes(__m512i v, int bits) {
  if (bits > 0) return _mm512_slli_epi32(v, static_cast<unsigned>(bits));
  if (bits < 0) return _mm512_srli_epi32(v, static_cast<unsigned>(-bits));
  return v;
}

// A half's (even or odd lanes') columnwise codes of a unit's 16 rows as the columnwise output
// holds them: row i's code (already shifted to nibble i % 8) ORed into packed[i / 8]. Rows go in
// pairs, one three-way OR per two codes.
struct ColumnCodes {
  __m512i packed[2];
  __m512i held;  // an even row's code, until the odd row's comes

  MICROSCALE_AVX512_INLINE void add(int i, __m512i code) {
    if (i % 2 == 0) {
      held = code;
    } else if (i % 8 == 1) {
      packed[i / 8] = _mm512_or_si512(held, code);
    } else {
      packed[i / 8] = _mm512_ternarylogic_epi32(packed[i / 8], held, code, 0xFE);  // a | b | c
    }
  }
};

// A unit's columnwise output words from its two halves' codes. Column 2j + p's 8 bytes: word j of
// half p's packed[0] (rows 0-7), then of its packed[1]. Interleaving even and odd columns, then rows
// 0-7 and 8-15, leaves in 128-bit chunk l of words[w] the qwords of columns 8l + 2w and 8l + 2w + 1.
MICROSCALE_AVX512_INLINE void column_words(const ColumnCodes& even, const ColumnCodes& odd,
                                           __m512i words[4]) {
  const __m512i lo_a = _mm512_unpacklo_epi32(even.packed[0], odd.packed[0]);  // 8l + 0..3
  const __m512i lo_b = _mm512_unpackhi_epi32(even.packed[0], odd.packed[0]);  // 8l + 4..7
  const __m512i hi_a = _mm512_unpacklo_epi32(even.packed[1], odd.packed[1]);
  const __m512i hi_b = _mm512_unpackhi_epi32(even.packed[1], odd.packed[1]);
  words[0] = _mm512_unpacklo_epi32(lo_a, hi_a);
  words[1] = _mm512_unpackhi_epi32(lo_a, hi_a);
  words[2] = _mm512_unpacklo_epi32(lo_b, hi_b);
  words[3] = _mm512_unpackhi_epi32(lo_b, hi_b);
}

// The scales of a unit, per direction: rowwise in transpose_max16x2 order (row_scale[h] for rows
// 8h..8h+7), columnwise per even and odd lane.
struct UnitScales {
  __m512 row_scale[2];
  __m512 col_even, col_odd;
};

// A unit's maxes as its first step computes them: the 16-bit |x| column maxes and
// transpose_max16x2's row pairs. Where pass 1 kept no maxes for pass 2, a unit's element loop
// computes the next unit's as it goes, so that its loads and maxes overlap the encoding instead of
// opening the next unit with 16 loads and a reduction that everything after waits on (measured on
// Zen 4: -4 to -5 % for the call, -2 to -5 % with the RHT; docs/perf.md, thirty-second session).
struct UnitMaxes {
  __m512i col_max;
  __m512i pairs[8];      // 1x16 blocks only (NextMaxes::ColumnsAndRows)
  __m512i min_less_one;  // with the RHT: min_nonzero_less_one over the rows
};

// What of the next unit's maxes an element loop leaves in its UnitMaxes.
enum class NextMaxes : uint8_t {
  None,
  Columns,         // col_max (and min_less_one with the RHT): 16x16 tiles take their max from it
  ColumnsAndRows,  // also the row pairs: 1x16 blocks
};

// The element loop of a unit: each row loaded once (mostly from L1: the amax step or the unit
// before read it; after pass 1's tile maxes, from where the prefetches left it), both directions
// encoded. kSharedSign: no product underflows to -0, so a lane's sign is its input's, one compare
// for both directions. kSameCodes (16x16 tiles, both directions on the same global amax): the two
// directions' scales are equal, so are their codes: encoded once (with their signs, at the
// rowwise nibbles), then shifted to the columnwise ones. kNext: also reads the next unit's rows
// (64 bytes on) and leaves those of its maxes in *next.
template <DType kIn, bool kRows, bool kCols, bool kSharedSign, bool kSameCodes, bool kRht, bool kBounded,
          NextMaxes kNext>
MICROSCALE_AVX512_INLINE void encode_unit(const Group& g, const std::byte* src, const UnitScales& s,
                                          const RhtUnit* rht, RowStage& stage, int line_tile,
                                          __m512i col_words[4], UnitMaxes* next) {
  [[maybe_unused]] __m512i next_col_max, next_pairs[8], next_held, next_min_less_one;
  __m512i row_packed = _mm512_setzero_si512();
  ColumnCodes col_even, col_odd;  // the columnwise codes of the even and the odd lanes
  // NOTE: fully unrolled, every table, shift and scale index is a constant (GCC does not unroll
  // this body by itself: rolled, it computes them per row and keeps the column codes on the stack).
#pragma GCC unroll 16
  for (int i = 0; i < kBlock; ++i) {
    prefetch_unit_row<_MM_HINT_T1>(src + i * g.row_bytes);
    if constexpr (kNext != NextMaxes::None) {  // the next unit's row i
      const __m512i v =
          _mm512_and_si512(_mm512_loadu_si512(src + 64 + i * g.row_bytes), _mm512_set1_epi16(0x7FFF));
      next_col_max = i == 0 ? v : _mm512_max_epu16(next_col_max, v);
      if constexpr (kRht)
        next_min_less_one = min_nonzero_less_one(i == 0 ? _mm512_set1_epi16(-1) : next_min_less_one, v);
      if constexpr (kNext == NextMaxes::ColumnsAndRows) {
        if (i % 2 == 0) {
          next_held = v;
        } else {
          next_pairs[i / 2] = transpose_max_row_pair(next_held, v);
        }
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
      col_even.add(i, ce);
      col_odd.add(i, co);
    }
  }
  if constexpr (kNext != NextMaxes::None) {
    next->col_max = next_col_max;
    if constexpr (kNext == NextMaxes::ColumnsAndRows)
      for (int p = 0; p < 8; ++p) next->pairs[p] = next_pairs[p];
    if constexpr (kRht) next->min_less_one = next_min_less_one;
  }
  if constexpr (kCols) column_words(col_even, col_odd, col_words);
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
template <DType kIn, bool kRows, bool kCols, bool kSameCodes, bool kRht, NextMaxes kNext>
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
// maxes from the unit before (null: computed here); `next` (null: not asked): where the element
// loop leaves the next unit's, filled whenever this returns true (the row pairs with 1x16 blocks
// only).
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
  // The RHT's outputs (null without it) are what its units encode columnwise. same_codes comes
  // only with 16x16 tiles, which never have the RHT.
  const RhtUnit* rht_values = kRht ? &rht : nullptr;
  constexpr bool kMaySameCodes = kRows && kCols && !kRht;
  // (16x16 tiles never come with the RHT: validate_quantize rejects them, and kRht takes the 1x16
  // form, which is right for any unit.)
  if (next != nullptr && (kRht || !g.tile_2d)) {
    encode_unit_form<kIn, kRows, kCols, false, kRht, NextMaxes::ColumnsAndRows>(
        tiny != 0, unbounded != 0, g, src, s, rht_values, stage, line_tile, col_words, next);
  } else if (next != nullptr) {
    if constexpr (!kRht) {  // 16x16 tiles: the column maxes alone
      if (same_codes) {
        encode_unit_form<kIn, kRows, kCols, kMaySameCodes, false, NextMaxes::Columns>(
            tiny != 0, unbounded != 0, g, src, s, nullptr, stage, line_tile, col_words, next);
      } else {
        encode_unit_form<kIn, kRows, kCols, false, false, NextMaxes::Columns>(
            tiny != 0, unbounded != 0, g, src, s, nullptr, stage, line_tile, col_words, next);
      }
    }
  } else if (same_codes) {
    encode_unit_form<kIn, kRows, kCols, kMaySameCodes, kRht, NextMaxes::None>(
        tiny != 0, unbounded != 0, g, src, s, rht_values, stage, line_tile, col_words, nullptr);
  } else {
    encode_unit_form<kIn, kRows, kCols, false, kRht, NextMaxes::None>(
        tiny != 0, unbounded != 0, g, src, s, rht_values, stage, line_tile, col_words, nullptr);
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

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
