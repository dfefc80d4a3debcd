// The GEMM's epilogue kernel over fp32 sums in the workspace, shared by both paths: a split K's
// second kernel on the fused path (each element's slices added in split order, the same sum
// whatever order the blocks ran in), and the expanded path's last step (one slice, cuBLAS's
// product).
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_params.hpp"

namespace microscale::cuda {
namespace {

// Work unit: kUnitColumns columns of one output row; thread t takes columns t, t + 256, ... of
// it, so each step of a warp reads and writes contiguous elements. Its batch, row and columns are
// found once per unit, and a split K's few rows (M = 128) still spread over many blocks. With one
// column per thread (a unit of 256 columns) the 64-bit divisions and the blocks' own start-up,
// once per element, made the kernel ~5x slower than its bytes (perf.md).
constexpr int kEpilogueThreads = 256;
constexpr int kColumnsPerThread = 8;
constexpr int kUnitColumns = kEpilogueThreads * kColumnsPerThread;
__global__ void gemm_epilogue_kernel(const __grid_constant__ GemmDeviceParams p) {
  const float alpha = effective_alpha(p);
  const int64_t total = p.batches * p.m * p.n, chunks = (p.n + kUnitColumns - 1) / kUnitColumns;
  for (int64_t unit = blockIdx.x; unit < p.batches * p.m * chunks; unit += gridDim.x) {
    const int64_t r = unit / chunks, l = r / p.m, row = r % p.m;
    const int64_t first = (unit % chunks) * kUnitColumns + threadIdx.x;
    const float* sums = p.workspace + r * p.n;  // slice 0's row; slice s's is s * total further
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const int64_t col = first + j * kEpilogueThreads;
      if (col >= p.n) break;
      float sum = sums[col];
      for (int64_t s = 1; s < p.splits; ++s) sum = sum + sums[s * total + col];
      store_result(p, row, col, l, alpha * sum);
    }
  }
}

}  // namespace

void launch_gemm_epilogue(const GemmDeviceParams& p, cudaStream_t stream) {
  const int64_t units = p.batches * p.m * ((p.n + kUnitColumns - 1) / kUnitColumns);
  const int64_t blocks = std::min<int64_t>(units, int64_t{1} << 20);
  gemm_epilogue_kernel<<<static_cast<unsigned>(blocks), kEpilogueThreads, 0, stream>>>(p);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
