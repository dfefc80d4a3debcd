// The AVX-512 MX quantizer's kernel for bf16 and f16 inputs with byte-sized codes (FP8, FP6), in
// 16-bit lanes. Part of quantize_mx_avx512.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cpu/mx_avx512_band.hpp"
#include "cpu/mx_avx512_chunk.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_mx_avx512.cpp is the one translation
// unit that includes the mx_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

// ---- bf16 and f16 inputs, byte-sized codes (FP8, FP6): 16-bit lanes throughout ----
//
// A chunk is one full band of 32 rows x 64 columns (two registers of 32 inputs per row; the last
// chunk of a band may be 32 columns, one register). The steps are those of quantize_chunk, but
// nothing is widened: the amaxes are unsigned maxes of the 16-bit |x| patterns (a vertical max
// per column, transpose_max16x2 per row block), and the codes come from mx16_codes_normal, a
// subtract and a shift per direction (avx512_codecs.hpp). Registers with a lane outside the normal
// form's range in either direction (format subnormals, input subnormals; zeros are fine) take
// mx_bf16_codes or mx_f16_codes; chunks with Inf or NaN take quantize_chunk, and so do bf16 chunks
// with a block scale below the format's bias (amax below ~2^-110) outside FP6's subnormal form
// (which takes blocks of zeros).
constexpr int k16Lanes = 32;
constexpr int k16ChunkCols = 64;

// Per 16 rows of row max patterns (the 16-bit max shifted up: bf16's fp32 bits) in row order:
// transpose_max16x2 on the rows' |x| (block b = columns 16b..16b+15 of the register), then the
// max of the two blocks.
MICROSCALE_AVX512_INLINE __m512i row_max16(const __m512i abs[16]) {
  __m512i out[2];
  transpose_max16x2(abs, out);
  // Lane d of out[h]: row 8h + 2(d % 4) + d / 8, block (d / 4) % 2; lanes d and d ^ 4 hold the two
  // blocks of one row (128-bit chunks 0 <-> 1, 2 <-> 3).
  for (__m512i& o : out) o = _mm512_max_epu32(o, _mm512_shuffle_i32x4(o, o, 0xB1));
  // Row r = 8h + q at lane 8(q % 2) + q / 2 of out[h].
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
  return _mm512_permutex2var_epi32(out[0], order, out[1]);
}

// Row block terms kept per band row: the scale byte and mx16_normal_terms, each as a 16-bit
// value repeated in both halves of a 32-bit word (a register is then one broadcast load).
struct RowTerms {
  alignas(64) uint32_t scale[kBlock];
  alignas(64) uint32_t lower[kBlock];
  alignas(64) uint32_t limit[kBlock];
  alignas(64) float multiplier[kBlock];  // FP6 in the subnormal form: subnormal_multipliers
};

// The output line of one row and direction: the 16-bit codes c[0..kRegs-1] as bytes.
template <int kRegs>
MICROSCALE_AVX512_INLINE void store_codes16(const __m512i* c, uint8_t* dst, bool stream) {
  if constexpr (kRegs == 2) {
    // packus interleaves the registers' 64-bit pieces per 128-bit lane; the permutation restores
    // the order. Codes are 0..255, so nothing saturates.
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    store_line(dst, _mm512_permutexvar_epi64(order, _mm512_packus_epi16(c[0], c[1])), stream);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi16_epi8(c[0]));
  }
}

// One register's codes for one direction (scale bytes per 16-bit lane) by the general form.
template <typename Codec, DType kIn>
MICROSCALE_AVX512_INLINE __m512i codes_outside_normal(__m512i x, __m512i scale_bytes) {
  if constexpr (kIn == DType::F16) {
    return mx_f16_codes<Codec>(x, scale_bytes);
  } else {
    const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
    return mx_bf16_codes<Codec>(abs, _mm512_srli_epi16(x, Mx16Format<Codec, kIn>::kSignShift), scale_bytes);
  }
}

// The codes of a register with a lane outside the normal form's range in a direction (rare): both
// requested directions by mx_bf16_codes or mx_f16_codes. `row_scale` is the row block's byte
// repeated in both halves of a 32-bit word; null pointers mark a direction not requested.
// NOTE: kept out of line: the hot loop stays small, and GCC 12 with -fsanitize=address,undefined
// and OpenMP miscompiled the inlined form (columnwise E3M2 codes took the normal form's values;
// adding a print made it disappear), while -O2 and either sanitizer alone did not.
template <typename Codec, DType kIn>
MICROSCALE_AVX512 __attribute__((noinline)) void encode_outside_normal(__m512i x, uint32_t row_scale,
                                                                       const __m512i* col_scale,
                                                                       __m512i* row_codes,
                                                                       __m512i* col_codes) {
  if (row_codes != nullptr)
    *row_codes = codes_outside_normal<Codec, kIn>(x, _mm512_set1_epi32(static_cast<int>(row_scale)));
  if (col_scale != nullptr) *col_codes = codes_outside_normal<Codec, kIn>(x, *col_scale);
}

// Step 1 of a 16-bit chunk, columns [col, col + 32 * kRegs) of a full band: its rows into
// `buffer`, the max |x| pattern per column (col_max[t], 16-bit lanes: columns 32t..32t+31) and per
// row and block (row_max[t][row]: the 16-bit max shifted up, i.e. bf16's fp32 bits); the columns
// that follow are prefetched.
template <int kRegs, int kWidth>
MICROSCALE_AVX512_INLINE void load_chunk16(const Band& b, int64_t col, uint16_t (*buffer)[kWidth],
                                           __m512i col_max[kRegs], uint32_t (*row_max)[kBlock]) {
  static_assert(kRegs * k16Lanes <= kWidth);
  const auto* src = reinterpret_cast<const uint16_t*>(b.src) + col;  // [32, row_bytes / 2]
  const int64_t stride = b.row_bytes / 2;
  const __m512i abs_mask = _mm512_set1_epi16(0x7FFF);
  const int64_t ahead = std::min(kPrefetchCols, b.k - col - kRegs * k16Lanes) * 2;
  for (int t = 0; t < kRegs; ++t) {
    col_max[t] = _mm512_setzero_si512();
    for (int h = 0; h < kBlock / 16; ++h) {
      __m512i abs[16];
      for (int i = 0; i < 16; ++i) {
        const int r = 16 * h + i;
        if (t == 0 && ahead > 0) {
          for (int64_t l = 0; l < kRegs * k16Lanes * 2; l += 64)
            _mm_prefetch(reinterpret_cast<const char*>(src + r * stride) + ahead + l, _MM_HINT_T1);
        }
        const __m512i v = _mm512_loadu_si512(src + r * stride + t * k16Lanes);
        _mm512_store_si512(buffer[r] + t * k16Lanes, v);
        abs[i] = _mm512_and_si512(v, abs_mask);
        col_max[t] = _mm512_max_epu16(col_max[t], abs[i]);
      }
      _mm512_store_si512(row_max[t] + 16 * h, row_max16(abs));
    }
  }
}

// The columnwise scale bytes of a 16-bit chunk from its column maxes (col_max[t]: columns
// 32t..32t+31): s[2t + h] holds those of columns 32t + 16h.. + 15, one per 32-bit lane.
template <MxScaleRule kRule, int kRegs, DType kIn>
MICROSCALE_AVX512_INLINE void column_scale_bytes(const Band& b, const __m512i* col_max, __m512i* s) {
  for (int t = 0; t < kRegs; ++t) {
    for (int h = 0; h < 2; ++h) {
      const __m256i half =
          h == 0 ? _mm512_castsi512_si256(col_max[t]) : _mm512_extracti64x4_epi64(col_max[t], 1);
      s[2 * t + h] = mx_scale_bytes<kRule>(_mm512_castps_si512(widen16<kIn>(half)), b.emax, b.mantissa_bits,
                                           b.max_normal);
    }
  }
}

// Whether every block of a 16-bit chunk has a scale byte from `least` to 0xFE or is a block of
// zeros (max pattern 0; every rule gives it byte 0, and a form that holds from `least` gets its
// codes right under the terms of `least`): where the FP6 subnormal form (least
// Mx16Subnormals::kMinScale) and the FP4 two-step form (least Mx16Fp4TwoStep::kMinScale) hold.
// Inf and NaN need no test of their own: every rule gives a block holding either the byte 0xFF
// (mx_scale_bytes). Column blocks: col_bytes and col_max, per register (16-bit lanes); row blocks:
// row_bytes and row_max (16-bit maxes shifted up), [register][row].
template <DType kIn, int kRegs>
MICROSCALE_AVX512_INLINE bool every_block_from(int least, bool rowwise, bool columnwise,
                                               const __m512i* col_bytes, const __m512i* col_max,
                                               const uint32_t (*row_bytes)[kBlock],
                                               const uint32_t (*row_max)[kBlock]) {
  // s - least (mod 2^16 or 2^32) is at least 0xFF - least exactly for s < least and s = 0xFF.
  __mmask32 outside = 0;
  if (columnwise) {
    for (int t = 0; t < kRegs; ++t) {
      const __m512i s = col_bytes[t];
      outside |=
          _mm512_mask_cmpge_epu16_mask(_mm512_test_epi16_mask(col_max[t], col_max[t]),
                                       _mm512_sub_epi16(s, _mm512_set1_epi16(static_cast<int16_t>(least))),
                                       _mm512_set1_epi16(static_cast<int16_t>(0xFF - least)));
    }
  }
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        const __m512i s = _mm512_load_si512(row_bytes[t] + 16 * h);
        const __m512i m = _mm512_load_si512(row_max[t] + 16 * h);
        outside |= _mm512_mask_cmpge_epu32_mask(_mm512_test_epi32_mask(m, m),
                                                _mm512_sub_epi32(s, _mm512_set1_epi32(least)),
                                                _mm512_set1_epi32(0xFF - least));
      }
    }
  }
  return outside == 0;
}

// The FP6 subnormal form (mx16_form.hpp: Mx16Subnormals) of the blocks of scale bytes S (32-bit
// lanes; S from kMinScale on, or a block of zeros): the multiplier 2^(127 - max(S, kMinScale) +
// kGridShift) as fp32 bits, a normal exponent for every such S.
template <typename Codec, DType kIn>
MICROSCALE_AVX512_INLINE __m512 subnormal_multipliers(__m512i bytes32) {
  using Subnormals = Mx16Subnormals<Codec, kIn>;
  const __m512i s = _mm512_max_epu32(bytes32, _mm512_set1_epi32(Subnormals::kMinScale));
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254 + Subnormals::kGridShift), s), 23));
}

// The subnormal form's code magnitudes of 32 lanes (the lanes outside the normal form; others are
// garbage): |x| as widen_half_lanes gives it (even and odd lanes) times the lanes' multipliers,
// rounded to integers in the current rounding mode (as encode_rn's add onto the grid rounds),
// back in 16-bit lanes.
MICROSCALE_AVX512_INLINE __m512i subnormal_magnitudes(__m512 even, __m512 odd, __m512 multiplier_even,
                                                      __m512 multiplier_odd) {
  const __m512i e = _mm512_cvtps_epi32(_mm512_mul_ps(even, multiplier_even));
  const __m512i o = _mm512_cvtps_epi32(_mm512_mul_ps(odd, multiplier_odd));
  return _mm512_mask_blend_epi16(0xAAAAAAAA, e, _mm512_slli_epi32(o, 16));  // low halves of e, o
}

// Step 3 of a 16-bit FP6 chunk in the subnormal form (every block from Mx16Subnormals::kMinScale):
// each lane's code from the normal form, or, where the lane is outside it (a nonzero format
// subnormal), from the subnormal form; branch-free, since FP6 blocks hold format subnormals in
// most registers (the general form per register took most of an FP6 chunk's time). Columnwise
// multipliers per register: [2t] even lanes, [2t + 1] odd lanes.
template <typename Codec, DType kIn, int kRegs>
MICROSCALE_AVX512_INLINE void encode_chunk16_fp6(const Band& b, int64_t col,
                                                 const uint16_t (*buffer)[k16ChunkCols], const RowTerms* row,
                                                 const __m512i* col_lower, const __m512i* col_limit,
                                                 const __m512* col_multiplier) {
  using F = Mx16Format<Codec, kIn>;
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  const __m512i one = _mm512_set1_epi16(1);
  for (int i = 0; i < kBlock; ++i) {
    __m512i row_codes[kRegs], col_codes[kRegs];
    for (int t = 0; t < kRegs; ++t) {
      const __m512i x = _mm512_load_si512(buffer[i] + t * k16Lanes);
      const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
      const __m512i x_shifted = _mm512_srli_epi16(x, F::kSignShift);
      const __m512i abs_plus_lsb =
          _mm512_add_epi16(abs, _mm512_and_si512(_mm512_srli_epi16(abs, F::kDrop), one));
      const __mmask32 nonzero = kIn == DType::F16 ? _mm512_test_epi16_mask(abs, abs) : 0;
      const __m512i abs_less_one = _mm512_sub_epi16(abs, one);
      const __m512 even = widen_half_lanes<kIn, false>(abs), odd = widen_half_lanes<kIn, true>(abs);
      if (rowwise) {
        const __m512 multiplier = _mm512_set1_ps(row[t].multiplier[i]);
        const __m512i normal = mx16_codes_normal<Codec, kIn>(
            abs_plus_lsb, x_shifted, _mm512_set1_epi32(static_cast<int>(row[t].lower[i])), nonzero);
        const __m512i subnormal =
            with_input_sign<Codec>(subnormal_magnitudes(even, odd, multiplier, multiplier), x_shifted);
        const __mmask32 outside =
            _mm512_cmple_epu16_mask(abs_less_one, _mm512_set1_epi32(static_cast<int>(row[t].limit[i])));
        row_codes[t] = _mm512_mask_blend_epi16(outside, normal, subnormal);
      }
      if (columnwise) {
        const __m512i normal = mx16_codes_normal<Codec, kIn>(abs_plus_lsb, x_shifted, col_lower[t], nonzero);
        const __m512i subnormal = with_input_sign<Codec>(
            subnormal_magnitudes(even, odd, col_multiplier[2 * t], col_multiplier[2 * t + 1]), x_shifted);
        col_codes[t] =
            _mm512_mask_blend_epi16(_mm512_cmple_epu16_mask(abs_less_one, col_limit[t]), normal, subnormal);
      }
    }
    if (rowwise) store_codes16<kRegs>(row_codes, b.row_data + i * b.data_stride + col, b.stream);
    if (columnwise) store_codes16<kRegs>(col_codes, b.col_data + i * b.data_stride + col, b.stream);
  }
}

// One chunk of a full band of kIn (bf16 or f16) inputs: columns [col, col + 32 * kRegs). False,
// with nothing written, when the chunk holds an Inf or NaN, or (bf16) a scale byte below the bias
// (see mx_bf16_codes) outside FP6's subnormal form. `buffer` is scratch: the chunk's rows,
// contiguous (see mx_avx512_chunk.hpp on L1 sets).
template <typename Codec, MxScaleRule kRule, int kRegs, DType kIn>
MICROSCALE_AVX512_INLINE bool quantize_chunk16(const Band& b, int64_t col, uint16_t (*buffer)[k16ChunkCols]) {
  using F = Mx16Format<Codec, kIn>;
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  const __m512i abs_mask = _mm512_set1_epi16(0x7FFF);

  // 1. Load into the buffer; |x| maxes per column and per row block.
  __m512i col_max[kRegs];
  alignas(64) uint32_t row_max[kRegs][kBlock];  // the 16-bit max shifted up
  load_chunk16<kRegs>(b, col, buffer, col_max, row_max);
  // Inf or NaN anywhere (every element is under a column max): the fp32 chunk handles them.
  for (int t = 0; t < kRegs; ++t) {
    if (_mm512_cmpge_epu16_mask(col_max[t], _mm512_set1_epi16(kInf16Bits<kIn>)) != 0) return false;
  }

  // 2. Scales and the encoders' terms; a direction not requested gets limit 0 (it sends only
  // |x| = 1, the smallest subnormal, to the general form, which is right for any lane). Columnwise:
  // kRegs * 32 contiguous bytes of the band's scale row, in 16-bit lanes per register.
  __m512i col_bytes = _mm512_setzero_si512();
  __m512i col_scale[kRegs];
  if (columnwise) {
    __m512i s[2 * kRegs];
    column_scale_bytes<kRule, kRegs, kIn>(b, col_max, s);
    col_bytes = pack_bytes<2 * kRegs>(s);  // byte j = column j's scale
    for (int t = 0; t < kRegs; ++t) {
      col_scale[t] = _mm512_cvtepu8_epi16(t == 0 ? _mm512_castsi512_si256(col_bytes)
                                                 : _mm512_extracti64x4_epi64(col_bytes, 1));
    }
  }
  // Rowwise: per row block its byte, each 16 rows' in one register.
  alignas(64) uint32_t bytes[kRegs][kBlock];  // rowwise: each row block's scale byte
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        // row_max holds each 16-bit max shifted up (bf16: its fp32 bits already).
        __m512i amax = _mm512_load_si512(row_max[t] + 16 * h);
        if constexpr (kIn == DType::F16) amax = _mm512_castps_si512(widen_half_lanes<kIn, true>(amax));
        _mm512_store_si512(bytes[t] + 16 * h,
                           mx_scale_bytes<kRule>(amax, b.emax, b.mantissa_bits, b.max_normal));
      }
    }
  }
  // FP6 in the subnormal form where every block of the chunk allows it (most chunks: under FLOOR,
  // block amaxes from 2^-122 (E2M3) or 2^-119 (E3M2) for bf16, 2^-11 or 2^-7 for f16, and blocks
  // of zeros).
  bool subnormal_form = false;
  if constexpr (Codec::kWidth == 6) {
    subnormal_form = every_block_from<kIn, kRegs>(Mx16Subnormals<Codec, kIn>::kMinScale, rowwise, columnwise,
                                                  col_scale, col_max, bytes, row_max);
  }
  // Other bf16 chunks with a scale byte below the bias go to the fp32 kernel (see mx_bf16_codes;
  // the subnormal form's least byte is above the bias); f16 takes any scale.
  if constexpr (kIn == DType::BF16) {
    if (!subnormal_form) {
      const __mmask64 valid = kRegs == 2 ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
      if (columnwise &&
          _mm512_mask_cmplt_epu8_mask(valid, col_bytes, _mm512_set1_epi8(static_cast<char>(F::kBias))) != 0)
        return false;
      for (int t = 0; t < kRegs && rowwise; ++t) {
        for (int h = 0; h < kBlock / 16; ++h) {
          if (_mm512_cmplt_epu32_mask(_mm512_load_si512(bytes[t] + 16 * h), _mm512_set1_epi32(F::kBias)) != 0)
            return false;
        }
      }
    }
  }
  __m512i col_lower[kRegs], col_limit[kRegs];
  for (int t = 0; t < kRegs; ++t) col_limit[t] = _mm512_setzero_si512();
  if (columnwise) {
    if constexpr (kRegs == 2) {
      _mm512_storeu_si512(b.col_scale + col, col_bytes);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.col_scale + col), _mm512_castsi512_si256(col_bytes));
    }
    for (int t = 0; t < kRegs; ++t) mx16_normal_terms<Codec, kIn>(col_scale[t], &col_lower[t], &col_limit[t]);
  }
  RowTerms row[kRegs];  // (K/32 bytes apart per row in the output)
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        const __m512i s = _mm512_load_si512(bytes[t] + 16 * h);
        const __m512i repeated = _mm512_or_si512(s, _mm512_slli_epi32(s, 16));
        __m512i lower, limit;
        mx16_normal_terms<Codec, kIn>(repeated, &lower, &limit);
        _mm512_store_si512(row[t].scale + 16 * h, repeated);
        _mm512_store_si512(row[t].lower + 16 * h, lower);
        _mm512_store_si512(row[t].limit + 16 * h, limit);
      }
    }
    uint8_t* dst = b.row_scale + col / kBlock;
    for (int i = 0; i < kBlock; ++i) {
      for (int t = 0; t < kRegs; ++t) dst[i * b.row_scale_stride + t] = static_cast<uint8_t>(bytes[t][i]);
    }
  } else {
    for (RowTerms& r : row) std::fill(std::begin(r.limit), std::end(r.limit), 0u);
  }

  // 3. Encode, row by row: FP6 in the subnormal form where it holds; FP8 seldom has a lane
  // outside the normal form, and takes the general form per register for it.
  if constexpr (Codec::kWidth == 6) {
    if (subnormal_form) {
      __m512 col_multiplier[2 * kRegs];
      for (int t = 0; t < kRegs && columnwise; ++t) {
        col_multiplier[2 * t] = subnormal_multipliers<Codec, kIn>(
            _mm512_and_si512(col_scale[t], _mm512_set1_epi32(0xFFFF)));  // even lanes' bytes
        col_multiplier[2 * t + 1] = subnormal_multipliers<Codec, kIn>(_mm512_srli_epi32(col_scale[t], 16));
      }
      if (rowwise) {
        for (int t = 0; t < kRegs; ++t) {
          for (int h = 0; h < kBlock / 16; ++h) {
            _mm512_store_ps(row[t].multiplier + 16 * h,
                            subnormal_multipliers<Codec, kIn>(_mm512_load_si512(bytes[t] + 16 * h)));
          }
        }
      }
      encode_chunk16_fp6<Codec, kIn, kRegs>(b, col, buffer, row, col_lower, col_limit, col_multiplier);
      return true;
    }
  }
  const __m512i one = _mm512_set1_epi16(1);
  for (int i = 0; i < kBlock; ++i) {
    __m512i row_codes[kRegs], col_codes[kRegs];
    for (int t = 0; t < kRegs; ++t) {
      const __m512i x = _mm512_load_si512(buffer[i] + t * k16Lanes);
      const __m512i abs = _mm512_and_si512(x, abs_mask);
      const __m512i x_shifted = _mm512_srli_epi16(x, F::kSignShift);
      const __m512i limit =
          _mm512_max_epu16(_mm512_set1_epi32(static_cast<int>(row[t].limit[i])), col_limit[t]);
      if (_mm512_cmple_epu16_mask(_mm512_sub_epi16(abs, one), limit) == 0) [[likely]] {
        const __m512i abs_plus_lsb =
            _mm512_add_epi16(abs, _mm512_and_si512(_mm512_srli_epi16(abs, F::kDrop), one));
        const __mmask32 nonzero = kIn == DType::F16 ? _mm512_test_epi16_mask(abs, abs) : 0;
        if (rowwise) {
          row_codes[t] = mx16_codes_normal<Codec, kIn>(
              abs_plus_lsb, x_shifted, _mm512_set1_epi32(static_cast<int>(row[t].lower[i])), nonzero);
        }
        if (columnwise)
          col_codes[t] = mx16_codes_normal<Codec, kIn>(abs_plus_lsb, x_shifted, col_lower[t], nonzero);
      } else {
        encode_outside_normal<Codec, kIn>(x, rowwise ? row[t].scale[i] : 0,
                                          columnwise ? &col_scale[t] : nullptr,
                                          rowwise ? &row_codes[t] : nullptr, &col_codes[t]);
      }
    }
    if (rowwise) store_codes16<kRegs>(row_codes, b.row_data + i * b.data_stride + col, b.stream);
    if (columnwise) store_codes16<kRegs>(col_codes, b.col_data + i * b.data_stride + col, b.stream);
  }
  return true;
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
