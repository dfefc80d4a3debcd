#include "core/input_matrix.hpp"

#include "microscale/error.hpp"

namespace microscale {

InputMatrix make_input_matrix(const TensorView& input, Device device) {
  if (input.device != device) {
    throw Error(device == Device::CPU ? "the CPU backend needs a CPU tensor"
                                      : "the CUDA backend needs a CUDA tensor");
  }
  if (input.dtype != DType::F32 && input.dtype != DType::BF16 && input.dtype != DType::F16) {
    throw Error("input dtype must be f32, bf16 or f16, got " + std::string(dtype_name(input.dtype)));
  }
  if (input.ndim() < 1) throw Error("input must have at least one dimension");
  const int64_t n = input.numel();
  if (n == 0) throw Error("input " + shape_string(input.shape) + " is empty");
  if (input.data == nullptr) throw Error("input has a null data pointer");
  const std::vector<int64_t> strides = input.effective_strides();
  for (size_t i = 0; i < strides.size(); ++i) {
    if (strides[i] <= 0 && input.shape[i] > 1) {
      throw Error("input strides " + shape_string(strides) + " must be positive");
    }
  }
  InputMatrix m;
  m.data = input.data;
  m.dtype = input.dtype;
  m.cols = input.shape.back();
  m.rows = n / m.cols;
  m.col_stride = strides.back();
  if (input.ndim() == 1) {
    m.row_stride = m.cols * m.col_stride;
    return m;
  }
  // Leading dims must fold into one row dimension with a single stride.
  m.row_stride = strides[input.ndim() - 2];
  for (int64_t i = input.ndim() - 3; i >= 0; --i) {
    if (input.shape[i] > 1 && strides[i] != strides[i + 1] * input.shape[i + 1]) {
      throw Error("input strides " + shape_string(strides) + " for shape " + shape_string(input.shape) +
                  " do not fold into 2-D [rows, cols]; make it contiguous first");
    }
  }
  if (m.rows > 1 && m.cols > 1 && m.row_stride < m.cols * m.col_stride &&
      m.col_stride < m.rows * m.row_stride) {
    throw Error("input strides " + shape_string(strides) + " make elements overlap");
  }
  return m;
}

Tensor to_f32_matrix(const TensorView& x) {
  const InputMatrix m = make_input_matrix(x);
  Tensor out(DType::F32, {m.rows, m.cols});
  float* o = out.data_as<float>();
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) o[r * m.cols + c] = m.at(r, c);
  }
  return out;
}

}  // namespace microscale
