// AVX-512 building blocks of the hand-vectorised CPU quantizers (quantize_nvfp4_avx512.cpp,
// quantize_mx_avx512.cpp): loading a row tile as fp32, max reductions, packing.
//
// Every function carries MICROSCALE_AVX512 (a GCC/Clang target attribute, not a -m flag for the
// whole file), so the rest of the library stays baseline x86-64 and these run only after
// cpu_kernels() has seen AVX-512 F/BW/DQ/VL on the CPU at hand. Only AVX-512 F/BW/DQ/VL
// (x86-64-v4, Skylake-SP and later, Zen 4) are used.
//
// The tile convention: a tile is 16 lanes wide (16 consecutive columns of the input); register i
// of a tile holds row i. "Lane" below always means a column of the tile.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define MICROSCALE_HAVE_AVX512_KERNELS 1

#include <immintrin.h>

// GCC 12 reports its own intrinsic headers' _mm512_undefined_*() placeholders as uninitialised
// once inlined; the files including this header are the AVX-512 kernels only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "cpu/input16.hpp"           // kInf16Bits
#include "cpu/quantize_kernels.hpp"  // kStreamBytes
#include "microscale/tensor.hpp"     // DType, Tensor

#define MICROSCALE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#define MICROSCALE_AVX512_INLINE MICROSCALE_AVX512 __attribute__((always_inline)) inline

namespace microscale::cpu::avx512 {

// Shared by both kernels (measured on each, see their files): the input is prefetched in software
// this many columns ahead (the hardware prefetchers do not follow 16-32 rows read side by side),
// and outputs from kStreamBytes (quantize_kernels.hpp) on are written with streaming stores.
// The prefetches go to L2 (_MM_HINT_T1), not L1: a chunk's 64-128 prefetched lines at once would
// evict lines still in use from the 32-48 KiB L1 (paired on Zen 4, seventeenth session: MX
// 16-bit kernels 0.78-0.88, NVFP4 RHT pass 1 0.97 against T0; NVFP4 pass 2 had measured the same,
// v10.5 in docs/perf.md).
constexpr int64_t kPrefetchCols = 128;

/// Whether `t`'s data starts on a 64-byte line (streaming stores need it).
inline bool line_aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()) % 64 == 0; }

/// Writes one whole 64-byte output line: a streaming store (dst aligned) or a plain one.
MICROSCALE_AVX512_INLINE void store_line(uint8_t* dst, __m512i line, bool stream) {
  if (stream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), line);
  } else {
    _mm512_storeu_si512(dst, line);
  }
}

/// 16 bf16 or f16 patterns widened exactly to fp32 (bf16: a shift; f16: vcvtph2ps, exact for
/// every pattern including subnormals).
template <DType kIn>
MICROSCALE_AVX512_INLINE __m512 widen16(__m256i h) {
  static_assert(kIn == DType::BF16 || kIn == DType::F16);
  if constexpr (kIn == DType::BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

/// 16 consecutive input elements at `p` widened exactly to fp32 (widen16; f32: a plain load).
template <DType kDType>
MICROSCALE_AVX512_INLINE __m512 load16(const void* p) {
  if constexpr (kDType == DType::F32) {
    return _mm512_loadu_ps(p);
  } else {
    return widen16<kDType>(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
}

/// The low (kHigh false) or high (kHigh true) 16 bits of each 32-bit lane of `v`, bf16 or f16
/// patterns, widened exactly to fp32: bf16 by a shift or a mask, f16 by vcvtph2ps (exact for every
/// pattern). A 512-bit load of a 16-bit row gives its even columns (low halves) and odd columns
/// (high halves) this way.
template <DType kIn, bool kHigh>
MICROSCALE_AVX512_INLINE __m512 widen_half_lanes(__m512i v) {
  static_assert(kIn == DType::BF16 || kIn == DType::F16);
  if constexpr (kIn == DType::BF16) {
    return _mm512_castsi512_ps(kHigh ? _mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)))
                                     : _mm512_slli_epi32(v, 16));
  } else {
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(kHigh ? _mm512_srli_epi32(v, 16) : v));
  }
}

/// Bytes per input element.
template <DType kDType>
constexpr int64_t element_bytes() {
  return kDType == DType::F32 ? 4 : 2;
}

/// fp32 lanes rounded to nearest even bf16 (as fp32 values), in integer steps: any finite input,
/// subnormals included.
MICROSCALE_AVX512_INLINE __m512 round_to_bf16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

/// round_to_bf16 in two FMAs (five operations above), for lanes that are zero or normal and below
/// 2^111 in magnitude. With C = y 2^16 (exact inside the FMA; its last place is y's bf16 last
/// place), C - y rounds y to that place, ties to even (at a tie C's last bit is 0), and
/// C - (C - y) is exact. The difference rather than the sum: C + y leaves C's binade when y is
/// within 2^-16 below a power of two, C - y only when y is within 2^-16 above one, which rounds to
/// it on either grid. Subnormals would round to the wrong place; from 2^111 on, C - y overflows.
MICROSCALE_AVX512_INLINE __m512 round_to_bf16_normal(__m512 y) {
  const __m512 c = _mm512_set1_ps(0x1p16f);
  return _mm512_fmsub_ps(y, c, _mm512_fmsub_ps(y, c, y));
}

MICROSCALE_AVX512_INLINE __m512i abs_bits(__m512 v) {
  return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF));
}

/// Transposing max reduction: lane L of the result = max over the 16 lanes of v[L], on unsigned
/// integers (|x| bit patterns order as the values; NaN patterns sit above +Inf).
/// NOTE: the tree leaves lane 4k + l holding the max of input 4l + k; feeding the inputs in that
/// transposed order (w[4l + k] = v[4k + l]) costs nothing and puts lane L on v[L].
MICROSCALE_AVX512_INLINE __m512i transpose_max16(const __m512i v[16]) {
  __m512i w[16];
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 4; ++l) w[4 * l + k] = v[4 * k + l];
  }
  __m512i a[8], b[4], c[2];
  for (int p = 0; p < 8; ++p) {  // 128-bit chunks: [w2p.q0|q1 max q2|q3, w2p+1 ...]
    const __m512i lo = _mm512_shuffle_i32x4(w[2 * p], w[2 * p + 1], 0x44);
    const __m512i hi = _mm512_shuffle_i32x4(w[2 * p], w[2 * p + 1], 0xEE);
    a[p] = _mm512_max_epu32(lo, hi);
  }
  for (int p = 0; p < 4; ++p) {  // chunk k of b[p]: 4 partial maxes of w[4p + k]
    const __m512i lo = _mm512_shuffle_i32x4(a[2 * p], a[2 * p + 1], 0x88);
    const __m512i hi = _mm512_shuffle_i32x4(a[2 * p], a[2 * p + 1], 0xDD);
    b[p] = _mm512_max_epu32(lo, hi);
  }
  for (int p = 0; p < 2; ++p) {  // chunk k of c[p]: 2 partials of w[8p + k], 2 of w[8p + 4 + k]
    c[p] = _mm512_max_epu32(_mm512_unpacklo_epi64(b[2 * p], b[2 * p + 1]),
                            _mm512_unpackhi_epi64(b[2 * p], b[2 * p + 1]));
  }
  const __m512 g = _mm512_castsi512_ps(c[0]), h = _mm512_castsi512_ps(c[1]);
  return _mm512_max_epu32(_mm512_castps_si512(_mm512_shuffle_ps(g, h, 0x88)),
                          _mm512_castps_si512(_mm512_shuffle_ps(g, h, 0xDD)));
}

/// transpose_max16x2's (below) first level on rows 2p and 2p + 1 of its v: per 128-bit chunk, 8
/// partials of one (row, block).
MICROSCALE_AVX512_INLINE __m512i transpose_max_row_pair(__m512i even_row, __m512i odd_row) {
  return _mm512_max_epu16(_mm512_shuffle_i32x4(even_row, odd_row, 0x88),
                          _mm512_shuffle_i32x4(even_row, odd_row, 0xDD));
}

/// The rest of transpose_max16x2 from its first level (a[p]: rows 2p and 2p + 1), for callers
/// that see the rows two at a time.
MICROSCALE_AVX512_INLINE void transpose_max16x2_from_pairs(const __m512i a[8], __m512i out[2]) {
  __m512i b[4];
  for (int p = 0; p < 4; ++p) {  // per 64 bits: 4 partials
    b[p] = _mm512_max_epu16(_mm512_unpacklo_epi64(a[2 * p], a[2 * p + 1]),
                            _mm512_unpackhi_epi64(a[2 * p], a[2 * p + 1]));
  }
  for (int h = 0; h < 2; ++h) {  // per 32 bits: 2 partials, then 1
    const __m512 x = _mm512_castsi512_ps(b[2 * h]), y = _mm512_castsi512_ps(b[2 * h + 1]);
    const __m512i c = _mm512_max_epu16(_mm512_castps_si512(_mm512_shuffle_ps(x, y, 0x88)),
                                       _mm512_castps_si512(_mm512_shuffle_ps(x, y, 0xDD)));
    out[h] = _mm512_slli_epi32(_mm512_max_epu16(c, _mm512_srli_epi32(c, 16)), 16);
  }
}

/// transpose_max16 on packed 16-bit lanes, two 16-lane blocks per register: v[i] holds row i of a
/// 16 x 32 unit (|x| bits of bf16 or f16 columns 0..31; block b = columns 16b..16b+15). out[h],
/// lane d (the 16-bit max shifted up: bf16's fp32 bits) is the max of row 8h + 2(d % 4) + d / 8
/// over block (d / 4) % 2 (transpose_max16x2_lane gives the lane of a row and block).
/// NOTE: four levels, each halving the registers and the lanes per block: 128-bit chunks, 64-bit
/// halves, 32-bit pairs, then the two 16-bit halves of each 32-bit lane.
MICROSCALE_AVX512_INLINE void transpose_max16x2(const __m512i v[16], __m512i out[2]) {
  __m512i a[8];
  for (int p = 0; p < 8; ++p) a[p] = transpose_max_row_pair(v[2 * p], v[2 * p + 1]);
  transpose_max16x2_from_pairs(a, out);
}

/// The lane of transpose_max16x2's out[row / 8] holding (row, block).
constexpr int transpose_max16x2_lane(int row, int block) { return 8 * (row % 2) + 4 * block + (row % 8) / 2; }

/// Per-lane max over n registers (unsigned integers).
MICROSCALE_AVX512_INLINE __m512i vertical_max(const __m512i* v, int n) {
  __m512i m = v[0];
  for (int i = 1; i < n; ++i) m = _mm512_max_epu32(m, v[i]);
  return m;
}

/// Replaces NaN patterns of |x| bit vectors by 0, so that a max ignores NaN (as fmaxf).
MICROSCALE_AVX512_INLINE __m512i drop_nan(__m512i abs) {
  return _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(abs, _mm512_set1_epi32(0x7F800000)), abs);
}

/// Stores the low byte of lanes 0..count-1 to dst[0], dst[stride], ..., dst[(count - 1) * stride].
MICROSCALE_AVX512_INLINE void scatter_bytes(__m512i v, uint8_t* dst, int64_t stride, int count = 16) {
  alignas(16) uint8_t bytes[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(bytes), _mm512_cvtepi32_epi8(v));
  for (int i = 0; i < count; ++i) dst[i * stride] = bytes[i];
}

/// 16 FP4 codes of one row (lane j = element j) -> 8 bytes, element 2t in the low nibble of byte t.
MICROSCALE_AVX512_INLINE void store_fp4_row(__m512i codes, uint8_t* dst) {
  const __m512i pairs = _mm512_or_si512(codes, _mm512_srli_epi64(codes, 28));  // in each qword's low byte
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi64_epi8(pairs));
}

/// Stores the low byte of each of the 16 lanes contiguously.
MICROSCALE_AVX512_INLINE void store_bytes(__m512i v, uint8_t* dst) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(v));
}

}  // namespace microscale::cpu::avx512

#endif
