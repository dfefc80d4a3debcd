// The skinny MXFP8 x MXFP8 GEMM kernel's launcher (src/cuda/gemm_mx_skinny.cu), called by
// cuda::gemm (src/cuda/gemm.cu) for two K-major MXFP8 operands (E4M3 or E5M2, either way) whose A
// has few rows: decode with an MXFP8 weight.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm_params.hpp"

namespace microscale::cuda {

/// D = alpha * A B^T (+ beta C) (+ bias) on `stream`. A split K sums into `workspace` when it holds
/// mx_skinny_workspace_bytes, else into memory from the stream-ordered pool. The operands are as
/// cuda::gemm checks them for this kernel: rows of codes 16-byte aligned (cp.async copies of 16
/// bytes); compact scale rows and swizzled scales 2-byte aligned, compact rows of an even number of
/// scales (a thread reads a row's two block scales of a chunk as one 16-bit word: K % 64 = 0, or
/// swizzled scales); a batch's codes and scales within 2 GiB (the kernel's 32-bit offsets).
void launch_mx_skinny_gemm(const GemmDeviceParams& p, cudaStream_t stream, void* workspace,
                           size_t workspace_bytes);

/// The split-K workspace of an M x N x K GEMM with `batches` batches on the current device.
size_t mx_skinny_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches);

}  // namespace microscale::cuda
