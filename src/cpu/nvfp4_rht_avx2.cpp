// The NVFP4 16-bit kernel's RHT (bf16 input, columnwise with --rht) in AVX2: the same bytes as
// its plain C++ form (rht_band and rht_band_max_abs in rht_band.cpp, encode_rht_columns in
// quantize_nvfp4_16.cpp), where kernel_set() says Avx2 or better (the AVX-512 kernels have their
// own; this form runs there only when asked for, MICROSCALE_CPU_KERNELS=avx2).
//
// Why: on Zen 3, NVFP4 row + col with the RHT of 4096 x 4096 bf16 took 71.5 ms at one thread
// (0.04x of memcpy). 43 % of it was rht_band: the band widened to fp32 in memory, then GCC's code
// for a butterfly over arrays of 64 columns; 20 % was encode_rht_columns, one block at a time with
// the scalar E4M3 codec; 13 % was pass 1, which widens each band too (docs/perf.md,
// twenty-seventh session).
//
// Here 16 columns of the band are one register of bf16 per row. The transform runs in two fp32
// halves, the even columns (x << 16) and the odd ones (x & 0xFFFF0000), so that each half's bf16
// outputs go back to their lanes with a shift or a mask: no lane shuffles. Its exactness test is
// rht_band's, on the 16-bit |x| patterns (MagnitudeRange); the few columns that fail it take
// rht_column_exact. A chunk's transform (16 x 256 bf16, in L1) is then a band like any other:
// its columnwise blocks are its columns, which the AVX2 chunk (nvfp4_chunk_avx2.cpp) encodes.
#include "cpu/nvfp4_16_chunk.hpp"

#ifdef MICROSCALE_HAVE_AVX2_KERNELS

#include <immintrin.h>

#include <algorithm>
#include <bit>

#include "cpu/avx2.hpp"      // prefetch_rows
#include "cpu/rht_band.hpp"  // rht_column_exact
#include "microscale/half.hpp"

namespace microscale::cpu::nvfp4_16 {
namespace {

constexpr int kColumns = 16;  // columns per step: a register of 16 bf16 per row

// s_i / 4 (column 0 of the coefficients) in fp32, exact: broadcast from memory.
struct InputSigns {
  float s[kBlock];
  explicit InputSigns(const RhtCoefficients& t) {
    for (int i = 0; i < kBlock; ++i) s[i] = static_cast<float>(t[i * 16]);
  }
};

// The range of the nonzero |x| of 16 columns, row after row, for rht_band's exactness test.
struct MagnitudeRange {
  __m256i amax;
  __m256i amin_less_one;  // min of |x| - 1, unsigned: zeros wrap to the top

  MICROSCALE_AVX2_INLINE MagnitudeRange()
      : amax(_mm256_setzero_si256()), amin_less_one(_mm256_set1_epi16(-1)) {}

  MICROSCALE_AVX2_INLINE void add(__m256i x) {
    const __m256i a = _mm256_and_si256(x, _mm256_set1_epi16(0x7FFF));
    amax = _mm256_max_epu16(amax, a);
    amin_less_one = _mm256_min_epu16(amin_less_one, _mm256_sub_epi16(a, _mm256_set1_epi16(1)));
  }

  // 16-bit lanes all ones for the columns whose transform the fp32 butterfly may not give
  // exactly. A column passes when its values are all zero, or its nonzero |x| are normal, below
  // 2^121 and within 12 binades (then every partial sum is exact in fp32: rht_band.cpp).
  MICROSCALE_AVX2_INLINE __m256i inexact() const {
    const __m256i amin = _mm256_add_epi16(amin_less_one, _mm256_set1_epi16(1));  // 0 if all are zero
    const __m256i span = _mm256_sub_epi16(_mm256_srli_epi16(amax, 7), _mm256_srli_epi16(amin, 7));
    __m256i out = _mm256_cmpgt_epi16(_mm256_set1_epi16(0x80), amin);  // subnormal (or all zero)
    out = _mm256_or_si256(out, _mm256_cmpgt_epi16(amax, _mm256_set1_epi16(0x7BFF)));  // >= 2^121, Inf, NaN
    out = _mm256_or_si256(out, _mm256_cmpgt_epi16(span, _mm256_set1_epi16(12)));
    return _mm256_andnot_si256(_mm256_cmpeq_epi16(amax, _mm256_setzero_si256()), out);
  }
};

// One half of the transform of the 16 columns at `src` (16 rows, row stride `stride`): z[j] lane
// l = output j (before rounding) of column 2l (kOdd false) or 2l + 1 (kOdd true), in fp32. Every
// product is exact; the sums are where MagnitudeRange::inexact passes the column. The even half
// also gives the columns' range, from the same loads.
template <bool kOdd>
MICROSCALE_AVX2_INLINE void transform_half(const uint16_t* src, int64_t stride, const InputSigns& signs,
                                           __m256 (&z)[kBlock], MagnitudeRange* range = nullptr) {
#pragma GCC unroll 16
  for (int i = 0; i < kBlock; ++i) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * stride));
    if constexpr (!kOdd) range->add(x);
    const __m256i wide = kOdd ? _mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))
                              : _mm256_slli_epi32(x, 16);
    z[i] = _mm256_mul_ps(_mm256_castsi256_ps(wide), _mm256_set1_ps(signs.s[i]));
  }
  fwht16(z);
}

// fp32 lanes (finite) rounded to bf16, to nearest even: the pattern in each lane's high 16 bits
// (the low ones are not meaningful).
MICROSCALE_AVX2_INLINE __m256i round_to_bf16_high(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
}

// One column (16 values at `column`, `stride` apart) through rht_column_exact: its 16 outputs as
// bf16 patterns, to y[j * y_stride].
void exact_column(const uint16_t* column, int64_t stride, const RhtCoefficients& t, uint16_t* y,
                  int64_t y_stride) {
  float x[kBlock], out[kBlock];
  for (int i = 0; i < kBlock; ++i) x[i] = bf16_to_float(column[i * stride]);
  rht_column_exact(x, 1, t, out);
  for (int j = 0; j < kBlock; ++j) y[j * y_stride] = static_cast<uint16_t>(float_bits(out[j]) >> 16);
}

// The lanes of MagnitudeRange::inexact (16 bits per column) to one bit per column, for ctz loops.
MICROSCALE_AVX2_INLINE uint32_t column_bits(__m256i inexact) {
  const __m128i bytes =
      _mm_packs_epi16(_mm256_castsi256_si128(inexact), _mm256_extracti128_si256(inexact, 1));
  return static_cast<uint32_t>(_mm_movemask_epi8(bytes));
}

// y[j * y_stride + c] = output j of the RHT of column c of the 16 at `src`, as a bf16 pattern,
// rounded as rht_band rounds.
MICROSCALE_AVX2_INLINE void rht_16_columns(const uint16_t* src, int64_t stride, const RhtCoefficients& t,
                                           const InputSigns& signs, uint16_t* y, int64_t y_stride) {
  __m256 z[kBlock];
  MagnitudeRange range;
  transform_half<false>(src, stride, signs, z, &range);  // even columns: patterns to the low halves
#pragma GCC unroll 16
  for (int j = 0; j < kBlock; ++j) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j * y_stride),
                        _mm256_srli_epi32(round_to_bf16_high(z[j]), 16));
  }
  transform_half<true>(src, stride, signs, z);  // odd columns: to the high halves
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
#pragma GCC unroll 16
  for (int j = 0; j < kBlock; ++j) {
    auto* row = reinterpret_cast<__m256i*>(y + j * y_stride);
    _mm256_storeu_si256(
        row, _mm256_or_si256(_mm256_loadu_si256(row), _mm256_and_si256(round_to_bf16_high(z[j]), high)));
  }
  for (uint32_t rest = column_bits(range.inexact()); rest != 0; rest &= rest - 1) {
    const int c = std::countr_zero(rest);
    exact_column(src + c, stride, t, y + c, y_stride);
  }
}

MICROSCALE_AVX2 void rht_chunk(const Call& call, const Chunk& c, ColumnStage& stage) {
  if (c.prefetch_next) prefetch_rows(c.src + kChunkCols, call.stride, kBlock, kPrefetchBytes);
  const InputSigns signs(*call.rht);
  alignas(32) uint16_t y[kBlock][kChunkCols];  // the chunk's transform: [output j][column]
  for (int c0 = 0; c0 < c.cols; c0 += kColumns)
    rht_16_columns(c.src + c0, call.stride, *call.rht, signs, &y[0][c0], kChunkCols);
  // The transform as a band of its own, whose columnwise blocks the AVX2 chunk encodes.
  Call transformed = call;
  transformed.src = &y[0][0];
  transformed.stride = kChunkCols;
  transformed.tile_2d = false;  // the RHT's blocks are 1 x 16 (encode_rht_columns)
  Chunk chunk = c;
  chunk.src = &y[0][0];
  chunk.prefetch_next = false;
  quantize_chunk_avx2<DType::BF16, false, true, false>(transformed, chunk, stage);
}

// Lanes of `bits` (fp32 patterns) with the inexact columns' lanes zeroed: `inexact` per 16-bit
// column, here taken for the even (kOdd false) or odd columns' 32-bit lanes.
template <bool kOdd>
MICROSCALE_AVX2_INLINE __m256i without_inexact(__m256i bits, __m256i inexact) {
  const __m256i mask =
      kOdd ? _mm256_srai_epi32(inexact, 16) : _mm256_srai_epi32(_mm256_slli_epi32(inexact, 16), 16);
  return _mm256_andnot_si256(mask, bits);
}

// Whether no output of the 16 columns at `src` can exceed at_least, by rht_band_max_abs's bound
// (rht_band.cpp): every column's sum_i |x_i| x (1 + 2^-18) is at most `limit`, 4 x at_least.
// NaN and Inf inputs fail it.
MICROSCALE_AVX2_INLINE bool below_limit(const uint16_t* src, int64_t stride, __m256 limit) {
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();  // sum_i |x_i| per column, i in order
#pragma GCC unroll 16
  for (int i = 0; i < kBlock; ++i) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * stride)),
                                       _mm256_set1_epi16(0x7FFF));
    even = _mm256_add_ps(even, _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)));
    odd = _mm256_add_ps(
        odd, _mm256_castsi256_ps(_mm256_and_si256(a, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))));
  }
  const __m256 slack = _mm256_set1_ps(1.0f + 0x1p-18f);
  const __m256 within = _mm256_and_ps(_mm256_cmp_ps(_mm256_mul_ps(even, slack), limit, _CMP_LE_OQ),
                                      _mm256_cmp_ps(_mm256_mul_ps(odd, slack), limit, _CMP_LE_OQ));
  return _mm256_movemask_ps(within) == 0xFF;
}

MICROSCALE_AVX2 float band_max_abs(const uint16_t* src, int64_t stride, int64_t k, const RhtCoefficients& t,
                                   float at_least) {
  const InputSigns signs(t);
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256 limit = _mm256_set1_ps(min_nonnegative(4.0f * at_least, FLT_MAX));
  __m256i max_bits = _mm256_setzero_si256();        // of the exact columns' |sums|, finite: signed order
  uint32_t max_output_bits = float_bits(at_least);  // and of the other columns' outputs
  for (int64_t c0 = 0; c0 < k; c0 += kColumns) {
    const uint16_t* columns = src + c0;
    if (below_limit(columns, stride, limit)) continue;
    __m256 z[kBlock];
    MagnitudeRange range;
    transform_half<false>(columns, stride, signs, z, &range);
    const __m256i inexact = range.inexact();
#pragma GCC unroll 16
    for (int j = 0; j < kBlock; ++j) {
      const __m256i a = _mm256_and_si256(_mm256_castps_si256(z[j]), magnitude);
      max_bits = _mm256_max_epi32(max_bits, without_inexact<false>(a, inexact));
    }
    transform_half<true>(columns, stride, signs, z);
#pragma GCC unroll 16
    for (int j = 0; j < kBlock; ++j) {
      const __m256i a = _mm256_and_si256(_mm256_castps_si256(z[j]), magnitude);
      max_bits = _mm256_max_epi32(max_bits, without_inexact<true>(a, inexact));
    }
    for (uint32_t rest = column_bits(inexact); rest != 0; rest &= rest - 1) {
      uint16_t y[kBlock];
      exact_column(columns + std::countr_zero(rest), stride, t, y, 1);
      for (const uint16_t v : y) {  // NaN outputs dropped, as amaxes drop NaN
        const uint32_t a = (uint32_t{v} << 16) & 0x7FFFFFFFu;
        if (a <= 0x7F800000u) max_output_bits = std::max(max_output_bits, a);
      }
    }
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), max_bits);
  const uint32_t sum_max = *std::max_element(lanes, lanes + 8);
  // Rounding is monotone: the largest rounded |output| is the largest |sum| rounded.
  const uint32_t rounded = uint32_t{float_to_bf16(bits_to_float(sum_max))} << 16;
  return bits_to_float(std::max(max_output_bits, rounded));
}

}  // namespace

void quantize_rht_chunk_avx2(const Call& call, const Chunk& c, ColumnStage& stage) {
  rht_chunk(call, c, stage);
}

float rht_band_max_abs_avx2(const uint16_t* src, int64_t stride, int64_t k, const RhtCoefficients& t,
                            float at_least) {
  return band_max_abs(src, stride, k, t, at_least);
}

}  // namespace microscale::cpu::nvfp4_16

#endif  // MICROSCALE_HAVE_AVX2_KERNELS
