// The AVX-512 MX quantizer's unit of threading, a band of up to 32 input rows with its outputs,
// and the stores of a chunk's codes as whole 64-byte lines. Part of quantize_mx_avx512.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/avx512.hpp"
#include "cpu/avx512_codecs.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_mx_avx512.cpp is the one translation
// unit that includes the mx_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

constexpr int kBlock = 32;  // MX block; also the rows of a band
constexpr int kLanes = 16;  // columns of a tile
// Tiles of a full chunk: one 64-byte line of output per row (64 codes, or 128 FP4 codes).
template <bool kPacked>
constexpr int kChunkTiles = kPacked ? 8 : 4;
constexpr int kMaxChunkCols = 128;

// One band of up to 32 input rows and everything it produces.
struct Band {
  const std::byte* src = nullptr;  // row 0 of the band
  int64_t row_bytes = 0;           // input row stride in bytes
  int rows = 0;                    // <= 32; short only for the last band of a rowwise-only input
  int64_t k = 0;
  // The element format's terms of mx_scale_bytes.
  int emax = 0;
  int mantissa_bits = 0;
  float max_normal = 0.0f;
  // Rowwise (row_data null: not requested): band row r at row_data + r * data_stride and
  // row_scale + r * row_scale_stride (K/32 bytes).
  uint8_t* row_data = nullptr;
  uint8_t* row_scale = nullptr;
  int64_t row_scale_stride = 0;
  // Columnwise (col_data null: not requested): band row r at col_data + r * data_stride; the
  // band's scales are one row of K bytes at col_scale.
  uint8_t* col_data = nullptr;
  uint8_t* col_scale = nullptr;
  int64_t data_stride = 0;  // K, or K/2 for FP4 (both directions)
  bool stream = false;      // full chunks' 64-byte lines bypass the caches (quantize_with)
  // MXFP4 of bf16/f16 (quantize_chunk16_fp4): the thresholds of the input type, and the same
  // widened to 32-bit words (wide_fp4_thresholds).
  const int16_t (*fp4_thresholds)[8] = nullptr;
  const uint32_t (*fp4_wide_thresholds)[8] = nullptr;
};

// The low bytes of the int32 lanes of c[0..n-1] (values 0..255; n = 2 or 4), in order: byte
// 16t + j = c[t] lane j; with n = 2 the high 32 bytes are zero.
template <int n>
MICROSCALE_AVX512_INLINE __m512i pack_bytes(const __m512i* c) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i c2 = n == 4 ? c[2] : zero, c3 = n == 4 ? c[3] : zero;
  // The packs work within 128-bit lanes: dword 4l + t of `b` holds c[t]'s elements 4l..4l+3;
  // the permutation moves it to dword 4t + l. Saturation never applies (codes are 0..255).
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c2, c3));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(order, b);
}

// 64 FP4 codes, one per byte -> 32 bytes, element 2t in the low nibble of byte t.
MICROSCALE_AVX512_INLINE __m256i pack_nibbles(__m512i bytes) {
  // 16-bit lane = even | odd << 8 (codes < 16): its low byte becomes even | odd << 4.
  return _mm512_cvtepi16_epi8(_mm512_or_si512(bytes, _mm512_srli_epi16(bytes, 4)));
}

// Stores the codes c[0..kTiles-1] (lane j of c[t] = element 16t + j) of one output row: one
// byte each, or for FP4 two per byte; one store either way (a whole line for a full chunk).
template <bool kPacked, int kTiles>
MICROSCALE_AVX512_INLINE void store_codes(const __m512i c[kTiles], uint8_t* dst, bool stream) {
  if constexpr (kTiles == kChunkTiles<kPacked>) {
    __m512i line;
    if constexpr (kPacked) {
      line = _mm512_inserti64x4(_mm512_castsi256_si512(pack_nibbles(pack_bytes<4>(c))),
                                pack_nibbles(pack_bytes<4>(c + 4)), 1);
    } else {
      line = pack_bytes<4>(c);
    }
    store_line(dst, line, stream);
  } else if constexpr (kPacked && kTiles == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), pack_nibbles(pack_bytes<4>(c)));
  } else if constexpr (kPacked) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(pack_nibbles(pack_bytes<2>(c))));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_castsi512_si256(pack_bytes<2>(c)));
  }
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
