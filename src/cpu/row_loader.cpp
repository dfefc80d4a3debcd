// load_rows (row_loader.hpp), cloned for AVX-512, AVX2 and baseline x86-64 (cpu_dispatch.hpp).
#include "cpu/row_loader.hpp"

#include <algorithm>

#include "cpu/cpu_dispatch.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {

MICROSCALE_CPU_DISPATCH void load_rows(const InputMatrix& x, int64_t first_row, int64_t rows, float* out) {
  const int64_t k = x.cols;
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + r * k;
    const int64_t base = (first_row + r) * x.row_stride;
    if (x.col_stride == 1 && x.dtype == DType::BF16) {
      const auto* src = static_cast<const uint16_t*>(x.data) + base;
      for (int64_t c = 0; c < k; ++c) dst[c] = bits_to_float(static_cast<uint32_t>(src[c]) << 16);
    } else if (x.col_stride == 1 && x.dtype == DType::F16) {
      const auto* src = static_cast<const uint16_t*>(x.data) + base;
      for (int64_t c = 0; c < k; ++c) dst[c] = half_to_float(src[c]);  // branch-free: vectorises
    } else if (x.col_stride == 1 && x.dtype == DType::F32) {
      std::copy_n(static_cast<const float*>(x.data) + base, k, dst);
    } else {
      for (int64_t c = 0; c < k; ++c) dst[c] = x.at(first_row + r, c);
    }
  }
}

}  // namespace microscale::cpu
