// Loads a band of input rows into a contiguous fp32 buffer (exact widening), the first step of
// the portable fp32 kernels: after it, they see plain float rows whatever the dtype and strides.
#pragma once

#include <omp.h>

#include <algorithm>

#include "core/input_matrix.hpp"

namespace microscale::cpu {

/// out[(r - first_row) * x.cols + c] = x(r, c) for r in [first_row, first_row + rows).
inline void load_rows(const InputMatrix& x, int64_t first_row, int64_t rows, float* out) {
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

/// Threads to use: the option, or all hardware threads when it is 0.
inline int thread_count(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

}  // namespace microscale::cpu
