// The skinny NVFP4 x NVFP4 GEMM kernel's launcher (src/cuda/gemm_nvfp4_skinny.cu), called by
// cuda::gemm (src/cuda/gemm.cu) for two NVFP4 operands whose A has few rows (decode-like: a
// handful of tokens against a weight) and whose K is a multiple of kNvfp4SkinnyK.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm_params.hpp"

namespace microscale::cuda {

/// K must be a multiple of kNvfp4SkinnyK (one thread's 16 bytes of codes); rows of codes 16-byte
/// aligned, compact scale rows and swizzled scales 2-byte aligned (a thread's two block scales are
/// one 16-bit load).
inline constexpr int64_t kNvfp4SkinnyK = 32;

/// The rows of A (M) up to which GemmPath::Auto takes the skinny kernel: past them it reads B
/// once per 32 rows of A, and the fused kernel's 128-row tiles do better (docs/perf.md, "A skinny
/// kernel for few rows of A").
inline constexpr int64_t kSkinnyMaxRows = 32;

/// Grid rows of the launch: A's rows in steps of 8 (M <= 8), 16 (M <= 16) or 32.
int64_t skinny_row_steps(int64_t m);

/// D = alpha' * A B^T (+ beta C) (+ bias) on `stream`; alpha' folds in the operands' amaxes. A
/// split K sums into `workspace` when it holds nvfp4_skinny_workspace_bytes, else into memory
/// from the stream-ordered pool.
void launch_nvfp4_skinny_gemm(const GemmDeviceParams& p, cudaStream_t stream, void* workspace,
                              size_t workspace_bytes);

/// The split-K workspace of an M x N x K GEMM with `batches` batches on the current device.
size_t nvfp4_skinny_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches);

}  // namespace microscale::cuda
