// How the CUDA GEMM runs: which path (cuda.hpp's GemmPath) and, on the fused and skinny paths,
// how many ways it splits K (host-only, no CUDA headers: tests/cpp tests it).
//
// A grid of output tiles smaller than the GPU leaves SMs idle: at M = 128, N = 7168 there are 56
// tiles of 128 x 128 for 132 SMs that each hold two blocks. Splitting K gives every tile `splits`
// blocks, each summing its run of K tiles into an fp32 workspace; a second kernel adds the runs
// in order (so the result does not depend on timing) and applies the epilogue.
#pragma once

#include <algorithm>
#include <cstdint>

namespace microscale::cuda {

struct GemmSplit {
  int64_t splits = 1;           ///< blocks per output tile
  int64_t tiles_per_split = 0;  ///< K tiles each of them sums (the last may sum fewer)
};

/// @brief The split for `tiles` output tiles of `k_tiles` K tiles on `sms` SMs running
/// `blocks_per_sm` blocks each: none when the tiles fill the GPU; otherwise enough to fill it,
/// keeping at least `min_run` K tiles per block (a run's fixed cost is its pipeline's fill and its
/// slice's round trip through memory: at 128 x 7168 x 2048, runs of 7 K tiles were slower than
/// no split) and at most 16 splits (each adds an [M, N] fp32 slice to the workspace). With
/// `one_wave`, no more blocks than the GPU holds at once (the skinny kernel, whose blocks all take
/// the same time: a second wave of a few blocks would add a whole block's time), else at least
/// as many (the fused kernel's choice).
inline GemmSplit choose_gemm_split(int64_t tiles, int64_t k_tiles, int64_t sms, int64_t blocks_per_sm,
                                   int64_t min_run = 16, bool one_wave = false) {
  GemmSplit s;
  s.tiles_per_split = k_tiles;
  const int64_t slots = sms * blocks_per_sm;
  if (tiles <= 0 || k_tiles <= 0 || tiles >= slots) return s;
  const int64_t fill = one_wave ? slots / tiles : (slots + tiles - 1) / tiles;
  const int64_t wanted = std::min<int64_t>({fill, k_tiles / min_run, 16});
  if (wanted < 2) return s;
  s.tiles_per_split = (k_tiles + wanted - 1) / wanted;
  s.splits = (k_tiles + s.tiles_per_split - 1) / s.tiles_per_split;  // no empty split
  return s;
}

/// @brief Whether the expanded path (exact bf16 copies of the operands, then cuBLAS) runs an
/// M x N x K GEMM, else the fused kernel. The copies cost a pass over both operands, which pays
/// once the product is large beside them. On the H200 (docs/perf.md "CUDA GEMM", v8) the expanded
/// path was faster from M = 512 (512 x 4096 x 4096: 51 against 104 us) and at 128 x 7168 x 2048
/// (30 against 33 us), slower at M = 128 with long K (128 x 7168 x 16384: 216 against 146 us,
/// where B's copy is most of the work). Rule: both sides at least `min_side`; it leaves the
/// 10 % at 128 x 7168 x 2048 to the fused kernel rather than guess at a K threshold from one
/// shape.
inline constexpr int64_t kExpandedMinSide = 512;
inline bool prefer_expanded_gemm(int64_t m, int64_t n, int64_t min_side = kExpandedMinSide) {
  return m >= min_side && n >= min_side;
}

}  // namespace microscale::cuda
