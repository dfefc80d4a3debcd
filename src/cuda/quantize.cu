// microscale::cuda::quantize: the CPU backend's argument checks (core/quantize_checks.hpp), the
// caller's output buffers checked against quantized_shapes(), then the launches on the stream:
// NVFP4 = amax pass + one quantize kernel; MX = one quantize kernel.
#include "core/input_matrix.hpp"
#include "core/quantize_checks.hpp"
#include "core/require.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launchers.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"
#include "microscale/layout.hpp"

namespace microscale::cuda {
namespace {

uint8_t* checked_output(const TensorView& t, const std::vector<int64_t>& shape, const char* what) {
  if (t.device != Device::CUDA) throw Error(std::string("output ") + what + " must be a CUDA tensor");
  if (t.dtype != DType::U8) throw Error(std::string("output ") + what + " must be u8");
  if (!t.is_contiguous()) throw Error(std::string("output ") + what + " must be contiguous");
  if (t.shape != shape) {
    throw Error(std::string("output ") + what + " must be " + shape_string(shape) + ", got " +
                shape_string(t.shape));
  }
  if (t.data == nullptr) throw Error(std::string("output ") + what + " has a null data pointer");
  return static_cast<uint8_t*>(t.data);
}

// Zero the swizzled padding the kernels do not visit (rows past the tensor up to a multiple of 128).
void clear_padding(const TensorView& scale, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (swizzled_rows(rows) == rows && swizzled_cols(cols) == cols) return;
  MICROSCALE_CUDA_CHECK(cudaMemsetAsync(scale.data, 0, static_cast<size_t>(scale.numel()), stream));
}

}  // namespace

void quantize(const TensorView& input, const QuantizeOptions& o, const QuantizedViews& outputs,
              void* stream_ptr) {
  const InputMatrix x = make_input_matrix(input, Device::CUDA);
  validate_quantize(x, o);
  const QuantizedShapes s = quantized_shapes(input.shape, o);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  OutputPointers out;
  if (o.rowwise) {
    out.rowwise_data = checked_output(outputs.rowwise_data, s.rowwise_data, "rowwise_data");
    out.rowwise_scale = checked_output(outputs.rowwise_scale, s.rowwise_scale, "rowwise_scale");
  }
  if (o.columnwise) {
    out.columnwise_data = checked_output(outputs.columnwise_data, s.columnwise_data, "columnwise_data");
    out.columnwise_scale = checked_output(outputs.columnwise_scale, s.columnwise_scale, "columnwise_scale");
  }
  const bool nvfp4 = o.scheme == Scheme::NVFP4;
  if (nvfp4 && outputs.amax == nullptr)
    throw Error(o.row_scaled
                    ? "row-scaled nvfp4 needs a device amax buffer of 2 + M + K floats (outputs.amax)"
                    : "nvfp4 needs a device amax buffer of 2 floats (outputs.amax)");
  out.amax = outputs.amax;
  const int block = block_size(o.scheme);
  if (o.scale_layout == ScaleLayout::Swizzled) {
    if (o.rowwise) clear_padding(outputs.rowwise_scale, x.rows, x.cols / block, stream);
    if (o.columnwise) clear_padding(outputs.columnwise_scale, x.cols, x.rows / block, stream);
  }
  const DeviceMatrix d = device_matrix(x);
  if (nvfp4) {
    if (o.row_scaled) {
      launch_nvfp4_row_scaled_amax(d, x.dtype, o, out.amax, stream);
    } else {
      launch_nvfp4_amax(d, x.dtype, o, out.amax, stream);
    }
    if (o.four_over_six != FourOverSix::Off) {
      launch_nvfp4_four_over_six(d, x.dtype, o, out, stream);
    } else {
      launch_nvfp4_quantize(d, x.dtype, o, out, stream);
    }
  } else {
    launch_mx_quantize(d, x.dtype, o, out, stream);
  }
}

}  // namespace microscale::cuda
