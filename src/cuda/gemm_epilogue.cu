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

// Work unit: kEpilogueColumns columns of one output row, a column per thread; its batch, row and
// columns are found once per unit, not per element (per-element 64-bit divisions made the kernel
// 2x slower), and a split K's few rows (M = 128) still spread over many blocks.
constexpr int kEpilogueColumns = 256;
__global__ void gemm_epilogue_kernel(const __grid_constant__ GemmDeviceParams p) {
  const float alpha = effective_alpha(p);
  const int64_t total = p.batches * p.m * p.n, chunks = (p.n + kEpilogueColumns - 1) / kEpilogueColumns;
  for (int64_t unit = blockIdx.x; unit < p.batches * p.m * chunks; unit += gridDim.x) {
    const int64_t r = unit / chunks, l = r / p.m, row = r % p.m;
    const int64_t col = (unit % chunks) * kEpilogueColumns + threadIdx.x;
    if (col >= p.n) continue;
    const float* sums = p.workspace + r * p.n;  // slice 0's row; slice s's is s * total further
    float sum = sums[col];
    for (int64_t s = 1; s < p.splits; ++s) sum = sum + sums[s * total + col];
    store_result(p, row, col, l, alpha * sum);
  }
}

}  // namespace

void launch_gemm_epilogue(const GemmDeviceParams& p, cudaStream_t stream) {
  const int64_t units = p.batches * p.m * ((p.n + kEpilogueColumns - 1) / kEpilogueColumns);
  const int64_t blocks = std::min<int64_t>(units, int64_t{1} << 20);
  gemm_epilogue_kernel<<<static_cast<unsigned>(blocks), kEpilogueColumns, 0, stream>>>(p);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
