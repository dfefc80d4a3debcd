// The allocating quantize() and dequantize() start from uninitialized output tensors
// (Tensor::uninitialized), so every output byte must be written by the kernels. Here: the same
// call under two different fills of those tensors gives the same bytes, for every scheme and the
// options that change which kernel runs, on every CPU kernel set.
//
// For the rest of this test binary those tensors are filled with 0xA5
// (fill_uninitialized_buffers_for_tests below), so that every fast-vs-reference test also shows
// a byte its kernel left unwritten: the reference path's outputs start zeroed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/buffer_pool.hpp"
#include "kernel_sets.hpp"
#include "microscale/error.hpp"
#include "microscale/quantize.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;
using testing_data::same_bytes;

constexpr int kTestFill = 0xA5;

// Runs before any test of the binary (a static initializer of this file).
const bool kFilled = [] {
  detail::fill_uninitialized_buffers_for_tests(kTestFill);
  return true;
}();

// Restores the binary's fill when a test that changes it ends.
struct FillScope {
  explicit FillScope(int byte) { detail::fill_uninitialized_buffers_for_tests(byte); }
  ~FillScope() { detail::fill_uninitialized_buffers_for_tests(kTestFill); }
};

bool all_bytes(const Tensor& t, uint8_t byte) {
  const auto* p = t.data_as<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i)
    if (p[i] != byte) return false;
  return true;
}

TEST(UninitializedOutputs, APooledBufferIsReusedWithItsOldBytes) {
  ASSERT_TRUE(kFilled);
  const int64_t bytes = int64_t{3} << 20;  // pooled (>= 1 MiB)
  const void* first = nullptr;
  {
    Tensor t(DType::U8, {bytes});
    first = t.data();
    std::memset(t.data(), 0xAB, t.nbytes());
  }
  {
    const FillScope unfilled(-1);
    Tensor again = Tensor::uninitialized(DType::U8, {bytes});
    ASSERT_EQ(again.data(), first);       // the same block, from the pool
    EXPECT_TRUE(all_bytes(again, 0xAB));  // not zeroed
  }
  Tensor filled = Tensor::uninitialized(DType::U8, {bytes});
  EXPECT_TRUE(all_bytes(filled, kTestFill));
  Tensor zeroed(DType::U8, {bytes});  // the constructor still zeroes
  EXPECT_TRUE(all_bytes(zeroed, 0));
}

void expect_same_outputs(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& what) {
  EXPECT_TRUE(same_bytes(a.rowwise_data, b.rowwise_data)) << what << ": rowwise_data";
  EXPECT_TRUE(same_bytes(a.rowwise_scale, b.rowwise_scale)) << what << ": rowwise_scale";
  EXPECT_TRUE(same_bytes(a.columnwise_data, b.columnwise_data)) << what << ": columnwise_data";
  EXPECT_TRUE(same_bytes(a.columnwise_scale, b.columnwise_scale)) << what << ": columnwise_scale";
  EXPECT_TRUE(same_bytes(a.rowwise_amaxes, b.rowwise_amaxes)) << what << ": rowwise_amaxes";
  EXPECT_TRUE(same_bytes(a.columnwise_amaxes, b.columnwise_amaxes)) << what << ": columnwise_amaxes";
}

// The options a test call takes: each scheme, direction, tile, scale layout, and NVFP4's RHT,
// row-scaled and 4over6 forms (combinations the quantizer refuses are skipped by the caller).
std::vector<QuantizeOptions> option_grid() {
  std::vector<QuantizeOptions> grid;
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3,
                        Scheme::MXFP6_E3M2, Scheme::MXFP4}) {
    for (int directions = 1; directions <= 3; ++directions) {
      for (Tile tile : {Tile::k1x16, is_mx(scheme) ? Tile::k32x32 : Tile::k16x16}) {
        for (ScaleLayout layout : {ScaleLayout::Compact, ScaleLayout::Swizzled}) {
          QuantizeOptions o;
          o.scheme = scheme;
          o.rowwise = (directions & 1) != 0;
          o.columnwise = (directions & 2) != 0;
          o.tile = tile;
          o.scale_layout = layout;
          grid.push_back(o);
          if (scheme != Scheme::NVFP4 || tile != Tile::k1x16) continue;
          QuantizeOptions rht = o, row_scaled = o, four_over_six = o;
          rht.rht = true;
          row_scaled.row_scaled = true;
          four_over_six.four_over_six = FourOverSix::MinMae;
          grid.insert(grid.end(), {rht, row_scaled, four_over_six});
        }
      }
    }
  }
  return grid;
}

TEST(UninitializedOutputs, QuantizeWritesEveryOutputByte) {
  int calls = 0;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor x = random_tensor(dtype, {64, 96}, Fill::Heavy, 53);
    for (const QuantizeOptions& o : option_grid()) {
      for (const char* kernels : testing_data::kKernelSets) {
        if (!testing_data::select_kernel_set(kernels)) continue;
        QuantizedTensor under[2];
        bool refused = false;
        for (int f = 0; f < 2; ++f) {
          const FillScope fill(f == 0 ? 0x00 : 0xFF);
          try {
            under[f] = quantize(x.view(), o);
          } catch (const Error&) {
            refused = true;
          }
        }
        if (refused) continue;
        ++calls;
        expect_same_outputs(under[0], under[1],
                            std::string(scheme_name(o.scheme)) + " " + std::string(dtype_name(dtype)) +
                                " rowwise " + std::to_string(o.rowwise) + " columnwise " +
                                std::to_string(o.columnwise) + " tile " + std::string(tile_name(o.tile)) +
                                " rht " + std::to_string(o.rht) + " row_scaled " +
                                std::to_string(o.row_scaled) + " 4over6 " +
                                std::to_string(o.four_over_six != FourOverSix::Off) + " [" + kernels + "]");
      }
    }
  }
  unsetenv("MICROSCALE_CPU_KERNELS");
  EXPECT_GT(calls, 300);  // the grid was not refused wholesale
}

TEST(UninitializedOutputs, DequantizeWritesEveryOutputByte) {
  const Tensor x = random_tensor(DType::BF16, {64, 96}, Fill::Specials, 54);
  for (const QuantizeOptions& o : option_grid()) {
    if (!o.rowwise || !o.columnwise || o.tile != Tile::k1x16) continue;
    const QuantizedTensor q = quantize(x.view(), o);
    for (Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
      for (DType out : {DType::F32, DType::BF16, DType::F16}) {
        Tensor under[2];
        for (int f = 0; f < 2; ++f) {
          const FillScope fill(f == 0 ? 0x00 : 0xFF);
          under[f] = dequantize(q, usage, out);
        }
        EXPECT_TRUE(same_bytes(under[0], under[1]))
            << scheme_name(o.scheme) << " " << (usage == Usage::Rowwise ? "rowwise" : "columnwise") << " to "
            << dtype_name(out);
      }
    }
  }
}

}  // namespace
}  // namespace microscale
