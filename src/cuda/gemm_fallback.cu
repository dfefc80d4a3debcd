// The expanded path's exact fallback: a plain tiled fp32 GEMM over the operands' values, read
// straight from their codes and scales. The expanded path launches it after cuBLAS when an operand
// may hold values that bf16 cannot (MX E4M3 or E5M2 blocks with scales below 2^-124 or 2^-117,
// whose products fall below bf16's subnormal step of 2^-133); it returns at once unless the copy
// kernels found such a value, so a normal call pays one launch. When it runs, it recomputes every
// sum (slowly, on the CUDA cores) and writes the expanded path's result in cuBLAS's place: the fp32
// product for the epilogue, or D = alpha' * sum when cuBLAS wrote D.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_fallback.hpp"
#include "cuda/gemm_operand_values.cuh"

namespace microscale::cuda {
namespace {

constexpr int kTile = 16;  // a CUDA block computes a kTile x kTile tile of D, a thread one element

struct FallbackParams {
  GemmDeviceParams p;
  int a_block, b_block;
  bool a_packed, b_packed;
  const int* inexact;  // the copy kernels' flag
  bool direct;         // write D = alpha' * sum (else p.workspace = the fp32 sums)
};

__global__ void exact_fallback_kernel(const __grid_constant__ FallbackParams f) {
  if (*f.inexact == 0) return;  // the same for every thread of the block
  __shared__ float a_tile[kTile][kTile + 1], b_tile[kTile][kTile + 1];
  const GemmDeviceParams& p = f.p;
  const int64_t l = blockIdx.y, tiles_n = (p.n + kTile - 1) / kTile;
  const int64_t tiles = ((p.m + kTile - 1) / kTile) * tiles_n;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t m0 = (t / tiles_n) * kTile, n0 = (t % tiles_n) * kTile;
    const int64_t ra = m0 + threadIdx.y, rb = n0 + threadIdx.y;
    float sum = 0.0f;
    for (int64_t k0 = 0; k0 < p.k; k0 += kTile) {  // K is a multiple of the block size (16 or 32)
      __syncthreads();                             // the last step's tiles are read
      a_tile[threadIdx.y][threadIdx.x] =
          ra < p.m ? operand_value(p.a, p.k, f.a_block, f.a_packed, l, ra, k0 + threadIdx.x) : 0.0f;
      b_tile[threadIdx.y][threadIdx.x] =
          rb < p.n ? operand_value(p.b, p.k, f.b_block, f.b_packed, l, rb, k0 + threadIdx.x) : 0.0f;
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTile; ++kk) sum = sum + a_tile[threadIdx.y][kk] * b_tile[threadIdx.x][kk];
    }
    const int64_t row = m0 + threadIdx.y, col = n0 + threadIdx.x;
    if (row >= p.m || col >= p.n) continue;
    if (f.direct) {
      store_value(p.d.data, p.d.dtype, row * p.d.strides[0] + col * p.d.strides[1] + l * p.d.strides[2],
                  effective_alpha(p) * sum);
    } else {
      p.workspace[(l * p.m + row) * p.n + col] = sum;
    }
  }
}

}  // namespace

bool may_not_fit_bf16(const GemmDeviceOperand& op) {
  if (op.scheme == Scheme::NVFP4) return false;  // E2M1 x E4M3: at least 2^-10
  // The element format's smallest step (its smallest subnormal, code 1) at the smallest scale.
  return decode(element_format(op.scheme), 1) * 0x1p-127f < 0x1p-133f;
}

void launch_exact_fallback(const GemmDeviceParams& p, const int* inexact, bool direct, cudaStream_t stream) {
  FallbackParams f{};
  f.p = p;
  f.a_block = block_size(p.a.scheme);
  f.b_block = block_size(p.b.scheme);
  f.a_packed = element_format(p.a.scheme) == Format::E2M1;
  f.b_packed = element_format(p.b.scheme) == Format::E2M1;
  f.inexact = inexact;
  f.direct = direct;
  const int64_t tiles = ((p.m + kTile - 1) / kTile) * ((p.n + kTile - 1) / kTile);
  // Few blocks: they return at once in the common case; when they run, each walks many tiles.
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, 1024)), static_cast<unsigned>(p.batches));
  exact_fallback_kernel<<<grid, dim3(kTile, kTile), 0, stream>>>(f);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
