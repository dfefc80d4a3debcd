// Philox4x32-10 against the Random123 known-answer vectors (kat_vectors, philox4x32_10).
#include "microscale/philox.hpp"

#include <gtest/gtest.h>

namespace microscale {
namespace {

TEST(Philox, KnownAnswers) {
  {
    uint32_t ctr[4] = {0, 0, 0, 0};
    philox4x32_10(ctr, 0, 0);
    EXPECT_EQ(ctr[0], 0x6627e8d5u);
    EXPECT_EQ(ctr[1], 0xe169c58du);
    EXPECT_EQ(ctr[2], 0xbc57ac4cu);
    EXPECT_EQ(ctr[3], 0x9b00dbd8u);
  }
  {
    uint32_t ctr[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    philox4x32_10(ctr, 0xffffffffu, 0xffffffffu);
    EXPECT_EQ(ctr[0], 0x408f276du);
    EXPECT_EQ(ctr[1], 0x41c83b0eu);
    EXPECT_EQ(ctr[2], 0xa20bc7c6u);
    EXPECT_EQ(ctr[3], 0x6d5451fdu);
  }
  {
    uint32_t ctr[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    philox4x32_10(ctr, 0xa4093822u, 0x299f31d0u);
    EXPECT_EQ(ctr[0], 0xd16cfe09u);
    EXPECT_EQ(ctr[1], 0x94fdccebu);
    EXPECT_EQ(ctr[2], 0x5001e420u);
    EXPECT_EQ(ctr[3], 0x24126ea1u);
  }
}

TEST(Philox, StreamLayout) {
  // sr_block_bits = Philox at counter {block lo, block hi, offset lo, offset hi}, key = seed.
  uint32_t a[4], b[4] = {5, 0, 7, 0};
  sr_block_bits(0x0000000200000001ull, 7, 5, a);
  philox4x32_10(b, 1, 2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]);
}

}  // namespace
}  // namespace microscale
