// NVFP4 fast path: threads over bands of 16 input rows, vectorised inner loops, branch-free
// encoders. Equal bit for bit to quantize_nvfp4_ref.cpp (tests/cpp/quantize_test.cpp,
// golden_test.cpp, stochastic_rounding_test.cpp).
//
// Pass 1 (per band): the rowwise amax; for RHT, the transformed band's amax (the columnwise amax);
// a row-scaled tensor's amax of every row and every column (row_scaled_amaxes).
// Pass 2 (per band, loaded once): rowwise blocks of its rows; columnwise blocks from the band's
// 16 x K tile transposed to K x 16 (through the RHT when asked): row c of that tile is block
// `band` of columnwise row c. The global scale needs the whole-tensor amax, hence two passes.
//
// RHT: the reference sums the 16 products in double in i order. Where every partial sum is exact,
// a 4-stage butterfly (4 adds per output instead of 16) gives the same bits: in fp32 for columns
// of bf16 values within 12 binades (almost all), in double within 40 (see rht_band); other
// columns take the reference order.
#include <algorithm>
#include <array>
#include <cfloat>
#include <vector>

#include "core/fp_environment.hpp"
#include "cpu/cpu_dispatch.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/nvfp4_band.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/quantize_nvfp4_16.hpp"
#include "cpu/rht.hpp"
#include "cpu/rht_band.hpp"
#include "cpu/row_loader.hpp"
#include "microscale/philox.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 16;

// One direction's global scales and output layout: block i of a run goes to
// data + i * data_stride (8 bytes) and scale + i * scale_stride.
struct Direction {
  float multiplier = 0.0f;  // RN(S_enc * RN(1/6))
  float s_dec = 0.0f;       // RN(1 / S_enc)
  const StochasticRounding* sr = nullptr;
  uint64_t first_block = 0;  // SR stream position of this direction's block 0
};

Direction make_direction(float amax, const QuantizeOptions& o, uint64_t first_block) {
  Direction d;
  const float s_enc = nvfp4_global_encode_scale(amax);
  d.multiplier = nvfp4_block_scale_multiplier(s_enc);
  d.s_dec = 1.0f / s_enc;
  d.sr = o.stochastic_rounding ? &*o.stochastic_rounding : nullptr;
  d.first_block = first_block;
  return d;
}

// Quantizes `count` consecutive 16-element blocks of `src`. `block_amax` (the 16x16 tiles' amaxes)
// replaces the blocks' own amaxes when given. Block i is block number sr_block0 + i * sr_stride of
// the direction's SR stream. A row-scaled tensor's transposed tile (each block a row of X^T with
// its own global scale) gives each block's multiplier and s_dec in place of the Direction's.
struct BlockRun {
  const float* src;
  int64_t count;
  const float* block_amax;
  uint8_t* data;
  int64_t data_stride;
  uint8_t* scale;
  int64_t scale_stride;
  uint64_t sr_block0;
  uint64_t sr_stride;
  const float* block_multiplier = nullptr;
  const float* block_s_dec = nullptr;
};

// Per-thread work arrays of quantize_blocks, sized for the longest run (a K x 16 tile).
struct Scratch {
  std::vector<float> amax, enc, enc_per_element;
  std::vector<uint8_t> scale_codes, codes, packed;
  explicit Scratch(int64_t max_blocks)
      : amax(max_blocks),
        enc(max_blocks),
        enc_per_element(max_blocks * kBlock),
        scale_codes(max_blocks),
        codes(max_blocks * kBlock),
        packed(max_blocks * kBlock / 2) {}
};

// NOTE: each step is its own loop over the run (scales of all blocks, then all elements, then the
// packing), not a chain of steps per block: the per-block scale chain (E4M3 encode, decode,
// division) then vectorises across blocks too (measured ~2x over the per-block form).
MICROSCALE_CPU_DISPATCH void quantize_blocks(const BlockRun& run, const Direction& d, Scratch& s) {
  const int64_t blocks = run.count, n = blocks * kBlock;
  // NOTE: __restrict on every array: codes and scales are bytes, which may alias anything (the
  // Scratch vectors' own pointers included), and without it GCC vectorises none of these loops
  // (callgrind: 8 instructions per element in the select alone; the scale chain ran one block at
  // a time, reloading each pointer after every byte store).
  float* __restrict amax = s.amax.data();
  uint8_t* __restrict scale_codes = s.scale_codes.data();
  float* __restrict block_enc = s.enc.data();
  if (run.block_amax != nullptr) {
    std::copy_n(run.block_amax, blocks, amax);
  } else {
    for (int64_t i = 0; i < blocks; ++i) amax[i] = max_abs(run.src + i * kBlock, kBlock, 0.0f);
  }
  if (run.block_multiplier != nullptr) {
    const float* __restrict multiplier = run.block_multiplier;
    const float* __restrict s_dec = run.block_s_dec;
    for (int64_t i = 0; i < blocks; ++i) {
      const uint8_t code = E4M3Codec::encode_rn(min_nonnegative(amax[i] * multiplier[i], FLT_MAX));
      scale_codes[i] = code;
      block_enc[i] = nvfp4_block_encode_scale(e4m3_code_value(code), s_dec[i]);
    }
  } else {
    for (int64_t i = 0; i < blocks; ++i) {
      const uint8_t code =
          E4M3Codec::encode_rn(min_nonnegative(amax[i] * d.multiplier, FLT_MAX));  // amax >= 0
      scale_codes[i] = code;
      block_enc[i] = nvfp4_block_encode_scale(e4m3_code_value(code), d.s_dec);
    }
  }
  uint8_t* __restrict scale = run.scale;
  const int64_t scale_stride = run.scale_stride;
  for (int64_t i = 0; i < blocks; ++i) scale[i * scale_stride] = scale_codes[i];
  const float* __restrict v = run.src;
  float* __restrict enc = s.enc_per_element.data();
  for (int64_t i = 0; i < blocks; ++i) {
    for (int j = 0; j < kBlock; ++j) enc[i * kBlock + j] = block_enc[i];
  }
  uint8_t* __restrict codes = s.codes.data();
  if (d.sr != nullptr) {
    for (int64_t i = 0; i < blocks; ++i) {
      uint32_t words[4];
      sr_block_bits(d.sr->seed, d.sr->offset, d.first_block + run.sr_block0 + i * run.sr_stride, words);
      for (int j = 0; j < kBlock; ++j) {
        const float scaled = v[i * kBlock + j] * enc[i * kBlock + j];
        const uint32_t code = E2M1Codec::encode_sr(scaled, (words[j / 4] >> (8 * (j % 4))) & 0xFFu);
        codes[i * kBlock + j] = static_cast<uint8_t>(select(scaled == 0.0f, 0u, code));  // any zero -> 0
      }
    }
  } else {
    for (int64_t c = 0; c < n; ++c) {
      const float scaled = v[c] * enc[c];
      codes[c] =
          static_cast<uint8_t>(select(scaled == 0.0f, 0u, E2M1Codec::encode_rn(scaled)));  // any zero -> 0
    }
  }
  uint8_t* __restrict packed = s.packed.data();
  for (int64_t j = 0; j < n / 2; ++j)
    packed[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
  if (run.data_stride == kBlock / 2) {
    std::copy_n(packed, n / 2, run.data);
  } else {
    for (int64_t i = 0; i < blocks; ++i) {
      std::copy_n(packed + i * (kBlock / 2), kBlock / 2, run.data + i * run.data_stride);
    }
  }
}

}  // namespace

void quantize_nvfp4(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  if (o.four_over_six != FourOverSix::Off) return quantize_nvfp4_four_over_six(x, o, out);
  // Row-scaled tensors take the portable kernel only (their global scale changes per row).
  if (!o.row_scaled && quantize_nvfp4_avx512(x, o, out)) return;
  if (!o.row_scaled && nvfp4_16_applies(x, o)) return quantize_nvfp4_16(x, o, out);  // bf16/f16 words
  const int64_t m = x.rows, k = x.cols;
  const int threads = thread_count(o.num_threads);
  const int64_t bands = (m + kBlock - 1) / kBlock;  // the last may be short (rowwise-only input)
  const bool rht = o.columnwise && o.rht;
  const bool tile_2d = o.tile == Tile::k16x16;
  const RhtCoefficients tables = rht_coefficients(o.rht_sign_mask);

  // Pass 1: amaxes (max|x| for rowwise, and columnwise without RHT; max|RHT(X^T)| with it; a
  // row-scaled tensor's per row of X and of X^T).
  std::vector<float> col_multiplier, col_s_dec;  // row-scaled columnwise: block c's global terms
  if (o.row_scaled) {
    row_scaled_amaxes(x, threads, o.rowwise ? out.rowwise_amaxes.data_as<float>() : nullptr,
                      o.columnwise ? out.columnwise_amaxes.data_as<float>() : nullptr);
    if (o.columnwise) {
      col_multiplier.resize(static_cast<size_t>(k));
      col_s_dec.resize(static_cast<size_t>(k));
      for (int64_t c = 0; c < k; ++c) {
        const Direction d = make_direction(out.columnwise_amaxes.data_as<float>()[c], o, 0);
        col_multiplier[c] = d.multiplier;
        col_s_dec[c] = d.s_dec;
      }
    }
  }
  const bool need_amax =
      !o.row_scaled && ((o.rowwise && !o.amax_rowwise) || (o.columnwise && !o.amax_columnwise));
  // NOTE: reduced as bit patterns (amaxes are >= 0, so the integer order is the float order): an
  // OpenMP reduction combines after the region's body, outside its IeeeSubnormals, where a caller's
  // DAZ would compare subnormal amaxes as equal (fp_environment.hpp).
  uint32_t amax_x_bits = 0, amax_rht_bits = 0;
  if (need_amax) {
#pragma omp parallel num_threads(threads) reduction(max : amax_x_bits, amax_rht_bits)
    {
      const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
      std::vector<float> band(static_cast<size_t>(kBlock * k));
      float rht_running = 0.0f;  // lets rht_band_max_abs skip most columns
#pragma omp for schedule(static)
      for (int64_t b = 0; b < bands; ++b) {
        const int64_t rows = std::min<int64_t>(kBlock, m - b * kBlock);
        load_rows(x, b * kBlock, rows, band.data());
        amax_x_bits = std::max(amax_x_bits, float_bits(band_max_abs(band.data(), rows * k)));
        if (rht && !o.amax_columnwise) rht_running = rht_band_max_abs(band.data(), k, tables, rht_running);
      }
      amax_rht_bits = std::max(amax_rht_bits, float_bits(rht_running));
    }
  }
  const float amax_x = bits_to_float(amax_x_bits), amax_rht = bits_to_float(amax_rht_bits);
  if (o.rowwise) out.rowwise_amax = o.amax_rowwise ? *o.amax_rowwise : amax_x;
  if (o.columnwise) out.columnwise_amax = o.amax_columnwise ? *o.amax_columnwise : (rht ? amax_rht : amax_x);

  // Pass 2: each band once, both directions.
  const Direction row_dir = make_direction(out.rowwise_amax, o, 0);
  const Direction col_dir = make_direction(out.columnwise_amax, o, static_cast<uint64_t>(m * k / kBlock));
#pragma omp parallel num_threads(threads)
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
    std::vector<float> band(static_cast<size_t>(kBlock * k)), tile(static_cast<size_t>(kBlock * k));
    std::vector<float> tile_amax(static_cast<size_t>(k / kBlock)), col_amax(static_cast<size_t>(k));
    Scratch scratch(k);  // runs: K/16 blocks (a row) or K blocks (the transposed tile)
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t rows = std::min<int64_t>(kBlock, m - b * kBlock);
      load_rows(x, b * kBlock, rows, band.data());
      if (tile_2d) band_tile_amax(band.data(), k, tile_amax.data());  // 16x16 tiles need full bands
      if (o.rowwise) {
        uint8_t* data = out.rowwise_data.data_as<uint8_t>();    // (M, K/2)
        uint8_t* scale = out.rowwise_scale.data_as<uint8_t>();  // (M, K/16)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = b * kBlock + r;
          const Direction row_scaled_dir =
              o.row_scaled ? make_direction(out.rowwise_amaxes.data_as<float>()[row], o, 0) : row_dir;
          const BlockRun run{band.data() + r * k,
                             k / kBlock,
                             tile_2d ? tile_amax.data() : nullptr,
                             data + row * (k / 2),
                             kBlock / 2,
                             scale + row * (k / kBlock),
                             1,
                             static_cast<uint64_t>(row * (k / kBlock)),
                             1};
          quantize_blocks(run, row_scaled_dir, scratch);
        }
      }
      if (o.columnwise) {
        // Tile row c = block b of columnwise row c: data (K, M/2), scale (K, M/16).
        if (rht) {
          rht_band(band.data(), k, tables, tile.data());
        } else {
          transpose_band(band.data(), k, tile.data());
        }
        if (tile_2d) {
          for (int64_t c = 0; c < k; ++c) col_amax[c] = tile_amax[c / kBlock];
        }
        const BlockRun run{tile.data(),
                           k,
                           tile_2d ? col_amax.data() : nullptr,
                           out.columnwise_data.data_as<uint8_t>() + b * (kBlock / 2),
                           m / 2,
                           out.columnwise_scale.data_as<uint8_t>() + b,
                           m / kBlock,
                           static_cast<uint64_t>(b),
                           static_cast<uint64_t>(m / kBlock),
                           o.row_scaled ? col_multiplier.data() : nullptr,
                           o.row_scaled ? col_s_dec.data() : nullptr};
        quantize_blocks(run, col_dir, scratch);
      }
    }
  }
}

}  // namespace microscale::cpu
