// NVFP4 4over6 fast path (FourOverSix in quantize.hpp): threads over bands of 16 input rows, each
// step a loop over all the band's blocks of a direction so that it vectorises across them. Equal
// bit for bit to quantize_nvfp4_ref.cpp's quantize_direction_four_over_six
// (tests/cpp/four_over_six_test.cpp).
//
// Pass 1: the amax (4over6 has no RHT, so one amax serves both directions), or a row-scaled
// tensor's amax of every row (rowwise only, as in TE). Pass 2, per band: the
// rowwise blocks are the band's [rows, K] read as rows * K/16 consecutive blocks, the columnwise
// ones its columns, read in place (block c = block `band` of columnwise row c, element j at row j);
// both candidates of every block, their errors, then the pick per block or per 16x16 tile.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <vector>

#include "core/fp_environment.hpp"
#include "cpu/cpu_dispatch.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/nvfp4_band.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/row_loader.hpp"
#include "cuda/fast_codec.cuh"  // host and device: e2m1_code_and_value

namespace microscale::cpu {
namespace {

constexpr int kBlock = 16;

// A direction's global terms.
struct Globals {
  float amax = 0.0f;
  float s_enc = 0.0f;
  float s_dec = 0.0f;
  float denominator = 0.0f;  // 6 * e4m3_max
  bool scaled_error = false;
  bool squared = false;
};

Globals make_globals(float amax, const QuantizeOptions& o) {
  Globals g;
  g.amax = amax;
  g.s_enc = nvfp4_global_encode_scale(amax, o.nvfp4_e4m3_max);
  g.s_dec = 1.0f / g.s_enc;
  g.denominator = static_cast<float>(6 * o.nvfp4_e4m3_max);
  g.scaled_error = o.four_over_six_scaled_error;
  g.squared = o.four_over_six == FourOverSix::MinMse;
  return g;
}

// Both candidates of up to K blocks, in the blocks' "columns" layout (element j of block i at
// [j * blocks + i]): [blocks] scales and errors, [16 * blocks] codes.
struct Candidates {
  std::vector<float> amax, value4, value6, enc4, enc6, error4, error6;
  std::vector<float> columns;  // rowwise_candidates': a band's rowwise blocks in the columns layout
  std::vector<uint8_t> scale4, scale6, codes4, codes6;
  std::vector<uint32_t> amax_bits;          // the blocks' amaxes as bits, found row by row
  std::vector<uint32_t> code4, code6;       // the scale codes, in 32-bit lanes (candidate_scales)
  std::vector<uint8_t> pick, chosen_scale;  // choose's: [blocks], [blocks]
  std::vector<uint64_t> packed;             // choose's: [blocks], a block's 8 bytes each (packed_bytes)
  explicit Candidates(int64_t max_blocks)
      : amax(max_blocks),
        value4(max_blocks),
        value6(max_blocks),
        enc4(max_blocks),
        enc6(max_blocks),
        error4(max_blocks),
        error6(max_blocks),
        columns(max_blocks * kBlock),
        scale4(max_blocks),
        scale6(max_blocks),
        codes4(max_blocks * kBlock),
        codes6(max_blocks * kBlock),
        amax_bits(max_blocks),
        code4(max_blocks),
        code6(max_blocks),
        pick(max_blocks),
        chosen_scale(max_blocks),
        packed(max_blocks) {}
  // The chosen codes as bytes: [blocks * 8], block i's at i * 8 (little-endian words, pack_chosen).
  const uint8_t* packed_bytes() const { return reinterpret_cast<const uint8_t*>(packed.data()); }
};

// Each block's two candidate scales from its amax: the E4M3 codes (in 32-bit lanes), their values
// and the encode scales. NOTE: a function of its own, with __restrict parameters: inline, GCC could
// not tell its eight arrays apart and did not vectorise the loop (a scalar E4M3 encode and division
// per block and candidate, the largest share of the kernel's time).
MICROSCALE_CPU_INLINE void candidate_scales(const float* __restrict amax, int64_t blocks, float s_enc,
                                            float s_dec, uint32_t* __restrict code4,
                                            uint32_t* __restrict code6, float* __restrict value4,
                                            float* __restrict value6, float* __restrict enc4,
                                            float* __restrict enc6) {
  for (int64_t i = 0; i < blocks; ++i) {
    const float base = four_over_six_base_scale(amax[i], s_enc);
    code4[i] = E4M3Codec::encode_rn(four_over_six_map4_scale(base));
    code6[i] = E4M3Codec::encode_rn(min_nonnegative(base, 448.0f));
    value4[i] = e4m3_code_value(code4[i]);
    value6[i] = e4m3_code_value(code6[i]);
    enc4[i] = nvfp4_block_encode_scale(value4[i], s_dec);
    enc6[i] = nvfp4_block_encode_scale(value6[i], s_dec);
  }
}

// One candidate of `blocks` blocks in the columns layout: element j of block c at x[j * blocks + c],
// enc and value [blocks], codes [16 * blocks] in the same layout, error [blocks]. Each block's 16
// terms are added in element order, as the reference does. NOTE: the loops run along the blocks
// (contiguous), so that every step vectorises and the sums are vertical adds; with each block's
// 16 elements contiguous instead, the sums were stride-16 permutes and the scales had to be
// broadcast per element (the call took ~1.6x as long).
template <bool kScaledError, bool kSquared>
MICROSCALE_CPU_INLINE void encode_candidate(const float* __restrict x, int64_t blocks,
                                            const float* __restrict enc, const float* __restrict value,
                                            const Globals& g, uint8_t* __restrict codes,
                                            float* __restrict error) {
  const float amax = g.amax, denominator = g.denominator, s_enc = g.s_enc;
  for (int64_t c = 0; c < blocks; ++c) error[c] = 0.0f;
  for (int j = 0; j < kBlock; ++j) {
    const float* __restrict row = x + j * blocks;        // [blocks]: element j of every block
    uint8_t* __restrict row_codes = codes + j * blocks;  // [blocks]
    for (int64_t c = 0; c < blocks; ++c) {
      float code_value;  // E2M1Codec::decode(code)
      const uint32_t code = cuda::e2m1_code_and_value(row[c] * enc[c], code_value);
      row_codes[c] = static_cast<uint8_t>(code);
      error[c] += four_over_six_error_term(
          four_over_six_candidate_value(code_value, value[c], amax, denominator, kScaledError),
          four_over_six_input_value(row[c], s_enc, kScaledError), kSquared);
    }
  }
}

// Both candidates of `k` blocks in the columns layout (x [16, k]; a full band's columnwise blocks
// as loaded: block c is column c's 16 rows). block_amax replaces their amaxes when given.
MICROSCALE_CPU_DISPATCH void candidates_in_columns(const float* x, int64_t blocks, const float* block_amax,
                                                   const Globals& g, Candidates& c) {
  float* __restrict amax = c.amax.data();
  if (block_amax != nullptr) {
    std::copy_n(block_amax, blocks, amax);
  } else {  // max_abs's bit maximum, row by row: the same value in any order
    uint32_t* bits = c.amax_bits.data();
    std::fill_n(bits, blocks, 0u);
    for (int j = 0; j < kBlock; ++j) max_column_bits(x + j * blocks, blocks, bits);
    for (int64_t i = 0; i < blocks; ++i) amax[i] = bits_to_float(bits[i]);
  }
  candidate_scales(amax, blocks, g.s_enc, g.s_dec, c.code4.data(), c.code6.data(), c.value4.data(),
                   c.value6.data(), c.enc4.data(), c.enc6.data());
  for (int64_t i = 0; i < blocks; ++i) {
    c.scale4[i] = static_cast<uint8_t>(c.code4[i]);
    c.scale6[i] = static_cast<uint8_t>(c.code6[i]);
  }
  const auto both = [&](auto encode) {
    encode(x, blocks, c.enc4.data(), c.value4.data(), g, c.codes4.data(), c.error4.data());
    encode(x, blocks, c.enc6.data(), c.value6.data(), g, c.codes6.data(), c.error6.data());
  };
  if (g.scaled_error) {
    g.squared ? both(encode_candidate<true, true>) : both(encode_candidate<true, false>);
  } else {
    g.squared ? both(encode_candidate<false, true>) : both(encode_candidate<false, false>);
  }
}

// Both candidates of `blocks` consecutive blocks at x ([blocks, 16]: a band's rowwise blocks in row
// order), put in the columns layout first (c.columns).
MICROSCALE_CPU_DISPATCH void rowwise_candidates(const float* x, int64_t blocks, const float* block_amax,
                                                const Globals& g, Candidates& c) {
  float* __restrict columns = c.columns.data();  // [16, blocks]
  for (int64_t i = 0; i < blocks; ++i) {
    for (int j = 0; j < kBlock; ++j) columns[j * blocks + i] = x[i * kBlock + j];
  }
  candidates_in_columns(columns, blocks, block_amax, g, c);
}

// A 16x16 tile's pick: map to 4 where the sum of its 16 blocks' errors is smaller. Its blocks start
// at `first` and are `stride` apart (a band's rowwise blocks: K/16; its columnwise ones: 1).
bool tile_picks_map4(const Candidates& c, int64_t first, int64_t stride) {
  const auto s = static_cast<int>(stride);
  return four_over_six_tile_error(&c.error4[first], s) < four_over_six_tile_error(&c.error6[first], s);
}

// The chosen candidates' codes (columns layout) packed two per byte, even element in the low
// nibble (block c's 8 bytes as packed[c], little-endian: built as one 64-bit word per block so
// that the loops run along the blocks), and their scales ([blocks]).
static_assert(std::endian::native == std::endian::little,
              "pack_chosen's words are the blocks' bytes in order");

MICROSCALE_CPU_DISPATCH void pack_chosen(const uint8_t* __restrict pick, const uint8_t* __restrict codes4,
                                         const uint8_t* __restrict codes6, const uint8_t* __restrict scale4,
                                         const uint8_t* __restrict scale6, int64_t blocks,
                                         uint64_t* __restrict packed, uint8_t* __restrict scale) {
  for (int64_t c = 0; c < blocks; ++c) packed[c] = 0;
  for (int jj = 0; jj < kBlock / 2; ++jj) {
    const uint8_t* __restrict even4 = codes4 + (2 * jj) * blocks;
    const uint8_t* __restrict odd4 = codes4 + (2 * jj + 1) * blocks;
    const uint8_t* __restrict even6 = codes6 + (2 * jj) * blocks;
    const uint8_t* __restrict odd6 = codes6 + (2 * jj + 1) * blocks;
    for (int64_t c = 0; c < blocks; ++c) {
      const auto map4 = static_cast<uint8_t>(0u - pick[c]);  // all ones where map to 4 wins
      const auto four = static_cast<uint8_t>(even4[c] | (odd4[c] << 4));
      const auto six = static_cast<uint8_t>(even6[c] | (odd6[c] << 4));
      const auto byte = static_cast<uint8_t>((four & map4) | (six & ~map4));
      packed[c] |= static_cast<uint64_t>(byte) << (8 * jj);  // little-endian: byte jj of the block
    }
  }
  for (int64_t c = 0; c < blocks; ++c) scale[c] = pick[c] != 0 ? scale4[c] : scale6[c];
}

// Every block's pick (map to 4 where its error, or with 16x16 tiles its tile's, is smaller; block
// i's tile starts at tile_first(i)), then its chosen codes and scale (pack_chosen) into c.packed
// and c.chosen_scale. NOTE: loops over all the blocks, which vectorise without tiles, where a
// block at a time (pick, pack and store) ran scalar, ~18 % of the call.
template <typename TileFirst>
MICROSCALE_CPU_INLINE void choose(Candidates& c, int64_t blocks, bool tile_2d, int64_t tile_stride,
                                  TileFirst tile_first) {
  uint8_t* pick = c.pick.data();
  if (tile_2d) {  // a tile's pick once, at its first block (tile_first(i) <= i), then copied
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t first = tile_first(i);
      pick[i] = first == i ? tile_picks_map4(c, i, tile_stride) : pick[first];
    }
  } else {
    const float* error4 = c.error4.data();
    const float* error6 = c.error6.data();
    for (int64_t i = 0; i < blocks; ++i) pick[i] = error4[i] < error6[i];  // a tie keeps map to 6
  }
  pack_chosen(pick, c.codes4.data(), c.codes6.data(), c.scale4.data(), c.scale6.data(), blocks,
              c.packed.data(), c.chosen_scale.data());
}

}  // namespace

void quantize_nvfp4_four_over_six(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const int64_t m = x.rows, k = x.cols, kb = k / kBlock;
  const int threads = thread_count(o.num_threads);
  const int64_t bands = (m + kBlock - 1) / kBlock;  // the last may be short (rowwise-only 1x16)
  const bool tile_2d = o.tile == Tile::k16x16;

  // Pass 1. NOTE: reduced as bit patterns, as quantize_nvfp4 does (an OpenMP reduction combines
  // outside the region's IeeeSubnormals).
  uint32_t amax_bits = 0;
  // Row-scaled (rowwise only, as validated): each row's own amax and global terms.
  std::vector<Globals> row_scaled_globals;
  if (o.row_scaled) {
    float* row_amax = out.rowwise_amaxes.data_as<float>();
    row_scaled_amaxes(x, threads, row_amax, nullptr);
    for (int64_t r = 0; r < m; ++r) row_scaled_globals.push_back(make_globals(row_amax[r], o));
  } else if ((o.rowwise && !o.amax_rowwise) || (o.columnwise && !o.amax_columnwise)) {
#pragma omp parallel num_threads(threads) reduction(max : amax_bits)
    {
      const IeeeSubnormals ieee;
      std::vector<float> band(static_cast<size_t>(kBlock * k));
#pragma omp for schedule(static)
      for (int64_t b = 0; b < bands; ++b) {
        const int64_t rows = std::min<int64_t>(kBlock, m - b * kBlock);
        load_rows(x, b * kBlock, rows, band.data());
        amax_bits = std::max(amax_bits, float_bits(band_max_abs(band.data(), rows * k)));
      }
    }
  }
  const float amax = bits_to_float(amax_bits);
  if (o.rowwise) out.rowwise_amax = o.amax_rowwise ? *o.amax_rowwise : amax;
  if (o.columnwise) out.columnwise_amax = o.amax_columnwise ? *o.amax_columnwise : amax;
  const Globals row_globals = make_globals(out.rowwise_amax, o);
  const Globals col_globals = make_globals(out.columnwise_amax, o);

  // Pass 2.
#pragma omp parallel num_threads(threads)
  {
    const IeeeSubnormals ieee;
    std::vector<float> band(static_cast<size_t>(kBlock * k));
    std::vector<float> tile_amax(static_cast<size_t>(kb)), block_amax(static_cast<size_t>(k));
    Candidates c(k);  // a band's rowwise blocks (rows * K/16 <= K) or its K columnwise blocks
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t rows = std::min<int64_t>(kBlock, m - b * kBlock);
      load_rows(x, b * kBlock, rows, band.data());
      if (tile_2d) band_tile_amax(band.data(), k, tile_amax.data());
      if (o.rowwise && o.row_scaled) {  // one row at a time, each with its own global terms
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = b * kBlock + r;
          rowwise_candidates(band.data() + r * k, kb, nullptr, row_scaled_globals[row], c);
          choose(c, kb, false, 1, [](int64_t j) { return j; });
          std::copy_n(c.packed_bytes(), k / 2, out.rowwise_data.data_as<uint8_t>() + row * (k / 2));
          std::copy_n(c.chosen_scale.data(), kb, out.rowwise_scale.data_as<uint8_t>() + row * kb);
        }
      } else if (o.rowwise) {
        // Block i = (row i / kb, column block i % kb); its tile's blocks are kb apart.
        if (tile_2d) {
          for (int64_t i = 0; i < rows * kb; ++i) block_amax[i] = tile_amax[i % kb];
        }
        rowwise_candidates(band.data(), rows * kb, tile_2d ? block_amax.data() : nullptr, row_globals, c);
        // The band's blocks in row order are its output rows' bytes in order: (M, K/2), (M, K/16).
        choose(c, rows * kb, tile_2d, kb, [kb](int64_t j) { return j % kb; });
        std::copy_n(c.packed_bytes(), rows * (k / 2),
                    out.rowwise_data.data_as<uint8_t>() + b * kBlock * (k / 2));
        std::copy_n(c.chosen_scale.data(), rows * kb, out.rowwise_scale.data_as<uint8_t>() + b * kBlock * kb);
      }
      if (o.columnwise) {
        // Block c = columnwise row c's block b, read in the band's layout (a full band: columnwise
        // output needs M % 16 == 0); its tile's blocks are consecutive.
        if (tile_2d) {
          for (int64_t i = 0; i < k; ++i) block_amax[i] = tile_amax[i / kBlock];
        }
        candidates_in_columns(band.data(), k, tile_2d ? block_amax.data() : nullptr, col_globals, c);
        uint8_t* data = out.columnwise_data.data_as<uint8_t>();    // (K, M/2)
        uint8_t* scale = out.columnwise_scale.data_as<uint8_t>();  // (K, M/16)
        choose(c, k, tile_2d, 1, [](int64_t j) { return j / kBlock * kBlock; });
        for (int64_t i = 0; i < k; ++i) {
          std::copy_n(c.packed_bytes() + i * (kBlock / 2), kBlock / 2, data + i * (m / 2) + b * (kBlock / 2));
          scale[i * (m / kBlock) + b] = c.chosen_scale[i];
        }
      }
    }
  }
}

}  // namespace microscale::cpu
