// How many ways the CUDA GEMM splits K (host-only, no CUDA headers: tests/cpp tests it).
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
/// no split) and
/// at most 16 splits (each adds an [M, N] fp32 slice to the workspace).
inline GemmSplit choose_gemm_split(int64_t tiles, int64_t k_tiles, int64_t sms, int64_t blocks_per_sm,
                                   int64_t min_run = 16) {
  GemmSplit s;
  s.tiles_per_split = k_tiles;
  const int64_t slots = sms * blocks_per_sm;
  if (tiles <= 0 || k_tiles <= 0 || tiles >= slots) return s;
  const int64_t wanted = std::min<int64_t>({(slots + tiles - 1) / tiles, k_tiles / min_run, 16});
  if (wanted < 2) return s;
  s.tiles_per_split = (k_tiles + wanted - 1) / wanted;
  s.splits = (k_tiles + s.tiles_per_split - 1) / s.tiles_per_split;  // no empty split
  return s;
}

}  // namespace microscale::cuda
