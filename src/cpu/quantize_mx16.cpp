// Portable MXFP8 and MXFP4 kernel (MXFP6 too where the CPU has AVX2) for bf16 and f16 inputs: plain C++ loops
// over 16-bit patterns, which GCC vectorises (AVX2: 16 lanes per operation; the clones of cpu_dispatch.hpp).
// FP8 codes by the 16-bit form of mx16_form.hpp, FP4 codes by thresholds (e2m1_thresholds.hpp; see
// quantize_chunk_fp4; the AVX2 chunk takes mx16_form.hpp's two-step form where it holds). Equal
// bit for bit to quantize_mx_ref.cpp (tests/cpp/quantize_test.cpp runs the portable kernels on
// random, special and boundary inputs; mx16_form_test.cpp and e2m1_thresholds_test.cpp check the
// per-lane forms exhaustively).
//
// Why: widened to fp32, each element costs a multiply and a 10-operation encoder per direction on
// 8 lanes (AVX2); on its 16-bit pattern, a subtract and a shift on 16 lanes.
//
// The unit of work is a chunk of one band: up to 32 rows x 256 columns (16 KiB of input, which
// stays in L1 between the steps):
//   1. maxes:   per column the max |x| pattern over the rows (columnwise blocks), per row and
//               32-column block its max (rowwise blocks); the patterns order as their magnitudes,
//               and a NaN pattern is above Inf's, so a NaN gives a NaN amax as torch.amax does;
//   2. scales:  each block's E8M0 byte (mx_scale_byte_branch_free on the widened amax: a loop
//               over blocks that vectorises) and its terms, looked up by the byte (TermTable:
//               mx16_terms; blocks with a NaN scale have every lane outside the normal form);
//   3. encode:  (FP8, FP6) row by row, both directions' codes by mx16_code_normal; in a row with a
//               lane outside the normal form (format or input subnormals, Inf/NaN blocks: rare for
//               FP8; the AVX2 chunk encodes FP6's in vector)
//               each block holding one is encoded again as the fp32 path does
//               (mx16_code_general, in fp32 lanes) and those lanes taken from it.
// On CPUs with AVX2 (kernel_set() Avx2 or better) whole bands' chunks run in AVX2 instead
// (mx16_chunk_avx2.cpp, the same bytes); the unit and the steps both share are in mx16_chunk.hpp.
#include "cpu/quantize_mx16.hpp"

#include <algorithm>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>  // SSE2: the fence after streaming stores
#endif

#include "core/fp_environment.hpp"
#include "cpu/cpu_dispatch.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/input16.hpp"
#include "cpu/kernel_set.hpp"
#include "cpu/mx16_chunk.hpp"
#include "cpu/mx16_form.hpp"
#include "cpu/row_loader.hpp"  // thread_count

namespace microscale::cpu {
namespace {

using mx16::block_scale_byte;
using mx16::Chunk;
using mx16::chunk_terms;
using mx16::fix_outside;
using mx16::kBlock;
using mx16::kChunkBlocks;
using mx16::kChunkCols;
using mx16::kPrefetchBytes;
using mx16::Terms;

// One chunk row's codes in the requested directions (kRow, kCol): rowwise with the terms of its
// blocks (row_terms from index `first_block`), columnwise with each lane's. Returns whether a lane
// is outside the normal form in either direction (its code then still to be fixed by
// fix_outside).
// NOTE: the outside lanes are ORed per lane of a block and tested once per row: tested per block,
// the horizontal OR and its branch cost as much as the block's codes.
template <typename Codec, DType kIn, bool kRow, bool kCol>
MICROSCALE_CPU_INLINE bool encode_row(const uint16_t* __restrict x, int blocks, const Terms& row_terms,
                                      int first_block, const Terms& col, uint8_t* __restrict row_out,
                                      uint8_t* __restrict col_out) {
  // NOTE: set by the first block, not zeroed before: GCC 12 zeroed it with two 16-byte stores that
  // the loop's 32-byte load could not forward from (a third of the kernel's time).
  alignas(32) uint8_t outside[kBlock];
  int b = 0;
  do {  // blocks >= 1: the first block sets every lane
    const uint16_t row_lower = row_terms.lower[first_block + b], row_limit = row_terms.limit[first_block + b];
    const int first = b * kBlock;
    for (int j = 0; j < kBlock; ++j) {
      const uint16_t v = x[first + j];
      uint8_t out = 0;
      if constexpr (kRow) {
        row_out[first + j] = mx16_code_normal<Codec, kIn>(v, row_lower);
        out |= static_cast<uint8_t>(mx16_outside(v, row_limit));
      }
      if constexpr (kCol) {
        col_out[first + j] = mx16_code_normal<Codec, kIn>(v, col.lower[first + j]);
        out |= static_cast<uint8_t>(mx16_outside(v, col.limit[first + j]));
      }
      outside[j] = b == 0 ? out : static_cast<uint8_t>(outside[j] | out);
    }
  } while (++b < blocks);
  uint8_t any = 0;
  for (uint8_t o : outside) any |= o;
  return any != 0;
}

// Step 1 of a chunk: col_max[j], the max |x| pattern of column j over the chunk's rows, and
// row_max[i * kChunkBlocks + b], that of row i's block b (every slot of a row defined).
MICROSCALE_CPU_INLINE void chunk_maxes(const Chunk& c, uint16_t* __restrict col_max,
                                       uint16_t* __restrict row_max) {
  const int blocks = c.cols / kBlock;
  std::fill_n(col_max, kChunkCols, uint16_t{0});
  // Step 2 runs over every [row][block] slot (one loop, which vectorises): a narrow last chunk's
  // unused slots get defined values.
  if (blocks < kChunkBlocks) std::fill_n(row_max, kBlock * kChunkBlocks, uint16_t{0});
  for (int i = 0; i < c.rows; ++i) {
    const uint16_t* __restrict row = c.src + i * c.stride;
    // The hardware prefetchers do not follow 32 rows at once (the AVX-512 kernels measured it).
    if (c.prefetch_next) {
      for (int64_t l = 0; l < kPrefetchBytes; l += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(row + kChunkCols) + l);
    }
    for (int j = 0; j < c.cols; ++j)
      col_max[j] = std::max(col_max[j], static_cast<uint16_t>(row[j] & 0x7FFF));
    for (int b = 0; b < blocks; ++b) {
      uint16_t m = 0;
      for (int j = 0; j < kBlock; ++j) m = std::max(m, static_cast<uint16_t>(row[b * kBlock + j] & 0x7FFF));
      row_max[i * kChunkBlocks + b] = m;
    }
  }
}

template <typename Codec, DType kIn, MxScaleRule kRule>
MICROSCALE_CPU_DISPATCH void quantize_chunk(const Chunk& c) {
  const bool rowwise = c.row_data != nullptr, columnwise = c.col_data != nullptr;
  const int blocks = c.cols / kBlock;

  // 1. Maxes of the |x| patterns.
  alignas(64) uint16_t col_max[kChunkCols];
  alignas(64) uint16_t row_max[kBlock * kChunkBlocks];  // [row][block]
  chunk_maxes(c, col_max, row_max);
  if (c.scale_tiles) tile_maxes(c, col_max, row_max);

  // 2. Scales and terms.
  Terms col, row;
  chunk_terms<kIn, kRule>(c, col_max, row_max, col, row);

  // 3. Encode, row by row.
  for (int i = 0; i < c.rows; ++i) {
    const uint16_t* x = c.src + i * c.stride;
    const int first_block = i * kChunkBlocks;
    uint8_t* row_out = rowwise ? c.row_data + i * c.data_stride : nullptr;
    uint8_t* col_out = columnwise ? c.col_data + i * c.data_stride : nullptr;
    bool outside;
    if (rowwise && columnwise) {
      outside = encode_row<Codec, kIn, true, true>(x, blocks, row, first_block, col, row_out, col_out);
    } else if (rowwise) {
      outside = encode_row<Codec, kIn, true, false>(x, blocks, row, first_block, col, row_out, col_out);
    } else {
      outside = encode_row<Codec, kIn, false, true>(x, blocks, row, first_block, col, row_out, col_out);
    }
    if (outside) [[unlikely]] {
      if (rowwise) fix_outside<Codec, kIn, false>(x, blocks, row, first_block, row_out);
      if (columnwise) fix_outside<Codec, kIn, true>(x, blocks, col, /*first_block=*/0, col_out);
    }
  }
}

// ---- MXFP4: codes by thresholds ----
//
// E2M1 puts a large share of a block in the format's subnormals (|x| below about a sixth of the
// block's amax), outside the 16-bit form above; there each element's code is 8 compares of its
// |x| pattern against its block's thresholds (e2m1_thresholds.hpp), and codes go two per byte.

// One chunk row's packed codes in the requested directions (kRow, kCol): rowwise against the
// thresholds of its blocks' bytes (row_scale from index `first_block`), columnwise against each
// lane's (col_below[k][j]).
template <bool kRow, bool kCol>
MICROSCALE_CPU_INLINE void encode_row_fp4(const uint16_t* __restrict x, int blocks,
                                          const MxE2m1Thresholds& table, const uint8_t* row_scale,
                                          int first_block, const int16_t (*col_below)[kChunkCols],
                                          uint8_t* __restrict row_out, uint8_t* __restrict col_out) {
  alignas(64) uint16_t row_code[kChunkCols], col_code[kChunkCols];
  for (int b = 0; b < blocks; ++b) {
    const int16_t* t = kRow ? table.below[row_scale[first_block + b]] : nullptr;
    for (int l = 0; l < kBlock; ++l) {
      const int j = b * kBlock + l;
      const auto a = static_cast<int16_t>(x[j] & 0x7FFF);
      const auto sign = static_cast<uint16_t>((x[j] >> 12) & 8);
      if constexpr (kRow) row_code[j] = e2m1_code_by_thresholds(a, sign, t);
      if constexpr (kCol) {
        const int16_t lane[8] = {col_below[0][j], col_below[1][j], col_below[2][j], col_below[3][j],
                                 col_below[4][j], col_below[5][j], col_below[6][j], col_below[7][j]};
        col_code[j] = e2m1_code_by_thresholds(a, sign, lane);
      }
    }
  }
  // NOTE: GCC 12 warns that pack_codes may read codes not set above; it reads the pairs of the
  // `blocks` blocks the loop set (the quantizer tests compare every output byte with the reference).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
  if constexpr (kRow) pack_codes(row_code, blocks * (kBlock / 2), row_out);
  if constexpr (kCol) pack_codes(col_code, blocks * (kBlock / 2), col_out);
#pragma GCC diagnostic pop
}

template <DType kIn, MxScaleRule kRule>
MICROSCALE_CPU_DISPATCH void quantize_chunk_fp4(const Chunk& c) {
  const bool rowwise = c.row_data != nullptr, columnwise = c.col_data != nullptr;
  const int blocks = c.cols / kBlock;
  const MxE2m1Thresholds& table = *c.fp4_thresholds;

  // 1. Maxes of the |x| patterns.
  alignas(64) uint16_t col_max[kChunkCols];
  alignas(64) uint16_t row_max[kBlock * kChunkBlocks];  // [row][block]
  chunk_maxes(c, col_max, row_max);
  if (c.scale_tiles) tile_maxes(c, col_max, row_max);

  // 2. Scale bytes; the columnwise blocks' thresholds per lane (col_below[k][j]).
  alignas(64) uint8_t col_scale[kChunkCols], row_scale[kBlock * kChunkBlocks];
  alignas(64) int16_t col_below[8][kChunkCols];
  mx16::fp4_scale_bytes<kIn, kRule>(c, col_max, row_max, col_scale, row_scale);
  if (columnwise) mx16::fp4_column_thresholds(c, col_scale, col_below);

  // 3. Codes, row by row.
  for (int i = 0; i < c.rows; ++i) {
    const uint16_t* x = c.src + i * c.stride;
    uint8_t* row_out = rowwise ? c.row_data + i * c.data_stride : nullptr;
    uint8_t* col_out = columnwise ? c.col_data + i * c.data_stride : nullptr;
    if (rowwise && columnwise) {
      encode_row_fp4<true, true>(x, blocks, table, row_scale, i * kChunkBlocks, col_below, row_out, col_out);
    } else if (rowwise) {
      encode_row_fp4<true, false>(x, blocks, table, row_scale, i * kChunkBlocks, col_below, row_out, col_out);
    } else {
      encode_row_fp4<false, true>(x, blocks, table, row_scale, i * kChunkBlocks, col_below, row_out, col_out);
    }
  }
}

#ifdef MICROSCALE_HAVE_AVX2_KERNELS
// A chunk in AVX2 where it is a whole band (mx16_chunk_avx2.cpp), else in plain C++.
template <typename Codec, DType kIn, MxScaleRule kRule>
void quantize_chunk_avx2_or_plain(const Chunk& c) {
  if constexpr (std::is_same_v<Codec, E2M1Codec>) {
    if (c.rows == kBlock) return mx16::quantize_chunk_fp4_avx2<kIn, kRule>(c);
    quantize_chunk_fp4<kIn, kRule>(c);
  } else {
    if (c.rows == kBlock) return mx16::quantize_chunk_avx2<Codec, kIn, kRule>(c);
    quantize_chunk<Codec, kIn, kRule>(c);
  }
}
#endif

// The chunk kernel of a codec, input type and scale rule: MXFP4 by thresholds (in AVX2: the
// two-step form where it holds), FP8 and FP6 by the 16-bit form; in AVX2 when `avx2` (kernel_set()
// says Avx2 or better).
template <typename Codec, DType kIn, MxScaleRule kRule>
auto kernel_of(bool avx2) -> void (*)(const Chunk&) {
#ifdef MICROSCALE_HAVE_AVX2_KERNELS
  if (avx2) return &quantize_chunk_avx2_or_plain<Codec, kIn, kRule>;
#endif
  if constexpr (std::is_same_v<Codec, E2M1Codec>) {
    return &quantize_chunk_fp4<kIn, kRule>;
  } else {
    return &quantize_chunk<Codec, kIn, kRule>;
  }
}

// Every band of 32 rows (the last may be short: rowwise-only input), chunk after chunk; the
// kernel of the scale rule (and kernel set) picked once per call.
template <typename Codec, DType kIn>
void quantize_with(const InputMatrix& x, const QuantizeOptions& o, const MxParams& p, QuantizedTensor& out) {
  constexpr bool kFp4 = std::is_same_v<Codec, E2M1Codec>;
  const int64_t m = x.rows, k = x.cols;
  const int64_t data_cols = kFp4 ? k / 2 : k;  // bytes of an output row
  // The kernel set, once per call (the chunk kernel and the FP4 table it reads must agree). 32x32
  // scale tiles take the same chunks, with tile_maxes after their maxes.
  const bool scale_tiles = o.tile == Tile::k32x32;
  const bool avx2 = kernel_set() >= KernelSet::Avx2;
  void (*chunk)(const Chunk&) = nullptr;
  switch (p.rule) {
    case MxScaleRule::Floor: chunk = kernel_of<Codec, kIn, MxScaleRule::Floor>(avx2); break;
    case MxScaleRule::Ceil: chunk = kernel_of<Codec, kIn, MxScaleRule::Ceil>(avx2); break;
    case MxScaleRule::Even: chunk = kernel_of<Codec, kIn, MxScaleRule::Even>(avx2); break;
    case MxScaleRule::RCeil: chunk = kernel_of<Codec, kIn, MxScaleRule::RCeil>(avx2); break;
  }
  const MxE2m1Thresholds* thresholds = kFp4 ? &mx_e2m1_thresholds(kIn) : nullptr;
  const E2m1ThresholdPairTable<256>* threshold_pairs = kFp4 && avx2 ? &mx_e2m1_threshold_pairs(kIn) : nullptr;
  mx16::TermTable terms{};
  if constexpr (!kFp4) terms = mx16::term_table<Codec, kIn>();
  const int64_t bands = (m + kBlock - 1) / kBlock;  // columnwise: M % 32 == 0 is checked
  // The AVX2 chunks stream whole chunks' rows of large outputs (both have M x data_cols bytes).
  const auto streams = [&](const Tensor& data) { return streamable(m * data_cols, data_cols, data.data()); };
  const bool stream =
      (!o.rowwise || streams(out.rowwise_data)) && (!o.columnwise || streams(out.columnwise_data));
#pragma omp parallel num_threads(thread_count(o.num_threads))
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t first_row = b * kBlock;
      Chunk c{};
      c.src = static_cast<const uint16_t*>(x.data) + first_row * x.row_stride;
      c.stride = x.row_stride;
      c.rows = static_cast<int>(std::min<int64_t>(kBlock, m - first_row));
      c.p = p;
      c.scale_tiles = scale_tiles;
      c.fp4_thresholds = thresholds;
      c.fp4_threshold_pairs = threshold_pairs;
      c.terms = &terms;
      c.data_stride = data_cols;
      c.row_scale_stride = k / kBlock;
      for (int64_t col = 0; col < k; col += kChunkCols) {
        const int64_t data_col = kFp4 ? col / 2 : col;
        c.cols = static_cast<int>(std::min<int64_t>(kChunkCols, k - col));
        c.prefetch_next = col + kChunkCols < k;
        c.stream = stream && c.cols == kChunkCols;
        if (o.rowwise) {
          c.row_data =
              out.rowwise_data.data_as<uint8_t>() + first_row * data_cols + data_col;  // (M, K or K/2)
          c.row_scale = out.rowwise_scale.data_as<uint8_t>() + first_row * c.row_scale_stride +
                        col / kBlock;  // (M, K/32)
        }
        if (o.columnwise) {
          c.col_data =
              out.columnwise_data.data_as<uint8_t>() + first_row * data_cols + data_col;  // (M, K or K/2)
          c.col_scale = out.columnwise_scale.data_as<uint8_t>() + b * k + col;            // (M/32, K)
        }
        chunk(c);
        c.src += kChunkCols;
      }
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence();  // streamed stores are weakly ordered
#endif
  }
}

template <typename Codec>
void quantize_with_input(const InputMatrix& x, const QuantizeOptions& o, const MxParams& p,
                         QuantizedTensor& out) {
  if (x.dtype == DType::BF16) {
    quantize_with<Codec, DType::BF16>(x, o, p, out);
  } else {
    quantize_with<Codec, DType::F16>(x, o, p, out);
  }
}

}  // namespace

bool mx16_applies(const InputMatrix& x, Scheme scheme) {
  // FP8 by the 16-bit form; FP4 by thresholds (in AVX2 the two-step form where it holds). FP6
  // only with AVX2: E2M3 puts a large share of a Gaussian block in the format's subnormals,
  // outside the 16-bit form, which the AVX2 chunk encodes in vector (the subnormal form,
  // mx16_chunk_avx2.cpp); the plain chunk mends them lane group by lane group and measured slower
  // than the fp32 kernel (docs/perf.md, fifteenth session). Chunks are whole rowwise blocks: a
  // columnwise-only call may have any last dim (K % 32 != 0), which the fp32 kernel takes.
  const bool fp6 = scheme == Scheme::MXFP6_E2M3 || scheme == Scheme::MXFP6_E3M2;
  return (x.dtype == DType::BF16 || x.dtype == DType::F16) && x.col_stride == 1 && x.cols % kBlock == 0 &&
         (scheme == Scheme::MXFP8_E4M3 || scheme == Scheme::MXFP8_E5M2 || scheme == Scheme::MXFP4 ||
          (fp6 && kernel_set() >= KernelSet::Avx2));
}

void quantize_mx16(const InputMatrix& x, const QuantizeOptions& o, const MxParams& p, QuantizedTensor& out) {
  switch (o.scheme) {
    case Scheme::MXFP8_E4M3: return quantize_with_input<E4M3Codec>(x, o, p, out);
    case Scheme::MXFP8_E5M2: return quantize_with_input<E5M2Codec>(x, o, p, out);
    case Scheme::MXFP4: return quantize_with_input<E2M1Codec>(x, o, p, out);
    case Scheme::MXFP6_E2M3: return quantize_with_input<E2M3Codec>(x, o, p, out);
    case Scheme::MXFP6_E3M2: return quantize_with_input<E3M2Codec>(x, o, p, out);
    default: break;  // not mx16_applies
  }
}

}  // namespace microscale::cpu
