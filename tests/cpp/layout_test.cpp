// Swizzled scale layout: the closed-form offset against the reshape/permute definition, padding,
// round trips on ragged shapes, and bad arguments.
#include "microscale/layout.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "microscale/error.hpp"

namespace microscale {
namespace {

// The definition by reshape: pad to (Rp, Cp), view as (Rp/128, 4, 32, Cp/4, 4), permute to
// (0, 3, 2, 1, 4), flatten.
int64_t offset_by_permute(int64_t r, int64_t c, int64_t cols) {
  const int64_t cp = swizzled_cols(cols);
  const int64_t i0 = r / 128, i1 = (r % 128) / 32, i2 = r % 32, i3 = c / 4, i4 = c % 4;
  return (((i0 * (cp / 4) + i3) * 32 + i2) * 4 + i1) * 4 + i4;
}

TEST(Layout, OffsetMatchesDefinition) {
  for (int64_t cols : {1, 3, 4, 7, 33}) {
    for (int64_t r = 0; r < 300; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(swizzled_offset(r, c, cols), offset_by_permute(r, c, cols));
    }
  }
}

TEST(Layout, RoundTripAndZeroPadding) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {130, 7}, {256, 8}, {300, 33}, {5, 4}}) {
    Tensor compact(DType::U8, {rows, cols});
    for (int64_t i = 0; i < rows * cols; ++i)
      compact.data_as<uint8_t>()[i] = static_cast<uint8_t>(1 + i % 251);
    const Tensor s = swizzle_scales(compact.view());
    ASSERT_EQ(s.shape(), (std::vector<int64_t>{swizzled_rows(rows), swizzled_cols(cols)}));
    int64_t nonzero = 0;
    for (int64_t i = 0; i < s.numel(); ++i) nonzero += s.data_as<uint8_t>()[i] != 0;
    EXPECT_EQ(nonzero, rows * cols);  // everything else is zero padding
    const Tensor back = unswizzle_scales(s.view(), rows, cols);
    EXPECT_EQ(0, std::memcmp(back.data(), compact.data(), compact.nbytes()));
  }
}

TEST(Layout, BadArguments) {
  Tensor f(DType::F32, {4, 4});
  EXPECT_THROW(swizzle_scales(f.view()), Error);
  Tensor three_d(DType::U8, {2, 2, 2});
  EXPECT_THROW(swizzle_scales(three_d.view()), Error);
  Tensor small(DType::U8, {100});
  EXPECT_THROW(unswizzle_scales(small.view(), 128, 4), Error);
  EXPECT_THROW(unswizzle_scales(small.view(), -1, 4), Error);
  // Negative shapes and sizes whose padded image would overflow int64.
  TensorView negative = small.view();
  negative.shape = {4, -4};
  EXPECT_THROW(swizzle_scales(negative), Error);
  Tensor empty(DType::U8, {0});
  EXPECT_THROW(unswizzle_scales(empty.view(), INT64_MAX - 10, 1), Error);
}

}  // namespace
}  // namespace microscale
