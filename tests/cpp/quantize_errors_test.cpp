// Bad input: every case is a microscale::Error with a reason, never a crash or silent garbage.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "microscale/error.hpp"
#include "microscale/layout.hpp"
#include "microscale/quantize.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;

// Expects quantize and quantize_ref to throw microscale::Error whose message contains `reason`.
void expect_rejected(const TensorView& x, const QuantizeOptions& o, const std::string& reason) {
  for (auto fn : {quantize, quantize_ref}) {
    try {
      fn(x, o);
      ADD_FAILURE() << "accepted; expected an error about '" << reason << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

TEST(QuantizeErrors, WrongDtype) {
  const Tensor x(DType::U8, {32, 32});
  expect_rejected(x.view(), QuantizeOptions{}, "dtype must be f32, bf16 or f16");
}

TEST(QuantizeErrors, EmptyAndNull) {
  const Tensor empty(DType::F32, {0, 32});
  expect_rejected(empty.view(), QuantizeOptions{}, "is empty");
  TensorView scalar = Tensor(DType::F32, {1}).view();
  scalar.shape = {};
  expect_rejected(scalar, QuantizeOptions{}, "at least one dimension");
  TensorView null_view = Tensor(DType::F32, {16, 16}).view();
  null_view.data = nullptr;
  expect_rejected(null_view, QuantizeOptions{}, "null data pointer");
}

TEST(QuantizeErrors, ShortAndNullBuffers) {
  std::vector<float> buffer(100);
  EXPECT_THROW(TensorView::from_buffer(buffer.data(), buffer.size() * 4, DType::F32, {16, 16}), Error);
  EXPECT_THROW(TensorView::from_buffer(nullptr, 1024, DType::F32, {16, 16}), Error);
  EXPECT_THROW(TensorView::from_buffer(buffer.data(), 400, DType::F32, {-1, 16}), Error);
  EXPECT_NO_THROW(TensorView::from_buffer(buffer.data(), 400, DType::F32, {100}));
}

TEST(QuantizeErrors, BadStrides) {
  const Tensor base = random_tensor(DType::F32, {64, 64}, Fill::Normal, 1);
  TensorView v = base.view();
  v.strides = {-64, 1};
  expect_rejected(v, QuantizeOptions{}, "must be positive");
  v.strides = {64};
  expect_rejected(v, QuantizeOptions{}, "do not match shape");
  v.strides = {1, 1};  // rows overlap
  expect_rejected(v, QuantizeOptions{}, "overlap");
  TensorView three = base.view();
  three.shape = {4, 16, 64};
  three.strides = {1, 64, 1};  // leading dims do not fold
  expect_rejected(three, QuantizeOptions{}, "do not fold");
}

TEST(QuantizeErrors, ShapesThatCannotBeBlocked) {
  const Tensor x = random_tensor(DType::BF16, {48, 40}, Fill::Normal, 2);
  QuantizeOptions o;
  expect_rejected(x.view(), o, "divisible by 16");  // K = 40
  o.scheme = Scheme::MXFP8_E4M3;
  expect_rejected(x.view(), o, "divisible by 32");
  const Tensor y = random_tensor(DType::BF16, {40, 64}, Fill::Normal, 3);
  o.columnwise = true;
  expect_rejected(y.view(), o, "leading dims divisible by 32");  // M = 40, MX columnwise
  o.rowwise = false;
  o.scheme = Scheme::MXFP4;
  const Tensor odd = random_tensor(DType::BF16, {64, 41}, Fill::Normal, 5);
  expect_rejected(odd.view(), o, "even last dim");  // FP4 columnwise-only, K odd
  o.rowwise = true;
  o.scheme = Scheme::NVFP4;
  o.rowwise = true;
  o.columnwise = false;
  o.tile = Tile::k16x16;
  const Tensor z = random_tensor(DType::BF16, {40, 64}, Fill::Normal, 4);
  expect_rejected(z.view(), o, "16x16 tiles need both dims divisible by 16");
}

TEST(QuantizeErrors, OptionsThatDoNotApply) {
  const Tensor x = random_tensor(DType::F32, {64, 64}, Fill::Normal, 5);
  QuantizeOptions o;
  o.rowwise = o.columnwise = false;
  expect_rejected(x.view(), o, "rowwise and/or columnwise");
  o = QuantizeOptions{};
  o.columnwise = true;
  o.rht = true;
  expect_rejected(x.view(), o, "RHT is only supported for bf16");
  o = QuantizeOptions{};
  o.tile = Tile::k16x16;
  o.rht = true;
  expect_rejected(random_tensor(DType::BF16, {64, 64}, Fill::Normal, 6).view(), o, "not 16x16");
  o = QuantizeOptions{};
  o.scheme = Scheme::MXFP4;
  o.stochastic_rounding = StochasticRounding{};
  expect_rejected(x.view(), o, "stochastic rounding applies to nvfp4");
  o.stochastic_rounding.reset();
  o.tile = Tile::k16x16;
  expect_rejected(x.view(), o, "16x16 tiles are nvfp4's");
  o = QuantizeOptions{};
  o.tile = Tile::k32x32;
  expect_rejected(x.view(), o, "32x32 tiles are MX's");
  o.scheme = Scheme::MXFP4;
  o.tile = Tile::k1x16;
  o.rht = true;
  expect_rejected(x.view(), o, "RHT applies to nvfp4");
  o = QuantizeOptions{};
  const uint64_t seed_in_host_memory = 1;
  o.stochastic_rounding = StochasticRounding{0, 0, &seed_in_host_memory};  // a CUDA-only field
  expect_rejected(x.view(), o, "device_seed");
  o = QuantizeOptions{};
  o.amax_rowwise = NAN;
  expect_rejected(x.view(), o, "amax override");
  o.amax_rowwise = -1.0f;
  expect_rejected(x.view(), o, "amax override");
  o = QuantizeOptions{};
  o.num_threads = -2;
  expect_rejected(x.view(), o, "num_threads");
  o = QuantizeOptions{};
  o.scheme = static_cast<Scheme>(99);
  expect_rejected(x.view(), o, "unknown scheme");
  o = QuantizeOptions{};
  o.scheme = Scheme::MXFP8_E5M2;
  o.scale_mode = static_cast<ScaleMode>(42);
  expect_rejected(x.view(), o, "unknown scale mode");
}

TEST(QuantizeErrors, NamesAndDequantize) {
  EXPECT_THROW(parse_scheme("nvfp5"), Error);
  EXPECT_THROW(parse_scale_mode("round"), Error);
  EXPECT_EQ(parse_scheme("MXFP8_E4M3"), Scheme::MXFP8_E4M3);
  const Tensor x = random_tensor(DType::F32, {32, 32}, Fill::Normal, 8);
  const QuantizedTensor q = quantize(x.view(), QuantizeOptions{});
  EXPECT_THROW(dequantize(q, Usage::Columnwise), Error);
  EXPECT_THROW(dequantize(q, Usage::Rowwise, DType::U8), Error);
  TensorView cuda_view = x.view();
  cuda_view.device = Device::CUDA;
  expect_rejected(cuda_view, QuantizeOptions{}, "CPU tensor");
}

// Expects fn() to throw microscale::Error whose message contains `text`.
template <typename Fn>
void expect_error(Fn fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected '" << text << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(QuantizeErrors, SizesThatOverflowAndThreadCounts) {
  const std::vector<float> buf(4);
  // 2^62 f32 elements: the element count fits int64, the byte count does not.
  expect_error([&] { TensorView::from_buffer(buf.data(), 16, DType::F32, {int64_t{1} << 62}); },
               "too many bytes");
  expect_error([&] { Tensor(DType::F32, {int64_t{1} << 62}); }, "too many bytes");
  expect_error([&] { quantized_shapes({-32, 64}, QuantizeOptions{}); }, "negative dimension");
  expect_error(
      [&] {
        quantized_shapes({int64_t{1} << 40, int64_t{1} << 40, 32}, QuantizeOptions{});
      },
      "too many elements");
  const Tensor x = random_tensor(DType::F32, {32, 32}, Fill::Normal, 9);
  QuantizeOptions o;
  for (int threads : {-1, kMaxThreads + 1, 100000}) {
    o.num_threads = threads;
    expect_rejected(x.view(), o, "num_threads must be");
  }
}

TEST(QuantizeErrors, DequantizeChecksAHandBuiltQuantizedTensor) {
  const Tensor x = random_tensor(DType::F32, {64, 64}, Fill::Normal, 10);
  QuantizeOptions o;
  o.columnwise = true;
  const QuantizedTensor good = quantize(x.view(), o);
  QuantizedTensor q = good;
  q.rowwise_data = Tensor(DType::U8, {1, 1});  // too short
  expect_error([&] { dequantize(q, Usage::Rowwise); }, "rowwise data is u8 [1, 1]");
  q = good;
  q.rows = q.cols = 4096;  // the data is that of [64, 64]
  expect_error([&] { dequantize(q, Usage::Columnwise); }, "columnwise data");
  q = good;
  q.scheme = Scheme::MXFP8_E4M3;  // NVFP4 bytes labelled MXFP8
  expect_error([&] { dequantize(q, Usage::Rowwise); }, "rowwise data");
  q = good;
  q.rowwise_scale = Tensor(DType::F32, {64, 4});  // the right count of the wrong dtype
  expect_error([&] { dequantize(q, Usage::Rowwise); }, "rowwise scales are f32");
  q = good;
  q.scale_layout = ScaleLayout::Swizzled;  // compact [64, 4] scales labelled swizzled [128, 4]
  expect_error([&] { dequantize(q, Usage::Rowwise); }, "swizzled scales are u8 [128, 4]");
  q = good;
  q.scale_layout = static_cast<ScaleLayout>(5);
  expect_error([&] { dequantize(q, Usage::Rowwise); }, "unknown scale layout");
  EXPECT_NO_THROW(dequantize(good, Usage::Columnwise));
}

TEST(QuantizeErrors, OutputsThatShareTheirBytesAreNotWrittenOverEachOther) {
  // Square NVFP4: rowwise and columnwise data have the same shape; one Tensor given for both.
  const Tensor x = random_tensor(DType::F32, {64, 64}, Fill::Normal, 11);
  QuantizeOptions o;
  o.columnwise = true;
  const QuantizedTensor expected = quantize(x.view(), o);
  QuantizedTensor q;
  q.rowwise_data = q.columnwise_data = Tensor(DType::U8, {64, 32});
  quantize_into(x.view(), o, q);
  EXPECT_NE(q.rowwise_data.data(), q.columnwise_data.data());
  EXPECT_EQ(0,
            std::memcmp(q.rowwise_data.data(), expected.rowwise_data.data(), expected.rowwise_data.nbytes()));
  EXPECT_EQ(0, std::memcmp(q.columnwise_data.data(), expected.columnwise_data.data(),
                           expected.columnwise_data.nbytes()));
}

}  // namespace
}  // namespace microscale
