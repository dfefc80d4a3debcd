// choose_gemm_split and prefer_expanded_gemm: the CUDA GEMM's split of K and its path (pure host
// functions; the kernels run on a GPU machine, tests/gpu/gemm_gpu_test.cu).
#include "cuda/gemm_split.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace microscale::cuda {
namespace {

TEST(GemmSplit, NoSplitWhenTheTilesFillTheGpu) {
  const GemmSplit s = choose_gemm_split(/*tiles=*/1024, /*k_tiles=*/64, /*sms=*/132, /*blocks_per_sm=*/2);
  EXPECT_EQ(s.splits, 1);
  EXPECT_EQ(s.tiles_per_split, 64);
  EXPECT_EQ(choose_gemm_split(264, 1000, 132, 2).splits, 1);
}

TEST(GemmSplit, SmallGridsAreSplitToFillTheGpu) {
  // GPU MODE's M = 128 shapes: 56 and 32 tiles of 128 x 128.
  GemmSplit s = choose_gemm_split(56, 16384 / 64, 132, 2);
  EXPECT_EQ(s.splits, 5);  // 280 blocks for 264 slots
  EXPECT_EQ(s.tiles_per_split, 52);
  s = choose_gemm_split(32, 7168 / 64, 132, 2);  // 9 would fill the GPU; runs of 16 allow 7
  EXPECT_EQ(s.splits, 7);
  EXPECT_EQ(s.tiles_per_split, 16);
  s = choose_gemm_split(56, 2048 / 64, 132, 2);
  EXPECT_EQ(s.splits, 2);
  EXPECT_EQ(s.tiles_per_split, 16);
}

TEST(GemmSplit, EveryBlockSumsAtLeastTheMinimumRunAndNoSplitIsEmpty) {
  for (int64_t tiles = 1; tiles < 300; tiles += 7) {
    for (int64_t k_tiles = 1; k_tiles < 600; k_tiles += 13) {
      const GemmSplit s = choose_gemm_split(tiles, k_tiles, 132, 2);
      ASSERT_GE(s.splits, 1);
      ASSERT_LE(s.splits, 16);
      ASSERT_GE(s.splits * s.tiles_per_split, k_tiles);        // every K tile is summed
      ASSERT_LT((s.splits - 1) * s.tiles_per_split, k_tiles);  // the last split is not empty
      if (s.splits > 1) {
        ASSERT_GE(s.tiles_per_split, 16);
      }
    }
  }
  EXPECT_EQ(choose_gemm_split(1, 31, 132, 2).splits, 1);  // too short to split
  EXPECT_EQ(choose_gemm_split(1, 32, 132, 2).splits, 2);
  EXPECT_EQ(choose_gemm_split(1, 32, 132, 2, /*min_run=*/4).splits, 8);
}

TEST(GemmSplit, OneWaveNeverAsksForMoreBlocksThanTheGpuHolds) {
  // The skinny kernel at 16 x 7168 x 16384: 112 blocks of 64 rows of B, 128 chunks of K, 396
  // slots (3 blocks per SM): 3 splits (336 blocks), where filling would take 4 (448: two waves).
  EXPECT_EQ(choose_gemm_split(112, 128, 132, 3, 8).splits, 4);
  const GemmSplit s = choose_gemm_split(112, 128, 132, 3, 8, /*one_wave=*/true);
  EXPECT_EQ(s.splits, 3);
  EXPECT_EQ(s.tiles_per_split, 43);
  for (int64_t tiles = 1; tiles < 400; tiles += 3) {
    const GemmSplit w = choose_gemm_split(tiles, 256, 132, 3, 8, true);
    ASSERT_LE(w.splits * tiles, std::max<int64_t>(tiles, 396));
    ASSERT_GE(w.splits * w.tiles_per_split, 256);
  }
  EXPECT_EQ(choose_gemm_split(200, 256, 132, 3, 8, true).splits, 1);  // 2 x 200 > 396
}

TEST(GemmPath, ExpandedOnceBothSidesAreLarge) {
  EXPECT_FALSE(prefer_expanded_gemm(128, 7168));  // decode-like: B's copy would be most of the work
  EXPECT_FALSE(prefer_expanded_gemm(7168, 128));
  EXPECT_FALSE(prefer_expanded_gemm(511, 4096));
  EXPECT_TRUE(prefer_expanded_gemm(512, 4096));
  EXPECT_TRUE(prefer_expanded_gemm(8192, 8192));
  EXPECT_TRUE(prefer_expanded_gemm(256, 256, /*min_side=*/256));
}

}  // namespace
}  // namespace microscale::cuda
