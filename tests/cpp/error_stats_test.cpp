// error_stats: SQNR and max abs error of a dequantized tensor, as the CLI reports them.
#include "microscale/error_stats.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace microscale {
namespace {

TEST(ErrorStats, AFiniteValueLostToNaNIsNotHidden) {
  const float ref[4] = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
  const float close[4] = {1.0f, 2.5f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
  ErrorStats s = error_stats(ref, close, 4);  // the NaN input is skipped
  EXPECT_EQ(s.max_abs_error, 0.5);
  EXPECT_NEAR(s.sqnr_db, 10.0 * std::log10(21.0 / 0.25), 1e-12);
  const float lost[4] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f, 4.0f};
  s = error_stats(ref, lost, 4);  // 2.0 came back NaN (an MX block with a NaN)
  EXPECT_TRUE(std::isnan(s.max_abs_error));
  EXPECT_TRUE(std::isnan(s.sqnr_db));
}

TEST(ErrorStats, AddsUpOverParts) {
  const std::vector<float> ref = {1.0f, -2.0f, 3.0f, 0.5f, INFINITY, 4.0f};
  const std::vector<float> x = {1.1f, -2.0f, 2.5f, 0.5f, 0.0f, 3.0f};
  ErrorAccumulator parts;
  parts.add(ref.data(), x.data(), 2);
  parts.add(ref.data() + 2, x.data() + 2, 4);
  const ErrorStats whole = error_stats(ref.data(), x.data(), 6);
  EXPECT_EQ(parts.result().sqnr_db, whole.sqnr_db);
  EXPECT_EQ(parts.result().max_abs_error, whole.max_abs_error);
  EXPECT_EQ(whole.max_abs_error, 1.0);
}

}  // namespace
}  // namespace microscale
