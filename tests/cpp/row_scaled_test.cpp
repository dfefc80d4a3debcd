// Row-scaled NVFP4 (QuantizeOptions::row_scaled, TransformerEngine's row_scaled_nvfp4): each row
// quantized as a tensor of its own, the fast path against the reference, dequantization, the GEMM's
// outer scales, and the options it does not take.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/scale_math.hpp"
#include "kernel_sets.hpp"
#include "microscale/error.hpp"
#include "microscale/gemm.hpp"
#include "microscale/half.hpp"
#include "microscale/quantize.hpp"
#include "microscale/recipe.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;
using testing_data::same_bytes;

QuantizeOptions row_scaled_options(bool rowwise, bool columnwise) {
  QuantizeOptions o;
  o.scheme = Scheme::NVFP4;
  o.row_scaled = true;
  o.rowwise = rowwise;
  o.columnwise = columnwise;
  return o;
}

// Row r of a [rows, cols] tensor of any float dtype as a [1, cols] f32 tensor (exact widening).
Tensor row_of(const Tensor& x, int64_t r) {
  const int64_t cols = x.shape()[1];
  Tensor row(DType::F32, {1, cols});
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t i = r * cols + c;
    float v = 0.0f;
    switch (x.dtype()) {
      case DType::F32: v = x.data_as<float>()[i]; break;
      case DType::BF16: v = bf16_to_float(x.data_as<uint16_t>()[i]); break;
      default: v = half_to_float(x.data_as<uint16_t>()[i]); break;
    }
    row.data_as<float>()[c] = v;
  }
  return row;
}

Tensor transposed(const Tensor& x) {  // any float dtype -> f32 [cols, rows]
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  Tensor t(DType::F32, {cols, rows});
  for (int64_t r = 0; r < rows; ++r) {
    const Tensor row = row_of(x, r);
    for (int64_t c = 0; c < cols; ++c) t.data_as<float>()[c * rows + r] = row.data_as<float>()[c];
  }
  return t;
}

bool same_row(const Tensor& whole, int64_t r, const Tensor& one_row) {
  const int64_t n = one_row.numel();
  return std::memcmp(whole.data_as<uint8_t>() + r * n, one_row.data(), static_cast<size_t>(n)) == 0;
}

// The definition: row r of a row-scaled tensor has the bytes, scales and amax of row r quantized
// alone as a per-tensor NVFP4 tensor; columnwise, row k of X^T the same (X's column k alone).
TEST(RowScaled, EachRowIsQuantizedAsATensorOfItsOwn) {
  uint32_t seed = 70;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Specials, Fill::Sparse, Fill::Tiny}) {
      Tensor x = random_tensor(dtype, {32, 48}, fill, seed++);
      // One row of zeros: its amax is 0, and its codes and scales are all 0.
      std::memset(x.data_as<uint8_t>() + 5 * 48 * dtype_size(dtype), 0, 48 * dtype_size(dtype));
      const QuantizedTensor q = quantize_ref(x.view(), row_scaled_options(true, true));
      ASSERT_TRUE(q.row_scaled);
      QuantizeOptions plain;
      plain.scheme = Scheme::NVFP4;
      const std::string what =
          std::string(dtype_name(dtype)) + " fill " + std::to_string(static_cast<int>(fill));
      float largest = 0.0f;
      for (int64_t r = 0; r < 32; ++r) {
        const QuantizedTensor alone = quantize_ref(row_of(x, r).view(), plain);
        EXPECT_TRUE(same_row(q.rowwise_data, r, alone.rowwise_data)) << what << " row " << r;
        EXPECT_TRUE(same_row(q.rowwise_scale, r, alone.rowwise_scale)) << what << " row " << r;
        EXPECT_EQ(float_bits(q.rowwise_amaxes.data_as<float>()[r]), float_bits(alone.rowwise_amax)) << what;
        EXPECT_EQ(float_bits(q.amax_of_row(Usage::Rowwise, r)), float_bits(alone.rowwise_amax)) << what;
        largest = std::fmax(largest, alone.rowwise_amax);
      }
      EXPECT_EQ(q.rowwise_amaxes.data_as<float>()[5], 0.0f);
      EXPECT_EQ(float_bits(q.rowwise_amax), float_bits(largest)) << what;  // the largest row amax
      const Tensor xt = transposed(x);
      for (int64_t k = 0; k < 48; ++k) {
        const QuantizedTensor alone = quantize_ref(row_of(xt, k).view(), plain);
        EXPECT_TRUE(same_row(q.columnwise_data, k, alone.rowwise_data)) << what << " column " << k;
        EXPECT_TRUE(same_row(q.columnwise_scale, k, alone.rowwise_scale)) << what << " column " << k;
        EXPECT_EQ(float_bits(q.columnwise_amaxes.data_as<float>()[k]), float_bits(alone.rowwise_amax))
            << what;
      }
      // Dequantized, each row is that row's own tensor dequantized.
      const Tensor d = dequantize(q, Usage::Rowwise), dt = dequantize(q, Usage::Columnwise);
      for (int64_t r = 0; r < 32; r += 7) {
        const Tensor alone = dequantize(quantize_ref(row_of(x, r).view(), plain), Usage::Rowwise);
        EXPECT_EQ(std::memcmp(d.data_as<float>() + r * 48, alone.data(), alone.nbytes()), 0)
            << what << " " << r;
      }
      for (int64_t k = 0; k < 48; k += 5) {
        const Tensor alone = dequantize(quantize_ref(row_of(xt, k).view(), plain), Usage::Rowwise);
        EXPECT_EQ(std::memcmp(dt.data_as<float>() + k * 32, alone.data(), alone.nbytes()), 0)
            << what << " " << k;
      }
    }
  }
}

// 4over6 rows too: each row picks its candidates with its own global scale and amax.
TEST(RowScaled, FourOverSixRowsAreTensorsOfTheirOwn) {
  const Tensor x = random_tensor(DType::BF16, {16, 64}, Fill::Heavy, 5);
  for (FourOverSix mode : {FourOverSix::MinMae, FourOverSix::MinMse}) {
    QuantizeOptions o = row_scaled_options(true, false);
    o.four_over_six = mode;
    o.nvfp4_e4m3_max = 256;
    const QuantizedTensor q = quantize_ref(x.view(), o);
    o.row_scaled = false;
    for (int64_t r = 0; r < 16; ++r) {
      const QuantizedTensor alone = quantize_ref(row_of(x, r).view(), o);
      EXPECT_TRUE(same_row(q.rowwise_data, r, alone.rowwise_data)) << r;
      EXPECT_TRUE(same_row(q.rowwise_scale, r, alone.rowwise_scale)) << r;
    }
  }
}

void expect_same(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& what) {
  EXPECT_TRUE(same_bytes(a.rowwise_data, b.rowwise_data)) << what;
  EXPECT_TRUE(same_bytes(a.rowwise_scale, b.rowwise_scale)) << what;
  EXPECT_TRUE(same_bytes(a.columnwise_data, b.columnwise_data)) << what;
  EXPECT_TRUE(same_bytes(a.columnwise_scale, b.columnwise_scale)) << what;
  EXPECT_TRUE(same_bytes(a.rowwise_amaxes, b.rowwise_amaxes)) << what;
  EXPECT_TRUE(same_bytes(a.columnwise_amaxes, b.columnwise_amaxes)) << what;
  EXPECT_EQ(float_bits(a.rowwise_amax), float_bits(b.rowwise_amax)) << what;
  EXPECT_EQ(float_bits(a.columnwise_amax), float_bits(b.columnwise_amax)) << what;
  EXPECT_EQ(a.row_scaled, b.row_scaled) << what;
}

// The fast path equals the reference on every kernel set: every dtype and fill, rowwise only or
// both directions, 4over6 rowwise, swizzled scales, thread counts, a short last band, padded rows.
TEST(RowScaled, FastEqualsReference) {
  uint32_t seed = 90;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Specials, Fill::Sparse, Fill::Extreme}) {
      for (int variant = 0; variant < 6; ++variant) {
        const std::vector<int64_t> shape =
            variant == 5 ? std::vector<int64_t>{21, 48} : std::vector<int64_t>{2, 32, 80};
        const Tensor x = random_tensor(dtype, shape, fill, seed++);
        QuantizeOptions o = row_scaled_options(true, variant != 5);
        if (variant == 1) o.columnwise = false;
        if (variant == 2) o.scale_layout = ScaleLayout::Swizzled;
        if (variant == 3 || variant == 5) {
          o.columnwise = false;
          o.four_over_six = variant == 3 ? FourOverSix::MinMse : FourOverSix::MinMae;
        }
        o.num_threads = 1 + variant % 3;
        const std::string what = std::string(dtype_name(dtype)) + " fill " +
                                 std::to_string(static_cast<int>(fill)) + " variant " +
                                 std::to_string(variant);
        const QuantizedTensor ref = quantize_ref(x.view(), o);
        for (const char* kernels : testing_data::kKernelSets) {
          if (!testing_data::select_kernel_set(kernels)) continue;
          expect_same(quantize(x.view(), o), ref, what + " " + kernels);
        }
        unsetenv("MICROSCALE_CPU_KERNELS");
      }
    }
  }
  // Rows further apart than their length.
  const Tensor base = random_tensor(DType::BF16, {32, 128}, Fill::Normal, 3);
  TensorView padded = base.view();
  padded.shape = {32, 96};
  padded.strides = {128, 1};
  const QuantizeOptions o = row_scaled_options(true, true);
  expect_same(quantize(padded, o), quantize_ref(padded, o), "padded rows");
}

// quantize_into overwrites the amax vectors of a same-shaped earlier result in place.
TEST(RowScaled, QuantizeIntoReusesTheAmaxes) {
  const QuantizeOptions o = row_scaled_options(true, true);
  QuantizedTensor q = quantize(random_tensor(DType::F32, {32, 64}, Fill::Normal, 1).view(), o);
  const void* rows = q.rowwise_amaxes.data();
  const void* cols = q.columnwise_amaxes.data();
  const Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Heavy, 2);
  quantize_into(x.view(), o, q);
  EXPECT_EQ(q.rowwise_amaxes.data(), rows);
  EXPECT_EQ(q.columnwise_amaxes.data(), cols);
  expect_same(q, quantize_ref(x.view(), o), "into");
}

float at(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::BF16) return bf16_to_float(t.data_as<uint16_t>()[i]);
  return t.data_as<float>()[i];
}

// The GEMM follows TE's general_gemm for row-scaled operands: the product with every global amax
// taken as 1, then D[m, n] times the amaxes (their product first when one side has a single amax),
// the bias in fp32, and C (TE's accumulate) added to D rounded to its dtype.
TEST(RowScaled, GemmAppliesTheAmaxesAfterTheProduct) {
  const Tensor a = random_tensor(DType::BF16, {32, 64}, Fill::Heavy, 21);
  const Tensor b = random_tensor(DType::BF16, {16, 64}, Fill::Normal, 22);
  const QuantizedTensor qa = quantize(a.view(), row_scaled_options(true, false));
  QuantizeOptions plain;
  plain.scheme = Scheme::NVFP4;
  const QuantizedTensor qb_plain = quantize(b.view(), plain);
  const QuantizedTensor qb_rows = quantize(b.view(), row_scaled_options(true, false));
  // The unit product: both operands with amax 1.
  GemmOperand unit_a = GemmOperand::from(qa, Usage::Rowwise),
              unit_b = GemmOperand::from(qb_plain, Usage::Rowwise);
  unit_a.row_amaxes = {};
  unit_a.amax = unit_b.amax = 1.0f;
  const float alpha = 0.75f;
  GemmProblem unit_problem;
  unit_problem.alpha = alpha;
  const Tensor unit = gemm(unit_a, unit_b, unit_problem);
  GemmOperand unit_b_rows = GemmOperand::from(qb_rows, Usage::Rowwise);
  unit_b_rows.row_amaxes = {};
  unit_b_rows.amax = 1.0f;
  const Tensor unit_rows = gemm(unit_a, unit_b_rows, unit_problem);  // B's row-scaled blocks
  const float* row_a = qa.rowwise_amaxes.data_as<float>();
  const float* row_b = qb_rows.rowwise_amaxes.data_as<float>();
  const Tensor bias = random_tensor(DType::F32, {16}, Fill::Normal, 23);
  const Tensor c = random_tensor(DType::BF16, {32, 16}, Fill::Normal, 24);

  GemmProblem p;
  p.alpha = alpha;
  const Tensor one_side =
      gemm(GemmOperand::from(qa, Usage::Rowwise), GemmOperand::from(qb_plain, Usage::Rowwise), p);
  const Tensor both =
      gemm(GemmOperand::from(qa, Usage::Rowwise), GemmOperand::from(qb_rows, Usage::Rowwise), p);
  const Tensor other_side =
      gemm(GemmOperand::from(qb_plain, Usage::Rowwise), GemmOperand::from(qa, Usage::Rowwise), p);
  p.bias = bias.view();
  p.c = c.view();
  p.beta = 1.0f;
  p.out_dtype = DType::BF16;
  const Tensor with_epilogue =
      gemm(GemmOperand::from(qa, Usage::Rowwise), GemmOperand::from(qb_plain, Usage::Rowwise), p);
  for (int64_t i = 0; i < 32; ++i) {
    for (int64_t j = 0; j < 16; ++j) {
      const float u = unit.data_as<float>()[i * 16 + j];
      const float expect_one = u * (row_a[i] * qb_plain.rowwise_amax);
      EXPECT_EQ(float_bits(one_side.data_as<float>()[i * 16 + j]), float_bits(expect_one)) << i << ", " << j;
      const float expect_both = (unit_rows.data_as<float>()[i * 16 + j] * row_a[i]) * row_b[j];
      EXPECT_EQ(float_bits(both.data_as<float>()[i * 16 + j]), float_bits(expect_both)) << i << ", " << j;
      const float with_bias = expect_one + bias.data_as<float>()[j];
      const float expect_epilogue =
          bf16_to_float(float_to_bf16(at(c, i * 16 + j) + bf16_to_float(float_to_bf16(with_bias))));
      EXPECT_EQ(at(with_epilogue, i * 16 + j), expect_epilogue) << i << ", " << j;
    }
  }
  // B's rows scale D's columns: the transposed problem gives the transposed product (with one
  // single amax the product of the two amaxes is the same either way round).
  for (int64_t i = 0; i < 32; ++i) {
    for (int64_t j = 0; j < 16; ++j) {
      EXPECT_EQ(float_bits(other_side.data_as<float>()[j * 32 + i]),
                float_bits(one_side.data_as<float>()[i * 16 + j]));
    }
  }
  // A row-scaled B of one row counts as one value, as TE's numel() == 1: RN(D * RN(a[m] * b[0])).
  const Tensor b1 = random_tensor(DType::BF16, {1, 64}, Fill::Normal, 25);
  const QuantizedTensor qb1 = quantize(b1.view(), row_scaled_options(true, false));
  GemmOperand unit_b1 = GemmOperand::from(qb1, Usage::Rowwise);
  unit_b1.row_amaxes = {};
  unit_b1.amax = 1.0f;
  const Tensor unit1 = gemm(unit_a, unit_b1, unit_problem);
  GemmProblem plain_problem;
  plain_problem.alpha = alpha;
  const Tensor one_row =
      gemm(GemmOperand::from(qa, Usage::Rowwise), GemmOperand::from(qb1, Usage::Rowwise), plain_problem);
  for (int64_t i = 0; i < 32; ++i) {
    const float want = unit1.data_as<float>()[i] * (row_a[i] * qb1.rowwise_amaxes.data_as<float>()[0]);
    EXPECT_EQ(float_bits(one_row.data_as<float>()[i]), float_bits(want)) << i;
  }
  // Against the dequantized operands (each row with its own global scale): a few ulps apart.
  const Tensor da = dequantize(qa, Usage::Rowwise), db = dequantize(qb_plain, Usage::Rowwise);
  for (int64_t i = 0; i < 32; ++i) {
    for (int64_t j = 0; j < 16; ++j) {
      double sum = 0, magnitude = 0;  // fp32 sums: within a few ulps of the sum of |products|
      for (int64_t k = 0; k < 64; ++k) {
        const double product =
            static_cast<double>(da.data_as<float>()[i * 64 + k]) * db.data_as<float>()[j * 64 + k];
        sum += product;
        magnitude += std::abs(product);
      }
      EXPECT_NEAR(one_side.data_as<float>()[i * 16 + j], alpha * sum, 1e-5 * alpha * magnitude)
          << i << ", " << j;
    }
  }
}

void expect_error(const std::function<void()>& fn, const std::string& reason) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected an error about '" << reason << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

TEST(RowScaled, GemmErrors) {
  const Tensor a = random_tensor(DType::F32, {32, 64}, Fill::Normal, 1);
  const QuantizedTensor qa = quantize(a.view(), row_scaled_options(true, false));
  const GemmOperand op = GemmOperand::from(qa, Usage::Rowwise);
  GemmProblem p;
  const Tensor c(DType::F32, {32, 32});
  p.c = c.view();
  p.beta = 0.5f;
  expect_error([&] { gemm(op, op, p); }, "beta 1 only");
  GemmOperand both = op;
  both.amax = 1.0f;
  expect_error([&] { gemm(both, op); }, "not both");
  GemmOperand short_amaxes = op;
  short_amaxes.row_amaxes.shape = {16};
  expect_error([&] { gemm(short_amaxes, op); }, "row_amaxes must be");
  Tensor bad(DType::F32, {32});
  std::memcpy(bad.data(), qa.rowwise_amaxes.data(), bad.nbytes());
  bad.data_as<float>()[3] = INFINITY;
  GemmOperand infinite = op;
  infinite.row_amaxes = bad.view();
  expect_error([&] { gemm(infinite, op); }, "finite");
}

TEST(RowScaled, OptionsItDoesNotTake) {
  const Tensor x = random_tensor(DType::BF16, {32, 32}, Fill::Normal, 1);
  const auto rejected = [&](QuantizeOptions o, const std::string& reason) {
    for (auto fn : {quantize, quantize_ref}) expect_error([&] { fn(x.view(), o); }, reason);
  };
  QuantizeOptions o = row_scaled_options(true, true);
  o.tile = Tile::k16x16;
  rejected(o, "1x16 blocks only");
  o = row_scaled_options(true, true);
  o.rht = true;
  rejected(o, "does not take the RHT");
  o = row_scaled_options(true, true);
  o.stochastic_rounding = StochasticRounding{1, 0};
  rejected(o, "stochastic rounding");
  o = row_scaled_options(true, true);
  o.amax_rowwise = 1.0f;
  rejected(o, "no amax override");
  o = row_scaled_options(true, true);
  o.four_over_six = FourOverSix::MinMae;
  rejected(o, "rowwise only");
  rejected(row_scaled_options(false, true), "needs the rowwise output");
  o = row_scaled_options(true, true);
  o.scheme = Scheme::MXFP8_E4M3;
  rejected(o, "nvfp4 only");
  // A hand-made tensor whose amaxes do not fit its rows.
  QuantizedTensor q = quantize(x.view(), row_scaled_options(true, false));
  q.rowwise_amaxes = Tensor(DType::F32, {16});
  expect_error([&] { dequantize(q, Usage::Rowwise); }, "amaxes must be f32 [32]");
}

// TE's row_scaled_activation: the input only, and TE's refusals when the recipe is made.
TEST(RowScaled, RecipeMakesTheInputRowScaled) {
  NVFP4BlockScaling::Options o;
  o.disable_rht = true;
  o.row_scaled_activation = true;
  const NVFP4BlockScaling recipe(o);
  EXPECT_TRUE(quantize_options(recipe, TensorRole::Input)->row_scaled);
  EXPECT_FALSE(quantize_options(recipe, TensorRole::Weight)->row_scaled);
  EXPECT_FALSE(quantize_options(recipe, TensorRole::GradOutput)->row_scaled);
  EXPECT_FALSE(quantize_options(NVFP4BlockScaling{}, TensorRole::Input)->row_scaled);
  o.disable_rht = false;
  expect_error([&] { NVFP4BlockScaling{o}; }, "pass disable_rht=True too");
  o.disable_rht = true;
  // With 4over6 on the input the recipe stands (inference quantizes x rowwise only); a quantized
  // backward's X^T is refused when asked for, as TE refuses it.
  o.four_over_six = Nvfp4Scope::Activations;
  QuantizeOptions input = *quantize_options(NVFP4BlockScaling{o}, TensorRole::Input);
  EXPECT_EQ(input.four_over_six, FourOverSix::MinMae);
  EXPECT_TRUE(input.row_scaled);
  const Tensor x = random_tensor(DType::BF16, {32, 32}, Fill::Normal, 2);
  expect_error([&] { quantize(x.view(), input); }, "pass the recipe a backward_override");
  input.columnwise = false;
  EXPECT_TRUE(quantize(x.view(), input).row_scaled);
}

}  // namespace
}  // namespace microscale
