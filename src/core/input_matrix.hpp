// InputMatrix: a checked 2-D strided view of a quantizer input, read as exact fp32.
#pragma once

#include <cstdint>

#include "microscale/half.hpp"
#include "microscale/tensor.hpp"

namespace microscale {

/// The input flattened to [rows, cols]: leading dims are folded into rows (they must collapse to
/// a single row stride); the column stride may be anything positive (e.g. a transposed view).
struct InputMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // elements
  int64_t col_stride = 1;  // elements

  float at(int64_t r, int64_t c) const {
    const int64_t i = r * row_stride + c * col_stride;
    switch (dtype) {
      case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
      case DType::F16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
      default: return static_cast<const float*>(data)[i];
    }
  }
  bool contiguous_rows() const { return col_stride == 1; }
};

/// Validates a quantizer input (memory on `device`, f32/bf16/f16, >= 1-D, non-empty, positive
/// strides that fold to 2-D) and views it as an InputMatrix. Throws microscale::Error with the reason.
InputMatrix make_input_matrix(const TensorView& input, Device device = Device::CPU);

}  // namespace microscale
