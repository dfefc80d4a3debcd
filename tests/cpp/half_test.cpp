// bf16 / fp16 conversions: exhaustive widening round trips and RNE narrowing at ties.
#include "microscale/half.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace microscale {
namespace {

TEST(Half, EveryBf16RoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(x))));
    } else {
      EXPECT_EQ(float_to_bf16(x), b);
    }
  }
}

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = half_to_float(static_cast<uint16_t>(b));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(x))));
    } else {
      EXPECT_EQ(float_to_half(x), b) << b;
    }
  }
}

TEST(Half, NarrowingRoundsToNearestEven) {
  // Midpoints between consecutive bf16 / half values go to the even neighbour.
  for (uint32_t b = 0; b < 0x7F7F; b += 7) {
    const float lo = bf16_to_float(static_cast<uint16_t>(b)),
                hi = bf16_to_float(static_cast<uint16_t>(b + 1));
    const float mid = bits_to_float((float_bits(lo) + float_bits(hi)) / 2);
    EXPECT_EQ(float_to_bf16(mid), (b % 2 == 0) ? b : b + 1);
  }
  for (uint32_t b = 0; b < 0x7BFF; b += 3) {
    const double lo = half_to_float(static_cast<uint16_t>(b)),
                 hi = half_to_float(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in fp32
    EXPECT_EQ(float_to_half(mid), (b % 2 == 0) ? b : b + 1) << b;
    EXPECT_EQ(float_to_half(std::nextafter(mid, 0.0f)), b) << b;
  }
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // rounds to Inf
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7F80);
}

}  // namespace
}  // namespace microscale
