// NVFP4 fast path: threads over 16-row bands, vectorisable inner loops, branch-free encoders.
// Equal bit for bit to quantize_nvfp4_ref.cpp (tests/cpp/quantize_test.cpp, golden_test.cpp).
//
// Pass 1 (per band of 16 input rows): the rowwise amax, and for columnwise output the source
// T = X^T [K, M] (through the RHT, rounded to bf16, when asked) with its amax.
// Pass 2 (per band of 16 source rows): block scales and E2M1 codes for X (rowwise) and T
// (columnwise). The global scale needs the whole-tensor amax, hence two passes.
#include <algorithm>
#include <array>
#include <cfloat>
#include <vector>

#include "cpu/cpu_dispatch.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/rht.hpp"
#include "cpu/row_loader.hpp"
#include "microscale/philox.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 16;

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) t[code] = decode(Format::E4M3, static_cast<uint8_t>(code));
    return t;
  }();
  return table;
}

struct Direction {
  float multiplier = 0.0f;  // RN(S_enc * RN(1/6))
  float s_dec = 0.0f;       // RN(1 / S_enc)
  bool tile_2d = false;
  const StochasticRounding* sr = nullptr;
  uint64_t first_block = 0;  // SR stream position of this direction's block 0
  uint8_t* data = nullptr;   // (rows, n/2)
  uint8_t* scale = nullptr;  // (rows, n/16)
};

Direction make_direction(float amax, const QuantizeOptions& o, uint64_t first_block, uint8_t* data, uint8_t* scale) {
  Direction d;
  const float s_enc = nvfp4_global_encode_scale(amax);
  d.multiplier = nvfp4_block_scale_multiplier(s_enc);
  d.s_dec = 1.0f / s_enc;
  d.tile_2d = o.tile == Tile::k16x16;
  d.sr = o.stochastic_rounding ? &*o.stochastic_rounding : nullptr;
  d.first_block = first_block;
  d.data = data;
  d.scale = scale;
  return d;
}

[[gnu::always_inline]] inline float max_abs(const float* v, int64_t n, float start) {
  // On the bits (see quantize_mx.cpp's block_amax): NaN patterns are dropped, so a NaN never wins,
  // as fmaxf in TE's amax kernels; the rest compare as unsigned integers, which vectorises.
  uint32_t m = to_bits(start);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = to_bits(v[i]) & 0x7FFFFFFFu;
    const uint32_t candidate = a > 0x7F800000u ? 0u : a;
    m = candidate > m ? candidate : m;
  }
  return from_bits(m);
}

// max_abs over a whole band (the amax pass), compiled per ISA.
MICROSCALE_CPU_DISPATCH float band_max_abs(const float* v, int64_t n, float start) { return max_abs(v, n, start); }

// Quantizes one 16-element block at `v` with decode scale code `scale_code` into 8 packed bytes.
[[gnu::always_inline]] inline void encode_block(const float* v, float encode_scale, const uint32_t* random_words, uint8_t* out) {
  uint8_t codes[kBlock];
  if (random_words != nullptr) {
    for (int i = 0; i < kBlock; ++i) {
      const float scaled = v[i] * encode_scale;
      const uint32_t code = E2M1Codec::encode_sr(scaled, (random_words[i / 4] >> (8 * (i % 4))) & 0xFFu);
      codes[i] = static_cast<uint8_t>(select(scaled == 0.0f, 0u, code));  // any zero (-0.0 too) is code 0
    }
  } else {
    for (int i = 0; i < kBlock; ++i) {
      const float scaled = v[i] * encode_scale;
      codes[i] = static_cast<uint8_t>(select(scaled == 0.0f, 0u, E2M1Codec::encode_rn(scaled)));  // as TE's reference
    }
  }
  for (int j = 0; j < kBlock / 2; ++j) out[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
}

// Quantizes `rows` (<= 16) rows of src (fp32, [rows, n]) that are rows row0.. of the direction.
MICROSCALE_CPU_DISPATCH void quantize_band(const float* src, int64_t rows, int64_t n, int64_t row0, const Direction& d) {
  const int64_t blocks = n / kBlock;
  std::vector<float> tile_amax;
  if (d.tile_2d) {
    tile_amax.assign(static_cast<size_t>(blocks), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < blocks; ++b) tile_amax[b] = max_abs(src + r * n + b * kBlock, kBlock, tile_amax[b]);
    }
  }
  const std::array<float, 256>& e4m3 = e4m3_values();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * n;
    const int64_t out_row = row0 + r;
    for (int64_t b = 0; b < blocks; ++b) {
      const float block_amax = d.tile_2d ? tile_amax[b] : max_abs(row + b * kBlock, kBlock, 0.0f);
      const uint8_t scale_code = E4M3Codec::encode_rn(std::min(block_amax * d.multiplier, FLT_MAX));
      d.scale[out_row * blocks + b] = scale_code;
      const float encode_scale = nvfp4_block_encode_scale(e4m3[scale_code], d.s_dec);
      uint32_t words[4];
      if (d.sr != nullptr) sr_block_bits(d.sr->seed, d.sr->offset, d.first_block + out_row * blocks + b, words);
      encode_block(row + b * kBlock, encode_scale, d.sr != nullptr ? words : nullptr,
                   d.data + out_row * (n / 2) + b * (kBlock / 2));
    }
  }
}

// Signed RHT coefficients +-0.25 of entry (i, j), as the reference multiplies them.
std::array<double, 256> rht_coefficients(uint16_t mask) {
  std::array<double, 256> c{};
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) c[i * 16 + j] = rht_sign(mask, i, j) * 0.25;
  }
  return c;
}

// T[c][row0 + j] for the 16 rows of `band` ([16, k]): the columns' 16-chunks, through the RHT
// (same double sum, same order as rht16) when `coefficients` is given. Returns the band's amax.
MICROSCALE_CPU_DISPATCH float transpose_band(const float* band, int64_t k, int64_t m, int64_t row0, const double* coefficients, float* t) {
  float amax = 0.0f;
  if (coefficients == nullptr) {
    for (int64_t c = 0; c < k; ++c) {
      for (int i = 0; i < kBlock; ++i) t[c * m + row0 + i] = band[i * k + c];
    }
    return band_max_abs(band, kBlock * k, 0.0f);
  }
  constexpr int64_t kChunk = 256;
  double sums[kChunk];
  float outputs[kChunk];
  for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
    const int64_t width = std::min(kChunk, k - c0);
    for (int j = 0; j < kBlock; ++j) {
      std::fill_n(sums, width, 0.0);
      for (int i = 0; i < kBlock; ++i) {
        const double coefficient = coefficients[i * 16 + j];
        const float* x = band + i * k + c0;
        for (int64_t c = 0; c < width; ++c) sums[c] += coefficient * x[c];
      }
      for (int64_t c = 0; c < width; ++c) outputs[c] = rht_output_to_bf16_value(sums[c]);
      amax = max_abs(outputs, width, amax);
      for (int64_t c = 0; c < width; ++c) t[(c0 + c) * m + row0 + j] = outputs[c];
    }
  }
  return amax;
}

}  // namespace

void quantize_nvfp4(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const int64_t m = x.rows, k = x.cols;
  const int threads = thread_count(o.num_threads);
  const int64_t bands = (m + kBlock - 1) / kBlock;  // the last may be short (rowwise-only input)
  const bool rht = o.columnwise && o.rht;
  const std::array<double, 256> coefficients = rht_coefficients(o.rht_sign_mask);

  // Pass 1: amaxes, and the columnwise source T = X^T (or RHT(X^T)), [K, M].
  std::vector<float> t(o.columnwise ? static_cast<size_t>(k * m) : 0);
  float amax_row = 0.0f, amax_col = 0.0f;
  const bool need_row_amax = o.rowwise && !o.amax_rowwise;
#pragma omp parallel num_threads(threads) reduction(max : amax_row, amax_col)
  {
    std::vector<float> band(static_cast<size_t>(kBlock * k));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t rows = std::min<int64_t>(kBlock, m - b * kBlock);
      if (!need_row_amax && !o.columnwise) continue;
      load_rows(x, b * kBlock, rows, band.data());
      if (need_row_amax) amax_row = std::max(amax_row, band_max_abs(band.data(), rows * k, 0.0f));
      if (o.columnwise) {
        amax_col = std::max(amax_col, transpose_band(band.data(), k, m, b * kBlock, rht ? coefficients.data() : nullptr, t.data()));
      }
    }
  }
  if (!rht) amax_col = std::max(amax_col, amax_row);  // without RHT both directions share max|x|
  if (o.rowwise) out.rowwise_amax = o.amax_rowwise ? *o.amax_rowwise : amax_row;
  if (o.columnwise) out.columnwise_amax = o.amax_columnwise ? *o.amax_columnwise : amax_col;

  // Pass 2: scales and codes.
  if (o.rowwise) {
    const Direction d = make_direction(out.rowwise_amax, o, 0, out.rowwise_data.data_as<uint8_t>(),
                                       out.rowwise_scale.data_as<uint8_t>());
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> band(static_cast<size_t>(kBlock * k));
#pragma omp for schedule(static)
      for (int64_t b = 0; b < bands; ++b) {
        const int64_t rows = std::min<int64_t>(kBlock, m - b * kBlock);
        load_rows(x, b * kBlock, rows, band.data());
        quantize_band(band.data(), rows, k, b * kBlock, d);
      }
    }
  }
  if (o.columnwise) {
    const Direction d = make_direction(out.columnwise_amax, o, static_cast<uint64_t>(m * k / kBlock),
                                       out.columnwise_data.data_as<uint8_t>(), out.columnwise_scale.data_as<uint8_t>());
    const int64_t t_bands = (k + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < t_bands; ++b) {
      quantize_band(t.data() + b * kBlock * m, std::min<int64_t>(kBlock, k - b * kBlock), m, b * kBlock, d);
    }
  }
}

}  // namespace microscale::cpu
