#include "cpu/nvfp4_band.hpp"

#include <algorithm>
#include <vector>

#include "core/fp_environment.hpp"
#include "cpu/row_loader.hpp"

namespace microscale::cpu {

constexpr int kBlock = 16;

MICROSCALE_CPU_DISPATCH float band_max_abs(const float* v, int64_t n) { return max_abs(v, n, 0.0f); }

MICROSCALE_CPU_DISPATCH void transpose_band(const float* band, int64_t k, float* tile) {
  for (int64_t c = 0; c < k; ++c) {
    for (int i = 0; i < kBlock; ++i) tile[c * kBlock + i] = band[i * k + c];
  }
}

MICROSCALE_CPU_DISPATCH void band_tile_amax(const float* band, int64_t k, float* tile_amax) {
  // Column maxima first, row after row (contiguous, vertical maxima), then each tile's 16 of them:
  // max_abs's bit maximum, the same in any order. NOTE: a tile at a time (16 rows of 16) took 16
  // horizontal reductions per tile, ~9 % of a 4over6 call.
  constexpr int64_t kChunk = 256;  // columns per step: the maxima stay in L1
  alignas(64) uint32_t column_bits[kChunk];
  for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
    const int64_t n = std::min(kChunk, k - c0);  // a multiple of 16
    std::fill_n(column_bits, n, 0u);
    for (int i = 0; i < kBlock; ++i) max_column_bits(band + i * k + c0, n, column_bits);
    for (int64_t t = 0; t < n / kBlock; ++t) {
      uint32_t m = 0;
      for (int c = 0; c < kBlock; ++c) m = std::max(m, column_bits[t * kBlock + c]);
      tile_amax[c0 / kBlock + t] = bits_to_float(m);
    }
  }
}

namespace {

// max_column_bits compiled per x86-64 level, for row_scaled_amaxes (which is not).
MICROSCALE_CPU_DISPATCH void column_max_bits(const float* row, int64_t k, uint32_t* column_bits) {
  max_column_bits(row, k, column_bits);
}

}  // namespace

void row_scaled_amaxes(const InputMatrix& x, int threads, float* row_amax, float* col_amax) {
  const int64_t m = x.rows, k = x.cols, bands = (m + kBlock - 1) / kBlock;
  // NOTE: column maxes as bit patterns (amaxes are >= 0, so the integer order is the float
  // order), combined by the threads after their bands.
  std::vector<uint32_t> column_bits(col_amax != nullptr ? static_cast<size_t>(k) : 0, 0u);
#pragma omp parallel num_threads(threads)
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
    std::vector<float> band(static_cast<size_t>(kBlock * k));
    std::vector<uint32_t> mine(column_bits.size(), 0u);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t rows = std::min<int64_t>(kBlock, m - b * kBlock);
      load_rows(x, b * kBlock, rows, band.data());
      for (int64_t r = 0; r < rows; ++r) {
        if (row_amax != nullptr) row_amax[b * kBlock + r] = band_max_abs(band.data() + r * k, k);
        if (col_amax != nullptr) column_max_bits(band.data() + r * k, k, mine.data());
      }
    }
#pragma omp critical(microscale_row_scaled_amaxes)
    for (size_t c = 0; c < mine.size(); ++c) column_bits[c] = std::max(column_bits[c], mine[c]);
  }
  for (size_t c = 0; c < column_bits.size(); ++c) col_amax[c] = bits_to_float(column_bits[c]);
}

}  // namespace microscale::cpu
