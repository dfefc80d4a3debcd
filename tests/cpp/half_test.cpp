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

TEST(Half, EveryHalfWidensToItsValue) {
  // The value from the fields, computed in double: (-1)^s 2^(e-15) (1 + m/1024), or 2^-14 m/1024.
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t e = (b >> 10) & 0x1Fu, m = b & 0x3FFu;
    const double sign = (b & 0x8000u) != 0 ? -1.0 : 1.0;
    const float x = half_to_float(static_cast<uint16_t>(b));
    if (e == 0x1F) {
      if (m == 0) {
        EXPECT_EQ(x, static_cast<float>(sign * INFINITY)) << b;
      } else {
        EXPECT_TRUE(std::isnan(x)) << b;
        EXPECT_EQ(float_bits(x), ((b & 0x8000u) << 16) | 0x7F800000u | (m << 13)) << b;  // payload kept
      }
      continue;
    }
    const double value = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024.0 + m, static_cast<int>(e) - 25);
    EXPECT_EQ(x, static_cast<float>(sign * value)) << b;
    EXPECT_EQ(std::signbit(x), (b & 0x8000u) != 0) << b;  // -0 stays -0
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
