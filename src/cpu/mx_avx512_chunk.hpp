// The AVX-512 MX quantizer's general kernel, in fp32 lanes: every input type, scheme and scale
// rule (chunks of bf16 and f16 with Inf or NaN come here from the 16-bit kernels). Part of
// quantize_mx_avx512.cpp.
//
// The unit of work is a chunk of one band of 32 input rows x 64 columns (four 16-lane tiles;
// FP4: 128 columns, eight tiles), so that every output row of the chunk is one 64-byte line. The
// last chunk of a band may be narrower (K is only a multiple of 32). Three steps:
//   1. load:    each row's tiles are widened to fp32 once (load16) into a local buffer, and the
//               |x| bit patterns feed both amaxes: per lane a vertical max over the 32 rows
//               (columnwise), per row the max of its two tiles of each block (rowwise).
//   2. scales:  columnwise, one register of 16 block amaxes per tile (scales: 16 contiguous
//               bytes); rowwise, transpose_max16 turns 16 rows' partial maxes into one register
//               of 16 row amaxes per block. The amaxes are unsigned maxes of |x| bits, so a NaN
//               anywhere in a block gives a NaN pattern and scale 0xFF, as the reference
//               (torch.amax propagates NaN).
//   3. encode:  row by row from the buffer: each tile times its inverse scale (the row's, a
//               broadcast; or the column's, a register), encoded, packed into the row's 64 bytes
//               and written with a single full-width store.
// Why: the outputs go to 64 rows (32 per direction) whose stride is usually a power of two.
// Stores of 8-16 byte pieces into many such rows leave partial lines and conflict in L1 (the
// NVFP4 kernel measured it); whole lines do not, and large outputs are streamed past the caches
// (quantize_with, in quantize_mx_avx512.cpp). The fp32 buffer keeps the reloads off the input rows, which
// share L1 sets at such strides, and converts each input once; the input is prefetched in software.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/mx_avx512_band.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_mx_avx512.cpp is the one translation
// unit that includes the mx_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

// mx_scaled_element on 16 lanes: x * inverse, except that a NaN x stays a NaN of its own sign
// (here quieted, which no code depends on). kHasNan: some x of the chunk is NaN; else the product
// alone.
template <bool kHasNan>
MICROSCALE_AVX512_INLINE __m512 scaled(__m512 x, __m512 inverse) {
  const __m512 p = _mm512_mul_ps(x, inverse);
  if constexpr (!kHasNan) return p;
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(p), nan, _mm512_castps_si512(x),
                                                  _mm512_set1_epi32(0x00400000)));
}

// Step 3 of a chunk (below): the codes of every output row of the chunk, one row at a time, from
// the fp32 chunk in `buffer` and the inverse scales: row_inverse[r][i] of band row i's block r,
// col_inverse[t] of tile t's 16 column blocks.
template <typename Codec, bool kPacked, int kTiles, bool kHasNan>
MICROSCALE_AVX512_INLINE void encode_chunk(const Band& b, int64_t col, const float (*buffer)[kMaxChunkCols],
                                           const float (*row_inverse)[kBlock], const __m512* col_inverse) {
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  const int64_t data_col = kPacked ? col / 2 : col;
  const int rows = columnwise ? kBlock : b.rows;  // columnwise bands are always full
  for (int i = 0; i < rows; ++i) {
    __m512 v[kTiles];
    for (int t = 0; t < kTiles; ++t) v[t] = _mm512_load_ps(buffer[i] + t * kLanes);
    if (rowwise && i < b.rows) {
      __m512i c[kTiles];
      for (int r = 0; r < kTiles / 2; ++r) {
        const __m512 inverse = _mm512_set1_ps(row_inverse[r][i]);
        c[2 * r] = encode_rn<Codec>(scaled<kHasNan>(v[2 * r], inverse));
        c[2 * r + 1] = encode_rn<Codec>(scaled<kHasNan>(v[2 * r + 1], inverse));
      }
      store_codes<kPacked, kTiles>(c, b.row_data + i * b.data_stride + data_col, b.stream);
    }
    if (columnwise) {
      __m512i c[kTiles];
      for (int t = 0; t < kTiles; ++t) c[t] = encode_rn<Codec>(scaled<kHasNan>(v[t], col_inverse[t]));
      store_codes<kPacked, kTiles>(c, b.col_data + i * b.data_stride + data_col, b.stream);
    }
  }
}

// One chunk: band rows 0..b.rows-1, columns [col, col + 16 * kTiles). `buffer` is scratch.
template <typename Codec, bool kPacked, MxScaleRule kRule, DType kDType, int kTiles>
MICROSCALE_AVX512_INLINE void quantize_chunk(const Band& b, int64_t col, float (*buffer)[kMaxChunkCols]) {
  constexpr int kRowBlocks = kTiles / 2;  // rowwise blocks per row of the chunk
  constexpr int64_t kElementBytes = element_bytes<kDType>();
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;

  // 1. Load (rows past b.rows are zeros: they change no amax, and nothing of them is stored).
  // NOTE: the hardware prefetchers do not follow 32 input rows at once (nor the 64 output rows
  // beside them): without the software prefetch, half the time went to waiting on loads.
  __m512i col_max[kTiles];
  for (int t = 0; t < kTiles; ++t) col_max[t] = _mm512_setzero_si512();
  __m512i row_max[kRowBlocks][kBlock];  // per row, the max of its block's two tiles (16 lanes)
  const std::byte* src = b.src + col * kElementBytes;
  const int64_t ahead = std::min(kPrefetchCols, b.k - col - kTiles * kLanes) * kElementBytes;
  for (int i = 0; i < kBlock; ++i) {
    if (i < b.rows && ahead > 0) {
      for (int64_t l = 0; l < kTiles * kLanes * kElementBytes; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(src + i * b.row_bytes + ahead + l), _MM_HINT_T1);
    }
    __m512i a[kTiles];
    for (int t = 0; t < kTiles; ++t) {
      const __m512 v = i < b.rows ? load16<kDType>(src + i * b.row_bytes + t * kLanes * kElementBytes)
                                  : _mm512_setzero_ps();
      _mm512_store_ps(buffer[i] + t * kLanes, v);
      a[t] = abs_bits(v);
      col_max[t] = _mm512_max_epu32(col_max[t], a[t]);
    }
    for (int r = 0; r < kRowBlocks; ++r) row_max[r][i] = _mm512_max_epu32(a[2 * r], a[2 * r + 1]);
  }

  // Any NaN in the chunk (every element is under a column max): rare, costs one more step.
  const bool has_nan =
      _mm512_cmpgt_epu32_mask(vertical_max(col_max, kTiles), _mm512_set1_epi32(0x7F800000)) != 0;

  // 2. Scales. Columnwise: 16 * kTiles contiguous bytes of the band's scale row.
  __m512 col_inverse[kTiles];
  if (columnwise) {
    __m512i s[kTiles];
    for (int t = 0; t < kTiles; ++t) {
      s[t] = mx_scale_bytes<kRule>(col_max[t], b.emax, b.mantissa_bits, b.max_normal);
      col_inverse[t] = mx_inverse_scales(s[t]);
    }
    if constexpr (kTiles == 2) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.col_scale + col),
                          _mm512_castsi512_si256(pack_bytes<2>(s)));
    } else {
      for (int t = 0; t < kTiles; t += 4)
        _mm512_storeu_si512(b.col_scale + col + t * kLanes, pack_bytes<4>(s + t));
    }
  }
  // Rowwise: kRowBlocks bytes per row (K/32 apart: small stores, but 1/32 of the data bytes).
  alignas(64) float row_inverse[kRowBlocks][kBlock];
  if (rowwise) {
    for (int h = 0; h * kLanes < b.rows; ++h) {  // 16 rows at a time: lane L = row 16h + L
      __m512i s[kRowBlocks];
      for (int r = 0; r < kRowBlocks; ++r) {
        s[r] = mx_scale_bytes<kRule>(transpose_max16(row_max[r] + h * kLanes), b.emax, b.mantissa_bits,
                                     b.max_normal);
        _mm512_store_ps(row_inverse[r] + h * kLanes, mx_inverse_scales(s[r]));
      }
      const int n = std::min(kLanes, b.rows - h * kLanes);
      uint8_t* dst = b.row_scale + h * kLanes * b.row_scale_stride + col / kBlock;
      if constexpr (kRowBlocks == 1) {
        scatter_bytes(s[0], dst, b.row_scale_stride, n);
      } else {
        // Lane L: row L's kRowBlocks bytes in memory order.
        __m512i packed = s[0];
        for (int r = 1; r < kRowBlocks; ++r) packed = _mm512_or_si512(packed, _mm512_slli_epi32(s[r], 8 * r));
        alignas(64) uint32_t bytes[kLanes];
        _mm512_store_si512(bytes, packed);
        for (int i = 0; i < n; ++i) std::memcpy(dst + i * b.row_scale_stride, &bytes[i], kRowBlocks);
      }
    }
  }

  // 3. Encode.
  if (has_nan) {
    encode_chunk<Codec, kPacked, kTiles, true>(b, col, buffer, row_inverse, col_inverse);
  } else {
    encode_chunk<Codec, kPacked, kTiles, false>(b, col, buffer, row_inverse, col_inverse);
  }
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
