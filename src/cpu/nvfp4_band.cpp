#include "cpu/nvfp4_band.hpp"

namespace microscale::cpu {

constexpr int kBlock = 16;

MICROSCALE_CPU_DISPATCH float band_max_abs(const float* v, int64_t n) { return max_abs(v, n, 0.0f); }

MICROSCALE_CPU_DISPATCH void transpose_band(const float* band, int64_t k, float* tile) {
  for (int64_t c = 0; c < k; ++c) {
    for (int i = 0; i < kBlock; ++i) tile[c * kBlock + i] = band[i * k + c];
  }
}

MICROSCALE_CPU_DISPATCH void band_tile_amax(const float* band, int64_t k, float* tile_amax) {
  for (int64_t kb = 0; kb < k / kBlock; ++kb) {
    float m = 0.0f;
    for (int i = 0; i < kBlock; ++i) m = max_abs(band + i * k + kb * kBlock, kBlock, m);
    tile_amax[kb] = m;
  }
}

}  // namespace microscale::cpu
