// NVFP4 quantizer written with AVX-512 intrinsics: round to nearest, 1x16 or 16x16 scaling, the
// RHT, rowwise and columnwise; equal bit for bit to quantize_nvfp4_ref.cpp (tests/cpp/
// quantize_test.cpp runs it on random, special and boundary inputs, golden_test.cpp on the golden
// cases). Stochastic rounding and inputs with strided columns take the portable fast path.
//
// bf16 and f16 inputs go by units of 16 rows x 32 columns (quantize_unit16: one 512-bit load per
// row, 16-bit amaxes, codes looked up already in their packed nibbles; with the RHT (bf16 only),
// the transform of each column in fp32 or double, rht_unit_bf16). The rest (f32, NaN units, RHT
// columns exact in neither, a last odd tile, a last partial band) goes by tiles of 16 input
// rows x 16 columns in 16 registers (register i = row i, lane j = column j), loaded once for both
// directions:
//   rowwise:    block amax per register: one transposing max tree (16 -> 1 register);
//               scales per lane of that result; elements times their row's scale (a broadcast).
//   columnwise: block amax per lane: a vertical max over the 16 registers; element i of the
//               column blocks is register i, so the quantized transpose needs no data transpose,
//               only the final nibble packing (8 bytes per column).
//   RHT:        the 16-point transform runs down the registers as a 4-stage butterfly in fp32
//               or double (two halves of 8 lanes), exact where the reference's sum is (rht_tile).
// Pass 1 computes the global amaxes (both directions' when the RHT is on); pass 2 quantizes.
//
// The kernel's parts, each in a header that only this file includes:
//   nvfp4_avx512_group.hpp     a group of up to 256 rows (the unit of threading), its stages
//   nvfp4_avx512_tile.hpp      the general path: tiles of 16 x 16 (quantize_tile)
//   nvfp4_avx512_rht_unit.hpp  the RHT of a bf16 unit of 16 x 32 (rht_unit_bf16)
//   nvfp4_avx512_unit.hpp      the bf16 / f16 fast path: units of 16 x 32 (quantize_unit16)
//   nvfp4_avx512_flush.hpp     the staged outputs written as whole lines
//   nvfp4_avx512_amax.hpp      pass 1 (group_amaxes)
// This file walks a group's bands (quantize_group) and runs both passes over the groups on the
// threads (quantize_with).
#include <omp.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/fp_environment.hpp"
#include "cpu/avx512.hpp"
#include "cpu/kernel_set.hpp"
#include "cpu/nvfp4_avx512_amax.hpp"
#include "cpu/nvfp4_avx512_flush.hpp"
#include "cpu/nvfp4_avx512_group.hpp"
#include "cpu/nvfp4_avx512_tile.hpp"
#include "cpu/nvfp4_avx512_unit.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/rht.hpp"
#include "cpu/row_loader.hpp"

namespace microscale::cpu {

#ifdef MICROSCALE_HAVE_AVX512_KERNELS
namespace {

using namespace avx512;

// quantize_unit16 in the form the group asks for: its directions, and the RHT (bf16 only: for other
// inputs validate_quantize rejects the RHT before any kernel runs, so g.rht is null here).
template <DType kIn>
MICROSCALE_AVX512_INLINE bool quantize_unit_as_asked(const Group& g, const std::byte* src, int64_t col,
                                                     int band, RowStage& stage, ColumnStage cs,
                                                     const UnitMaxes* given, UnitMaxes* next) {
  const bool rowwise = g.row_data != nullptr, columnwise = g.col_data != nullptr;
  if constexpr (kIn == DType::BF16) {
    if (g.rht != nullptr) {
      return rowwise ? quantize_unit16<kIn, true, true, true>(g, src, col, band, stage, cs, given, next)
                     : quantize_unit16<kIn, false, true, true>(g, src, col, band, stage, cs, given, next);
    }
  }
  if (!rowwise) return quantize_unit16<kIn, false, true, false>(g, src, col, band, stage, cs, given, next);
  return columnwise ? quantize_unit16<kIn, true, true, false>(g, src, col, band, stage, cs, given, next)
                    : quantize_unit16<kIn, true, false, false>(g, src, col, band, stage, cs, given, next);
}

// Pass 2 for one group, band after band (16 input rows: few enough read streams for the
// hardware prefetcher). Outputs are staged and written a whole 64-byte line at a time: 8 tiles
// fill a line of each of the band's 16 rowwise rows, and the group's 16 bands two lines of each
// of the K columnwise rows.
// NOTE: writing each tile's 8-byte pieces straight to the outputs (rows 2 KiB apart for a
// 4096 x 4096 input) was 3x slower: partial lines, all in two L1 sets, evicted and re-read.
// Walking all rows of a group per tile column was slower still (128 read streams).
template <DType kDType>
MICROSCALE_AVX512 void quantize_group(const Group& g, ColumnStage cs) {
  const int bands = (g.rows + kBlock - 1) / kBlock;
  const bool rowwise = g.row_data != nullptr, columnwise = g.col_data != nullptr;
  // bf16 and f16 full bands go by units of two tiles.
  constexpr bool kUnits = kDType == DType::BF16 || kDType == DType::F16;
  for (int band = 0; band < bands; ++band) {
    const int rows = std::min(kBlock, g.rows - band * kBlock);
    const std::byte* src = g.src + band * kBlock * g.row_bytes;
    RowStage stage;
    // Each unit's element loop computes the maxes of the unit after it (UnitMaxes), unless pass 1
    // kept them (16x16 tiles, whose amaxes were not both given).
    const bool carry = g.tile_maxes == nullptr;
    UnitMaxes carried[2];
    bool have_carried = false;
    int current = 0;
    for (int64_t col = 0; col < g.k;) {
      const bool unit = kUnits && rows == kBlock && col + kUnitColumns <= g.k;
      if (!unit) prefetch_band_ahead<kDType, _MM_HINT_T1>(g, src, rows, col);  // units: prefetch_unit_row
      int64_t next = col + kBlock;
      if (unit) {
        next = col + kUnitColumns;
        bool done = false;
        const bool next_unit = carry && col + 2 * kUnitColumns <= g.k;
        if constexpr (kUnits) {
          done = quantize_unit_as_asked<kDType>(g, src, col, band, stage, cs,
                                                have_carried ? &carried[current] : nullptr,
                                                next_unit ? &carried[current ^ 1] : nullptr);
        }
        have_carried = done && next_unit;
        current ^= 1;
        if (!done) {
          quantize_tile<kDType>(g, src, rows, col, band, stage, cs);
          quantize_tile<kDType>(g, src, rows, col + kBlock, band, stage, cs);
        }
      } else {
        quantize_tile<kDType>(g, src, rows, col, band, stage, cs);
      }
      const int line_tile = static_cast<int>((next - 1) / kBlock) % kLineTiles;  // of the last tile
      if (rowwise && (line_tile == kLineTiles - 1 || next == g.k)) {
        flush_row_line(g, stage, band, rows, (next - 1) / kBlock / kLineTiles * kLineTiles * kBlock,
                       line_tile + 1);
      }
      col = next;
    }
  }
  if (columnwise) flush_column_lines(g, cs, bands);
  if (g.row_stream || g.col_stream) _mm_sfence();  // streamed stores are weakly ordered
}

// The groups of the calling thread of an OpenMP team: a contiguous share.
struct GroupRange {
  int64_t begin, end;
};
GroupRange thread_groups(int64_t groups) {
  const int64_t team = omp_get_num_threads(), member = omp_get_thread_num();
  return {groups * member / team, groups * (member + 1) / team};
}

template <DType kDType>
void quantize_with(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const int64_t m = x.rows, k = x.cols;
  const int threads = thread_count(o.num_threads);
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  const bool rht = o.columnwise && o.rht;
  const RhtCoefficients coefficients = rht_coefficients(o.rht_sign_mask);
  alignas(64) float input_scale[16];
  for (int i = 0; i < kBlock; ++i) input_scale[i] = static_cast<float>(coefficients[i * 16]);
  const int64_t row_bytes = x.row_stride * element_bytes<kDType>();

  Group base;
  base.row_bytes = row_bytes;
  base.k = k;
  base.tile_2d = o.tile == Tile::k16x16;
  base.rht = rht ? &coefficients : nullptr;
  base.rht_input_scale = input_scale;
  // Pass 1: the global amaxes (those not given).
  const bool need_x = (o.rowwise && !o.amax_rowwise) || (o.columnwise && !rht && !o.amax_columnwise);
  const bool need_rht = rht && !o.amax_columnwise;
  // 16x16 tiles of a 16-bit input: pass 1, where it runs without the RHT (16x16 never has it),
  // keeps each unit's tile maxes for pass 2 (unit_tile_maxes). Left uninitialised: pass 1 writes
  // every record pass 2 reads.
  const bool keep_tile_maxes = kDType != DType::F32 && base.tile_2d && need_x && !rht;
  base.units_per_band = k / kUnitColumns;
  const int64_t group_records = kGroupBands * base.units_per_band * 2;
  const std::unique_ptr<uint16_t[]> tile_maxes(keep_tile_maxes ? new uint16_t[groups * group_records]
                                                               : nullptr);
  auto group = [&](int64_t index) {
    Group g = base;
    g.src = static_cast<const std::byte*>(x.data) + index * kGroupRows * row_bytes;
    g.rows = static_cast<int>(std::min<int64_t>(kGroupRows, m - index * kGroupRows));
    if (keep_tile_maxes) g.tile_maxes = tile_maxes.get() + index * group_records;  // (groups, 16, K/32, 2)
    return g;
  };

  // NOTE: reduced as bit patterns (amaxes are >= 0, so the integer order is the float order): an
  // OpenMP reduction combines after the region's body, outside its IeeeSubnormals, where a caller's
  // DAZ would compare subnormal amaxes as equal (fp_environment.hpp).
  uint32_t amax_x_bits = 0, amax_rht_bits = 0;
  if (need_x || need_rht) {
#pragma omp parallel num_threads(threads) reduction(max : amax_x_bits, amax_rht_bits)
    {
      const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
      // Each thread reads the groups it quantizes in pass 2, last first: pass 2 starts on what
      // is still in its caches.
      const GroupRange range = thread_groups(groups);
      float rht_floor = 0.0f;  // this thread's max |RHT(x)| so far
      for (int64_t i = range.end - 1; i >= range.begin; --i) {
        float gx = 0.0f, gr = 0.0f;
        group_amaxes<kDType>(group(i), need_rht, &gx, &gr, &rht_floor);
        amax_x_bits = std::max(amax_x_bits, float_bits(gx));
        amax_rht_bits = std::max(amax_rht_bits, float_bits(gr));
      }
    }
  }
  const float amax_x = bits_to_float(amax_x_bits), amax_rht = bits_to_float(amax_rht_bits);
  if (o.rowwise) out.rowwise_amax = o.amax_rowwise ? *o.amax_rowwise : amax_x;
  if (o.columnwise) out.columnwise_amax = o.amax_columnwise ? *o.amax_columnwise : (rht ? amax_rht : amax_x);

  // Pass 2: each group once, both directions.
  if (o.rowwise) {
    base.row = direction_scales(out.rowwise_amax);
    base.row_data_stride = k / 2;
    base.row_scale_stride = k / kBlock;
  }
  if (o.columnwise) {
    base.col = direction_scales(out.columnwise_amax);
    base.col_data_stride = m / 2;
    base.col_scale_stride = m / kBlock;
  }
  // Large outputs are written with streaming stores: they cannot stay in the caches anyway, and a
  // streamed whole line skips the read for ownership of a plain store (measured: 4096 x 4096 bf16
  // rowwise, 9.5 -> 7 ms). Needs the lines aligned; small outputs stay cached for their reader.
  const bool big = (int64_t{o.rowwise} + int64_t{o.columnwise}) * m * (k / 2) >= kStreamBytes;
  base.row_stream = big && o.rowwise && k % (2 * 64) == 0 && line_aligned(out.rowwise_data);
  base.col_stream = big && o.columnwise && m % (2 * 64) == 0 && line_aligned(out.columnwise_data);
  // The columnwise scale lines too (measured, 4096 x 4096: their plain stores waited on reads for
  // ownership, ~0.4 ms).
  const bool col_scale_stream =
      big && o.columnwise && (m / kBlock) % 64 == 0 && line_aligned(out.columnwise_scale);
  // Columnwise scales: a group has 16 bytes of each columnwise row (stride M/16 bytes); written
  // straight, each is a partial line that costs a read for ownership (measured with 8-byte pieces:
  // 1.2 of 4 ms for 4096 x 4096). So each thread stages the scales of 4 consecutive groups (one
  // 64-byte line of every columnwise row) and writes whole lines.
  // With more threads than lines of groups (16 threads on 16 groups), 2-4 threads would write the
  // pieces of each line and its plain stores would bounce between their cores (measured on a
  // 16-core server, 4096 x 4096: 0.2 of 0.85 ms). Then each group's pieces go to a shared
  // [group][K][16] stage instead, and after a barrier each thread writes the whole lines of a
  // share of the columnwise rows (gather_scale_lines).
  constexpr int kLineGroups = 64 / kGroupBands;
  // A call of one group (M <= 256) writes its columnwise scales straight to the output: no other
  // group shares their lines, and staging them cost a 16-row call a fifth of its time.
  const bool scales_direct = groups == 1;
  std::vector<uint8_t> group_scales;  // [groups][K][16] when lines are shared between threads
#pragma omp parallel num_threads(threads)
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
    // This thread's groups: a contiguous range, so that its scale lines fill up.
    const auto [begin, end] = thread_groups(groups);
    const int team = omp_get_num_threads();
    bool lines_shared = false;  // the same answer in every thread of the team
    for (int member = 1; member < team; ++member) lines_shared |= groups * member / team % kLineGroups != 0;
    lines_shared &= o.columnwise;
    if (lines_shared) {
#pragma omp single
      group_scales.resize(static_cast<size_t>(groups) * k * kGroupBands);
    }
    // Left uninitialised (new T[n], not a vector): every byte is written before it is read, and
    // zeroing ~0.8 MiB per call for K = 4096 was a tenth of a 16-row call.
    const auto stage = [&](int64_t bytes) {
      return std::unique_ptr<uint8_t[]>(o.columnwise ? new uint8_t[bytes] : nullptr);
    };
    const std::unique_ptr<uint8_t[]> stage_data = stage(k * kGroupBands * 8);
    const std::unique_ptr<uint8_t[]> stage_scale = stage(k * kGroupBands);
    const std::unique_ptr<uint8_t[]> scale_lines =
        stage(lines_shared || scales_direct ? 0 : k * 64);  // [K][64]
    for (int64_t i = begin; i < end; ++i) {
      Group g = group(i);
      if (o.rowwise) {
        g.row_data = out.rowwise_data.data_as<uint8_t>() + i * kGroupRows * g.row_data_stride;  // (M, K/2)
        g.row_scale =
            out.rowwise_scale.data_as<uint8_t>() + i * kGroupRows * g.row_scale_stride;  // (M, K/16)
      }
      if (o.columnwise) {
        g.col_data = out.columnwise_data.data_as<uint8_t>() + i * kGroupBands * 8;  // (K, M/2)
        if (scales_direct) {
          g.col_scale = out.columnwise_scale.data_as<uint8_t>();  // (K, M/16)
          g.col_scale_stride = base.col_scale_stride;
        } else {
          g.col_scale = lines_shared ? group_scales.data() + i * k * kGroupBands
                                     : scale_lines.get() + (i % kLineGroups) * kGroupBands;
          g.col_scale_stride = lines_shared ? kGroupBands : 64;
        }
      }
      quantize_group<kDType>(g, ColumnStage{stage_data.get(), stage_scale.get()});
      if (o.columnwise && !lines_shared && !scales_direct &&
          (i % kLineGroups == kLineGroups - 1 || i == end - 1)) {
        const int64_t first = std::max(begin, i - i % kLineGroups);  // the line's first group here
        const int64_t from = (first % kLineGroups) * kGroupBands;
        const int64_t to = (i % kLineGroups) * kGroupBands + (g.rows + kBlock - 1) / kBlock;
        uint8_t* dst = out.columnwise_scale.data_as<uint8_t>() + first * kGroupBands;  // (K, M/16)
        copy_line_bytes(scale_lines.get(), k, from, to, dst, base.col_scale_stride, col_scale_stream);
      }
    }
    if (lines_shared) {
#pragma omp barrier
      const int member = omp_get_thread_num();
      gather_scale_lines(group_scales.data(), groups, k, m / kBlock, k * member / team,
                         k * (member + 1) / team, out.columnwise_scale.data_as<uint8_t>(),
                         base.col_scale_stride, col_scale_stream);
    }
  }
}

}  // namespace

bool quantize_nvfp4_avx512(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  // Tiles are 16 columns wide: a columnwise-only call may have any last dim, and then the portable
  // kernel runs.
  if (kernel_set() != KernelSet::Avx512 || o.stochastic_rounding || !x.contiguous_rows() ||
      x.cols % kBlock != 0)
    return false;
  switch (x.dtype) {
    case DType::BF16: quantize_with<DType::BF16>(x, o, out); return true;
    case DType::F16: quantize_with<DType::F16>(x, o, out); return true;
    case DType::F32: quantize_with<DType::F32>(x, o, out); return true;
    default: return false;
  }
}

#else

bool quantize_nvfp4_avx512(const InputMatrix&, const QuantizeOptions&, QuantizedTensor&) { return false; }

#endif

}  // namespace microscale::cpu
