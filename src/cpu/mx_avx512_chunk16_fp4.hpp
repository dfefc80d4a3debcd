// The AVX-512 MX quantizer's kernel for bf16 and f16 inputs to MXFP4, in 16-bit lanes. Part of
// quantize_mx_avx512.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/e2m1_thresholds.hpp"
#include "cpu/mx_avx512_band.hpp"
#include "cpu/mx_avx512_chunk.hpp"
#include "cpu/mx_avx512_chunk16.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_mx_avx512.cpp is the one translation
// unit that includes the mx_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

// ---- MXFP4 of bf16 and f16 inputs: codes in 16-bit lanes ----
//
// E2M1 puts a large share of a block in the format's subnormals, outside the 16-bit form of
// mx_avx512_chunk16.hpp. Two forms take them, chosen per chunk:
// - the two-step form (mx16_form.hpp: Mx16Fp4TwoStep, mx16_fp4_code): the normal form's code
//   with a saturating subtract, raised to the count of the block's two lowest steps; three terms
//   per block, each the scale byte shifted less a constant. It holds for scale bytes from
//   Mx16Fp4TwoStep::kMinScale to 0xFE and for blocks of zeros: every chunk of finite data whose
//   block amaxes are above ~2^-122 (bf16) or ~2^-10 (f16).
// - thresholds: compares of the |x| pattern with its block's thresholds (e2m1_thresholds.hpp:
//   mx_e2m1_thresholds), exact for every scale byte, 0xFF (Inf and NaN blocks) included; the
//   chunks the two-step form does not hold for.
// A chunk is a full band of 32 rows x 128 columns (four registers per row: each output row one
// 64-byte line); a band's last chunks may be 64 or 32 columns.
constexpr int kFp4ChunkCols = 128;

// The MXFP4 thresholds of kIn with each value repeated in both halves of a 32-bit word (one
// block's thresholds are then broadcast loads), and in word 0, instead of the zero step, the
// code's sign mask: 8, or 0 where the step is never reached (byte 0xFF: every code +6).
template <DType kIn>
const uint32_t (*wide_fp4_thresholds())[8] {
  struct Table {
    alignas(64) uint32_t below[256][8];
  };
  static const Table table = [] {
    const MxE2m1Thresholds& t = mx_e2m1_thresholds(kIn);
    Table w;
    for (int s = 0; s < 256; ++s) {
      for (int k = 0; k < 8; ++k) {
        // MX rows have the zero step at -1 (every pattern takes its sign) or 0x7FFF (none does).
        const auto v = static_cast<uint16_t>(k == 0 ? (t.below[s][0] < 0 ? 8 : 0) : t.below[s][k]);
        w.below[s][k] = v | uint32_t{v} << 16;
      }
    }
    return w;
  }();
  return table.below;
}

// The E2M1 codes of 32 lanes: |x| patterns `a`, input patterns shifted right by 12 (`sign_bits`:
// the sign in bit 3), against per-lane thresholds t[1..7] and sign masks t[0] (8 or 0).
MICROSCALE_AVX512_INLINE __m512i e2m1_codes16(__m512i a, __m512i sign_bits, const __m512i t[8]) {
  // The magnitude (0..7) bit by bit, a binary search over the monotone steps: bit 2 from step 4,
  // bit 1 from step 2 or 6, bit 0 from step 1, 3, 5 or 7.
  const __mmask32 b2 = _mm512_cmpgt_epi16_mask(a, t[4]);
  const __mmask32 b1 = _mm512_cmpgt_epi16_mask(a, _mm512_mask_blend_epi16(b2, t[2], t[6]));
  const __m512i odd = _mm512_mask_blend_epi16(b1, _mm512_mask_blend_epi16(b2, t[1], t[5]),
                                              _mm512_mask_blend_epi16(b2, t[3], t[7]));
  const __mmask32 b0 = _mm512_cmpgt_epi16_mask(a, odd);
  __m512i m = _mm512_maskz_mov_epi16(b2, _mm512_set1_epi16(4));
  m = _mm512_mask_add_epi16(m, b1, m, _mm512_set1_epi16(2));
  m = _mm512_mask_add_epi16(m, b0, m, _mm512_set1_epi16(1));
  return _mm512_ternarylogic_epi32(m, sign_bits, t[0], 0xF8);  // m | (sign_bits & t[0])
}

// The two-step form's terms (Mx16Fp4TwoStep::terms) of 32 lanes of scale bytes, one per 16-bit
// lane (a byte repeated in both halves of a 32-bit word gives its terms repeated likewise): each
// the byte clamped to the form's range, shifted to the input's exponent field, less an offset
// (mod 2^16, as the scalar form's casts).
struct Fp4TwoStepLanes {
  __m512i lower, step1, step2;
};

// A 16-bit lane holding `v` mod 2^16.
MICROSCALE_AVX512_INLINE __m512i set1_u16(int v) {
  return _mm512_set1_epi16(static_cast<int16_t>(static_cast<uint16_t>(v)));
}

template <DType kIn>
MICROSCALE_AVX512_INLINE Fp4TwoStepLanes fp4_two_step_terms(__m512i bytes16) {
  using T = Mx16Fp4TwoStep<kIn>;
  const __m512i clamped =
      _mm512_min_epu16(_mm512_max_epu16(bytes16, set1_u16(T::kMinScale)), set1_u16(T::kMaxScale));
  const __m512i base = _mm512_slli_epi16(clamped, T::kMantissaBits);
  return {_mm512_sub_epi16(base, set1_u16(T::kLowerOffset)),
          _mm512_sub_epi16(base, set1_u16(T::kStep1Offset)),
          _mm512_sub_epi16(base, set1_u16(T::kStep2Offset))};
}

// mx16_fp4_code on 32 lanes: |x| patterns `a`, |x| plus the rounding bit of the kept mantissa bit
// `a_plus_lsb`, input patterns shifted right by 12 (`sign_bits`: the sign in bit 3), and each
// lane's block terms.
template <DType kIn>
MICROSCALE_AVX512_INLINE __m512i two_step_codes16(__m512i a, __m512i a_plus_lsb, __m512i sign_bits,
                                                  const Fp4TwoStepLanes& t) {
  using F = Mx16Format<E2M1Codec, kIn>;
  const __m512i normal = _mm512_min_epu16(_mm512_srli_epi16(_mm512_subs_epu16(a_plus_lsb, t.lower), F::kDrop),
                                          _mm512_set1_epi16(static_cast<int16_t>(E2M1Codec::kMaxCode)));
  // The steps passed (|x| above step1, then step2) raise the code to at least 1, then 2.
  __m512i m =
      _mm512_mask_max_epu16(normal, _mm512_cmpgt_epi16_mask(a, t.step1), normal, _mm512_set1_epi16(1));
  m = _mm512_mask_max_epu16(m, _mm512_cmpgt_epi16_mask(a, t.step2), m, _mm512_set1_epi16(2));
  return _mm512_ternarylogic_epi32(m, sign_bits, _mm512_set1_epi16(8), 0xF8);  // m | (sign_bits & 8)
}

// The output row of one direction: the 16-bit codes c[0..kRegs-1] (lane j of c[t] = column
// 32t + j) two per byte, column 2q in the low nibble of byte q.
template <int kRegs>
MICROSCALE_AVX512_INLINE void store_fp4_codes16(const __m512i* c, uint8_t* dst, bool stream) {
  __m512i p[4];
  for (int t = 0; t < kRegs; ++t)  // 32-bit lane q: (codes 2q | 2q + 1 << 4) & 0xFF
    p[t] = _mm512_ternarylogic_epi32(c[t], _mm512_srli_epi32(c[t], 12), _mm512_set1_epi32(0xFF), 0xA8);
  if constexpr (kRegs == 4) {
    store_line(dst, pack_bytes<4>(p), stream);
  } else if constexpr (kRegs == 2) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_castsi512_si256(pack_bytes<2>(p)));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(p[0]));
  }
}

// Step 2's terms of an MXFP4 chunk for step 3, in the form chosen for the chunk. Thresholds:
// each row block's scale byte (its thresholds broadcast per row), each column lane's thresholds
// (col_below[k][j], from the 16-bit table by 8 x 8 transposes) and sign mask. Two-step form: each
// row block's terms as 32-bit words holding the 16-bit term twice (broadcast per row), each
// column lane's terms.
struct Fp4ChunkTerms {
  alignas(64) uint32_t row_bytes[4][kBlock];
  alignas(64) int16_t col_below[8][kFp4ChunkCols];
  __m512i col_sign[4];
  alignas(64) uint32_t row_lower[4][kBlock], row_step1[4][kBlock], row_step2[4][kBlock];
  Fp4TwoStepLanes col[4];
};

// Step 3 of quantize_chunk16_fp4 for the directions kRows, kCols: each row's codes, in the
// two-step form (kTwoStep) or by thresholds, from the chunk's terms.
// NOTE: the directions and the form are template arguments and the loops over registers and
// thresholds fully unrolled, so that the codes stay in registers (as runtime tests, GCC kept them
// on the stack).
template <DType kIn, int kRegs, bool kRows, bool kCols, bool kTwoStep>
MICROSCALE_AVX512_INLINE void encode_chunk16_fp4(const Band& b, int64_t col,
                                                 const uint16_t (*buffer)[kFp4ChunkCols],
                                                 const Fp4ChunkTerms& terms) {
  using F = Mx16Format<E2M1Codec, kIn>;
  const int64_t data_col = col / 2;
  for (int i = 0; i < kBlock; ++i) {
    __m512i row_codes[kRegs], col_codes[kRegs];
#pragma GCC unroll 4
    for (int t = 0; t < kRegs; ++t) {
      const __m512i x = _mm512_load_si512(buffer[i] + t * k16Lanes);
      const __m512i a = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
      const __m512i sign_bits = _mm512_srli_epi16(x, 12);
      if constexpr (kTwoStep) {
        const __m512i a_plus_lsb =
            _mm512_add_epi16(a, _mm512_and_si512(_mm512_srli_epi16(a, F::kDrop), _mm512_set1_epi16(1)));
        if constexpr (kRows) {
          const Fp4TwoStepLanes row = {_mm512_set1_epi32(static_cast<int>(terms.row_lower[t][i])),
                                       _mm512_set1_epi32(static_cast<int>(terms.row_step1[t][i])),
                                       _mm512_set1_epi32(static_cast<int>(terms.row_step2[t][i]))};
          row_codes[t] = two_step_codes16<kIn>(a, a_plus_lsb, sign_bits, row);
        }
        if constexpr (kCols) col_codes[t] = two_step_codes16<kIn>(a, a_plus_lsb, sign_bits, terms.col[t]);
      } else {
        if constexpr (kRows) {
          const uint32_t* w = b.fp4_wide_thresholds[terms.row_bytes[t][i]];
          __m512i th[8];
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) th[k] = _mm512_set1_epi32(static_cast<int>(w[k]));
          row_codes[t] = e2m1_codes16(a, sign_bits, th);
        }
        if constexpr (kCols) {
          __m512i th[8];
          th[0] = terms.col_sign[t];
#pragma GCC unroll 8
          for (int k = 1; k < 8; ++k) th[k] = _mm512_load_si512(terms.col_below[k] + t * k16Lanes);
          col_codes[t] = e2m1_codes16(a, sign_bits, th);
        }
      }
    }
    if constexpr (kRows)
      store_fp4_codes16<kRegs>(row_codes, b.row_data + i * b.data_stride + data_col, b.stream);
    if constexpr (kCols)
      store_fp4_codes16<kRegs>(col_codes, b.col_data + i * b.data_stride + data_col, b.stream);
  }
}

// Step 3 in the requested directions.
template <DType kIn, int kRegs, bool kTwoStep>
MICROSCALE_AVX512_INLINE void encode_chunk16_fp4_directions(const Band& b, int64_t col,
                                                            const uint16_t (*buffer)[kFp4ChunkCols],
                                                            const Fp4ChunkTerms& terms) {
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  if (rowwise && columnwise) {
    encode_chunk16_fp4<kIn, kRegs, true, true, kTwoStep>(b, col, buffer, terms);
  } else if (rowwise) {
    encode_chunk16_fp4<kIn, kRegs, true, false, kTwoStep>(b, col, buffer, terms);
  } else {
    encode_chunk16_fp4<kIn, kRegs, false, true, kTwoStep>(b, col, buffer, terms);
  }
}

// One MXFP4 chunk of a full band of kIn (bf16 or f16) inputs: columns [col, col + 32 * kRegs).
// `buffer` is scratch: the chunk's rows, contiguous.
template <MxScaleRule kRule, int kRegs, DType kIn>
MICROSCALE_AVX512_INLINE void quantize_chunk16_fp4(const Band& b, int64_t col,
                                                   uint16_t (*buffer)[kFp4ChunkCols]) {
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;

  // 1. Load into the buffer; |x| maxes per column and per row block.
  __m512i col_max[kRegs];
  alignas(64) uint32_t row_max[kRegs][kBlock];  // the 16-bit max shifted up
  load_chunk16<kRegs>(b, col, buffer, col_max, row_max);

  // 2. Scale bytes, then the terms of the form the chunk takes.
  Fp4ChunkTerms terms;
  alignas(64) uint8_t bytes[kFp4ChunkCols];  // byte j = column j's scale
  if (columnwise) {
    __m512i s[2 * kRegs];
    column_scale_bytes<kRule, kRegs, kIn>(b, col_max, s);
    if constexpr (kRegs == 1) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), _mm512_castsi512_si256(pack_bytes<2>(s)));
    } else {
      for (int q = 0; q < kRegs / 2; ++q) _mm512_store_si512(bytes + 64 * q, pack_bytes<4>(s + 4 * q));
    }
    std::memcpy(b.col_scale + col, bytes, kRegs * k16Lanes);
  }
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        __m512i amax = _mm512_load_si512(row_max[t] + 16 * h);
        if constexpr (kIn == DType::F16) amax = _mm512_castps_si512(widen_half_lanes<kIn, true>(amax));
        _mm512_store_si512(terms.row_bytes[t] + 16 * h,
                           mx_scale_bytes<kRule>(amax, b.emax, b.mantissa_bits, b.max_normal));
      }
    }
    uint8_t* dst = b.row_scale + col / kBlock;
    for (int i = 0; i < kBlock; ++i) {
      for (int t = 0; t < kRegs; ++t)
        dst[i * b.row_scale_stride + t] = static_cast<uint8_t>(terms.row_bytes[t][i]);
    }
  }

  __m512i col_bytes16[kRegs];  // columnwise: the scale bytes in 16-bit lanes
  for (int t = 0; t < kRegs && columnwise; ++t)
    col_bytes16[t] =
        _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + t * k16Lanes)));
  if (every_block_from<kIn, kRegs>(Mx16Fp4TwoStep<kIn>::kMinScale, rowwise, columnwise, col_bytes16, col_max,
                                   terms.row_bytes, row_max)) {
    for (int t = 0; t < kRegs && columnwise; ++t) terms.col[t] = fp4_two_step_terms<kIn>(col_bytes16[t]);
    if (rowwise) {
      for (int t = 0; t < kRegs; ++t) {
        for (int h = 0; h < kBlock / 16; ++h) {
          const __m512i s = _mm512_load_si512(terms.row_bytes[t] + 16 * h);
          const Fp4TwoStepLanes r = fp4_two_step_terms<kIn>(_mm512_or_si512(s, _mm512_slli_epi32(s, 16)));
          _mm512_store_si512(terms.row_lower[t] + 16 * h, r.lower);
          _mm512_store_si512(terms.row_step1[t] + 16 * h, r.step1);
          _mm512_store_si512(terms.row_step2[t] + 16 * h, r.step2);
        }
      }
    }
    return encode_chunk16_fp4_directions<kIn, kRegs, true>(b, col, buffer, terms);
  }
  if (columnwise) {
    for (int j = 0; j < kRegs * k16Lanes; j += 8)
      transpose_thresholds<kFp4ChunkCols>(b.fp4_thresholds, bytes + j, terms.col_below, j);
    for (int t = 0; t < kRegs; ++t) {  // the zero step's -1 (a sign) or 0x7FFF (none) -> 8 or 0
      terms.col_sign[t] =
          _mm512_maskz_mov_epi16(_mm512_cmplt_epi16_mask(_mm512_load_si512(terms.col_below[0] + t * k16Lanes),
                                                         _mm512_setzero_si512()),
                                 _mm512_set1_epi16(8));
    }
  }
  encode_chunk16_fp4_directions<kIn, kRegs, false>(b, col, buffer, terms);
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
