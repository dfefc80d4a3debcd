// NVFP4 x NVFP4 GEMM on Hopper for an A of few rows (decode: a few tokens against a weight B of
// N x K). docs/perf.md, "A skinny kernel for few rows of A".
//
// Where M is small the work is reading B (N x K codes) and converting it; the tensor cores are
// nearly idle. The fused kernel (gemm_nvfp4.cu) pads M to its 128-row tile and converts every B
// tile into shared memory before wgmma reads it; here each thread converts its share of B in
// registers and hands it straight to mma.sync, with B as the instruction's 16-row operand and A
// as its 8-column one, so that D^T's tile is computed:
//
//   B codes + E4M3 scales --16-byte loads--> registers --convert--> fp16 A fragments --mma.sync-->
//   A codes + scales      --16-byte loads--> registers --convert--> fp16 B fragments --^
//   fp32 accumulators --4 warps summed in shared memory, in warp order--> D (or a split's slice)
//
// Which K element each fragment slot holds is free, as long as both operands use the same map:
// in a chunk of 128 codes, thread t % 4 of a row takes codes 32 (t % 4) .. + 31 (16 bytes, two
// 16-element blocks), 4 of them per mma in the order of nvfp4_word_to_fp16_pairs. The conversion
// is exact (nvfp4_fp16_codes.cuh): the accumulators hold sum(a * b) * 2^-28.
//
// A block is 4 warps over the same 16 * kGroupsN rows of B and 8 * kTilesM rows of A; warp w
// takes chunks w, w + 4, ... of the block's K range, two chunks ahead of the one it converts
// (codes by cp.async into shared memory, scales into registers). When the blocks cannot fill the GPU, K is
// split over several blocks whose fp32 sums go to workspace slices, added in split order by
// gemm_epilogue_kernel (gemm_split.hpp).
#include <algorithm>
#include <cstdint>

#include "cuda/cp_async.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/gemm_nvfp4_skinny.hpp"
#include "cuda/nvfp4_fp16_codes.cuh"
#include "cuda/skinny_gemm.cuh"

namespace microscale::cuda {
namespace {

constexpr int kWarps = kSkinnyWarps;
constexpr int kThreads = kSkinnyThreads;
constexpr int kChunkK = 128;  // codes of a row per warp step: 4 threads x 32
constexpr int kChunkBytes = kChunkK / 2;
constexpr int kStages = kSkinnyStages;
constexpr auto groups_n = skinny_groups_n;

// One thread's rows of one operand, r0 + 8 j for j < kRows, in batch l: each chunk, its 16 bytes
// of codes per row (copied into shared memory ahead of use) and their two block scales (loaded
// into registers ahead of use; low byte first). Rows past the operand and codes past K read as
// zeros. The sizes and strides are read from the kernel's parameters (constant memory), not kept
// in registers.
template <bool Swizzled, int kRows>
struct ThreadRows {
  const GemmDeviceOperand& op;
  const uint8_t* codes;   // row r0's bytes of chunk 0 (the thread's 16)
  const uint8_t* scales;  // the batch's scales
  int64_t r0, rows, k;
  int quad;

  __device__ ThreadRows(const GemmDeviceOperand& op_, int64_t rows_, int64_t k_, int64_t l, int64_t r0_,
                        int quad_)
      : op(op_), r0(r0_), rows(rows_), k(k_), quad(quad_) {
    codes = op.data + l * op.batch_bytes + r0 * op.row_bytes + quad * 16;
    scales = op.scales + l * op.scale_batch_bytes;
  }

  __device__ __forceinline__ bool in_k(int64_t chunk) const { return chunk * kChunkK + 32 * quad < k; }

  // Byte offset of the thread's two block scales (2 quad, 2 quad + 1 of the chunk's 8) of `row`.
  __device__ __forceinline__ int64_t scale_offset(int64_t row, int64_t chunk) const {
    // The swizzled form is common.cuh's scale_offset at column 8 chunk + 2 quad, written with
    // shifts: rows are never negative, and its signed divisions cost instructions in this loop.
    // The thread's two scales are adjacent bytes of one atom row.
    if constexpr (Swizzled) {
      const int64_t atoms_per_row = (k / 16 + 3) / 4;
      return ((row >> 7) * atoms_per_row + 2 * chunk + (quad >> 1)) * 512 + (row & 31) * 16 +
             ((row >> 5) & 3) * 4 + 2 * (quad & 1);
    }
    return row * op.scale_row_bytes + 8 * chunk + 2 * quad;
  }

  // Copies the chunk's codes of row j to slot[j * 32] (16-byte slots, one per lane: the warp's
  // reads of a row are contiguous).
  __device__ __forceinline__ void copy_codes(int64_t chunk, uint4* slot) const {
    const bool k_ok = in_k(chunk);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool valid = k_ok && r0 + 8 * j < rows;
      copy16(slot + j * 32, valid ? codes + 8 * j * op.row_bytes + chunk * kChunkBytes : op.data, valid);
    }
  }

  __device__ __forceinline__ void load_scales(int64_t chunk, uint32_t (&scale)[kRows]) const {
    const bool k_ok = in_k(chunk);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int64_t row = r0 + 8 * j;
      scale[j] = k_ok && row < rows
                     ? __ldg(reinterpret_cast<const unsigned short*>(scales + scale_offset(row, chunk)))
                     : 0u;
    }
  }
};

// What a thread holds of one chunk: B rows n0 + 16 g + lane / 4 (+ 8) as rows 2 g (+ 1), A rows
// m0 + 8 i + lane / 4 as rows 2 kGroupsN + i (one array: one shared-memory slot per row).
template <int kTilesM>
struct Chunk {
  static constexpr int kRowsB = 2 * groups_n(kTilesM), kRows = kRowsB + kTilesM;
  uint4 codes[kRows];
  uint32_t scales[kRows];
};

// acc[g][i] += the chunk's products of B's row group g and A's tile i.
template <int kTilesM>
__device__ __forceinline__ void multiply(const Chunk<kTilesM>& c,
                                         float (&acc)[groups_n(kTilesM)][kTilesM][4]) {
  constexpr int kGroupsN = groups_n(kTilesM), kRowsB = Chunk<kTilesM>::kRowsB, kRows = Chunk<kTilesM>::kRows;
  ScalePair scale[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) scale[r] = e4m3_scale_pair(c.scales[r] & 0xFF, c.scales[r] >> 8);
#pragma unroll
  for (int w = 0; w < 4; ++w) {  // word w of the thread's 16 bytes: 8 codes of block w / 2
    uint4 a_pairs[kTilesM];
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
      const ScalePair& s = scale[kRowsB + i];
      a_pairs[i] = nvfp4_word_to_fp16_pairs(word_of(c.codes[kRowsB + i], w), w < 2 ? s.low : s.high);
    }
#pragma unroll
    for (int g = 0; g < kGroupsN; ++g) {
      const uint4 low =
          nvfp4_word_to_fp16_pairs(word_of(c.codes[2 * g], w), w < 2 ? scale[2 * g].low : scale[2 * g].high);
      const uint4 high = nvfp4_word_to_fp16_pairs(word_of(c.codes[2 * g + 1], w),
                                                  w < 2 ? scale[2 * g + 1].low : scale[2 * g + 1].high);
#pragma unroll
      for (int s = 0; s < 2; ++s) {  // pairs 2s and 2s + 1: k slots (2t, 2t+1) and (2t+8, 2t+9)
#pragma unroll
        for (int i = 0; i < kTilesM; ++i) {
          mma_16x8x16(acc[g][i], word_of(low, 2 * s), word_of(high, 2 * s), word_of(low, 2 * s + 1),
                      word_of(high, 2 * s + 1), word_of(a_pairs[i], 2 * s), word_of(a_pairs[i], 2 * s + 1));
        }
      }
    }
  }
}

// Shared memory of a block: per warp, kStages chunks of kRows 16-byte slots per lane.
template <int kTilesM>
constexpr int shared_bytes() {
  return kWarps * kStages * Chunk<kTilesM>::kRows * 32 * 16;
}

template <int kTilesM, bool SwizzledA, bool SwizzledB>
__global__ void __launch_bounds__(kThreads, kSkinnyBlocksPerSm)
    nvfp4_skinny_gemm_kernel(const __grid_constant__ GemmDeviceParams p) {
  constexpr int kGroupsN = groups_n(kTilesM);
  extern __shared__ uint4 shared_raw[];  // the warps' stages; then the partial sums

  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int quad = lane % 4, lane_row = lane / 4;
  const SkinnyWarpWork work(p, kChunkK, 16 * kGroupsN, 8 * kTilesM, warp);
  const ThreadRows<SwizzledB, Chunk<kTilesM>::kRowsB> b_rows(p.b, p.n, p.k, work.l, work.n0 + lane_row, quad);
  const ThreadRows<SwizzledA, kTilesM> a_rows(p.a, p.m, p.k, work.l, work.m0 + lane_row, quad);
  constexpr int kRows = Chunk<kTilesM>::kRows, kRowsB = Chunk<kTilesM>::kRowsB;
  // This lane's slots: stage s, row j at slots[(s * kRows + j) * 32].
  uint4* const slots = reinterpret_cast<uint4*>(shared_raw) + warp * kStages * kRows * 32 + lane;
  auto chunk_of = [&](int i) { return work.chunk(i); };
  auto copy_chunk = [&](int i) {
    uint4* stage = slots + (i % kStages) * kRows * 32;
    b_rows.copy_codes(chunk_of(i), stage);
    a_rows.copy_codes(chunk_of(i), stage + kRowsB * 32);
  };
  struct Scales {
    uint32_t of_row[kRows];
  };
  auto load_scales = [&](int i, Scales& scales) {
    uint32_t b[kRowsB], a[kTilesM];
    b_rows.load_scales(chunk_of(i), b);
    a_rows.load_scales(chunk_of(i), a);
#pragma unroll
    for (int j = 0; j < kRowsB; ++j) scales.of_row[j] = b[j];
#pragma unroll
    for (int j = 0; j < kTilesM; ++j) scales.of_row[kRowsB + j] = a[j];
  };
  float acc[kGroupsN][kTilesM][4] = {};
  run_skinny_pipeline<Scales>(work.count, copy_chunk, load_scales, [&](int i, const Scales& scales) {
    Chunk<kTilesM> c;
    const uint4* stage = slots + (i % kStages) * kRows * 32;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      c.scales[j] = scales.of_row[j];
      c.codes[j] = stage[j * 32];
    }
    multiply(c, acc);
  });
  // The accumulators hold sum(a * b) * 2^-28 (nvfp4_fp16_codes.cuh).
  finish_skinny_block(p, acc, shared_raw, work.n0, work.m0, work.l, work.split, 0x1p28f);
}

template <int kTilesM, bool SwizzledA, bool SwizzledB>
void launch(const GemmDeviceParams& p, cudaStream_t stream) {
  launch_skinny_kernel(nvfp4_skinny_gemm_kernel<kTilesM, SwizzledA, SwizzledB>, shared_bytes<kTilesM>(), p,
                       stream);
}

template <int kTilesM>
void launch_layouts(const GemmDeviceParams& p, cudaStream_t stream) {
  if (p.a.swizzled) {
    p.b.swizzled ? launch<kTilesM, true, true>(p, stream) : launch<kTilesM, true, false>(p, stream);
  } else {
    p.b.swizzled ? launch<kTilesM, false, true>(p, stream) : launch<kTilesM, false, false>(p, stream);
  }
}

}  // namespace

int64_t skinny_row_steps(int64_t m) { return (m + 8 * skinny_tiles_m(m) - 1) / (8 * skinny_tiles_m(m)); }

size_t nvfp4_skinny_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches) {
  return skinny_workspace_bytes(m, n, k, batches, kChunkK);
}

void launch_nvfp4_skinny_gemm(const GemmDeviceParams& problem, cudaStream_t stream, void* workspace,
                              size_t workspace_bytes) {
  run_skinny_gemm(
      problem, kChunkK, stream, workspace, workspace_bytes,
      [stream](const GemmDeviceParams& p, auto tiles) { launch_layouts<decltype(tiles)::value>(p, stream); });
}

}  // namespace microscale::cuda
