// The GEMM's epilogue kernel over fp32 sums in the workspace, shared by the paths: a split K's
// second kernel on the fused and skinny paths (each element's slices added in split order, the same sum
// whatever order the blocks ran in), and the expanded path's last step (one slice, cuBLAS's
// product). Two forms: a Linear's fprop (no C, D's rows contiguous, N % 4 == 0) takes four
// columns per thread with vector loads and stores; every other epilogue (C, strided or unaligned D)
// the general form. perf.md (fortieth session) has their figures: 4096^3 bf16 with a bias, the
// bias cost 146 us with a column per thread, 79 us with eight, 43 us with quads.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_params.hpp"
#include "microscale/half.hpp"
#include "microscale/tensor.hpp"

namespace microscale::cuda {
namespace {

// Work unit: kUnitColumns columns of one output row; thread t takes columns t, t + 256, ... of
// it, so each step of a warp reads and writes contiguous elements. Its batch, row and columns are
// found once per unit (64-bit divisions), and a split K's few rows (M = 128) still spread over
// many blocks. Units of 256 columns, one per thread, paid the divisions and a block's start-up per
// element: twice this form's time.
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

// A Linear's fprop (the bias alone, D's rows contiguous): four columns per thread, the sums read
// as one float4 per slice and the results written in one store. The grid's y walks the rows, its
// x a row's groups of four, so the only division is once per row a thread visits.
__device__ __forceinline__ uint32_t pack_halves(DType dtype, float lo, float hi) {
  const auto half_bits = [dtype](float v) -> uint32_t {
    return dtype == DType::BF16 ? float_to_bf16(v) : float_to_half(v);
  };
  return half_bits(lo) | (half_bits(hi) << 16);
}

__global__ void gemm_epilogue_quads_kernel(const __grid_constant__ GemmDeviceParams p) {
  const float alpha = effective_alpha(p);
  const int64_t rows = p.batches * p.m, total = rows * p.n, quads = p.n / 4;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t l = r / p.m, row = r % p.m;
    const int64_t d_row = row * p.d.strides[0] + l * p.d.strides[2];  // in elements
    for (int64_t q = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads;
         q += int64_t{gridDim.x} * blockDim.x) {
      const int64_t col = 4 * q;
      float4 sum = *reinterpret_cast<const float4*>(p.workspace + r * p.n + col);
      for (int64_t s = 1; s < p.splits; ++s) {
        const float4 slice = *reinterpret_cast<const float4*>(p.workspace + s * total + r * p.n + col);
        sum = float4{sum.x + slice.x, sum.y + slice.y, sum.z + slice.z, sum.w + slice.w};
      }
      float v[4] = {alpha * sum.x, alpha * sum.y, alpha * sum.z, alpha * sum.w};
      if (p.bias) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] + load_value(p.bias, p.bias_dtype, col + i);
      }
      if (p.d.dtype == DType::F32) {
        *reinterpret_cast<float4*>(static_cast<float*>(p.d.data) + d_row + col) =
            float4{v[0], v[1], v[2], v[3]};
      } else {
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.d.data) + d_row + col) =
            uint2{pack_halves(p.d.dtype, v[0], v[1]), pack_halves(p.d.dtype, v[2], v[3])};
      }
    }
  }
}

constexpr int kQuadThreads = 256;

// Whether gemm_epilogue_quads_kernel takes `p`: no C, D's columns contiguous, N and D's row and
// batch strides multiples of 4, D aligned to four values; the sums' rows and slices (r * N and
// s * L * M * N floats from the workspace) start on 16 bytes when the workspace does and N % 4 == 0.
bool takes_quads(const GemmDeviceParams& p) {
  const int64_t value_bytes = static_cast<int64_t>(dtype_size(p.d.dtype));
  return !p.has_c && p.d.strides[1] == 1 && p.n % 4 == 0 && p.d.strides[0] % 4 == 0 &&
         p.d.strides[2] % 4 == 0 && aligned(p.d.data, 4 * value_bytes) && aligned(p.workspace, 16);
}

}  // namespace

void launch_gemm_epilogue(const GemmDeviceParams& p, cudaStream_t stream) {
  if (takes_quads(p)) {
    // x: enough blocks for a row's quads (capped: a wide row loops); y: up to 1024 rows at once,
    // so a block visits several rows and its start-up is not paid per row.
    const int64_t rows = p.batches * p.m, quads = p.n / 4;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((quads + kQuadThreads - 1) / kQuadThreads, 64)),
                    static_cast<unsigned>(std::min<int64_t>(rows, 1024)));
    gemm_epilogue_quads_kernel<<<grid, kQuadThreads, 0, stream>>>(p);
  } else {
    const int64_t units = p.batches * p.m * ((p.n + kUnitColumns - 1) / kUnitColumns);
    const int64_t blocks = std::min<int64_t>(units, int64_t{1} << 20);
    gemm_epilogue_kernel<<<static_cast<unsigned>(blocks), kEpilogueThreads, 0, stream>>>(p);
  }
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
