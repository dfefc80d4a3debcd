// The CUDA GEMM's epilogue on the device, shared by its paths (the fused and skinny kernels, the
// expanded path's finishing kernel and its exact fallback): alpha with the NVFP4 global scales folded in,
// then D = alpha' * sum (+ beta C) (+ bias) in core/gemm.cpp's order, read and written in any
// float dtype.
#pragma once

#include <cstdint>

#include "core/scale_math.hpp"
#include "cuda/gemm_params.hpp"
#include "microscale/half.hpp"

namespace microscale::cuda {

__device__ __forceinline__ float load_value(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_value(void* p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_half(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// D[row, col, l] = v (+ beta C) (+ bias), in core/gemm.cpp's order; v is alpha' times the sum.
__device__ __forceinline__ void store_result(const GemmDeviceParams& p, int64_t row, int64_t col, int64_t l,
                                             float v) {
  if (p.has_c) {
    v = v + p.beta * load_value(p.c.data, p.c.dtype,
                                row * p.c.strides[0] + col * p.c.strides[1] + l * p.c.strides[2]);
  }
  if (p.bias) v = v + load_value(p.bias, p.bias_dtype, col);
  store_value(p.d.data, p.d.dtype, row * p.d.strides[0] + col * p.d.strides[1] + l * p.d.strides[2], v);
}

// alpha with the global scales folded in, in core/gemm.cpp's order. On the host only where no amax
// is a device pointer.
__host__ __device__ __forceinline__ float effective_alpha(const GemmDeviceParams& p) {
  const bool a_global = p.a.has_amax, b_global = p.b.has_amax;
  const float amax_a = p.a.amax ? *p.a.amax : p.a.amax_value;
  const float amax_b = p.b.amax ? *p.b.amax : p.b.amax_value;
  if (a_global && b_global) return nvfp4_gemm_alpha(p.alpha, amax_a, p.a.e4m3_max, amax_b, p.b.e4m3_max);
  if (a_global) return nvfp4_gemm_alpha(p.alpha, amax_a, p.a.e4m3_max);
  if (b_global) return nvfp4_gemm_alpha(p.alpha, amax_b, p.b.e4m3_max);
  return p.alpha;
}

}  // namespace microscale::cuda
