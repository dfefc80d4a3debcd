// The expanded path of the CUDA GEMM (src/cuda/gemm_expanded.cu): exact bf16 copies of both
// operands, cuBLAS's BF16 GEMM with fp32 accumulation, the epilogue. Takes every block-scaled
// pair the CPU GEMM takes (NVFP4 x NVFP4, MX x MX of any element formats; K-major or MX
// columnwise operands).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm_params.hpp"

namespace microscale::cuda {

/// D = alpha' * A B^T (+ beta C) (+ bias) on `stream`, in `workspace` when it holds
/// expanded_gemm_workspace_bytes, else in memory from the stream-ordered pool.
void launch_expanded_gemm(const GemmDeviceParams& p, cudaStream_t stream, void* workspace,
                          size_t workspace_bytes);

/// Enough workspace for any operands, C, bias and D of an M x N x K GEMM with `batches` batches.
size_t expanded_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches);

}  // namespace microscale::cuda
