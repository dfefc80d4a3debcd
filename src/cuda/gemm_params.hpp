// The CUDA GEMM's operands and problem as its kernels read them (both paths: the fused NVFP4
// kernel, src/cuda/gemm_nvfp4.cu, and the expanded path, src/cuda/gemm_expanded.cu), filled by
// cuda::gemm (src/cuda/gemm.cu) once the operands and the epilogue tensors are checked; and the
// epilogue launcher both paths finish with.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "microscale/quantize.hpp"
#include "microscale/tensor.hpp"

namespace microscale::cuda {

/// One block-scaled operand [rows, K(, L)] on the device. Codes are stored in rows of bytes:
/// K-major ([rows, K], FP4 two codes per byte: [rows, K/2]) or, for an MX columnwise output,
/// transposed ([K, rows], FP4 [K, rows/2]).
struct GemmDeviceOperand {
  Scheme scheme = Scheme::NVFP4;
  bool stored_transposed = false;
  const uint8_t* data = nullptr;
  int64_t row_bytes = 0;    ///< byte step between stored rows of data
  int64_t batch_bytes = 0;  ///< byte step between batches of data
  const uint8_t* scales = nullptr;
  bool swizzled = false;          ///< the 128x4 layout of the logical [rows, K/block] (one image per batch)
  int64_t scale_row_bytes = 0;    ///< compact: byte step between stored rows of scales
  int64_t scale_batch_bytes = 0;  ///< byte step between batches of scales
  const float* amax = nullptr;    ///< NVFP4 device global amax, or null (then `amax_value` if has_amax)
  bool has_amax = false;
  float amax_value = 0.0f;
  int e4m3_max = 448;  ///< NVFP4: the bound of the global scale (GemmOperand::nvfp4_e4m3_max)
};

/// A 2-D or 3-D epilogue tensor: element (m, n, l) at m*s0 + n*s1 + l*s2 (elements).
struct EpilogueTensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t strides[3] = {0, 0, 0};
};

struct GemmDeviceParams {
  GemmDeviceOperand a, b;  ///< A [M, K(, L)], B [N, K(, L)]
  int64_t m = 0, n = 0, k = 0, batches = 1;
  float alpha = 1.0f, beta = 0.0f;
  EpilogueTensor d;
  bool has_c = false;
  EpilogueTensor c;
  const void* bias = nullptr;  ///< [N], contiguous, or null
  DType bias_dtype = DType::F32;
  // Set by the launchers (the fused and skinny ones by gemm_split.hpp, in units of their own K
  // tiles; the expanded one: 1 split, the fp32 product as its slice): K split `splits` ways,
  // `tiles_per_split` K tiles each, the partial sums in `workspace` ([splits, L, M, N] fp32) when
  // split.
  int64_t splits = 1, tiles_per_split = 0;
  float* workspace = nullptr;
};

/// Whether `p` is a multiple of `bytes` (the operand and epilogue checks of both paths).
inline bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

/// The epilogue over fp32 sums already in p.workspace ([splits, L, M, N], true sums, not scaled):
/// each element's slices added in split order, then alpha' (+ beta C) (+ bias) into D.
void launch_gemm_epilogue(const GemmDeviceParams& p, cudaStream_t stream);

}  // namespace microscale::cuda
