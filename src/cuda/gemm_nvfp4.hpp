// The fused NVFP4 x NVFP4 GEMM kernel's launcher (src/cuda/gemm_nvfp4.cu), called by cuda::gemm
// (src/cuda/gemm.cu) for two NVFP4 operands whose K is a multiple of kNvfp4GemmK.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm_params.hpp"

namespace microscale::cuda {

/// K must be a multiple of kNvfp4GemmK (the kernel's K tile); rows of codes 16-byte aligned.
inline constexpr int64_t kNvfp4GemmK = 64;

/// D = alpha' * A B^T (+ beta C) (+ bias) on `stream`; alpha' folds in the operands' amaxes. A
/// split K sums into `workspace` when it holds nvfp4_gemm_workspace_bytes, else into memory from
/// the stream-ordered pool.
void launch_nvfp4_gemm(const GemmDeviceParams& p, cudaStream_t stream, void* workspace,
                       size_t workspace_bytes);

/// The split-K workspace of an M x N x K GEMM with `batches` batches on the current device.
size_t nvfp4_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches);

}  // namespace microscale::cuda
