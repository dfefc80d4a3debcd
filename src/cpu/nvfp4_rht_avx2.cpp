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
// outputs go back to their lanes with a shift or a mask: no lane shuffles; its butterfly runs in
// two stages that each fit AVX2's 16 registers (Halves). Its exactness test is
// rht_band's, on the 16-bit |x| patterns (MagnitudeRange); the few columns that fail it take
// rht_column_exact. A chunk's transform (16 x 256 bf16, in L1) is then a band like any other:
// its columnwise blocks are its columns, which the AVX2 chunk (nvfp4_chunk_avx2.cpp) encodes.
#include "cpu/nvfp4_16_chunk.hpp"

#ifdef MICROSCALE_HAVE_AVX2_KERNELS

#include <immintrin.h>

#include <algorithm>
#include <bit>

#include "cpu/avx2.hpp"      // prefetch_line_of_rows
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

// The transform of 16 columns in fp32, in two halves: the even columns (x << 16) and the odd
// ones (x & 0xFFFF0000), 8 lanes each. The FWHT's four butterfly steps run in two stages of two:
// mix_within_groups (steps 1 and 2: rows 4g .. 4g + 3) and mix_across_groups (steps 4 and 8:
// rows r, r + 4, r + 8, r + 12), with the 32 intermediate registers in L1 in between.
// NOTE: in registers, the 16 rows of a half plus a temporary did not fit AVX2's 16 registers,
// and GCC's spills ran the whole transform at ~1.3 instructions per cycle (docs/perf.md,
// twenty-eighth session). The operations are fwht16's, in its order within each step: the same
// sums, which are exact where MagnitudeRange::inexact passes the column.
struct Halves {
  __m256 even[kBlock];  // lane l: column 2l of the 16
  __m256 odd[kBlock];   // lane l: column 2l + 1
};

// Steps (0, 1), (2, 3) then (0, 2), (1, 3) of a butterfly: the FWHT's two steps on 4 values.
MICROSCALE_AVX2_INLINE void butterfly4(__m256 (&v)[4]) {
  const __m256 s01 = _mm256_add_ps(v[0], v[1]), d01 = _mm256_sub_ps(v[0], v[1]);
  const __m256 s23 = _mm256_add_ps(v[2], v[3]), d23 = _mm256_sub_ps(v[2], v[3]);
  v[0] = _mm256_add_ps(s01, s23);
  v[2] = _mm256_sub_ps(s01, s23);
  v[1] = _mm256_add_ps(d01, d23);
  v[3] = _mm256_sub_ps(d01, d23);
}

// Stage 1: the 16 rows at `src` (row stride `stride`) times s_i / 4 (every product exact), each
// group of 4 rows through steps 1 and 2, to h; and the columns' range from the same loads.
MICROSCALE_AVX2_INLINE void mix_within_groups(const uint16_t* src, int64_t stride, const InputSigns& signs,
                                              Halves& h, MagnitudeRange& range) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
#pragma GCC unroll 4
  for (int g = 0; g < kBlock; g += 4) {
    __m256 even[4], odd[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (g + r) * stride));
      range.add(x);
      const __m256 s = _mm256_set1_ps(signs.s[g + r]);
      even[r] = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), s);
      odd[r] = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(x, high)), s);
    }
    butterfly4(even);
    butterfly4(odd);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      h.even[g + r] = even[r];
      h.odd[g + r] = odd[r];
    }
  }
}

// Stage 2: steps 4 and 8 across the groups; output(j, even, odd) takes output j of the 16
// columns (before rounding).
template <typename Output>
MICROSCALE_AVX2_INLINE void mix_across_groups(const Halves& h, Output output) {
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    __m256 even[4] = {h.even[r], h.even[r + 4], h.even[r + 8], h.even[r + 12]};
    __m256 odd[4] = {h.odd[r], h.odd[r + 4], h.odd[r + 8], h.odd[r + 12]};
    butterfly4(even);
    butterfly4(odd);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) output(r + 4 * q, even[q], odd[q]);
  }
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
  Halves h;
  MagnitudeRange range;
  mix_within_groups(src, stride, signs, h, range);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  // The even columns' patterns to the low halves of their 32-bit lanes, the odd ones' to the high.
  mix_across_groups(h, [&](int j, __m256 even, __m256 odd) MICROSCALE_AVX2_LAMBDA {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j * y_stride),
                        _mm256_or_si256(_mm256_srli_epi32(round_to_bf16_high(even), 16),
                                        _mm256_and_si256(round_to_bf16_high(odd), high)));
  });
  for (uint32_t rest = column_bits(range.inexact()); rest != 0; rest &= rest - 1) {
    const int c = std::countr_zero(rest);
    exact_column(src + c, stride, t, y + c, y_stride);
  }
}

MICROSCALE_AVX2 void rht_chunk(const Call& call, const Chunk& c, ColumnStage& stage) {
  const InputSigns signs(*call.rht);
  alignas(32) uint16_t y[kBlock][kChunkCols];  // the chunk's transform: [output j][column]
  for (int c0 = 0; c0 < c.cols; c0 += kColumns) {
    // The next chunk's line at these 32 columns, of each row. (The rowwise chunk that follows
    // prefetches the same lines again over its own work: faster, in one paired run by ~4 %, than
    // leaving them to this one.)
    if (c.prefetch != nullptr && c0 % 32 == 0 && c0 * 2 < c.prefetch_bytes)
      prefetch_line_of_rows(c.prefetch, call.stride, kBlock, c0);
    rht_16_columns(c.src + c0, call.stride, *call.rht, signs, &y[0][c0], kChunkCols);
  }
  for (int64_t at = (c.cols + 31) / 32 * 32; c.prefetch != nullptr && at * 2 < c.prefetch_bytes; at += 32)
    prefetch_line_of_rows(c.prefetch, call.stride, kBlock, at);  // past this chunk's width
  // The transform as a band of its own, whose columnwise blocks the AVX2 chunk encodes.
  Call transformed = call;
  transformed.src = &y[0][0];
  transformed.stride = kChunkCols;
  transformed.tile_2d = false;  // the RHT's blocks are 1 x 16 (encode_rht_columns)
  Chunk chunk = c;
  chunk.src = &y[0][0];
  chunk.prefetch = nullptr;
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
    Halves h;
    MagnitudeRange range;
    mix_within_groups(columns, stride, signs, h, range);
    __m256i even_max = _mm256_setzero_si256(), odd_max = _mm256_setzero_si256();  // of the |sums|
    mix_across_groups(h, [&](int, __m256 even, __m256 odd) MICROSCALE_AVX2_LAMBDA {
      even_max = _mm256_max_epi32(even_max, _mm256_and_si256(_mm256_castps_si256(even), magnitude));
      odd_max = _mm256_max_epi32(odd_max, _mm256_and_si256(_mm256_castps_si256(odd), magnitude));
    });
    // A column's lane is the same for its 16 outputs: its mask can wait until after the max.
    const __m256i inexact = range.inexact();
    max_bits = _mm256_max_epi32(max_bits, without_inexact<false>(even_max, inexact));
    max_bits = _mm256_max_epi32(max_bits, without_inexact<true>(odd_max, inexact));
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
