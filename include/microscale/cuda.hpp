// microscale/cuda.hpp — the CUDA backend (sm_90a, Hopper): quantize, dequantize and swizzle on the
// device, into buffers the caller allocated (a PyTorch frontend passes its allocator's tensors).
//
// Same numerics as the CPU backend, byte for byte (data, scales, amaxes, stochastic rounding).
// Every call is asynchronous on `stream` (a cudaStream_t; nullptr = the legacy default stream);
// arguments are checked on the host before anything is launched, and launch failures throw
// microscale::Error. No managed memory, no allocation: scratch needs none.
#pragma once

#include <cstdint>
#include <vector>

#include "microscale/quantize.hpp"
#include "microscale/tensor.hpp"

namespace microscale::cuda {

/// @brief Caller-allocated device outputs of a quantization (u8, contiguous, Device::CUDA),
/// shaped as quantized_shapes(input.shape, options) gives them. Outputs not asked for are ignored.
struct QuantizedViews {
  TensorView rowwise_data, rowwise_scale;
  TensorView columnwise_data, columnwise_scale;
  /// NVFP4: device fp32 [2] = {rowwise amax, columnwise amax} (written by quantize, read by
  /// dequantize); the override from the options when given. Unused for MX (may be null).
  float* amax = nullptr;
};

/// @brief Quantizes a device tensor; bit-exact with microscale::quantize_ref.
void quantize(const TensorView& input, const QuantizeOptions& options, const QuantizedViews& outputs,
              void* stream);

/// @brief Dequantizes one usage of `q` (quantized from an input of `shape` with `options`) into
/// `output` (device, contiguous, f32/bf16/f16): [M, K], or for NVFP4 columnwise X^T [K, M].
/// Same values as microscale::dequantize.
void dequantize(const QuantizedViews& q, const std::vector<int64_t>& shape, const QuantizeOptions& options,
                Usage usage, const TensorView& output, void* stream);

/// @brief Compact u8 [R, C] -> the 128x4 swizzled layout u8 [roundup(R,128), roundup(C,4)] (zero
/// padding), both on the device.
void swizzle_scales(const TensorView& compact, const TensorView& swizzled, void* stream);

/// @brief Visible CUDA devices (0 without a driver or device).
int device_count();

}  // namespace microscale::cuda
