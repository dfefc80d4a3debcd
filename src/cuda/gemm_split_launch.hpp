// What the two split-K GEMM kernels' launchers share (gemm_nvfp4.cu, gemm_nvfp4_skinny.cu): the
// SM count their splits are chosen for, the bytes of the split's fp32 slices, and the slices'
// workspace set into the kernel's parameters.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/gemm_params.hpp"
#include "cuda/gemm_split.hpp"
#include "cuda/stream_workspace.hpp"

namespace microscale::cuda {

/// SMs of the current device.
inline int multiprocessor_count() {
  int device = 0, count = 0;
  MICROSCALE_CUDA_CHECK(cudaGetDevice(&device));
  MICROSCALE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

/// The split's fp32 slices, [splits, L, M, N]; none without a split.
inline size_t split_slices_bytes(const GemmSplit& s, int64_t m, int64_t n, int64_t batches) {
  return s.splits > 1 ? static_cast<size_t>(s.splits * batches * m * n) * sizeof(float) : 0;
}

/// Sets `split` into `p` and points p.workspace at its slices: `workspace` when it holds them, else
/// memory from the stream-ordered pool, given back on the stream when this object goes.
class SplitWorkspace {
 public:
  SplitWorkspace(GemmDeviceParams& p, const GemmSplit& split, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream)
      : scratch_(split_slices_bytes(split, p.m, p.n, p.batches), workspace, workspace_bytes, stream) {
    p.splits = split.splits;
    p.tiles_per_split = split.tiles_per_split;
    p.workspace = reinterpret_cast<float*>(scratch_.data());
  }

 private:
  StreamWorkspace scratch_;
};

}  // namespace microscale::cuda
