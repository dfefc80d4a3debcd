// The AVX-512 NVFP4 quantizer's general path: a tile of 16 input rows x 16 columns in 16
// registers, both directions, with or without the RHT (rht_tile); f32 inputs, NaN units, a last
// odd tile or partial band go this way. Part of quantize_nvfp4_avx512.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/nvfp4_avx512_group.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_nvfp4_avx512.cpp is the one translation
// unit that includes the nvfp4_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

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

// One tile of pass 2 (see quantize_group in quantize_nvfp4_avx512.cpp): rowwise codes and scales
// into the band's stage at tile `line_tile` of its line, columnwise ones into the group's stage.
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

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
