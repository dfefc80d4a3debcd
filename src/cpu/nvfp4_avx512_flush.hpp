// The AVX-512 NVFP4 quantizer's output writes: the staged rowwise lines of a band, the
// columnwise lines and scale lines of a group, whole 64-byte lines streamed where they can be.
// Part of quantize_nvfp4_avx512.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/nvfp4_avx512_group.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale::cpu {
// Internal linkage, as the rest of the kernel: quantize_nvfp4_avx512.cpp is the one translation
// unit that includes the nvfp4_avx512_*.hpp headers (directly or through each other).
namespace {

using namespace avx512;

// The band's staged rowwise line starting at column `line_col`, its first `tiles` tiles filled:
// one 64-byte store per row when whole.
MICROSCALE_AVX512_INLINE void flush_row_line(const Group& g, const RowStage& stage, int band, int rows,
                                             int64_t line_col, int tiles) {
  // The scales in row order: 16-bit word 16p + i of the stage is row i's tile pair p; row i's 8
  // bytes go to qword i % 8 of ordered[i / 8].
  alignas(64) uint8_t ordered[2][64];
  for (int h = 0; h < 2; ++h) {
    alignas(64) int16_t index[32];
    for (int w = 0; w < 32; ++w) index[w] = static_cast<int16_t>(16 * (w % 4) + 8 * h + w / 4);
    _mm512_store_si512(ordered[h],
                       _mm512_permutex2var_epi16(_mm512_load_si512(stage.scale[0]), _mm512_load_si512(index),
                                                 _mm512_load_si512(stage.scale[2])));
  }
  for (int i = 0; i < rows; ++i) {
    const int64_t r = band * kBlock + i;
    uint8_t* data = g.row_data + r * g.row_data_stride + line_col / 2;
    uint8_t* scale = g.row_scale + r * g.row_scale_stride + line_col / kBlock;
    if (tiles == kLineTiles) {
      store_line(data, _mm512_load_si512(stage.data[i]), g.row_stream);
      std::memcpy(scale, &ordered[i / 8][8 * (i % 8)], kLineTiles);
    } else {
      std::memcpy(data, stage.data[i], tiles * 8);
      std::memcpy(scale, &ordered[i / 8][8 * (i % 8)], tiles);
    }
  }
}

// 8 registers of 8 qwords -> their transpose (v[j] lane b = old v[b] lane j).
MICROSCALE_AVX512_INLINE void transpose8x8_epi64(__m512i v[8]) {
  __m512i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm512_unpacklo_epi64(v[2 * p], v[2 * p + 1]);      // chunk k: v2p[2k], v2p+1[2k]
    t[2 * p + 1] = _mm512_unpackhi_epi64(v[2 * p], v[2 * p + 1]);  // ... [2k + 1]
  }
  for (int q = 0; q < 2; ++q) {
    for (int h = 0; h < 2; ++h) {  // lanes 2k + h of rows 4q..4q+3: chunks (0, 2), then (1, 3)
      u[4 * q + h] = _mm512_shuffle_i64x2(t[4 * q + h], t[4 * q + 2 + h], _MM_SHUFFLE(2, 0, 2, 0));
      u[4 * q + 2 + h] = _mm512_shuffle_i64x2(t[4 * q + h], t[4 * q + 2 + h], _MM_SHUFFLE(3, 1, 3, 1));
    }
  }
  // u[4q + m], by chunk: rows (4q, 4q + 1) of lanes m and m + 4, then rows (4q + 2, 4q + 3).
  for (int m = 0; m < 4; ++m) {
    v[m] = _mm512_shuffle_i64x2(u[m], u[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
    v[m + 4] = _mm512_shuffle_i64x2(u[m], u[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Groups of at most this many bands (inputs of up to 64 rows) copy their columnwise outputs
// qword by qword (flush_column_lines).
constexpr int kFewBands = 4;

// The first n (0..8) qwords of a register.
MICROSCALE_AVX512_INLINE __mmask8 qword_mask(int n) { return static_cast<__mmask8>((1u << n) - 1); }

// The group's columnwise lines from the band-major stage: 8 bytes of each of `bands` bands per
// columnwise row (two whole 64-byte lines when bands == 16), and its `bands` scale bytes.
MICROSCALE_AVX512 void flush_column_lines(const Group& g, ColumnStage cs, int bands) {
  if (bands <= kFewBands) {
    // The transposes below would move mostly zeros: each columnwise row's few qwords and scale
    // bytes copied as they are (a 16-row call: 9 -> ~2 us of its ~40 us at K = 4096).
    for (int64_t c = 0; c < g.k; ++c) {
      for (int b = 0; b < bands; ++b) {
        std::memcpy(g.col_data + c * g.col_data_stride + 8 * b, cs.data + (b * g.k + c) * 8, 8);
        g.col_scale[c * g.col_scale_stride + b] = cs.scale[b * g.k + c];
      }
    }
    return;
  }
  const int lines = bands > kLineBands ? 2 : 1;  // lines holding bands
  for (int64_t c0 = 0; c0 < g.k; c0 += 8) {
    __m512i v[2][8];  // [line][band of the line], then transposed: [line][column c0 + j]
    for (int line = 0; line < lines; ++line) {
      for (int b = 0; b < kLineBands; ++b) {
        const int band = line * kLineBands + b;
        v[line][b] =
            band < bands ? _mm512_loadu_si512(cs.data + (band * g.k + c0) * 8) : _mm512_setzero_si512();
      }
      transpose8x8_epi64(v[line]);
    }
    for (int j = 0; j < 8; ++j) {
      uint8_t* data = g.col_data + (c0 + j) * g.col_data_stride;
      if (bands == kGroupBands) {
        store_line(data, v[0][j], g.col_stream);
        store_line(data + 64, v[1][j], g.col_stream);
      } else {  // a partial group: its bands' qwords by masked stores (a memcpy call per row was
                // most of a 16-row call's time)
        _mm512_mask_storeu_epi64(data, qword_mask(std::min(bands, kLineBands)), v[0][j]);
        if (lines == 2) _mm512_mask_storeu_epi64(data + 64, qword_mask(bands - kLineBands), v[1][j]);
      }
    }
  }
  // Scales: 64 columns and 8 bands at a time, an 8 x 64 byte transpose (per 128-bit chunk l:
  // bands paired, then 4, then 8), leaving column 16l + 2o + t in qword 2l + t of out[o].
  for (int64_t c0 = 0; c0 < g.k; c0 += 64) {
    const __mmask64 in_range = g.k - c0 >= 64 ? ~__mmask64{0} : (__mmask64{1} << (g.k - c0)) - 1;
    alignas(64) uint64_t out[2][8][8];  // [8 bands][o][qword]
    for (int half = 0; half < kGroupBands / kLineBands; ++half) {
      __m512i v[8];
      for (int b = 0; b < kLineBands; ++b) {
        const int band = kLineBands * half + b;
        v[b] = band < bands ? _mm512_maskz_loadu_epi8(in_range, cs.scale + band * g.k + c0)
                            : _mm512_setzero_si512();
      }
      __m512i w[2][4];  // [columns 0..7 / 8..15 of each chunk][band pair]: 16-bit words
      for (int p = 0; p < 4; ++p) {
        w[0][p] = _mm512_unpacklo_epi8(v[2 * p], v[2 * p + 1]);
        w[1][p] = _mm512_unpackhi_epi8(v[2 * p], v[2 * p + 1]);
      }
      for (int h = 0; h < 2; ++h) {
        __m512i d[2][2];  // [bands 0-3 / 4-7][columns 8h + 0..3 / 8h + 4..7]: 32-bit words
        for (int q = 0; q < 2; ++q) {
          d[q][0] = _mm512_unpacklo_epi16(w[h][2 * q], w[h][2 * q + 1]);
          d[q][1] = _mm512_unpackhi_epi16(w[h][2 * q], w[h][2 * q + 1]);
        }
        for (int x = 0; x < 2; ++x) {  // columns 8h + 4x + {0, 1} and + {2, 3}
          _mm512_store_si512(out[half][4 * h + 2 * x], _mm512_unpacklo_epi32(d[0][x], d[1][x]));
          _mm512_store_si512(out[half][4 * h + 2 * x + 1], _mm512_unpackhi_epi32(d[0][x], d[1][x]));
        }
      }
    }
    const int64_t columns = std::min<int64_t>(64, g.k - c0);
    for (int c = 0; c < columns; ++c) {
      uint8_t* scale = g.col_scale + (c0 + c) * g.col_scale_stride;
      const int o = (c % 16) / 2, q = 2 * (c / 16) + c % 2;
      if (bands == kGroupBands) {  // constant sizes: two 8-byte stores
        std::memcpy(scale, &out[0][o][q], 8);
        std::memcpy(scale + 8, &out[1][o][q], 8);
      } else {
        const __m128i bytes =
            _mm_set_epi64x(static_cast<int64_t>(out[1][o][q]), static_cast<int64_t>(out[0][o][q]));
        _mm_mask_storeu_epi8(scale, static_cast<__mmask16>((1u << bands) - 1), bytes);
      }
    }
  }
}

// Bytes [from, to) of `count` 64-byte lines -> dst + i * stride (a whole line: one store,
// streamed when `stream`; see store_line).
MICROSCALE_AVX512 void copy_line_bytes(const uint8_t* lines, int64_t count, int64_t from, int64_t to,
                                       uint8_t* dst, int64_t stride, bool stream) {
  for (int64_t i = 0; i < count; ++i) {
    if (to - from == 64) {
      store_line(dst + i * stride, _mm512_loadu_si512(lines + i * 64), stream);
    } else {  // masked: a memcpy call per row cost more than the row's bytes
      const __mmask64 part = (~__mmask64{0}) >> (64 - (to - from));
      _mm512_mask_storeu_epi8(dst + i * stride, part, _mm512_maskz_loadu_epi8(part, lines + i * 64 + from));
    }
  }
  if (stream) _mm_sfence();
}

// Columnwise scale lines for columnwise rows [c_begin, c_end), gathered from every group's pieces
// (group_scales: [groups][K][16], band b of group j for row c at (j * K + c) * 16 + b): each
// 64-byte line of a row (4 groups) assembled in a local buffer and written once, to dst + c * stride.
MICROSCALE_AVX512 void gather_scale_lines(const uint8_t* group_scales, int64_t groups, int64_t k,
                                          int64_t row_bytes, int64_t c_begin, int64_t c_end, uint8_t* dst,
                                          int64_t stride, bool stream) {
  constexpr int64_t kLineGroups = 64 / kGroupBands;
  for (int64_t c = c_begin; c < c_end; ++c) {
    for (int64_t from = 0; from < row_bytes; from += 64) {
      alignas(64) uint8_t line[64] = {};
      const int64_t first = from / kGroupBands;  // the line's first group
      const int64_t count = std::min(kLineGroups, groups - first);
      for (int64_t j = 0; j < count; ++j)
        std::memcpy(line + kGroupBands * j, group_scales + ((first + j) * k + c) * kGroupBands, kGroupBands);
      if (row_bytes - from >= 64) {
        store_line(dst + c * stride + from, _mm512_load_si512(line), stream);
      } else {
        std::memcpy(dst + c * stride + from, line, row_bytes - from);
      }
    }
  }
  if (stream) _mm_sfence();
}

}  // namespace
}  // namespace microscale::cpu

#endif  // MICROSCALE_HAVE_AVX512_KERNELS
