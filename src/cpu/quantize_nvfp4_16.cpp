// Portable NVFP4 kernel for bf16 and f16 inputs: plain C++ loops that GCC vectorises (AVX2: 16
// lanes of 16 bits per operation; the clones of cpu_dispatch.hpp). Equal bit for bit to
// quantize_nvfp4_ref.cpp (tests/cpp/quantize_test.cpp runs the portable kernels on random,
// special and boundary inputs; e2m1_thresholds_test.cpp checks the codes exhaustively).
//
// Why: the fp32 kernel (quantize_nvfp4.cpp) widens each band to fp32 in memory, runs each step of
// a block run as its own loop over arrays (amaxes, per-element encode scales, codes, packing),
// takes the columnwise blocks through a transposed copy of the band, and writes 8 columnwise
// bytes at a time to lines M/2 bytes apart: ~1 GB/s on AVX2 (docs/perf.md, sixteenth session).
// Here elements stay 16-bit patterns: an element's code is 8 compares of its |x| pattern against
// its block's thresholds (e2m1_thresholds.hpp), no widening and no multiply.
//
// The unit of work is a chunk: one band (16 rows) x up to 256 columns (8 KiB of input, in L1):
//   1. maxes:  per column the max |x| pattern over the band's rows (columnwise blocks), per row
//              and 16 columns its max (rowwise blocks), per 16 x 16 tile for 2-D blocks. NaN
//              patterns are dropped, as the reference's amaxes drop NaN; the other patterns order
//              as their magnitudes (f16 as bf16);
//   2. scales: each block's E4M3 code (loops over blocks, which vectorise), which picks its row
//              of thresholds;
//   3. codes:  row by row, both directions. Rowwise codes are packed two per byte; columnwise,
//              row i's code goes to nibble i % 4 of one of four 16-bit accumulators per column,
//              which make the column's 8 bytes of the band without a transpose.
// On CPUs with AVX2 (kernel_set() Avx2 or better) whole bands' chunks run in AVX2 instead
// (nvfp4_chunk_avx2.cpp, the same bytes); the unit and what it writes are in nvfp4_16_chunk.hpp.
// Threads take groups of 8 bands; a group's columnwise bytes are staged per thread and written as
// one 64-byte piece per columnwise row (a whole line) instead of 8 pieces of 8 bytes. Outputs of
// 8 MiB and more are written by streaming stores.
// With the RHT, the columnwise blocks come from the band's transform (rht_band.hpp) instead of its
// rows: see encode_rht_columns (in AVX2: nvfp4_rht_avx2.cpp).
#include "cpu/quantize_nvfp4_16.hpp"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>  // SSE2: streaming stores
#endif

#include "core/fp_environment.hpp"
#include "core/scale_math.hpp"
#include "cpu/cpu_dispatch.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/input16.hpp"
#include "cpu/kernel_set.hpp"
#include "cpu/nvfp4_16_chunk.hpp"
#include "cpu/quantize_kernels.hpp"  // streamable
#include "cpu/rht.hpp"
#include "cpu/rht_band.hpp"
#include "cpu/row_loader.hpp"  // load_rows, thread_count

namespace microscale::cpu {
namespace {

using nvfp4_16::Call;
using nvfp4_16::Chunk;
using nvfp4_16::ColumnStage;
using nvfp4_16::Direction;
using nvfp4_16::kBlock;
using nvfp4_16::kChunkBlocks;
using nvfp4_16::kChunkCols;
using nvfp4_16::kGroupBands;
using nvfp4_16::kPrefetchBytes;

Direction make_direction(float amax) {
  const float s_enc = nvfp4_global_encode_scale(amax);
  return {nvfp4_block_scale_multiplier(s_enc), 1.0f / s_enc};
}

// |x|'s pattern, 0 for a NaN (so that a NaN is never an amax, as in the reference).
template <DType kIn>
MICROSCALE_CPU_INLINE uint16_t magnitude_bits(uint16_t bits) {
  const unsigned a = bits & 0x7FFFu;
  return static_cast<uint16_t>(a & (0u - static_cast<unsigned>(a <= kInf16Bits<kIn>)));
}

// The sign bit of an element's code (8 for a negative x, |x| pattern a), but none for a NaN: the
// reference gives a NaN the code of +6 whatever its sign.
template <DType kIn>
MICROSCALE_CPU_INLINE uint16_t code_sign(uint16_t x, int16_t a) {
  return static_cast<uint16_t>(((x >> 12) & 8) & (0u - static_cast<unsigned>(a <= kInf16Bits<kIn>)));
}

// The max |x| pattern of `n` elements (pass 1).
template <DType kIn>
MICROSCALE_CPU_DISPATCH uint16_t max_magnitude_bits(const uint16_t* x, int64_t n) {
  uint16_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, magnitude_bits<kIn>(x[i]));
  return m;
}

// The max |x| pattern of the n elements at x and the n at y, read side by side: two streams.
// NOTE: on Zen 3 one core read 32 MiB in ~2.6 ms from two streams against ~3.5 ms from one
// (docs/perf.md, fifty-second session), as the AVX-512 kernels' pass 1 found on Zen 4.
template <DType kIn>
MICROSCALE_CPU_DISPATCH uint16_t max_magnitude_bits_2(const uint16_t* x, const uint16_t* y, int64_t n) {
  uint16_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    m = std::max(m, std::max(magnitude_bits<kIn>(x[i]), magnitude_bits<kIn>(y[i])));
  return m;
}

// One 64-byte line of output: streamed where `stream` (the line is aligned; SSE2, which every
// x86-64 CPU has), else an ordinary copy. A streamed whole line is not read for ownership first,
// and the outputs of a large call cannot stay cached anyway (the AVX-512 kernels measured it).
MICROSCALE_CPU_INLINE void store_line(uint8_t* line, const uint64_t* from, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    for (int q = 0; q < 4; ++q) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(line) + q,
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(from) + q));
    }
    return;
  }
#else
  static_cast<void>(stream);
#endif
  std::memcpy(line, from, 64);
}

// kSameCodes: 16 x 16 tiles with the same global scale in both directions, where an element's
// two codes are equal (its tile's scale code and thresholds serve both): encoded once.
template <DType kIn, bool kRows, bool kCols, bool kSameCodes>
MICROSCALE_CPU_DISPATCH void quantize_chunk(const Call& call, const Chunk& c, ColumnStage& stage) {
  const int blocks = c.cols / kBlock;

  // 1. Maxes of the |x| patterns: col_max per column, row_max per [row][block].
  alignas(64) uint16_t col_max[kChunkCols] = {};
  alignas(64) uint16_t row_max[kBlock * kChunkBlocks] = {};
  for (int i = 0; i < c.rows; ++i) {
    const uint16_t* __restrict row = c.src + i * call.stride;
    // The hardware prefetchers do not follow 16 rows read side by side (the AVX-512 kernels
    // measured it).
    if (c.prefetch != nullptr) {
      for (int64_t l = 0; l < c.prefetch_bytes; l += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(c.prefetch + i * call.stride) + l);
    }
    alignas(64) uint16_t magnitude[kChunkCols];
    for (int j = 0; j < c.cols; ++j) {
      magnitude[j] = magnitude_bits<kIn>(row[j]);
      col_max[j] = std::max(col_max[j], magnitude[j]);
    }
    for (int b = 0; b < blocks; ++b) {
      uint16_t m = 0;
      for (int t = 0; t < kBlock; ++t) m = std::max(m, magnitude[b * kBlock + t]);
      row_max[i * kChunkBlocks + b] = m;
    }
  }
  if (call.tile_2d) {  // every block of a 16 x 16 tile takes the tile's max (full bands only)
    for (int b = 0; b < blocks; ++b) {
      uint16_t m = 0;
      for (int t = 0; t < kBlock; ++t) m = std::max(m, col_max[b * kBlock + t]);
      for (int t = 0; t < kBlock; ++t) col_max[b * kBlock + t] = m;
      for (int i = 0; i < kBlock; ++i) row_max[i * kChunkBlocks + b] = m;
    }
  }

  // 2. Scale codes: to the outputs, and each block's thresholds (e2m1_thresholds.hpp). Rowwise,
  // row_codes[i * kChunkBlocks + b] picks block b's row of the table; columnwise, column j's
  // thresholds are copied to col_below[k][j] (the compares then take them lane by lane).
  alignas(64) uint8_t row_codes[kBlock * kChunkBlocks];
  alignas(64) int16_t col_below[8][kChunkCols];
  if constexpr (kRows) {
    for (int q = 0; q < kBlock * kChunkBlocks; ++q)  // every slot (one loop that vectorises)
      row_codes[q] = nvfp4_16::block_scale_code(widen16<kIn>(row_max[q]), call.row);
    for (int i = 0; i < c.rows; ++i)
      std::memcpy(call.row_scale + (c.first_row + i) * (call.k / kBlock) + c.col0 / kBlock,
                  row_codes + i * kChunkBlocks, blocks);
  }
  if constexpr (kCols) {
    alignas(64) uint8_t col_codes[kChunkCols];
    for (int j = 0; j < c.cols; ++j)
      col_codes[j] = nvfp4_16::block_scale_code(widen16<kIn>(col_max[j]), call.col);
    uint8_t* scale = stage.scale.get() + c.col0 * kGroupBands + c.band_in_group;
    for (int j = 0; j < c.cols; ++j) scale[j * kGroupBands] = col_codes[j];
    if constexpr (!kSameCodes) {
      for (int j = 0; j < c.cols; j += 8)
        transpose_thresholds<kChunkCols>(call.col_thresholds->below, col_codes + j, col_below, j);
    }
  }

  // 3. Codes, row by row, 16 lanes per operation (AVX2). Rowwise codes go through row_code to
  // be packed two per byte; columnwise ones collect in col_acc[q][j] (rows 4q..4q+3 of column
  // j, row i in nibble i % 4), which make column j's 8 bytes of the band.
  alignas(64) uint16_t col_acc[4][kChunkCols] = {};
  alignas(64) uint16_t row_code[kChunkCols];
  for (int i = 0; i < c.rows; ++i) {
    const uint16_t* __restrict row = c.src + i * call.stride;
    uint16_t* __restrict acc = col_acc[i / 4];
    const int shift = 4 * (i % 4);
    for (int b = 0; b < blocks; ++b) {
      const int16_t* t = kRows ? call.row_thresholds->below[row_codes[i * kChunkBlocks + b]] : nullptr;
      for (int l = 0; l < kBlock; ++l) {
        const int j = b * kBlock + l;
        const uint16_t x = row[j];
        const auto a = static_cast<int16_t>(x & 0x7FFF);
        const uint16_t sign = code_sign<kIn>(x, a);
        [[maybe_unused]] uint16_t row_element_code = 0;
        if constexpr (kRows) row_code[j] = row_element_code = e2m1_code_by_thresholds(a, sign, t);
        if constexpr (kSameCodes) {
          acc[j] = static_cast<uint16_t>(acc[j] | (row_element_code << shift));
        } else if constexpr (kCols) {
          const int16_t lane[8] = {col_below[0][j], col_below[1][j], col_below[2][j], col_below[3][j],
                                   col_below[4][j], col_below[5][j], col_below[6][j], col_below[7][j]};
          acc[j] = static_cast<uint16_t>(acc[j] | (e2m1_code_by_thresholds(a, sign, lane) << shift));
        }
      }
    }
    if constexpr (kRows) {  // byte j: columns 2j (low nibble) and 2j + 1
      uint8_t* out = call.row_data + (c.first_row + i) * (call.k / 2) + c.col0 / 2;
      alignas(64) uint64_t packed[kChunkCols / 16];
      pack_codes(row_code, blocks * (kBlock / 2), reinterpret_cast<uint8_t*>(packed));
      if (call.row_stream && blocks == kChunkBlocks) {  // two whole lines
        store_line(out, packed, true);
        store_line(out + 64, packed + 8, true);
      } else {
        std::memcpy(out, packed, blocks * (kBlock / 2));
      }
    }
  }
  if constexpr (kCols) {
    uint64_t* data = stage.data.get() + c.col0 * kGroupBands + c.band_in_group;
    for (int j = 0; j < c.cols; ++j) {
      data[j * kGroupBands] = col_acc[0][j] | (uint64_t{col_acc[1][j]} << 16) |
                              (uint64_t{col_acc[2][j]} << 32) | (uint64_t{col_acc[3][j]} << 48);
    }
  }
}

// A group's staged columnwise bytes to the outputs: `bands` (<= 8) bands from `first_band`.
void flush_columns(const Call& call, const ColumnStage& stage, int64_t first_band, int bands) {
  const int64_t data_stride = call.m / 2, scale_stride = call.m / kBlock;
  if (bands == kGroupBands) {  // constant sizes: one 64-byte piece, one 8-byte one per column
    for (int64_t c = 0; c < call.k; ++c) {
      store_line(call.col_data + c * data_stride + first_band * (kBlock / 2),
                 stage.data.get() + c * kGroupBands, call.col_stream);
      std::memcpy(call.col_scale + c * scale_stride + first_band, stage.scale.get() + c * kGroupBands,
                  kGroupBands);
    }
    return;
  }
  // The call's last group, short: band by band, 8 bytes and 1 per column.
  // NOTE: column by column with a loop over the bands this took ~41 instructions per column and
  // band, a quarter of a 16 x 4096 call (docs/perf.md, twenty-eighth session).
  for (int b = 0; b < bands; ++b) {
    uint8_t* data = call.col_data + (first_band + b) * (kBlock / 2);
    uint8_t* scale = call.col_scale + first_band + b;
    const uint64_t* from = stage.data.get() + b;
    const uint8_t* scale_from = stage.scale.get() + b;
    for (int64_t c = 0; c < call.k; ++c) {
      std::memcpy(data + c * data_stride, from + c * kGroupBands, sizeof(uint64_t));
      scale[c * scale_stride] = scale_from[c * kGroupBands];
    }
  }
}

// ---- Columnwise through the RHT (bf16 input) ----
//
// rht_band (rht_band.hpp) gives a band's transform column by column: output j of column c at
// [c * 16 + j], as bf16 values. Column c's columnwise block is exactly those 16 values, so here a
// block is 16 contiguous patterns with one set of thresholds, as a rowwise block is.

// A thread's buffers for the RHT of a band: the band in fp32 (16 x K), its transform, and the
// transform's bf16 patterns.
struct RhtScratch {
  std::vector<float> band, tile;
  std::vector<uint16_t> y;
  explicit RhtScratch(int64_t k) : band(kBlock * k), tile(kBlock * k), y(kBlock * k) {}
};

// The bf16 patterns of values that are bf16 values (rht_band rounds every output to bf16, NaN
// included): the high half of their fp32 bits, exactly.
MICROSCALE_CPU_DISPATCH void bf16_patterns(const float* v, int64_t n, uint16_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(float_bits(v[i]) >> 16);
}

// s.y[c * 16 + j] = output j of the RHT of column c of band `band`.
void rht_band_patterns(const Call& call, int64_t band, RhtScratch& s) {
  load_rows(*call.x, band * kBlock, kBlock, s.band.data());
  rht_band(s.band.data(), call.k, *call.rht, s.tile.data());
  bf16_patterns(s.tile.data(), kBlock * call.k, s.y.data());
}

// The columnwise blocks of one band from its transform's patterns `y`: scale codes and the
// columns' 8 bytes to the group's stage.
MICROSCALE_CPU_DISPATCH void encode_rht_columns(const Call& call, const uint16_t* y, int band_in_group,
                                                ColumnStage& stage) {
  for (int64_t c0 = 0; c0 < call.k; c0 += kChunkCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kChunkCols, call.k - c0));
    const uint16_t* __restrict block = y + c0 * kBlock;  // [column][16]
    alignas(64) uint16_t block_max[kChunkCols];
    alignas(64) uint8_t codes[kChunkCols];
    for (int c = 0; c < cols; ++c) {
      uint16_t m = 0;
      for (int l = 0; l < kBlock; ++l) m = std::max(m, magnitude_bits<DType::BF16>(block[c * kBlock + l]));
      block_max[c] = m;
    }
    for (int c = 0; c < cols; ++c)
      codes[c] = nvfp4_16::block_scale_code(bf16_to_float(block_max[c]), call.col);
    uint8_t* scale = stage.scale.get() + c0 * kGroupBands + band_in_group;
    uint64_t* data = stage.data.get() + c0 * kGroupBands + band_in_group;
    for (int c = 0; c < cols; ++c) {
      scale[c * kGroupBands] = codes[c];
      const int16_t* t = call.col_thresholds->below[codes[c]];
      alignas(32) uint16_t code[kBlock];
      for (int l = 0; l < kBlock; ++l) {
        const uint16_t v = block[c * kBlock + l];
        const auto a = static_cast<int16_t>(v & 0x7FFF);
        code[l] = e2m1_code_by_thresholds(a, code_sign<DType::BF16>(v, a), t);
      }
      pack_codes(code, kBlock / 2, reinterpret_cast<uint8_t*>(&data[c * kGroupBands]));  // rows 2q, 2q + 1
    }
  }
}

// Pass 2: groups of 8 bands over the threads, chunk after chunk of each band.
// kRht: the columnwise blocks from the band's RHT (encode_rht_columns) instead of its rows.
template <DType kIn, bool kRows, bool kCols, bool kSameCodes = false, bool kRht = false>
void quantize_groups(const Call& call, int threads) {
  static_assert(!kRht || (kCols && kIn == DType::BF16 && !kSameCodes));
  const int64_t bands = (call.m + kBlock - 1) / kBlock;  // the last may be short (rowwise only)
  const int64_t groups = (bands + kGroupBands - 1) / kGroupBands;
#pragma omp parallel num_threads(threads)
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
    ColumnStage stage;
    if (kCols) {
      stage.data.reset(new uint64_t[static_cast<size_t>(call.k * kGroupBands)]);  // left uninitialised
      stage.scale.reset(new uint8_t[static_cast<size_t>(call.k * kGroupBands)]);
    }
    RhtScratch rht(kRht && !call.avx2 ? call.k : 0);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t first_band = g * kGroupBands;
      const int group_bands = static_cast<int>(std::min<int64_t>(kGroupBands, bands - first_band));
      for (int bi = 0; bi < group_bands; ++bi) {
        Chunk c{};
        c.first_row = (first_band + bi) * kBlock;
        c.rows = static_cast<int>(std::min<int64_t>(kBlock, call.m - c.first_row));
        c.band_in_group = bi;
        for (int64_t col0 = 0; col0 < call.k; col0 += kChunkCols) {
          c.src = call.src + c.first_row * call.stride + col0;
          c.col0 = col0;
          c.cols = static_cast<int>(std::min<int64_t>(kChunkCols, call.k - col0));
          const bool band_ends = col0 + kChunkCols >= call.k;
          const bool next_band_whole = c.first_row + 2 * kBlock <= call.m;  // 16 rows to prefetch
          c.prefetch = !band_ends         ? c.src + kChunkCols
                       : !next_band_whole ? nullptr
                                          : call.src + (c.first_row + kBlock) * call.stride;
          // The prefetched chunk's bytes per row: no further than its row's end.
          c.prefetch_bytes = 2 * static_cast<int>(std::min<int64_t>(
                                     kChunkCols, call.k - (band_ends ? 0 : col0 + kChunkCols)));
          bool avx2 = false;
#ifdef MICROSCALE_HAVE_AVX2_KERNELS
          avx2 = call.avx2 && c.rows == kBlock;  // whole bands (a rowwise-only call's last may not be)
          if constexpr (kRht) {                  // columnwise: every band is whole
            if (call.avx2) nvfp4_16::quantize_rht_chunk_avx2(call, c, stage);
          }
          if constexpr (kRows || !kRht) {
            if (avx2) nvfp4_16::quantize_chunk_avx2<kIn, kRows, kCols && !kRht, kSameCodes>(call, c, stage);
          }
#endif
          if constexpr (kRows || !kRht) {
            if (!avx2) quantize_chunk<kIn, kRows, kCols && !kRht, kSameCodes>(call, c, stage);
          }
        }
        if constexpr (kRht) {
          if (!call.avx2) {
            rht_band_patterns(call, first_band + bi, rht);
            encode_rht_columns(call, rht.y.data(), bi, stage);
          }
        }
      }
      if (kCols) flush_columns(call, stage, first_band, group_bands);
    }
#if defined(__SSE2__)
    if (call.row_stream || call.col_stream) _mm_sfence();  // streamed stores are weakly ordered
#endif
  }
}

template <DType kIn>
void quantize_with_input(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const int threads = thread_count(o.num_threads);
  const auto* src = static_cast<const uint16_t*>(x.data);
  bool avx2 = false;  // the AVX2 forms of the chunks and of the RHT
#ifdef MICROSCALE_HAVE_AVX2_KERNELS
  avx2 = kernel_set() >= KernelSet::Avx2;
#endif

  // Pass 1: max |x| (rowwise; columnwise too without the RHT) and max |RHT(x)| (columnwise with
  // it), unless given.
  const bool rht = o.columnwise && o.rht;
  const bool need_rht_amax = rht && !o.amax_columnwise;
  const bool need_amax = (o.rowwise && !o.amax_rowwise) || (o.columnwise && !rht && !o.amax_columnwise);
  const RhtCoefficients rht_tables = rht_coefficients(o.rht_sign_mask);
  uint16_t amax_bits = 0;
  uint32_t rht_amax_bits = 0;  // fp32 bits (of a bf16 value)
  if (need_rht_amax) {
    // NOTE: reduced as bit patterns (fp_environment.hpp: an OpenMP reduction runs outside the
    // region's IeeeSubnormals); the running max lets rht_band_max_abs skip most columns.
#pragma omp parallel num_threads(threads) reduction(max : amax_bits, rht_amax_bits)
    {
      const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
      std::vector<float> band(avx2 ? 0 : static_cast<size_t>(kBlock * x.cols));
      float running = 0.0f;
#pragma omp for schedule(static)
      for (int64_t b = 0; b < x.rows / kBlock; ++b) {
#ifdef MICROSCALE_HAVE_AVX2_KERNELS
        if (avx2) {
          running = nvfp4_16::rht_band_max_abs_avx2(src + b * kBlock * x.row_stride, x.row_stride, x.cols,
                                                    rht_tables, running);
        }
#endif
        if (!avx2) {
          load_rows(x, b * kBlock, kBlock, band.data());
          running = rht_band_max_abs(band.data(), x.cols, rht_tables, running);
        }
        if (need_amax) {  // the band's rows are in cache
          for (int64_t r = b * kBlock; r < (b + 1) * kBlock; ++r)
            amax_bits = std::max(amax_bits, max_magnitude_bits<kIn>(src + r * x.row_stride, x.cols));
        }
      }
      rht_amax_bits = std::max(rht_amax_bits, float_bits(running));
    }
  } else if (need_amax) {
    // Rows [0, h) beside [h, rows), h = ceil(rows / 2); for an odd count, row h - 1 beside itself.
    const int64_t half = (x.rows + 1) / 2;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(max : amax_bits)
    for (int64_t r = 0; r < half; ++r) {
      const int64_t other = r + half < x.rows ? r + half : r;
      amax_bits = std::max(
          amax_bits, max_magnitude_bits_2<kIn>(src + r * x.row_stride, src + other * x.row_stride, x.cols));
    }
  }
  const float amax = widen16<kIn>(amax_bits);
  if (o.rowwise) out.rowwise_amax = o.amax_rowwise ? *o.amax_rowwise : amax;
  if (o.columnwise) {
    out.columnwise_amax = o.amax_columnwise ? *o.amax_columnwise : rht ? bits_to_float(rht_amax_bits) : amax;
  }

  E2m1Thresholds row_thresholds, col_thresholds;
  E2m1Thresholds row_doubling{}, col_doubling{};  // the codes below a form's first are left zero
  std::optional<nvfp4_16::E2m1ThresholdPairs> row_threshold_pairs, row_doubling_pairs;
  Call call{};
  call.avx2 = avx2;
  call.src = src;
  call.stride = x.row_stride;
  call.m = x.rows;
  call.k = x.cols;
  call.tile_2d = o.tile == Tile::k16x16;
  call.x = &x;
  call.rht = rht ? &rht_tables : nullptr;
  if (o.rowwise) {
    call.row = make_direction(out.rowwise_amax);
    build_e2m1_thresholds(kIn, call.row.s_dec, row_thresholds);
    call.row_thresholds = &row_thresholds;
    if (call.avx2) call.row_threshold_pairs = &row_threshold_pairs.emplace(row_thresholds);
    call.row_data = out.rowwise_data.data_as<uint8_t>();
    call.row_scale = out.rowwise_scale.data_as<uint8_t>();
    call.row_stream = streamable(x.rows * x.cols / 2, x.cols / 2, call.row_data);  // 2 lines per chunk row
  }
  if (o.columnwise) {
    call.col = make_direction(out.columnwise_amax);
    if (o.rowwise && call.col.s_dec == call.row.s_dec) {  // one table serves both directions
      call.col_thresholds = &row_thresholds;
    } else {
      build_e2m1_thresholds(kIn, call.col.s_dec, col_thresholds);
      call.col_thresholds = &col_thresholds;
    }
    call.col_data = out.columnwise_data.data_as<uint8_t>();
    call.col_scale = out.columnwise_scale.data_as<uint8_t>();
    call.col_stream = streamable(x.rows * x.cols / 2, x.rows / 2, call.col_data);  // a line per group
  }
  call.doubling_from = 127;
  if (call.avx2) {  // the AVX2 chunk's doubling forms, from the first code where both directions hold
    const int row_first = o.rowwise ? build_e2m1_doubling_form(kIn, row_thresholds, row_doubling) : 0;
    int col_first = 0;
    if (o.columnwise && call.col_thresholds == &row_thresholds) {
      col_first = row_first;
      call.col_doubling = &row_doubling;
    } else if (o.columnwise) {
      col_first = build_e2m1_doubling_form(kIn, *call.col_thresholds, col_doubling);
      call.col_doubling = &col_doubling;
    }
    call.doubling_from = std::max(row_first, col_first);
    if (o.rowwise && call.doubling_from < 127)
      call.row_doubling_pairs = &row_doubling_pairs.emplace(row_doubling);
  }
  const bool same_codes = o.rowwise && o.columnwise && call.tile_2d &&
                          call.row.multiplier == call.col.multiplier && call.row.s_dec == call.col.s_dec;
  if constexpr (kIn == DType::BF16) {  // validate_quantize allows the RHT for bf16 only
    if (rht) {
      if (o.rowwise) return quantize_groups<kIn, true, true, false, true>(call, threads);
      return quantize_groups<kIn, false, true, false, true>(call, threads);
    }
  }
  if (same_codes) {
    quantize_groups<kIn, true, true, true>(call, threads);
  } else if (o.rowwise && o.columnwise) {
    quantize_groups<kIn, true, true>(call, threads);
  } else if (o.rowwise) {
    quantize_groups<kIn, true, false>(call, threads);
  } else {
    quantize_groups<kIn, false, true>(call, threads);
  }
}

}  // namespace

bool nvfp4_16_applies(const InputMatrix& x, const QuantizeOptions& o) {
  // Rowwise blocks and 16 x 16 tiles need whole blocks in a row; columnwise-only calls may have
  // any last dim (the fp32 kernel takes those). Columnwise and 16 x 16 calls have whole bands
  // (validate_quantize); the test here keeps this kernel's assumption next to it.
  const bool whole_bands = x.rows % kBlock == 0 || (!o.columnwise && o.tile == Tile::k1x16);
  return (x.dtype == DType::BF16 || x.dtype == DType::F16) && x.col_stride == 1 && x.cols % kBlock == 0 &&
         whole_bands && !o.stochastic_rounding && !(o.columnwise && o.rht && x.dtype != DType::BF16);
}

void quantize_nvfp4_16(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  if (x.dtype == DType::BF16) {
    quantize_with_input<DType::BF16>(x, o, out);
  } else {
    quantize_with_input<DType::F16>(x, o, out);
  }
}

}  // namespace microscale::cpu
