// Host-side launchers of the CUDA quantize kernels (one per .cu file), called by quantize.cu after
// the arguments are checked. Pointers are device pointers; outputs not asked for are null.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "microscale/quantize.hpp"

namespace microscale::cuda {

struct DeviceMatrix;

struct OutputPointers {
  uint8_t* rowwise_data = nullptr;
  uint8_t* rowwise_scale = nullptr;
  uint8_t* columnwise_data = nullptr;
  uint8_t* columnwise_scale = nullptr;
  float* amax = nullptr;  // NVFP4: [rowwise, columnwise], and row-scaled: then M + K amaxes per row
};

/// NVFP4: writes amax[0..1] (override or computed; RHT amax through the transform).
void launch_nvfp4_amax(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o, float* amax,
                       cudaStream_t stream);
/// Row-scaled NVFP4, each direction asked for: amax[2 + m] = max|X[m, :]| and amax[0] their largest
/// (rowwise), amax[2 + M + k] = max|X[:, k]| and amax[1] their largest (columnwise), the rest 0; in
/// place of launch_nvfp4_amax.
void launch_nvfp4_row_scaled_amax(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o, float* amax,
                                  cudaStream_t stream);
/// NVFP4: data and scales of both directions from one read of the input (amaxes already written).
void launch_nvfp4_quantize(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o,
                           const OutputPointers& out, cudaStream_t stream);
/// NVFP4 with 4over6 (o.four_over_six set), in place of launch_nvfp4_quantize.
void launch_nvfp4_four_over_six(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o,
                                const OutputPointers& out, cudaStream_t stream);
/// MX: data and scales of both directions from one read of the input.
void launch_mx_quantize(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o,
                        const OutputPointers& out, cudaStream_t stream);

}  // namespace microscale::cuda
