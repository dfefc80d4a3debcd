// What the AVX2 kernel set (kernel_set.hpp) is built with: where it is built, the target
// attribute of its functions, and the helpers its kernels share (the NVFP4 and MX chunks).
#pragma once

// The AVX2 kernels are built where the AVX-512 kernels are (x86-64, GCC or Clang: target
// attributes), and run where kernel_set() says Avx2 or better.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define MICROSCALE_HAVE_AVX2_KERNELS 1
#endif

#ifdef MICROSCALE_HAVE_AVX2_KERNELS

#include <immintrin.h>

#include <cstdint>
#include <cstring>

// On the AVX2 functions (not -mavx2 for their files, so nothing else of the library is compiled
// for AVX2); they run only after kernel_set() has seen AVX2 on the CPU.
#define MICROSCALE_AVX2 __attribute__((target("avx2,f16c")))
#define MICROSCALE_AVX2_INLINE MICROSCALE_AVX2 __attribute__((always_inline)) inline
// On a lambda inside an AVX2 function (after its parameters): lambdas do not take the enclosing
// function's target.
#define MICROSCALE_AVX2_LAMBDA MICROSCALE_AVX2 __attribute__((always_inline))

namespace microscale::cpu {

// Lane i: the max of the 16 lanes of m[i]. Each level interleaves pairs and takes the max, which
// halves the vectors and the lanes each row spans: 8 + 4 + 2 + 1 pairs.
MICROSCALE_AVX2_INLINE __m256i lane_maxes(const __m256i (&m)[16]) {
  __m256i s1[8], s2[4], s3[2];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {  // 16-bit pairs (row 2p, row 2p + 1)
    s1[p] = _mm256_max_epi16(_mm256_unpacklo_epi16(m[2 * p], m[2 * p + 1]),
                             _mm256_unpackhi_epi16(m[2 * p], m[2 * p + 1]));
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {  // 64-bit groups of rows 4q .. 4q + 3
    s2[q] = _mm256_max_epi16(_mm256_unpacklo_epi32(s1[2 * q], s1[2 * q + 1]),
                             _mm256_unpackhi_epi32(s1[2 * q], s1[2 * q + 1]));
  }
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r) {  // rows 8r .. 8r + 7 in order, per 128-bit half
    s3[r] = _mm256_max_epi16(_mm256_unpacklo_epi64(s2[2 * r], s2[2 * r + 1]),
                             _mm256_unpackhi_epi64(s2[2 * r], s2[2 * r + 1]));
  }
  return _mm256_max_epi16(_mm256_permute2x128_si256(s3[0], s3[1], 0x20),
                          _mm256_permute2x128_si256(s3[0], s3[1], 0x31));
}

// Prefetches `bytes` of the row at `row`: the same row of the next chunk of a band, which the
// hardware prefetchers do not follow (a chunk's rows are read side by side), for a chunk that
// encodes row after row (the MX chunks: one row of the next chunk per row encoded).
// NOTE: on Zen 3 the MX chunks ran 6-11 % faster so than with the next chunk's rows prefetched all
// at once at their start (docs/perf.md, fifty-third session).
MICROSCALE_AVX2_INLINE void prefetch_row(const uint16_t* row, int64_t bytes) {
  for (int64_t l = 0; l < bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + l, _MM_HINT_T0);
}

// Prefetches the 64-byte line at element `at` (a multiple of 32) of each of `rows` rows from
// `first` (row stride `stride` elements): one line per row of the next chunk, for a chunk that
// works a block column at a time (the NVFP4 chunks: a line of every row per 32 columns).
// NOTE: on Zen 3 the NVFP4 chunks ran ~6 % faster so than with the next chunk's 128 lines
// prefetched all at once at their start (docs/perf.md, fifty-third session).
MICROSCALE_AVX2_INLINE void prefetch_line_of_rows(const uint16_t* first, int64_t stride, int rows,
                                                  int64_t at) {
  for (int i = 0; i < rows; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(first + i * stride + at), _MM_HINT_T0);
}

// A chunk row's output bytes from `line` (32-byte aligned, in L1) to `out`: streamed when `stream`
// (then `out` is 32-byte aligned and `bytes` a multiple of 32: whole lines of a streamable output),
// else copied.
MICROSCALE_AVX2_INLINE void copy_row(const uint8_t* line, int bytes, bool stream, uint8_t* out) {
  if (stream) {
    for (int l = 0; l < bytes; l += 32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + l),
                          _mm256_load_si256(reinterpret_cast<const __m256i*>(line + l)));
    }
  } else {
    std::memcpy(out, line, static_cast<size_t>(bytes));
  }
}

// E2M1 codes of 16 lanes by thresholds (e2m1_code_by_thresholds, e2m1_thresholds.hpp): `a` the
// |x| patterns, `sign` 8 where the code takes the sign, t[k] threshold k per lane. A true compare
// is -1, so subtracting it counts the steps reached.
MICROSCALE_AVX2_INLINE __m256i e2m1_codes(__m256i a, __m256i sign, const __m256i (&t)[8]) {
  __m256i code = _mm256_and_si256(sign, _mm256_cmpgt_epi16(a, t[0]));
#pragma GCC unroll 7
  for (int k = 1; k < 8; ++k) code = _mm256_sub_epi16(code, _mm256_cmpgt_epi16(a, t[k]));
  return code;
}

// e2m1_codes by the doubling form (e2m1_code_by_doubling, e2m1_thresholds.hpp): t[0..4] that
// form's five numbers per lane, kShift doubling_shift of the input. 13 operations where
// e2m1_codes takes 16: the odd steps 3, 5, 7 and the even ones 4, 6 each by a saturating subtract
// and a shift, summed and capped at 7 once.
template <int kShift>
MICROSCALE_AVX2_INLINE __m256i e2m1_codes_doubling(__m256i a, __m256i sign, const __m256i (&t)[5]) {
  const __m256i signed_step = _mm256_and_si256(sign, _mm256_cmpgt_epi16(a, t[0]));
  const __m256i odd = _mm256_srli_epi16(_mm256_subs_epu16(a, t[3]), kShift);
  const __m256i even = _mm256_srli_epi16(_mm256_subs_epu16(a, t[4]), kShift);
  __m256i magnitude = _mm256_sub_epi16(_mm256_add_epi16(odd, even), _mm256_cmpgt_epi16(a, t[1]));
  magnitude = _mm256_sub_epi16(magnitude, _mm256_cmpgt_epi16(a, t[2]));
  return _mm256_or_si256(_mm256_min_epi16(magnitude, _mm256_set1_epi16(7)), signed_step);
}

}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX2_KERNELS
