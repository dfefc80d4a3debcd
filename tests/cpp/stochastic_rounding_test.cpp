// Stochastic rounding: reproducible per seed on every run and thread count, different per seed,
// and unbiased: the mean of many SR draws is closer to the input than round-to-nearest (TE's
// test_nvfp4_sr_quantize criterion), for rowwise and RHT columnwise outputs.
#include <gtest/gtest.h>

#include <cmath>

#include "microscale/hadamard.hpp"
#include "microscale/quantize.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;
using testing_data::same_bytes;

QuantizeOptions sr_options(uint64_t seed, uint64_t offset = 0) {
  QuantizeOptions o;
  o.rowwise = o.columnwise = true;
  o.rht = true;
  o.stochastic_rounding = StochasticRounding{seed, offset};
  return o;
}

TEST(StochasticRounding, SameSeedSameBytes) {
  const Tensor x = random_tensor(DType::BF16, {128, 256}, Fill::Normal, 3);
  const QuantizedTensor a = quantize(x.view(), sr_options(7));
  for (int run = 0; run < 3; ++run) {
    QuantizeOptions o = sr_options(7);
    o.num_threads = run + 1;
    const QuantizedTensor b = quantize(x.view(), o);
    EXPECT_TRUE(same_bytes(a.rowwise_data, b.rowwise_data));
    EXPECT_TRUE(same_bytes(a.columnwise_data, b.columnwise_data));
  }
  const QuantizedTensor r = quantize_ref(x.view(), sr_options(7));
  EXPECT_TRUE(same_bytes(a.rowwise_data, r.rowwise_data));
  EXPECT_TRUE(same_bytes(a.columnwise_data, r.columnwise_data));
  // Another seed or offset gives other bytes; scales and amaxes do not depend on the rounding.
  for (const QuantizeOptions& o : {sr_options(8), sr_options(7, 1)}) {
    const QuantizedTensor c = quantize(x.view(), o);
    EXPECT_FALSE(same_bytes(a.rowwise_data, c.rowwise_data));
    EXPECT_TRUE(same_bytes(a.rowwise_scale, c.rowwise_scale));
    EXPECT_EQ(a.columnwise_amax, c.columnwise_amax);
  }
}

double rmse(const std::vector<double>& a, const float* b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

TEST(StochasticRounding, MeanOfDrawsBeatsRoundToNearest) {
  const int64_t m = 128, k = 256;
  const Tensor x = random_tensor(DType::BF16, {m, k}, Fill::Normal, 4);
  // Targets: X for rowwise; RHT(X^T) for columnwise (TE dequantizes fp4 * scale * amax / 2688).
  Tensor xt(DType::BF16, {k, m});
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) xt.data_as<uint16_t>()[c * m + r] = x.data_as<uint16_t>()[r * k + c];
  }
  const Tensor target_col = hadamard16(xt.view(), 0xD7E8, false);
  std::vector<double> target_row(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) target_row[i] = bf16_to_float(x.data_as<uint16_t>()[i]);
  const std::vector<double> target_colv(target_col.data_as<float>(), target_col.data_as<float>() + m * k);

  QuantizeOptions rn = sr_options(0);
  rn.stochastic_rounding.reset();
  const QuantizedTensor q_rn = quantize(x.view(), rn);
  const Tensor rn_row = dequantize(q_rn, Usage::Rowwise), rn_col = dequantize(q_rn, Usage::Columnwise);

  constexpr int kDraws = 50;  // as TE's test
  std::vector<float> mean_row(static_cast<size_t>(m * k), 0.0f), mean_col(static_cast<size_t>(m * k), 0.0f);
  for (int draw = 0; draw < kDraws; ++draw) {
    const QuantizedTensor q = quantize(x.view(), sr_options(1000 + draw));
    const Tensor row = dequantize(q, Usage::Rowwise), col = dequantize(q, Usage::Columnwise);
    for (int64_t i = 0; i < m * k; ++i) {
      mean_row[i] += row.data_as<float>()[i] / kDraws;
      mean_col[i] += col.data_as<float>()[i] / kDraws;
    }
  }
  EXPECT_LT(rmse(target_row, mean_row.data()), rmse(target_row, rn_row.data_as<float>()));
  EXPECT_LT(rmse(target_colv, mean_col.data()), rmse(target_colv, rn_col.data_as<float>()));
}

}  // namespace
}  // namespace microscale
