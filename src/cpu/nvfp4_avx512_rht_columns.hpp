// The AVX-512 NVFP4 quantizer's columnwise codes of a bf16 unit through the RHT, a half (the even
// or the odd columns) at a time, its 16 transformed rows kept in registers from the butterfly to
// their codes (rht_half_columns); and the packing of columnwise codes that every unit shares.
// Part of quantize_nvfp4_avx512.cpp.
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

// Blocks whose amax times encode scale may reach 7 (or is NaN: an Inf amax): their products are
// beyond nvfp4_e2m1_index<true, true>. A normal E4M3 block scale rounds amax / 6 by at most 1/16,
// so only subnormal or saturated block scales (an amax override below the data's) get there.
MICROSCALE_AVX512_INLINE __mmask16 block_may_reach_seven(__m512i amax_bits, __m512 encode_scale) {
  return _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_castsi512_ps(amax_bits), encode_scale), _mm512_set1_ps(7.0f),
                            _CMP_NLT_UQ);
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

// One half's columnwise outputs through the RHT: its codes and, per lane, its block's E4M3 scale
// code (low 8 bits).
struct RhtHalfColumns {
  ColumnCodes codes;
  __m512i scale_codes;
};

// The codes of a half's 16 transformed rows y (bf16 values as fp32) under `scale`.
template <bool kBounded>
MICROSCALE_AVX512_INLINE void encode_rht_half(const __m512 y[16], __m512 scale, ColumnCodes& codes) {
#pragma GCC unroll 16
  for (int i = 0; i < kBlock; ++i) {
    const __m512 p = _mm512_mul_ps(y[i], scale);
    codes.add(i,
              nvfp4_e2m1_codes<kBounded>(nvfp4_e2m1_index<true, kBounded>(p), is_negative(p), 4 * (i % 8)));
  }
}

// Half `half` of a bf16 unit's columnwise output through the RHT, as quantize_unit16 gives it from
// rht_unit_bf16's RhtUnit, without storing the transformed values: in fp32 (rht_half_float), each
// output rounded to bf16 by round_to_bf16_normal (the caller has checked
// rht_outputs_in_normal_range and rht_unit_bf16's conditions for fp32 sums), then rht_unit_bf16's
// check, per column: its bf16 max at most `limit` (the same bound, one lane per column of this
// half). False, with `out` of no use, where the check fails: the caller then takes rht_unit_bf16's
// way for the whole unit.
// NOTE: a half at a time, 16 rows live from the butterfly to the codes; both halves first, as
// RhtUnit holds them, kept 32 registers of outputs and stored and reloaded them (docs/perf.md,
// thirty-fifth session).
MICROSCALE_AVX512_INLINE bool rht_half_columns(const std::byte* src, int64_t row_bytes, int half,
                                               const float* input_scale, __m512i limit,
                                               const DirectionScales& col, RhtHalfColumns& out) {
  __m512 y[16];
  rht_half_float(src, row_bytes, half, input_scale, y);
  __m512 max = _mm512_setzero_ps();
  for (int j = 0; j < kBlock; ++j) {
    y[j] = round_to_bf16_normal(y[j]);
    max = _mm512_range_ps(max, y[j], 0x0B);  // max |.|, sign cleared
  }
  const __m512i max_bits = _mm512_castps_si512(max);
  if (_mm512_cmple_epu32_mask(_mm512_srli_epi32(max_bits, 16), limit) != __mmask16{0xFFFF}) return false;
  const __m512 scale = nvfp4_block_scales(max_bits, col.multiplier, col.encode_scale, &out.scale_codes);
  if (block_may_reach_seven(max_bits, scale) != 0) {
    encode_rht_half<false>(y, scale, out.codes);
  } else {
    encode_rht_half<true>(y, scale, out.codes);
  }
  return true;
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
