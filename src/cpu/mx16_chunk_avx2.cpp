// The chunks of the MX 16-bit kernel (quantize_mx16.cpp) in AVX2: FP8 and FP6 (the same bytes as
// its plain C++ quantize_chunk) and FP4 (quantize_chunk_fp4), where kernel_set() says Avx2 or
// better (on AVX-512 CPUs the AVX-512 kernels take these calls unless MICROSCALE_CPU_KERNELS=avx2).
//
// Why: on Zen 3 GCC's code for the plain chunks ran 6.0 (FP8) and 6.35 (FP4) instructions per
// element (row + col of 4096 x 4096 bf16 at one thread: MXFP8 15.4 ms, 0.25x of memcpy; MXFP4
// 17.7 ms): a row's codes went through arrays, each rowwise block's max was reduced on its own,
// and the loops that compute the blocks' terms did not vectorise (docs/perf.md, twenty-seventh
// session). Here a register of 16 lanes is half a block row:
//   1. maxes:  per column, the max over the band's 32 rows; per row and block, the max of its two
//              halves, then of the 16 lanes for 16 rows at once by the transposing tree
//              (lane_maxes, avx2.hpp);
//   2. scales: as the plain chunks (mx16_chunk.hpp), compiled here for AVX2; then (FP6, FP4)
//              whether the chunk's blocks take the fast form (every_block_from), and FP4's
//              columnwise terms of the form taken;
//   3. codes:  each half row's |x| and sign once, then each direction's codes:
//              - FP8 by the 16-bit form (mx16_form.hpp: a saturating subtract, a shift and a min)
//                and its lanes outside the form, ORed over the row; a row with such a lane takes
//                the plain chunk's fix_outside, as there;
//              - FP6 likewise, but its lanes outside the normal form (format subnormals: most
//                E2M3 block rows have some) take the subnormal form (mx16_form.hpp) in vector:
//                |x| widened to fp32, a multiply, a conversion to integer, a blend. Chunks with a
//                scale byte where that form does not hold (Inf, NaN, tiny amaxes) take the FP8
//                way;
//              - FP4 in the two-step form (mx16_form.hpp: the normal form's code or the count
//                of the block's two lowest thresholds, whichever is larger; no lane is outside)
//                or, in chunks where it does not hold (Inf, NaN, tiny amaxes), by thresholds
//                (e2m1_codes, avx2.hpp); the block's rowwise terms broadcast, the columnwise
//                ones per lane; two codes per byte by a multiply-add and packs.
//              A row's codes go to lines in L1, then to the outputs (streamed when large).
// Whole bands only (a rowwise-only call's last band may be short: the plain chunks take it).
#include "cpu/mx16_chunk.hpp"

#ifdef MICROSCALE_HAVE_AVX2_KERNELS

#include <immintrin.h>

#include <array>
#include <type_traits>

#include "core/element_codec.hpp"
#include "cpu/avx2.hpp"  // lane_maxes, e2m1_codes, copy_row, prefetch_row

namespace microscale::cpu::mx16 {
namespace {

constexpr int kLanes = 16;  // a register of 16-bit lanes: half a block row

// What both directions' codes take of 16 lanes (mx16_code_normal, mx16_outside).
struct Lanes {
  __m256i abs;           // |x| patterns
  __m256i abs_plus_lsb;  // |x| plus the rounding bit of the kept mantissa (ties to even)
  __m256i abs_less_one;  // |x| - 1: a zero wraps to 0xFFFF
  __m256i sign;          // the code's sign bit
};

template <typename Codec, DType kIn>
MICROSCALE_AVX2_INLINE Lanes lanes_of(__m256i x) {
  using F = Mx16Format<Codec, kIn>;
  const __m256i one = _mm256_set1_epi16(1);
  Lanes l;
  l.abs = _mm256_and_si256(x, _mm256_set1_epi16(0x7FFF));
  l.abs_plus_lsb = _mm256_add_epi16(l.abs, _mm256_and_si256(_mm256_srli_epi16(l.abs, F::kDrop), one));
  l.abs_less_one = _mm256_sub_epi16(l.abs, one);
  l.sign = _mm256_and_si256(_mm256_srli_epi16(x, F::kSignShift),
                            _mm256_set1_epi16(static_cast<int16_t>(Codec::kSignBit)));
  return l;
}

// mx16_code_normal on 16 lanes, each with its `lower`, without the sign: 16-bit code magnitudes.
template <typename Codec, DType kIn>
MICROSCALE_AVX2_INLINE __m256i magnitudes(const Lanes& l, __m256i lower) {
  using F = Mx16Format<Codec, kIn>;
  __m256i rebased;
  if constexpr (kIn == DType::BF16) {
    rebased = _mm256_subs_epu16(l.abs_plus_lsb, lower);  // max(a, lower) - lower
  } else {
    rebased = _mm256_andnot_si256(_mm256_cmpeq_epi16(l.abs, _mm256_setzero_si256()),
                                  _mm256_sub_epi16(l.abs_plus_lsb, lower));
  }
  return _mm256_min_epu16(_mm256_srli_epi16(rebased, F::kDrop),
                          _mm256_set1_epi16(static_cast<int16_t>(Codec::kMaxCode)));
}

// mx16_code_normal on 16 lanes, each with its `lower`: 16-bit codes.
template <typename Codec, DType kIn>
MICROSCALE_AVX2_INLINE __m256i codes(const Lanes& l, __m256i lower) {
  return _mm256_or_si256(magnitudes<Codec, kIn>(l, lower), l.sign);
}

// mx16_outside on 16 lanes: all ones where |x| - 1 <= limit (unsigned).
MICROSCALE_AVX2_INLINE __m256i outside(const Lanes& l, __m256i limit) {
  return _mm256_cmpeq_epi16(_mm256_min_epu16(l.abs_less_one, limit), l.abs_less_one);
}

// ---- FP6: the subnormal form (mx16_form.hpp) in fp32 lanes ----
//
// 16 lanes' |x| widened to fp32 in the order _mm256_unpack*_epi16 leaves them: `low` holds lanes
// 0-3 and 8-11, `high` lanes 4-7 and 12-15. _mm256_packs_epi32 of the two puts 16-bit results
// back in lane order, so the subnormal codes cost no permutation; the columnwise multipliers are
// stored in this order (subnormal_multipliers).
struct Widened {
  __m256 low, high;
};

template <DType kIn>
MICROSCALE_AVX2_INLINE Widened widen(__m256i abs) {
  if constexpr (kIn == DType::BF16) {
    const __m256i zero = _mm256_setzero_si256();  // a bf16 pattern is the high half of its fp32's
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, abs)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, abs))};
  } else {
    const __m256i grouped = _mm256_permute4x64_epi64(abs, 0xD8);  // lanes 0-3, 8-11 | 4-7, 12-15
    return {_mm256_cvtph_ps(_mm256_castsi256_si128(grouped)),
            _mm256_cvtph_ps(_mm256_extracti128_si256(grouped, 1))};
  }
}

// mx16_code_subnormal on 16 lanes (lane order): `multiplier` per lane in the Widened order.
MICROSCALE_AVX2_INLINE __m256i subnormal_magnitudes(const Widened& w, __m256 multiplier_low,
                                                    __m256 multiplier_high) {
  // NOTE: _mm256_cvtps_epi32 rounds in the current rounding mode, as encode_rn's fp32 add onto
  // the grid does. Lanes in the normal form may overflow here (0x80000000); the blend drops them.
  return _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(w.low, multiplier_low)),
                            _mm256_cvtps_epi32(_mm256_mul_ps(w.high, multiplier_high)));
}

// FP6 codes of 16 lanes with their normal form's `lower` and `limit`: the normal form's, and the
// subnormal form's where a lane is outside the normal form.
template <typename Codec, DType kIn>
MICROSCALE_AVX2_INLINE __m256i fp6_codes(const Lanes& l, const Widened& w, __m256i lower, __m256i limit,
                                         __m256 multiplier_low, __m256 multiplier_high) {
  const __m256i magnitude =
      _mm256_blendv_epi8(magnitudes<Codec, kIn>(l, lower),
                         subnormal_magnitudes(w, multiplier_low, multiplier_high), outside(l, limit));
  return _mm256_or_si256(magnitude, l.sign);
}

// Whether any of n blocks has a scale byte outside [least, 0xFE] and is not a block of zeros.
// NOTE: branch-free in bytes so that it vectorises: a loop with `||` took a tenth of an AVX2
// MXFP4 chunk's instructions.
MICROSCALE_AVX2_INLINE bool any_block_outside(uint8_t least, const uint8_t* __restrict scale,
                                              const uint16_t* __restrict max, int n) {
  // s - least (mod 256) is at least 0xFF - least exactly for s < least and s = 0xFF.
  const auto first_outside = static_cast<uint8_t>(0xFF - least);
  uint8_t any = 0;
  for (int q = 0; q < n; ++q) {
    const auto rebased = static_cast<uint8_t>(scale[q] - least);
    any |= static_cast<uint8_t>((rebased >= first_outside) & (max[q] != 0));
  }
  return any != 0;
}

// Whether every block of the chunk has a scale byte from `least` to 0xFE, or is a block of zeros
// (max pattern 0: zero padding; every rule gives it byte 0), whose codes every form but that of
// 0xFF gets right: where the FP6 subnormal form of the AVX2 chunk (least Mx16Subnormals::kMinScale:
// the multiplier is capped) and the FP4 two-step form (least Mx16Fp4TwoStep::kMinScale) hold.
// Under FLOOR those leave out blocks with amaxes below 2^-122 (E2M3, E2M1) or 2^-119 (E3M2) of
// bf16 inputs, 2^-11 (E2M3), 2^-10 (E2M1) or 2^-7 (E3M2) of f16 inputs, and Inf or NaN. Scale
// bytes and maxes as step 2 has them: col_scale[j], j < cols; row_scale[q], q < rows *
// kChunkBlocks (every slot defined: a narrow chunk's unused ones have max 0).
MICROSCALE_AVX2_INLINE bool every_block_from(uint8_t least, const Chunk& c, const uint8_t* col_scale,
                                             const uint8_t* row_scale, const uint16_t* col_max,
                                             const uint16_t* row_max) {
  return !(c.col_data != nullptr && any_block_outside(least, col_scale, col_max, c.cols)) &&
         !(c.row_data != nullptr && any_block_outside(least, row_scale, row_max, c.rows * kChunkBlocks));
}

// The columnwise blocks' multipliers (Mx16Subnormals::multiplier) per lane, in the Widened order:
// per 16 lanes, those of lanes 0-3, 8-11, then 4-7, 12-15.
template <typename Codec, DType kIn>
MICROSCALE_AVX2_INLINE void subnormal_multipliers(const Terms& col, int cols, float* out) {
  using Subnormals = Mx16Subnormals<Codec, kIn>;
  const __m256 factor = _mm256_set1_ps(Subnormals::multiplier(1.0f));  // as multiplier(), in vector
  const __m256 cap = _mm256_set1_ps(Subnormals::kMaxInverse);
  for (int j = 0; j < cols; j += kLanes) {
    const __m256 first = _mm256_mul_ps(_mm256_min_ps(_mm256_load_ps(col.inverse + j), cap), factor);
    const __m256 second = _mm256_mul_ps(_mm256_min_ps(_mm256_load_ps(col.inverse + j + 8), cap), factor);
    _mm256_store_ps(out + j, _mm256_permute2f128_ps(first, second, 0x20));
    _mm256_store_ps(out + j + 8, _mm256_permute2f128_ps(first, second, 0x31));
  }
}

// 32 codes of 16 bits (< 256) from two registers to 32 bytes in lane order.
MICROSCALE_AVX2_INLINE void store_codes(__m256i low, __m256i high, uint8_t* out) {
  // The pack works per 128-bit half: the 64-bit groups are put back in order after it.
  _mm256_store_si256(reinterpret_cast<__m256i*>(out),
                     _mm256_permute4x64_epi64(_mm256_packus_epi16(low, high), 0xD8));
}

MICROSCALE_AVX2_INLINE __m256i load16(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Step 1: col_max[j] over the band's 32 rows, row_max[i * kChunkBlocks + b] for row i's block b
// (every slot defined, 0 past the chunk's blocks, as chunk_terms reads them all).
MICROSCALE_AVX2_INLINE void maxes(const Chunk& c, uint16_t* col_max, uint16_t* row_max) {
  const int blocks = c.cols / kBlock;
  alignas(32) uint16_t by_block[kChunkBlocks][kBlock] = {};  // [block][row]
  const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
  for (int b = 0; b < blocks; ++b) {
    const uint16_t* block = c.src + b * kBlock;
    __m256i column[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 2
    for (int r0 = 0; r0 < kBlock; r0 += kLanes) {
      __m256i m[kLanes];
#pragma GCC unroll 16
      for (int i = 0; i < kLanes; ++i) {
        const uint16_t* row = block + (r0 + i) * c.stride;
        const __m256i a = _mm256_and_si256(load16(row), magnitude);
        const __m256i b16 = _mm256_and_si256(load16(row + kLanes), magnitude);
        column[0] = _mm256_max_epi16(column[0], a);
        column[1] = _mm256_max_epi16(column[1], b16);
        m[i] = _mm256_max_epi16(a, b16);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(&by_block[b][r0]), lane_maxes(m));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(col_max + b * kBlock), column[0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(col_max + b * kBlock + kLanes), column[1]);
  }
  for (int i = 0; i < kBlock; ++i) {
    for (int b = 0; b < kChunkBlocks; ++b) row_max[i * kChunkBlocks + b] = by_block[b][i];
  }
}

// Step 3 for the requested directions (kRow, kCol). A row's codes go to lines in L1 first, where
// fix_outside mends them, then to the outputs. With kSubnormalForm (FP6 chunks whose blocks are
// every_block_from Mx16Subnormals::kMinScale) the lanes outside the normal form take the
// subnormal form instead, and nothing is mended.
template <typename Codec, DType kIn, bool kRow, bool kCol, bool kSubnormalForm>
MICROSCALE_AVX2_INLINE void encode(const Chunk& c, const Terms& row, const Terms& col) {
  const int blocks = c.cols / kBlock;
  alignas(32) uint8_t row_out[kChunkCols], col_out[kChunkCols];
  alignas(32) float col_multiplier[kSubnormalForm && kCol ? kChunkCols : 1];  // the Widened order
  if constexpr (kSubnormalForm && kCol) subnormal_multipliers<Codec, kIn>(col, c.cols, col_multiplier);
  for (int i = 0; i < kBlock; ++i) {
    const uint16_t* x = c.src + i * c.stride;
    if (c.prefetch_next) prefetch_row(x + kChunkCols, kPrefetchBytes);  // the next chunk's row i
    __m256i any_outside = _mm256_setzero_si256();
    for (int b = 0; b < blocks; ++b) {
      const int first = b * kBlock;
      const int q = i * kChunkBlocks + b;
      const __m256i row_lower = _mm256_set1_epi16(static_cast<int16_t>(row.lower[q]));
      const __m256i row_limit = _mm256_set1_epi16(static_cast<int16_t>(row.limit[q]));
      [[maybe_unused]] __m256 row_multiplier;
      if constexpr (kSubnormalForm && kRow)
        row_multiplier = _mm256_set1_ps(Mx16Subnormals<Codec, kIn>::multiplier(row.inverse[q]));
      __m256i row_codes[2], col_codes[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int lane = first + h * kLanes;
        const Lanes l = lanes_of<Codec, kIn>(load16(x + lane));
        if constexpr (kSubnormalForm) {
          const Widened w = widen<kIn>(l.abs);
          if constexpr (kRow)
            row_codes[h] = fp6_codes<Codec, kIn>(l, w, row_lower, row_limit, row_multiplier, row_multiplier);
          if constexpr (kCol) {
            col_codes[h] = fp6_codes<Codec, kIn>(l, w, load16(col.lower + lane), load16(col.limit + lane),
                                                 _mm256_load_ps(col_multiplier + lane),
                                                 _mm256_load_ps(col_multiplier + lane + 8));
          }
        } else {
          if constexpr (kRow) {
            row_codes[h] = codes<Codec, kIn>(l, row_lower);
            any_outside = _mm256_or_si256(any_outside, outside(l, row_limit));
          }
          if constexpr (kCol) {
            col_codes[h] = codes<Codec, kIn>(l, load16(col.lower + lane));
            any_outside = _mm256_or_si256(any_outside, outside(l, load16(col.limit + lane)));
          }
        }
      }
      if constexpr (kRow) store_codes(row_codes[0], row_codes[1], row_out + first);
      if constexpr (kCol) store_codes(col_codes[0], col_codes[1], col_out + first);
    }
    if (!_mm256_testz_si256(any_outside, any_outside)) [[unlikely]] {
      if constexpr (kRow) fix_outside<Codec, kIn, false>(x, blocks, row, i * kChunkBlocks, row_out);
      if constexpr (kCol) fix_outside<Codec, kIn, true>(x, blocks, col, /*first_block=*/0, col_out);
    }
    if constexpr (kRow) copy_row(row_out, c.cols, c.stream, c.row_data + i * c.data_stride);
    if constexpr (kCol) copy_row(col_out, c.cols, c.stream, c.col_data + i * c.data_stride);
  }
}

// Step 3 in the requested directions, with or without the subnormal form.
template <typename Codec, DType kIn, bool kSubnormalForm>
MICROSCALE_AVX2_INLINE void encode_directions(const Chunk& c, const Terms& row, const Terms& col) {
  const bool rowwise = c.row_data != nullptr, columnwise = c.col_data != nullptr;
  if (rowwise && columnwise) {
    encode<Codec, kIn, true, true, kSubnormalForm>(c, row, col);
  } else if (rowwise) {
    encode<Codec, kIn, true, false, kSubnormalForm>(c, row, col);
  } else {
    encode<Codec, kIn, false, true, kSubnormalForm>(c, row, col);
  }
}

template <typename Codec, DType kIn, MxScaleRule kRule>
MICROSCALE_AVX2 void chunk_avx2(const Chunk& c) {
  alignas(32) uint16_t col_max[kChunkCols];
  alignas(32) uint16_t row_max[kBlock * kChunkBlocks];  // [row][block]
  maxes(c, col_max, row_max);
  if (c.scale_tiles) tile_maxes(c, col_max, row_max);
  Terms col, row;
  chunk_terms<kIn, kRule>(c, col_max, row_max, col, row);
  // FP6 puts many lanes in the format's subnormals (E2M3: most blocks have some), which the
  // subnormal form encodes in vector; FP8 has few, which fix_outside mends.
  if constexpr (Codec::kWidth == 6) {
    constexpr auto kLeast = static_cast<uint8_t>(Mx16Subnormals<Codec, kIn>::kMinScale);
    if (every_block_from(kLeast, c, col.scale, row.scale, col_max, row_max))
      return encode_directions<Codec, kIn, true>(c, row, col);
  }
  encode_directions<Codec, kIn, false>(c, row, col);
}

// ---- MXFP4: codes in the two-step form, or by thresholds ----

// The columnwise terms of an MXFP4 chunk's step 3 by thresholds, per lane: its block's
// thresholds below[k][j].
struct Fp4ThresholdColumns {
  alignas(64) int16_t below[8][kChunkCols];
};

// The columnwise terms of an MXFP4 chunk in the two-step form, per lane: its block's
// Mx16Fp4TwoStep::terms.
struct Fp4TwoStepColumns {
  alignas(64) int16_t lower[kChunkCols];
  alignas(64) int16_t step1[kChunkCols];
  alignas(64) int16_t step2[kChunkCols];
};

// Each column's terms, by a loop GCC vectorises (the byte clamped, shifted, less an offset).
template <DType kIn>
MICROSCALE_AVX2_INLINE void fp4_two_step_columns(const uint8_t* __restrict col_scale, int cols,
                                                 Fp4TwoStepColumns& out) {
  for (int j = 0; j < cols; ++j) {
    const auto t = Mx16Fp4TwoStep<kIn>::terms(col_scale[j]);
    out.lower[j] = static_cast<int16_t>(t.lower);
    out.step1[j] = t.step1;
    out.step2[j] = t.step2;
  }
}

// The two-step form's terms of every scale byte (Mx16Fp4TwoStep::terms), each as a 32-bit word
// holding the 16-bit term twice (as E2m1ThresholdPairTable: a broadcast from memory is a load):
// the rowwise blocks'.
struct Fp4TwoStepPairs {
  int32_t lower, step1, step2, unused;
};

template <DType kIn>
constexpr std::array<Fp4TwoStepPairs, 256> fp4_two_step_pairs() {
  std::array<Fp4TwoStepPairs, 256> table{};
  for (int s = 0; s < 256; ++s) {
    const auto t = Mx16Fp4TwoStep<kIn>::terms(static_cast<uint8_t>(s));
    table[s] = {repeated_pair(t.lower), repeated_pair(t.step1), repeated_pair(t.step2), 0};
  }
  return table;
}

template <DType kIn>
alignas(64) constexpr std::array<Fp4TwoStepPairs, 256> kFp4TwoStepPairs = fp4_two_step_pairs<kIn>();

// mx16_fp4_code on 16 lanes without the sign: `a` the |x| patterns, `a_plus_lsb` |x| plus the
// rounding bit of the kept mantissa bit; a block's lower, step1 and step2 per lane.
template <DType kIn>
MICROSCALE_AVX2_INLINE __m256i two_step_magnitudes(__m256i a, __m256i a_plus_lsb, __m256i lower,
                                                   __m256i step1, __m256i step2) {
  using F = Mx16Format<E2M1Codec, kIn>;
  const __m256i normal = _mm256_min_epu16(_mm256_srli_epi16(_mm256_subs_epu16(a_plus_lsb, lower), F::kDrop),
                                          _mm256_set1_epi16(static_cast<int16_t>(E2M1Codec::kMaxCode)));
  // A true compare is -1: the steps passed, negated.
  const __m256i steps = _mm256_add_epi16(_mm256_cmpgt_epi16(a, step1), _mm256_cmpgt_epi16(a, step2));
  return _mm256_max_epi16(normal, _mm256_abs_epi16(steps));
}

// 32 E2M1 codes (16-bit, < 16) of one block row, two per byte (the even column in the low
// nibble), to 16 bytes at `out`.
MICROSCALE_AVX2_INLINE void store_packed_block(__m256i low, __m256i high, uint8_t* out) {
  const __m256i low_plus_16_high = _mm256_set1_epi32(0x00100001);
  // 32-bit lane q of each: code 2q + 16 x code 2q + 1, the byte. The packs work per 128-bit half:
  // bytes 0-3 of the result hold codes 0-7, 4-7 codes 16-23 (then repeated); the high half 8-15
  // and 24-31.
  const __m256i words = _mm256_packus_epi32(_mm256_madd_epi16(low, low_plus_16_high),
                                            _mm256_madd_epi16(high, low_plus_16_high));
  const __m256i bytes = _mm256_packus_epi16(words, words);
  const __m256i in_order = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
  _mm_store_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(in_order));
}

// Step 3 of an MXFP4 chunk for the requested directions (kRow, kCol), in the two-step form
// (Columns = Fp4TwoStepColumns: the rowwise terms broadcast from the table) or by thresholds
// (Fp4ThresholdColumns: the rowwise ones broadcast from the widened table). Each half block
// row's |x| and sign once. A row's bytes go to lines in L1, then to the outputs.
template <DType kIn, bool kRow, bool kCol, typename Columns>
MICROSCALE_AVX2_INLINE void encode_fp4(const Chunk& c, const uint8_t* row_scale, const Columns& col) {
  constexpr bool kTwoStep = std::is_same_v<Columns, Fp4TwoStepColumns>;
  using F = Mx16Format<E2M1Codec, kIn>;
  const int blocks = c.cols / kBlock;
  alignas(32) uint8_t row_out[kChunkCols / 2], col_out[kChunkCols / 2];
  for (int i = 0; i < kBlock; ++i) {
    const uint16_t* x = c.src + i * c.stride;
    if (c.prefetch_next) prefetch_row(x + kChunkCols, kPrefetchBytes);  // the next chunk's row i
    for (int b = 0; b < blocks; ++b) {
      [[maybe_unused]] __m256i row_t[8];  // thresholds; the two-step form's lower, step1, step2 in 0-2
      if constexpr (kRow) {
        const int s = row_scale[i * kChunkBlocks + b];
        if constexpr (kTwoStep) {
          const Fp4TwoStepPairs& t = kFp4TwoStepPairs<kIn>[s];
          row_t[0] = _mm256_set1_epi32(t.lower);
          row_t[1] = _mm256_set1_epi32(t.step1);
          row_t[2] = _mm256_set1_epi32(t.step2);
        } else {
          const int32_t* t = c.fp4_threshold_pairs->pairs[s];
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) row_t[k] = _mm256_set1_epi32(t[k]);
        }
      }
      __m256i row_codes[2], col_codes[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int lane = b * kBlock + h * kLanes;
        const __m256i v = load16(x + lane);
        const __m256i a = _mm256_and_si256(v, _mm256_set1_epi16(0x7FFF));
        const __m256i sign = _mm256_and_si256(_mm256_srli_epi16(v, 12), _mm256_set1_epi16(8));
        if constexpr (kTwoStep) {
          const __m256i a_plus_lsb =
              _mm256_add_epi16(a, _mm256_and_si256(_mm256_srli_epi16(a, F::kDrop), _mm256_set1_epi16(1)));
          if constexpr (kRow)
            row_codes[h] =
                _mm256_or_si256(two_step_magnitudes<kIn>(a, a_plus_lsb, row_t[0], row_t[1], row_t[2]), sign);
          if constexpr (kCol) {
            const auto at = [lane](const int16_t* p) MICROSCALE_AVX2_LAMBDA {
              return _mm256_load_si256(reinterpret_cast<const __m256i*>(p + lane));
            };
            col_codes[h] = _mm256_or_si256(
                two_step_magnitudes<kIn>(a, a_plus_lsb, at(col.lower), at(col.step1), at(col.step2)), sign);
          }
        } else {
          if constexpr (kRow) row_codes[h] = e2m1_codes(a, sign, row_t);
          if constexpr (kCol) {
            __m256i col_t[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k)
              col_t[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&col.below[k][lane]));
            col_codes[h] = e2m1_codes(a, sign, col_t);
          }
        }
      }
      if constexpr (kRow) store_packed_block(row_codes[0], row_codes[1], row_out + b * (kBlock / 2));
      if constexpr (kCol) store_packed_block(col_codes[0], col_codes[1], col_out + b * (kBlock / 2));
    }
    if constexpr (kRow) copy_row(row_out, c.cols / 2, c.stream, c.row_data + i * c.data_stride);
    if constexpr (kCol) copy_row(col_out, c.cols / 2, c.stream, c.col_data + i * c.data_stride);
  }
}

// Step 3 of an MXFP4 chunk in the requested directions.
template <DType kIn, typename Columns>
MICROSCALE_AVX2_INLINE void encode_fp4_directions(const Chunk& c, const uint8_t* row_scale,
                                                  const Columns& col) {
  const bool rowwise = c.row_data != nullptr, columnwise = c.col_data != nullptr;
  if (rowwise && columnwise) {
    encode_fp4<kIn, true, true>(c, row_scale, col);
  } else if (rowwise) {
    encode_fp4<kIn, true, false>(c, row_scale, col);
  } else {
    encode_fp4<kIn, false, true>(c, row_scale, col);
  }
}

template <DType kIn, MxScaleRule kRule>
MICROSCALE_AVX2 void chunk_fp4_avx2(const Chunk& c) {
  alignas(32) uint16_t col_max[kChunkCols];
  alignas(32) uint16_t row_max[kBlock * kChunkBlocks];  // [row][block]
  maxes(c, col_max, row_max);
  if (c.scale_tiles) tile_maxes(c, col_max, row_max);
  alignas(64) uint8_t col_scale[kChunkCols], row_scale[kBlock * kChunkBlocks];
  fp4_scale_bytes<kIn, kRule>(c, col_max, row_max, col_scale, row_scale);
  const bool columnwise = c.col_data != nullptr;
  // The two-step form wherever it holds (every finite block with an amax from ~2^-122 for bf16,
  // ~2^-10 for f16, or of zeros); thresholds (8 compares per lane, against 2 and the normal form's 3)
  // elsewhere.
  constexpr auto kLeast = static_cast<uint8_t>(Mx16Fp4TwoStep<kIn>::kMinScale);
  if (every_block_from(kLeast, c, col_scale, row_scale, col_max, row_max)) {
    Fp4TwoStepColumns col;
    if (columnwise) fp4_two_step_columns<kIn>(col_scale, c.cols, col);
    return encode_fp4_directions<kIn>(c, row_scale, col);
  }
  Fp4ThresholdColumns col;
  if (columnwise) fp4_column_thresholds(c, col_scale, col.below);
  encode_fp4_directions<kIn>(c, row_scale, col);
}

}  // namespace

// The target attribute is on chunk_avx2: GCC takes a template's attributes from its first
// declaration (mx16_chunk.hpp), which the rest of the library sees without one.
template <typename Codec, DType kIn, MxScaleRule kRule>
void quantize_chunk_avx2(const Chunk& c) {
  chunk_avx2<Codec, kIn, kRule>(c);
}

#define MICROSCALE_MX16_CHUNK_AVX2(Codec, kIn)                                     \
  template void quantize_chunk_avx2<Codec, kIn, MxScaleRule::Floor>(const Chunk&); \
  template void quantize_chunk_avx2<Codec, kIn, MxScaleRule::Ceil>(const Chunk&);  \
  template void quantize_chunk_avx2<Codec, kIn, MxScaleRule::Even>(const Chunk&);  \
  template void quantize_chunk_avx2<Codec, kIn, MxScaleRule::RCeil>(const Chunk&);
MICROSCALE_MX16_CHUNK_AVX2(E4M3Codec, DType::BF16)
MICROSCALE_MX16_CHUNK_AVX2(E4M3Codec, DType::F16)
MICROSCALE_MX16_CHUNK_AVX2(E5M2Codec, DType::BF16)
MICROSCALE_MX16_CHUNK_AVX2(E5M2Codec, DType::F16)
MICROSCALE_MX16_CHUNK_AVX2(E2M3Codec, DType::BF16)
MICROSCALE_MX16_CHUNK_AVX2(E2M3Codec, DType::F16)
MICROSCALE_MX16_CHUNK_AVX2(E3M2Codec, DType::BF16)
MICROSCALE_MX16_CHUNK_AVX2(E3M2Codec, DType::F16)
#undef MICROSCALE_MX16_CHUNK_AVX2

template <DType kIn, MxScaleRule kRule>
void quantize_chunk_fp4_avx2(const Chunk& c) {
  chunk_fp4_avx2<kIn, kRule>(c);
}

#define MICROSCALE_MX16_CHUNK_FP4_AVX2(kIn)                                     \
  template void quantize_chunk_fp4_avx2<kIn, MxScaleRule::Floor>(const Chunk&); \
  template void quantize_chunk_fp4_avx2<kIn, MxScaleRule::Ceil>(const Chunk&);  \
  template void quantize_chunk_fp4_avx2<kIn, MxScaleRule::Even>(const Chunk&);  \
  template void quantize_chunk_fp4_avx2<kIn, MxScaleRule::RCeil>(const Chunk&);
MICROSCALE_MX16_CHUNK_FP4_AVX2(DType::BF16)
MICROSCALE_MX16_CHUNK_FP4_AVX2(DType::F16)
#undef MICROSCALE_MX16_CHUNK_FP4_AVX2

}  // namespace microscale::cpu::mx16

#endif  // MICROSCALE_HAVE_AVX2_KERNELS
