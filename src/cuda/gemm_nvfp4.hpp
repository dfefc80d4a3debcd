// The NVFP4 x NVFP4 GEMM kernel's parameters and launcher (src/cuda/gemm_nvfp4.cu), called by
// cuda::gemm (src/cuda/gemm.cu) once the operands and the epilogue tensors are checked.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "microscale/tensor.hpp"

namespace microscale::cuda {

/// One K-major NVFP4 operand [rows, K(, L)] on the device, as the kernel reads it.
struct Nvfp4GemmOperand {
  const uint8_t* data = nullptr;  ///< codes, two per byte: [rows, K/2]; rows 16-byte aligned
  int64_t row_bytes = 0;          ///< byte step between rows of data (a multiple of 16)
  int64_t batch_bytes = 0;        ///< byte step between batches of data
  const uint8_t* scales = nullptr;
  bool swizzled = false;          ///< the 128x4 layout (one image per batch) instead of compact
  int64_t scale_row_bytes = 0;    ///< compact: byte step between rows (a multiple of 4)
  int64_t scale_batch_bytes = 0;  ///< byte step between batches of scales
  const float* amax = nullptr;    ///< device global amax, or null (then `amax_value` if has_amax)
  bool has_amax = false;
  float amax_value = 0.0f;
};

/// A 2-D or 3-D epilogue tensor: element (m, n, l) at m*s0 + n*s1 + l*s2 (elements).
struct EpilogueTensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t strides[3] = {0, 0, 0};
};

struct Nvfp4GemmParams {
  Nvfp4GemmOperand a, b;  ///< A [M, K(, L)], B [N, K(, L)]
  int64_t m = 0, n = 0, k = 0, batches = 1;
  float alpha = 1.0f, beta = 0.0f;
  EpilogueTensor d;
  bool has_c = false;
  EpilogueTensor c;
  const void* bias = nullptr;  ///< [N], contiguous, or null
  DType bias_dtype = DType::F32;
  // Set by the launchers (the fused one by gemm_split.hpp; the expanded one: 1 split, the fp32
  // product as its slice): K split `splits` ways, `tiles_per_split` K tiles
  // each, the partial sums in `workspace` ([splits, L, M, N] fp32) when split.
  int64_t splits = 1, tiles_per_split = 0;
  float* workspace = nullptr;
};

/// K must be a multiple of kNvfp4GemmK (the kernel's K tile).
inline constexpr int64_t kNvfp4GemmK = 64;

/// D = alpha' * A B^T (+ beta C) (+ bias) on `stream`; alpha' folds in the operands' amaxes. A
/// split K sums into `workspace` when it holds nvfp4_gemm_workspace_bytes, else into memory from
/// the stream-ordered pool.
void launch_nvfp4_gemm(const Nvfp4GemmParams& p, cudaStream_t stream, void* workspace,
                       size_t workspace_bytes);

/// The split-K workspace of an M x N x K GEMM with `batches` batches on the current device.
size_t nvfp4_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches);

/// The epilogue over fp32 sums already in p.workspace ([splits, L, M, N], true sums, not scaled):
/// each element's slices added in split order, then alpha' (+ beta C) (+ bias) into D.
void launch_gemm_epilogue(const Nvfp4GemmParams& p, cudaStream_t stream);

/// The expanded path (src/cuda/gemm_expanded.cu): bf16 copies of A and B, cuBLAS, the epilogue.
void launch_expanded_nvfp4_gemm(const Nvfp4GemmParams& p, cudaStream_t stream, void* workspace,
                                size_t workspace_bytes);
size_t expanded_nvfp4_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches);

}  // namespace microscale::cuda
