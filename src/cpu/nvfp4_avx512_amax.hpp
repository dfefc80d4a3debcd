// The AVX-512 NVFP4 quantizer's pass 1: the global amaxes (max |x|; max |RHT(x)| with the RHT)
// of a group, and the 16x16 tile maxes pass 2 starts from. Part of quantize_nvfp4_avx512.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cpu/nvfp4_avx512_group.hpp"
#include "cpu/nvfp4_avx512_rht_unit.hpp"
#include "cpu/nvfp4_avx512_tile.hpp"
#include "cpu/nvfp4_avx512_unit.hpp"
#include "microscale/half.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_nvfp4_avx512.cpp is the one translation
// unit that includes the nvfp4_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

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

// ---- the global amaxes: max |x| row by row (raw_abs_max), and unit by unit with the RHT ----

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

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
