// The pool of large host buffers behind Tensor (src/core/buffer_pool.hpp): reuse, zeroing, the cap.
#include "core/buffer_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "microscale/tensor.hpp"

namespace microscale {
namespace {

bool all_zero(const Tensor& t) {
  const auto* p = t.data_as<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i)
    if (p[i] != 0) return false;
  return true;
}

TEST(BufferPool, ReleaseFreesWhatThePoolKeepsAndNotWhatIsInUse) {
  release_cached_host_memory();
  const int64_t bytes = int64_t{2} << 20;
  Tensor kept(DType::U8, {bytes});
  { Tensor dropped(DType::U8, {bytes}); }
  ASSERT_GE(detail::pooled_bytes(), static_cast<size_t>(bytes));
  EXPECT_GE(release_cached_host_memory(), static_cast<size_t>(bytes));
  EXPECT_EQ(detail::pooled_bytes(), 0u);
  EXPECT_EQ(release_cached_host_memory(), 0u);
  std::memset(kept.data(), 1, kept.nbytes());  // still the caller's (ASan would see a freed block)
  const void* kept_data = kept.data();
  kept = Tensor();  // its last owner: back to the pool
  EXPECT_GE(detail::pooled_bytes(), static_cast<size_t>(bytes));
  Tensor again(DType::U8, {bytes});
  EXPECT_EQ(again.data(), kept_data);  // reused after a release, as before it
  EXPECT_TRUE(all_zero(again));
}

TEST(BufferPool, ATensorsBufferIsReusedAndZeroedAgain) {
  const int64_t bytes = int64_t{4} << 20;
  const void* first = nullptr;
  {
    Tensor t(DType::U8, {bytes});
    first = t.data();
    std::memset(t.data(), 0xAB, t.nbytes());
  }
  const size_t held = detail::pooled_bytes();
  EXPECT_GE(held, static_cast<size_t>(bytes));
  Tensor again(DType::U8, {bytes});
  EXPECT_EQ(again.data(), first);  // the same block, taken out of the pool
  EXPECT_EQ(detail::pooled_bytes(), held - (static_cast<size_t>(bytes) + 64));
  EXPECT_TRUE(all_zero(again));
}

TEST(BufferPool, ABlockServesRequestsItExceedsByAtMostAnEighth) {
  const size_t mib = size_t{1} << 20;
  EXPECT_TRUE(detail::reusable(2 * mib, 2 * mib));
  EXPECT_TRUE(detail::reusable(2 * mib + mib / 4, 2 * mib));
  EXPECT_FALSE(detail::reusable(2 * mib + mib / 4 + 1, 2 * mib));
  EXPECT_FALSE(detail::reusable(4 * mib, 2 * mib));
  EXPECT_FALSE(detail::reusable(2 * mib - 1, 2 * mib));
}

TEST(BufferPool, SharedStorageIsReturnedByItsLastHolder) {
  const int64_t bytes = int64_t{2} << 20;
  Tensor a(DType::U8, {bytes});
  const void* data = a.data();
  Tensor b = a.reshaped({bytes / 2, 2});  // shares a's storage
  a = Tensor();
  std::memset(b.data(), 1, b.nbytes());  // still b's: nothing went back to the pool
  Tensor c(DType::U8, {bytes});
  EXPECT_NE(c.data(), data);
  b = Tensor();
  Tensor d(DType::U8, {bytes});
  EXPECT_EQ(d.data(), data);
  EXPECT_TRUE(all_zero(d));
}

TEST(BufferPool, SmallBuffersStayOutAndTheCapHolds) {
  const size_t before = detail::pooled_bytes();
  { Tensor t(DType::U8, {int64_t{1} << 16}); }
  EXPECT_EQ(detail::pooled_bytes(), before);
  const int64_t big = static_cast<int64_t>(detail::kPooledMaxBytes / 2 + (size_t{1} << 20));
  {
    std::vector<Tensor> three;
    for (int i = 0; i < 3; ++i) three.emplace_back(DType::U8, std::vector<int64_t>{big});
  }
  EXPECT_LE(detail::pooled_bytes(), detail::kPooledMaxBytes);
  EXPECT_GE(detail::pooled_bytes(), static_cast<size_t>(big));  // the newest one kept
  // A block larger than the whole pool is freed at once and evicts nothing.
  const size_t held = detail::pooled_bytes();
  { Tensor huge(DType::U8, {static_cast<int64_t>(detail::kPooledMaxBytes + 1)}); }
  EXPECT_EQ(detail::pooled_bytes(), held);
}

}  // namespace
}  // namespace microscale
