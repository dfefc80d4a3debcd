// Dequantization on the device: one thread per output element, the same fp32 arithmetic as
// microscale::dequantize (core/quantize.cpp). Code values come from the host's format table
// (microscale::decode, exact), passed by value and read through shared memory.
#include <cmath>

#include "core/scale_math.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"

namespace microscale::cuda {
namespace {

struct DequantParams {
  float values[256];  // element code -> value
  float e4m3[256];    // NVFP4 scale code -> value
  const uint8_t* data;
  const uint8_t* scale;
  const float* amax;        // NVFP4: the usage's amax
  const float* row_amaxes;  // row-scaled NVFP4: the usage's amax per row, in place of *amax
  int e4m3_max;             // NVFP4: S_enc = 6 * e4m3_max / amax
  void* out;
  DType out_dtype;
  int64_t rows, cols, data_cols;
  int block;
  bool nvfp4, packed, mx_columnwise, swizzled;
  int64_t scale_cols;  // columns of the (compact, or swizzled-as) scale matrix
};

__global__ void dequantize_kernel(const __grid_constant__ DequantParams p) {
  __shared__ float values[256];
  __shared__ float e4m3[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) values[i] = p.values[i];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) e4m3[i] = p.e4m3[i];
  __syncthreads();
  const float tensor_s_dec = p.nvfp4 ? 1.0f / nvfp4_global_encode_scale(*p.amax, p.e4m3_max) : 0.0f;
  const int64_t total = p.rows * p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.cols, c = i % p.cols;
    uint8_t code = p.data[r * p.data_cols + (p.packed ? c / 2 : c)];
    if (p.packed) code = (c % 2 == 0) ? (code & 0x0F) : static_cast<uint8_t>(code >> 4);
    int64_t o;
    if (p.mx_columnwise) {
      // compact [M/32, K]; swizzled as the transpose [K, M/32]
      o = p.swizzled ? scale_offset(c, r / p.block, p.scale_cols, true) : (r / p.block) * p.cols + c;
    } else {
      o = scale_offset(r, c / p.block, p.scale_cols, p.swizzled);
    }
    const uint8_t s = p.scale[o];
    float value;
    if (p.nvfp4) {
      const float s_dec = p.row_amaxes == nullptr
                              ? tensor_s_dec
                              : 1.0f / nvfp4_global_encode_scale(p.row_amaxes[r], p.e4m3_max);
      value = values[code] * (e4m3[s] * s_dec);
    } else {
      value = s == 0xFF ? bits_to_float(0x7FC00000u)
                        : values[code] * (s == 0 ? bits_to_float(0x00400000u)
                                                 : bits_to_float(static_cast<uint32_t>(s) << 23));
    }
    switch (p.out_dtype) {
      case DType::F32: static_cast<float*>(p.out)[i] = value; break;
      case DType::BF16: static_cast<uint16_t*>(p.out)[i] = float_to_bf16(value); break;
      default: static_cast<uint16_t*>(p.out)[i] = float_to_half(value); break;
    }
  }
}

void require_device(const TensorView& t, DType dtype, const std::vector<int64_t>& shape, const char* what) {
  if (t.device != Device::CUDA) throw Error(std::string(what) + " must be a CUDA tensor");
  if (t.dtype != dtype) throw Error(std::string(what) + " must be " + std::string(dtype_name(dtype)));
  if (!t.is_contiguous()) throw Error(std::string(what) + " must be contiguous");
  if (t.shape != shape)
    throw Error(std::string(what) + " must be " + shape_string(shape) + ", got " + shape_string(t.shape));
  if (t.data == nullptr) throw Error(std::string(what) + " has a null data pointer");
}

}  // namespace

void dequantize(const QuantizedViews& q, const std::vector<int64_t>& shape, const QuantizeOptions& o,
                Usage usage, const TensorView& output, void* stream) {
  const QuantizedShapes s = quantized_shapes(shape, o);
  const bool rowwise = usage == Usage::Rowwise;
  if (rowwise ? !o.rowwise : !o.columnwise) {
    throw Error(std::string("this quantized tensor has no ") + (rowwise ? "rowwise" : "columnwise") +
                " data");
  }
  if (output.dtype == DType::U8) throw Error("dequantize output dtype must be f32, bf16 or f16");
  const bool nvfp4 = o.scheme == Scheme::NVFP4;
  const Format format = element_format(o.scheme);
  const bool transposed = nvfp4 && !rowwise;
  const int64_t rows = transposed ? s.cols : s.rows, cols = transposed ? s.rows : s.cols;
  require_device(rowwise ? q.rowwise_data : q.columnwise_data, DType::U8,
                 rowwise ? s.rowwise_data : s.columnwise_data, "quantized data");
  require_device(rowwise ? q.rowwise_scale : q.columnwise_scale, DType::U8,
                 rowwise ? s.rowwise_scale : s.columnwise_scale, "quantized scales");
  require_device(output, output.dtype, {rows, cols}, "dequantize output");
  if (nvfp4 && q.amax == nullptr) throw Error("nvfp4 dequantize needs the device amax pointer");
  if (o.nvfp4_e4m3_max != 448 && !(nvfp4 && o.nvfp4_e4m3_max == 256))
    throw Error("nvfp4_e4m3_max must be 448, or 256 for nvfp4; got " + std::to_string(o.nvfp4_e4m3_max));

  DequantParams p{};
  const int code_count = 1 << format_info(format).bits;
  for (int i = 0; i < 256; ++i) p.values[i] = i < code_count ? decode(format, static_cast<uint8_t>(i)) : 0.0f;
  for (int i = 0; i < 256; ++i) p.e4m3[i] = decode(Format::E4M3, static_cast<uint8_t>(i));
  p.data = static_cast<const uint8_t*>((rowwise ? q.rowwise_data : q.columnwise_data).data);
  p.scale = static_cast<const uint8_t*>((rowwise ? q.rowwise_scale : q.columnwise_scale).data);
  p.amax = nvfp4 ? q.amax + (rowwise ? 0 : 1) : nullptr;
  // Row-scaled: q.amax is [2 | M rows of X | K rows of X^T] (QuantizedViews::amax).
  if (nvfp4 && o.row_scaled) p.row_amaxes = q.amax + 2 + (rowwise ? 0 : s.rows);
  p.e4m3_max = o.nvfp4_e4m3_max;
  p.out = output.data;
  p.out_dtype = output.dtype;
  p.rows = rows;
  p.cols = cols;
  p.packed = format == Format::E2M1;
  p.data_cols = p.packed ? cols / 2 : cols;
  p.block = block_size(o.scheme);
  p.nvfp4 = nvfp4;
  p.mx_columnwise = !nvfp4 && !rowwise;
  p.swizzled = o.scale_layout == ScaleLayout::Swizzled;
  p.scale_cols = p.mx_columnwise ? (p.swizzled ? s.rows / p.block : s.cols) : cols / p.block;
  const int64_t total = rows * cols;
  const int64_t blocks = (total + 255) / 256;
  dequantize_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0,
                      static_cast<cudaStream_t>(stream)>>>(p);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
