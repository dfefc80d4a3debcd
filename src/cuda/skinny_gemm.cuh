// What the two skinny GEMM kernels share (gemm_nvfp4_skinny.cu for NVFP4 pairs,
// gemm_mx_skinny.cu for MXFP8 pairs): the block shape and its tilings, the tensor-core
// instruction, the launch grid and split, and the block's last step (its warps' sums added in
// warp order, then written to D or to a split's workspace slice).
//
// Both kernels compute D^T's tiles with mma.sync.m16n8k16: 16 rows of B (N) as the instruction's
// 16-row operand, 8 rows of A (M) as its 8-column one. A block is kSkinnyWarps warps over the
// same 16 * skinny_groups_n(tiles_m) rows of B and 8 * tiles_m rows of A, each warp taking every
// kSkinnyWarps-th chunk of the block's K range.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/cp_async.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_params.hpp"
#include "cuda/gemm_split.hpp"
#include "cuda/gemm_split_launch.hpp"

namespace microscale::cuda {

inline constexpr int kSkinnyWarps = 4;
inline constexpr int kSkinnyThreads = 32 * kSkinnyWarps;
// 12 warps per SM, up to 168 registers each. 8 or 16 warps, or 4 stages, measured no faster on
// the NVFP4 kernel (docs/perf.md): the SM's integer and conversion work bounds it, not memory.
inline constexpr int kSkinnyBlocksPerSm = 3;
inline constexpr int kSkinnyStages = 3;          // chunks per warp in shared memory: 1 used, 2 in flight
inline constexpr int kSkinnySplitMinChunks = 8;  // per block: each warp at least 2 chunks of a split

/// 16-row groups of B per block for `tiles_m` 8-row tiles of A: fewer where A's tiles take the
/// accumulators' registers (skinny_groups_n * tiles_m * 4 fp32 per thread).
__host__ __device__ constexpr int skinny_groups_n(int tiles_m) { return tiles_m == 4 ? 2 : 4; }

/// A's 8-row tiles per block: 1, 2 or 4 (M <= 8, <= 16, more).
inline int skinny_tiles_m(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : 4; }

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/// D[16 x 8] += A[16 x 16] B[16 x 8] (fp16 in, fp32 accumulators). Fragments, lane = 4 g + t:
/// a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
/// b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; d = D[g][2t, 2t+1], D[g+8][2t, 2t+1].
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// Blocks of a launch without a split: (B's row groups, A's row steps, batches).
inline dim3 skinny_grid(int64_t m, int64_t n, int64_t batches) {
  const int tiles_m = skinny_tiles_m(m);
  const int64_t b_rows = 16 * skinny_groups_n(tiles_m), a_rows = 8 * tiles_m;
  return dim3(static_cast<unsigned>((n + b_rows - 1) / b_rows),
              static_cast<unsigned>((m + a_rows - 1) / a_rows), static_cast<unsigned>(batches));
}

/// K split so that the blocks fill the GPU in one wave, for chunks of `chunk_k` elements.
inline GemmSplit skinny_split(int64_t m, int64_t n, int64_t k, int64_t batches, int64_t chunk_k) {
  const dim3 grid = skinny_grid(m, n, batches);
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  return choose_gemm_split(blocks, (k + chunk_k - 1) / chunk_k, multiprocessor_count(), kSkinnyBlocksPerSm,
                           kSkinnySplitMinChunks, /*one_wave=*/true);
}

/// The split-K workspace (its fp32 slices) of an M x N x K skinny GEMM with chunks of `chunk_k`.
inline size_t skinny_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches, int64_t chunk_k) {
  return split_slices_bytes(skinny_split(m, n, k, batches, chunk_k), m, n, batches);
}

/// Launches `kernel` (an instantiation of a skinny kernel, `shared_bytes` of dynamic shared memory)
/// over p's grid: B's row groups, A's row steps, and batches times p.splits.
template <typename Kernel>
void launch_skinny_kernel(Kernel kernel, int shared_bytes, const GemmDeviceParams& p, cudaStream_t stream) {
  dim3 grid = skinny_grid(p.m, p.n, p.batches);
  grid.z = static_cast<unsigned>(p.batches * p.splits);
  MICROSCALE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  kernel<<<grid, kSkinnyThreads, shared_bytes, stream>>>(p);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

/// A skinny GEMM's launches: K split for chunks of `chunk_k` (its slices in `workspace` when it
/// holds them, else in memory from the stream-ordered pool), `launch_tiles(p, tiles)` with
/// `tiles` a std::integral_constant of A's row tiles (1, 2 or 4), then the split's epilogue.
template <typename LaunchTiles>
void run_skinny_gemm(const GemmDeviceParams& problem, int64_t chunk_k, cudaStream_t stream, void* workspace,
                     size_t workspace_bytes, LaunchTiles&& launch_tiles) {
  GemmDeviceParams p = problem;
  const SplitWorkspace scratch(p, skinny_split(p.m, p.n, p.k, p.batches, chunk_k), workspace, workspace_bytes,
                               stream);
  switch (skinny_tiles_m(p.m)) {
    case 1: launch_tiles(p, std::integral_constant<int, 1>{}); break;
    case 2: launch_tiles(p, std::integral_constant<int, 2>{}); break;
    default: launch_tiles(p, std::integral_constant<int, 4>{}); break;
  }
  if (p.splits > 1) launch_gemm_epilogue(p, stream);
}

/// What a warp of a block sums: D's rows n0.. of B and m0.. of A in batch l, and, of K's chunks of
/// `chunk_k` elements, the split's run [split * run, min((split + 1) * run, all)) taken by the
/// warps in turn: chunks first + warp + kSkinnyWarps * i for i < count.
/// blockIdx = (B's row group, A's row step, batch * splits + split).
struct SkinnyWarpWork {
  int64_t n0, m0, l, split, first;
  int count;

  __device__ SkinnyWarpWork(const GemmDeviceParams& p, int64_t chunk_k, int64_t b_rows, int64_t a_rows,
                            int warp) {
    n0 = static_cast<int64_t>(blockIdx.x) * b_rows;
    m0 = static_cast<int64_t>(blockIdx.y) * a_rows;
    l = blockIdx.z / p.splits;
    split = blockIdx.z % p.splits;
    const int64_t chunks = (p.k + chunk_k - 1) / chunk_k, run_start = split * p.tiles_per_split;
    const int64_t end = chunks - run_start < p.tiles_per_split ? chunks : run_start + p.tiles_per_split;
    first = run_start + warp;
    count = first < end ? static_cast<int>((end - first + kSkinnyWarps - 1) / kSkinnyWarps) : 0;
  }

  __device__ __forceinline__ int64_t chunk(int i) const {
    return first + static_cast<int64_t>(i) * kSkinnyWarps;
  }
};

/// A warp's pipeline over its `count` chunks: chunks i + 1 and i + 2 in flight (their codes by
/// cp.async into stage (i % kSkinnyStages), one commit group per chunk, an empty group past the
/// last; their scales in registers) while chunk i is used. `copy(i)` issues chunk i's copies,
/// `load(i, scales)` loads its scales, `use(i, scales)` multiplies it: this lane's copies of it
/// are complete. A `use` that reads only the slots its lane copied needs no barrier (the NVFP4
/// kernel); one that reads other lanes' slots starts with __syncwarp() (the MX kernel), which also
/// keeps chunk i + 2's copies, issued after `use(i)` into the stage chunk i - 1 took, behind every
/// lane's reads of it. Returns with no copy in flight.
template <typename Scales, typename Copy, typename Load, typename Use>
__device__ __forceinline__ void run_skinny_pipeline(int count, Copy&& copy, Load&& load, Use&& use) {
  Scales next{}, after{};
#pragma unroll
  for (int i = 0; i < kSkinnyStages - 1; ++i) {
    if (i < count) copy(i);
    commit_copies();
  }
  if (count > 0) load(0, next);
  if (count > 1) load(1, after);
#pragma unroll 1
  for (int i = 0; i < count; ++i) {
    const Scales current = next;
    next = after;
    if (i + 2 < count) load(i + 2, after);
    wait_copies<kSkinnyStages - 2>();  // chunk i's group is complete
    use(i, current);
    // Into the stage chunk i - 1 used: this lane read its slots before use(i - 1) returned.
    if (i + kSkinnyStages - 1 < count) copy(i + kSkinnyStages - 1);
    commit_copies();
  }
  wait_copies<0>();
}

/// The block's last step. `acc[g][i][e]` (each warp's sums of its chunks) is D[m][n] for
/// n = n0 + 16 g + lane / 4 (+ 8 for e >= 2), m = m0 + 8 i + 2 (lane % 4) (+ 1 for odd e), times
/// `unscale` (exact: a power of two). Warp 0 adds warps 1, 2, 3's sums in that order (the same
/// result whatever the timing), through `shared` (the stages, no longer read), then writes
/// alpha' * sum (+ beta C) (+ bias) to D, or a split's sum to its workspace slice.
template <int kGroupsN, int kTilesM>
__device__ __forceinline__ void finish_skinny_block(const GemmDeviceParams& p,
                                                    float (&acc)[kGroupsN][kTilesM][4], void* shared,
                                                    int64_t n0, int64_t m0, int64_t l, int64_t split,
                                                    float unscale) {
  constexpr int kAccumulators = kGroupsN * kTilesM * 4;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  float* flat = &acc[0][0][0];
  __syncthreads();  // every warp is done with the stages: the partial sums take their place
  auto partial = reinterpret_cast<float(*)[kAccumulators][32]>(shared);
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) partial[warp - 1][i][lane] = flat[i];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 0; w < kSkinnyWarps - 1; ++w) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) flat[i] = flat[i] + partial[w][i][lane];
  }
  const float alpha = effective_alpha(p);
  float* slice = p.workspace ? p.workspace + (split * p.batches + l) * p.m * p.n : nullptr;
#pragma unroll
  for (int g = 0; g < kGroupsN; ++g) {
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t n = n0 + 16 * g + lane / 4 + 8 * (e / 2), m = m0 + 8 * i + 2 * (lane % 4) + e % 2;
        if (m >= p.m || n >= p.n) continue;
        const float sum = acc[g][i][e] * unscale;
        if (slice) {
          slice[m * p.n + n] = sum;
        } else {
          store_result(p, m, n, l, alpha * sum);
        }
      }
    }
  }
}

}  // namespace microscale::cuda
