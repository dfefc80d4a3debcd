// The AVX-512 NVFP4 quantizer's RHT of a bf16 unit (16 rows x 32 columns): the 16-point
// transform of every column in fp32, proven exact after the sums, else per half in fp32 or
// double (rht_unit_bf16). Part of quantize_nvfp4_avx512.cpp.
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

// Per column (16-bit lanes, column l in word l), whether fp32 can hold its sums: normal inputs
// (subnormal ones carry fewer bits) below 2^121 (no sum overflows), at most 16 binades apart (a
// column over 16 binades fails rht_unit_bf16's check anyway: the outputs' max is at least
// max |x| / 4, the inputs being the butterfly's first partial sums).
MICROSCALE_AVX512_INLINE __mmask32 rht_fp32_columns(__m512i col_max, __m512i min_less_one) {
  const __m512i spread = exponent_spread(col_max, min_less_one);
  return _mm512_cmplt_epu16_mask(col_max, _mm512_set1_epi16(0x7C00)) &
         _mm512_cmpge_epu16_mask(min_less_one, _mm512_set1_epi16(0x7F)) &
         _mm512_cmple_epi16_mask(spread, _mm512_set1_epi16(16));
}

// rht_unit_bf16's bound per column (16-bit lanes, column l in word l) on its outputs' bf16 max:
// (1 - 2^-7) 2^(e + 15), that is exponent e + 14 and significand at most 1.1111110b, e the
// exponent of the column's smallest nonzero |x|.
MICROSCALE_AVX512_INLINE __m512i rht_exact_max_limit(__m512i min_less_one) {
  return _mm512_add_epi16(
      _mm512_and_si512(_mm512_add_epi16(min_less_one, _mm512_set1_epi16(1)), _mm512_set1_epi16(0x7F80)),
      _mm512_set1_epi16((14 << 7) | 0x7E));
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
  // Columns fp32 cannot take go to the tested form first, so that data of a wide range do not pay
  // for both forms.
  if (rht_fp32_columns(col_max, min_less_one) != ~__mmask32{0})
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
  // The check, on bf16 patterns (word l: column l).
  const __m512i max16 = _mm512_or_si512(_mm512_srli_epi32(out.max[0], 16), out.max[1]);
  if (_mm512_cmple_epu16_mask(max16, rht_exact_max_limit(min_less_one)) != ~__mmask32{0})
    return rht_unit_bf16_tested<kKeep>(src, row_bytes, col_max, min_less_one, c, input_scale, out);
  return true;
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
