// Recipes, autocast and the quantized Linear: the three GEMMs against float64 on the same
// dequantized operands (TE's module tests: SR off), SQNR against the unquantized products
// (torchao's MXFP8 floors; NVFP4's measured and stated in tolerances below), main_grad
// accumulation, the weight cache, autocast nesting and exceptions.
#include "microscale/linear.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/operand_access.hpp"
#include "microscale/error.hpp"
#include "microscale/gemm.hpp"
#include "microscale/half.hpp"
#include "microscale/recipe.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;

// SQNR floors (dB) of the Linear outputs against the unquantized fp64 products, for randn inputs.
// MXFP8: torchao test_mxfp8_linear (output >= 27, grad_input >= 25, grad_weight >= 24).
// NVFP4 (default recipe: RHT, SR on grads, 16x16 weights): measured here on randn
// [256 x 512] x [384 x 512]: output 16.63, grad_input 15.02, grad_weight 15.57 dB; the floors
// leave about 1.5 dB of margin.
struct Floors {
  double output, grad_input, grad_weight;
};
constexpr Floors kMxfp8Floors{27.0, 25.0, 24.0};
constexpr Floors kNvfp4Floors{15.0, 13.5, 14.0};

double sqnr(const std::vector<double>& ref, const Tensor& t) {
  double s = 0, e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    s += ref[i] * ref[i];
    const double d = ref[i] - t.data_as<float>()[i];
    e += d * d;
  }
  return 10 * std::log10(s / e);
}

// Unquantized products in float64 from f32 tensors: y = x W^T, dx = dy W, dW = dy^T x.
std::vector<double> matmul(const Tensor& a, bool a_t, const Tensor& b, bool b_t, int64_t m, int64_t n,
                           int64_t k) {
  std::vector<double> out(static_cast<size_t>(m * n));
  const float* pa = a.data_as<float>();
  const float* pb = b.data_as<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double va = a_t ? pa[p * m + i] : pa[i * k + p];
        const double vb = b_t ? pb[p * n + j] : pb[j * k + p];
        s += va * vb;
      }
      out[i * n + j] = s;
    }
  }
  return out;
}

struct LinearRun {
  Tensor y, dx, dw;
};

// Element i of an f32, bf16 or f16 tensor as a float.
float value_at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::BF16: return bf16_to_float(t.data_as<uint16_t>()[i]);
    case DType::F16: return half_to_float(t.data_as<uint16_t>()[i]);
    default: return t.data_as<float>()[i];
  }
}

LinearRun run_linear(const Recipe& recipe, const Tensor& x, const Tensor& w, const Tensor& dy,
                     uint64_t sr_seed = 5) {
  LinearSaved saved;
  LinearRun r;
  r.y = linear_forward(x.view(), w.view(), std::nullopt, recipe, &saved);
  LinearBackwardOptions o;
  o.stochastic_rounding = StochasticRounding{sr_seed, 0};
  const LinearGrads g = linear_backward(dy.view(), saved, o);
  r.dx = g.grad_input;
  r.dw = g.grad_weight;
  return r;
}

TEST(Recipe, OptionsPerRole) {
  const auto in = *quantize_options(NVFP4BlockScaling{}, TensorRole::Input);
  const auto wt = *quantize_options(NVFP4BlockScaling{}, TensorRole::Weight);
  const auto gr = *quantize_options(NVFP4BlockScaling{}, TensorRole::GradOutput, StochasticRounding{9, 1});
  EXPECT_TRUE(in.rht && !in.stochastic_rounding && in.tile == Tile::k1x16);
  EXPECT_TRUE(!wt.rht && !wt.stochastic_rounding && wt.tile == Tile::k16x16);
  EXPECT_TRUE(gr.rht && gr.stochastic_rounding && gr.stochastic_rounding->seed == 9);
  const auto plain = *quantize_options(
      NVFP4BlockScaling(
          {.disable_rht = true, .disable_stochastic_rounding = true, .disable_2d_quantization = true}),
      TensorRole::GradOutput);
  EXPECT_TRUE(!plain.rht && !plain.stochastic_rounding);
  EXPECT_EQ(quantize_options(MXFP8BlockScaling{}, TensorRole::GradOutput)->scheme, Scheme::MXFP8_E4M3);
  EXPECT_EQ(quantize_options(MXFP8BlockScaling(MXFP8BlockScaling::Fp8Format::HYBRID), TensorRole::GradOutput)
                ->scheme,
            Scheme::MXFP8_E5M2);
  EXPECT_EQ(quantize_options(MXFP8BlockScaling{}, TensorRole::Input)->scale_mode, ScaleMode::RCeil);
  // enable_2d_quantization: 32x32 tiles for the weight only (TE's MXFP8 2D quantization).
  const MXFP8BlockScaling two_d(MXFP8BlockScaling::Fp8Format::HYBRID, BackwardOverride::None, true);
  EXPECT_EQ(quantize_options(two_d, TensorRole::Weight)->tile, Tile::k32x32);
  EXPECT_EQ(quantize_options(two_d, TensorRole::Input)->tile, Tile::k1x16);
  EXPECT_EQ(quantize_options(two_d, TensorRole::GradOutput)->tile, Tile::k1x16);
  EXPECT_EQ(quantize_options(MXFP8BlockScaling{}, TensorRole::Weight)->tile, Tile::k1x16);
  EXPECT_FALSE(quantize_options(HighPrecision{}, TensorRole::Input).has_value());
}

TEST(Autocast, NestsRestoresAndIsExceptionSafe) {
  EXPECT_FALSE(autocast_enabled());
  EXPECT_STREQ(recipe_name(current_recipe()), "high_precision");
  {
    autocast outer(NVFP4BlockScaling{});
    EXPECT_STREQ(recipe_name(current_recipe()), "nvfp4");
    {
      autocast inner(MXFP8BlockScaling{});
      EXPECT_STREQ(recipe_name(current_recipe()), "mxfp8");
      {
        autocast off(MXFP8BlockScaling{}, /*enabled=*/false);
        EXPECT_FALSE(autocast_enabled());
        EXPECT_STREQ(recipe_name(current_recipe()), "high_precision");
      }
      EXPECT_STREQ(recipe_name(current_recipe()), "mxfp8");
    }
    EXPECT_STREQ(recipe_name(current_recipe()), "nvfp4");
    try {
      autocast inner(MXFP8BlockScaling(MXFP8BlockScaling::Fp8Format::HYBRID));
      EXPECT_STREQ(recipe_name(current_recipe()), "mxfp8_hybrid");
      throw Error("boom");
    } catch (const Error&) {
    }
    EXPECT_STREQ(recipe_name(current_recipe()), "nvfp4");
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_STREQ(recipe_name(current_recipe()), "high_precision");
}

// TE's module-exact criterion: each GEMM equals float64 on the same dequantized operands within
// fp32 accumulation (SR off so the gradient is deterministic), then rounded once to its bf16 output.
TEST(Linear, GemmsMatchFloat64OnDequantizedOperands) {
  const int64_t m = 64, k = 128, n = 96;
  const Tensor x = random_tensor(DType::BF16, {2, 32, k}, Fill::Normal, 1);
  const Tensor w = random_tensor(DType::F32, {n, k}, Fill::Normal, 2);
  const Tensor dy = random_tensor(DType::BF16, {2, 32, n}, Fill::Normal, 3);
  for (const Recipe& recipe :
       {Recipe{NVFP4BlockScaling({.disable_stochastic_rounding = true})}, Recipe{MXFP8BlockScaling{}},
        Recipe{MXFP8BlockScaling(MXFP8BlockScaling::Fp8Format::E4M3, BackwardOverride::None, true)}}) {
    LinearSaved saved;
    const Tensor y = linear_forward(x.view(), w.view(), std::nullopt, recipe, &saved);
    EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 32, n}));
    const LinearGrads g = linear_backward(dy.view(), saved);
    EXPECT_EQ(g.grad_input.shape(), x.shape());
    EXPECT_EQ(g.grad_weight.shape(), w.shape());
    EXPECT_EQ(saved.weight.tile, quantize_options(recipe, TensorRole::Weight)->tile);
    // Re-quantize dy as backward did and check each GEMM against its dequantized operands.
    const QuantizedTensor dyq = quantize(dy.view(), *quantize_options(recipe, TensorRole::GradOutput));
    const std::pair<const char*, std::pair<GemmOperand, GemmOperand>> gemms[] = {
        {"fprop", te_gemm_operands(saved.weight, saved.input, "TN")},
        {"dgrad", te_gemm_operands(saved.weight, dyq, "NN")},
        {"wgrad", te_gemm_operands(saved.input, dyq, "NT")}};
    const Tensor* outputs[] = {&y, &g.grad_input, &g.grad_weight};
    for (int i = 0; i < 3; ++i) {
      const auto& [a, b] = gemms[i].second;
      const OperandReader ra(a), rb(b);
      double alpha = 1.0;
      if (a.amax && b.amax) alpha = ((1.0f * *a.amax) * *b.amax) * (1.0f / 7225344.0f);
      double worst = 0;
      for (int64_t r = 0; r < ra.rows(); ++r) {
        for (int64_t c = 0; c < rb.rows(); ++c) {
          double s = 0, mag = 0;
          for (int64_t p = 0; p < ra.k(); ++p) {
            const double t = static_cast<double>(ra.at(0, r, p)) * rb.at(0, c, p);
            s += t;
            mag += std::fabs(t);
          }
          ASSERT_EQ(outputs[i]->dtype(), DType::BF16);  // x and dy are bf16: so are y, dx and dW
          const double got = value_at(*outputs[i], r * rb.rows() + c);
          const double rounding = std::ldexp(std::fabs(got), -8) * 1.01;  // RN to bf16: half an ulp, at most
          worst = std::max(worst, (std::fabs(got - alpha * s) - rounding) / (std::fabs(alpha) * mag + 1e-30));
        }
      }
      EXPECT_LT(worst, 1e-6) << recipe_name(recipe) << " " << gemms[i].first;  // TE: atol = rtol = 1e-6
    }
  }
  (void)m;
}

// Outputs come in the activation's dtype (TE's general_gemm out_dtype), each rounded once from the
// GEMM's fp32 result with the bias added: y in x's dtype, dx and db in dy's, a returned dW in x's.
TEST(Linear, OutputsInTheActivationDtypeRoundedOnce) {
  const Tensor x = random_tensor(DType::BF16, {32, 64}, Fill::Normal, 71);
  const Tensor w = random_tensor(DType::F32, {64, 64}, Fill::Normal, 72);
  const Tensor b = random_tensor(DType::BF16, {64}, Fill::Normal, 73);
  const Tensor dy = random_tensor(DType::F16, {32, 64}, Fill::Normal, 74);
  const Recipe recipe = MXFP8BlockScaling{};
  LinearSaved saved;
  const Tensor y = linear_forward(x.view(), w.view(), b.view(), recipe, &saved);
  ASSERT_EQ(y.dtype(), DType::BF16);
  GemmProblem f32;
  f32.bias = b.view();
  const auto [first, second] = te_gemm_operands(saved.weight, saved.input, "TN");
  const Tensor y32 = gemm(first, second, f32);
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_EQ(y.data_as<uint16_t>()[i], float_to_bf16(y32.data_as<float>()[i])) << i;
  const LinearGrads g = linear_backward(dy.view(), saved);
  EXPECT_EQ(g.grad_input.dtype(), DType::F16);
  EXPECT_EQ(g.grad_weight.dtype(), DType::BF16);
  EXPECT_EQ(g.grad_bias.dtype(), DType::F16);
  const QuantizedTensor dyq = quantize(dy.view(), *quantize_options(recipe, TensorRole::GradOutput));
  const auto [a, c] = te_gemm_operands(saved.weight, dyq, "NN");
  const Tensor dx32 = gemm(a, c);
  for (int64_t i = 0; i < dx32.numel(); ++i)
    EXPECT_EQ(g.grad_input.data_as<uint16_t>()[i], float_to_half(dx32.data_as<float>()[i])) << i;
  for (int64_t j = 0; j < 64; ++j) {
    double s = 0;
    for (int64_t i = 0; i < 32; ++i) s += half_to_float(dy.data_as<uint16_t>()[i * 64 + j]);
    EXPECT_EQ(g.grad_bias.data_as<uint16_t>()[j], float_to_half(static_cast<float>(s))) << j;
  }
  // f32 in, f32 out.
  const Tensor x32 = random_tensor(DType::F32, {32, 64}, Fill::Normal, 75);
  EXPECT_EQ(linear_forward(x32.view(), w.view(), std::nullopt, recipe).dtype(), DType::F32);
}

// Under an RHT recipe an f32 x is rounded to bf16 before it is quantized, for its rowwise copy too:
// a forward gives the same y whether it trains (saving X^T for wgrad) or not.
TEST(Linear, AnRhtRecipeGivesTheSameForwardInTrainingAndInference) {
  const Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Normal, 81);
  const Tensor w = random_tensor(DType::F32, {32, 64}, Fill::Normal, 82);
  const Recipe recipe = NVFP4BlockScaling{};
  LinearSaved saved;
  const Tensor trained = linear_forward(x.view(), w.view(), std::nullopt, recipe, &saved);
  const Tensor inferred = linear_forward(x.view(), w.view(), std::nullopt, recipe);
  ASSERT_EQ(trained.nbytes(), inferred.nbytes());
  EXPECT_EQ(0, std::memcmp(trained.data(), inferred.data(), trained.nbytes()));
}

TEST(Linear, SqnrAgainstUnquantizedProducts) {
  const int64_t m = 256, k = 512, n = 384;
  const Tensor x = random_tensor(DType::F32, {m, k}, Fill::Normal, 11);
  const Tensor w = random_tensor(DType::F32, {n, k}, Fill::Normal, 12);
  const Tensor dy = random_tensor(DType::F32, {m, n}, Fill::Normal, 13);
  const std::vector<double> y_ref = matmul(x, false, w, false, m, n, k);
  const std::vector<double> dx_ref = matmul(dy, false, w, true, m, k, n);  // dy [m,n] W [n,k]
  const std::vector<double> dw_ref = matmul(dy, true, x, true, n, k, m);   // dy^T [n,m] x [m,k]
  const std::pair<Recipe, Floors> cases[] = {{MXFP8BlockScaling{}, kMxfp8Floors},
                                             {NVFP4BlockScaling{}, kNvfp4Floors}};
  for (const auto& [recipe, floors] : cases) {
    const LinearRun r = run_linear(recipe, x, w, dy);
    const double s_y = sqnr(y_ref, r.y), s_dx = sqnr(dx_ref, r.dx), s_dw = sqnr(dw_ref, r.dw);
    EXPECT_GE(s_y, floors.output) << recipe_name(recipe);
    EXPECT_GE(s_dx, floors.grad_input) << recipe_name(recipe);
    EXPECT_GE(s_dw, floors.grad_weight) << recipe_name(recipe);
    std::printf("%-6s SQNR dB: output %.2f, grad_input %.2f, grad_weight %.2f\n", recipe_name(recipe), s_y,
                s_dx, s_dw);
  }
  // High precision is the fp32 product.
  const LinearRun hp = run_linear(HighPrecision{}, x, w, dy);
  EXPECT_GT(sqnr(y_ref, hp.y), 120.0);
  EXPECT_GT(sqnr(dw_ref, hp.dw), 120.0);
}

TEST(Linear, MainGradAccumulatesAndBiasGrad) {
  const Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Normal, 21);
  const Tensor w = random_tensor(DType::F32, {32, 64}, Fill::Normal, 22);
  const Tensor b = random_tensor(DType::F32, {32}, Fill::Normal, 23);
  const Tensor dy = random_tensor(DType::F32, {32, 32}, Fill::Normal, 24);
  const Recipe recipe = MXFP8BlockScaling{};
  LinearSaved saved;
  const Tensor y = linear_forward(x.view(), w.view(), b.view(), recipe, &saved);
  const Tensor y_nobias = linear_forward(x.view(), w.view(), std::nullopt, recipe);
  for (int64_t i = 0; i < y.numel(); ++i) {
    EXPECT_EQ(y.data_as<float>()[i], y_nobias.data_as<float>()[i] + b.data_as<float>()[i % 32]);
  }
  const LinearGrads plain = linear_backward(dy.view(), saved);
  Tensor main_grad(DType::F32, {32, 64});
  for (int64_t i = 0; i < main_grad.numel(); ++i) main_grad.data_as<float>()[i] = 1.0f;
  LinearBackwardOptions o;
  o.main_grad = main_grad.view();
  const LinearGrads fused = linear_backward(dy.view(), saved, o);
  EXPECT_FALSE(fused.grad_weight.defined());
  for (int64_t i = 0; i < main_grad.numel(); ++i) {
    EXPECT_EQ(main_grad.data_as<float>()[i], plain.grad_weight.data_as<float>()[i] + 1.0f);
  }
  for (int64_t j = 0; j < 32; ++j) {
    double s = 0;
    for (int64_t i = 0; i < 32; ++i) s += dy.data_as<float>()[i * 32 + j];
    EXPECT_FLOAT_EQ(plain.grad_bias.data_as<float>()[j], static_cast<float>(s));
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(Linear, AFrozenWeightSkipsWgradAndLeavesDxAsItWas) {
  const Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Normal, 31);
  const Tensor w = random_tensor(DType::F32, {96, 64}, Fill::Normal, 32);
  const Tensor dy = random_tensor(DType::F32, {32, 96}, Fill::Normal, 33);
  const Recipe recipes[] = {NVFP4BlockScaling{}, MXFP8BlockScaling{}, HighPrecision{}};
  for (const Recipe& recipe : recipes) {
    SCOPED_TRACE(recipe_name(recipe));
    const LinearRun full = run_linear(recipe, x, w, dy);
    // Frozen: the forward keeps no x for wgrad, the backward makes dx alone, with the same bytes
    // (dy's rowwise output, stochastic rounding included, does not depend on its columnwise one).
    LinearSaved saved;
    const Tensor y = linear_forward(x.view(), w.view(), std::nullopt, recipe, &saved, nullptr, false);
    EXPECT_TRUE(same_bytes(y, full.y));
    EXPECT_FALSE(saved.input.has(Usage::Columnwise));
    EXPECT_FALSE(saved.input_f32.defined());
    LinearBackwardOptions o;
    o.stochastic_rounding = StochasticRounding{5, 0};           // run_linear's
    EXPECT_THROW(linear_backward(dy.view(), saved, o), Error);  // dW asked for, nothing kept for it
    o.compute_grad_weight = false;
    const LinearGrads frozen = linear_backward(dy.view(), saved, o);
    EXPECT_TRUE(same_bytes(frozen.grad_input, full.dx));
    EXPECT_FALSE(frozen.grad_weight.defined());
    // The other way round: dW alone (an input that needs no gradient) equals the full run's.
    LinearSaved saved_all;
    linear_forward(x.view(), w.view(), std::nullopt, recipe, &saved_all);
    LinearBackwardOptions only_dw;
    only_dw.stochastic_rounding = StochasticRounding{5, 0};
    only_dw.compute_grad_input = false;
    const LinearGrads dw = linear_backward(dy.view(), saved_all, only_dw);
    EXPECT_FALSE(dw.grad_input.defined());
    EXPECT_TRUE(same_bytes(dw.grad_weight, full.dw));
  }
}

// TransformerEngine's backward_override: the recipe's forward, then dgrad and wgrad as an
// unquantized Linear computes them, from x and W as given ("high_precision") or from their rowwise
// quantizations dequantized to x's dtype ("dequantized"), and the unquantized dy.
TEST(Linear, BackwardOverridesRunTheBackwardUnquantized) {
  const Tensor x = random_tensor(DType::BF16, {64, 96}, Fill::Normal, 41);
  const Tensor w = random_tensor(DType::F32, {64, 96}, Fill::Normal, 42);
  const Tensor dy = random_tensor(DType::BF16, {64, 64}, Fill::Normal, 43);
  const auto with_override = [](const Recipe& base, BackwardOverride o) -> Recipe {
    if (std::holds_alternative<NVFP4BlockScaling>(base)) {
      NVFP4BlockScaling::Options options;
      options.backward_override = o;
      return NVFP4BlockScaling(options);
    }
    return MXFP8BlockScaling(MXFP8BlockScaling::Fp8Format::E4M3, o);
  };
  const LinearRun high = run_linear(HighPrecision{}, x, w, dy);
  for (const Recipe& base : {Recipe(NVFP4BlockScaling{}), Recipe(MXFP8BlockScaling{})}) {
    SCOPED_TRACE(recipe_name(base));
    EXPECT_EQ(backward_override(base), BackwardOverride::None);
    const LinearRun quantized = run_linear(base, x, w, dy);

    const Recipe hp = with_override(base, BackwardOverride::HighPrecision);
    EXPECT_EQ(backward_override(hp), BackwardOverride::HighPrecision);
    LinearSaved saved;
    const Tensor y = linear_forward(x.view(), w.view(), std::nullopt, hp, &saved);
    EXPECT_TRUE(same_bytes(y, quantized.y));                               // the recipe's forward
    EXPECT_TRUE(saved.input_f32.defined() && saved.weight_f32.defined());  // x and W kept unquantized
    EXPECT_FALSE(saved.input.has(Usage::Rowwise) || saved.weight.has(Usage::Rowwise));
    const LinearGrads g =
        linear_backward(dy.view(), saved, {});  // no seed needed: nothing is rounded stochastically
    EXPECT_TRUE(same_bytes(g.grad_input, high.dx));
    EXPECT_TRUE(same_bytes(g.grad_weight, high.dw));

    const Recipe dq = with_override(base, BackwardOverride::Dequantized);
    LinearSaved dq_saved;
    EXPECT_TRUE(same_bytes(linear_forward(x.view(), w.view(), std::nullopt, dq, &dq_saved), quantized.y));
    EXPECT_FALSE(dq_saved.input.has(Usage::Columnwise));
    // The same dense GEMMs on the rowwise quantizations' values in x's dtype (bf16), as f32.
    const Tensor w_values = to_f32_matrix(dequantize(dq_saved.weight, Usage::Rowwise, DType::BF16).view());
    const Tensor x_values = to_f32_matrix(dequantize(dq_saved.input, Usage::Rowwise, DType::BF16).view());
    const auto accumulated = [&dy](const Recipe& recipe, const Tensor& xv, const Tensor& wv, Tensor& dx) {
      LinearSaved s;
      linear_forward(xv.view(), wv.view(), std::nullopt, recipe, &s);
      Tensor main_grad(DType::F32, {64, 96});
      std::fill_n(main_grad.data_as<float>(), main_grad.numel(), 0.5f);  // dW is added to it
      LinearBackwardOptions o;
      o.main_grad = main_grad.view();
      const LinearGrads g = linear_backward(dy.view(), s, o);
      EXPECT_FALSE(g.grad_weight.defined());
      dx = g.grad_input;
      return main_grad;
    };
    Tensor dx, want_dx;
    const Tensor main_grad = accumulated(dq, x, w, dx);
    const Tensor want_main_grad = accumulated(HighPrecision{}, x_values, w_values, want_dx);
    EXPECT_TRUE(same_bytes(dx, want_dx));
    EXPECT_TRUE(same_bytes(main_grad, want_main_grad));
    EXPECT_FALSE(same_bytes(dx, high.dx));  // dequantized operands are not the originals
  }
}

TEST(Linear, WeightQuantizationIsCachedUntilTheWeightChanges) {
  Linear layer(64, 32, true, 7);
  const Tensor x = random_tensor(DType::BF16, {32, 64}, Fill::Normal, 31);
  const Tensor dy = random_tensor(DType::F32, {32, 32}, Fill::Normal, 32);
  autocast scope(NVFP4BlockScaling{});
  for (int micro_batch = 0; micro_batch < 3; ++micro_batch) {
    layer.forward(x.view());
    layer.backward(dy.view());
  }
  EXPECT_EQ(layer.weight_quantizations(), 1);
  layer.sgd_step(0.01f);
  layer.forward(x.view());
  EXPECT_EQ(layer.weight_quantizations(), 2);
  {
    autocast other(MXFP8BlockScaling{});  // a different recipe needs a different quantization
    layer.forward(x.view());
  }
  EXPECT_EQ(layer.weight_quantizations(), 3);
  {
    // MXFP8 again with 32x32 weight tiles: another quantization of the weight.
    autocast other(MXFP8BlockScaling(MXFP8BlockScaling::Fp8Format::E4M3, BackwardOverride::None, true));
    layer.forward(x.view());
  }
  EXPECT_EQ(layer.weight_quantizations(), 4);
  {
    // Another NVFP4 recipe whose weight is quantized otherwise (1x16 blocks, not 16x16 tiles).
    autocast other(NVFP4BlockScaling({.disable_2d_quantization = true}));
    layer.forward(x.view());
    layer.backward(dy.view());
  }
  EXPECT_EQ(layer.weight_quantizations(), 5);
  layer.forward(x.view());  // the default NVFP4 recipe again
  EXPECT_EQ(layer.weight_quantizations(), 6);
  // Recipes that differ only in the weight's 4over6: its error mode, then its bound.
  NVFP4BlockScaling::Options fos{.four_over_six = Nvfp4Scope::Weights};
  for (int expected : {7, 8, 9}) {
    autocast other{NVFP4BlockScaling(fos)};
    layer.forward(x.view());
    layer.backward(dy.view());
    EXPECT_EQ(layer.weight_quantizations(), expected);
    if (expected == 7) fos.four_over_six_err_mode = FourOverSix::MinMse;
    if (expected == 8) fos.four_over_six_e4m3_use_256 = Nvfp4Scope::None;
  }
}

TEST(Linear, ClearErrors) {
  const Tensor x = random_tensor(DType::F32, {16, 64}, Fill::Normal, 41);
  const Tensor w = random_tensor(DType::F32, {16, 48}, Fill::Normal, 42);
  EXPECT_THROW(linear_forward(x.view(), w.view(), std::nullopt, HighPrecision{}), Error);
  const Tensor w2 = random_tensor(DType::F32, {16, 64}, Fill::Normal, 43);
  LinearSaved saved;
  linear_forward(x.view(), w2.view(), std::nullopt, NVFP4BlockScaling{}, &saved);
  const Tensor wrong = random_tensor(DType::F32, {16, 8}, Fill::Normal, 44);
  EXPECT_THROW(linear_backward(wrong.view(), saved), Error);
  EXPECT_THROW(linear_backward(wrong.view(), LinearSaved{}), Error);
  // NVFP4 needs M divisible by 16 for the columnwise (wgrad) copy of x.
  const Tensor x_odd = random_tensor(DType::F32, {10, 64}, Fill::Normal, 45);
  EXPECT_THROW(linear_forward(x_odd.view(), w2.view(), std::nullopt, NVFP4BlockScaling{}, &saved), Error);
  EXPECT_THROW(Linear(0, 4, false, 1), Error);
  // A cached weight of another scheme or shape than the recipe's weight.
  QuantizeOptions mxfp4;
  mxfp4.scheme = Scheme::MXFP4;
  const QuantizedTensor w4 = quantize(w2.view(), mxfp4);
  EXPECT_THROW(linear_forward(x.view(), w2.view(), std::nullopt, MXFP8BlockScaling{}, nullptr, &w4), Error);
  const QuantizedTensor w_small = quantize(random_tensor(DType::F32, {32, 32}, Fill::Normal, 46).view(),
                                           *quantize_options(NVFP4BlockScaling{}, TensorRole::Weight));
  EXPECT_THROW(linear_forward(x.view(), w2.view(), std::nullopt, NVFP4BlockScaling{}, nullptr, &w_small),
               Error);
}

// Quantization errors inside the layer say which of its tensors they are about.
TEST(Linear, QuantizationErrorsNameTheTensor) {
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor x = random_tensor(DType::F32, {16, 64}, Fill::Normal, 51);
  const Tensor w24 = random_tensor(DType::F32, {24, 64}, Fill::Normal, 52);  // N = 24: no 16x16 tiles
  EXPECT_NE(message([&] { linear_forward(x.view(), w24.view(), std::nullopt, NVFP4BlockScaling{}); })
                .find("weight: nvfp4 columnwise needs the flattened leading dims divisible by 16; input "
                      "(flattened) is "
                      "[24, 64]"),
            std::string::npos);
  const Tensor x10 = random_tensor(DType::F32, {10, 64}, Fill::Normal, 53);
  const Tensor w = random_tensor(DType::F32, {16, 64}, Fill::Normal, 54);
  LinearSaved saved;
  EXPECT_NE(message([&] {
              linear_forward(x10.view(), w.view(), std::nullopt, NVFP4BlockScaling{}, &saved);
            }).find("x: nvfp4 columnwise needs"),
            std::string::npos);
  Linear layer(64, 24, false, 7);
  const autocast scope(NVFP4BlockScaling{});
  EXPECT_NE(message([&] { layer.forward(x.view()); }).find("weight: "), std::string::npos);
}

// One backward per forward, as in autograd: a second one would accumulate the same gradients again.
TEST(Linear, BackwardTwiceWithoutForwardIsAnError) {
  const Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Normal, 61);
  const Tensor dy = random_tensor(DType::F32, {32, 32}, Fill::Normal, 62);
  Linear layer(64, 32, true, 9);
  const autocast scope(MXFP8BlockScaling{});
  EXPECT_THROW(layer.backward(dy.view()), Error);  // no forward yet
  layer.forward(x.view());
  const Tensor wrong = random_tensor(DType::F32, {32, 8}, Fill::Normal, 63);
  EXPECT_THROW(layer.backward(wrong.view()), Error);  // a failed backward keeps the context
  layer.backward(dy.view());
  const std::vector<float> once(layer.main_grad().data_as<float>(),
                                layer.main_grad().data_as<float>() + layer.main_grad().numel());
  EXPECT_THROW(layer.backward(dy.view()), Error);
  EXPECT_TRUE(std::equal(once.begin(), once.end(), layer.main_grad().data_as<float>()));
  layer.forward(x.view());
  EXPECT_NO_THROW(layer.backward(dy.view()));
}

// A failed backward draws no stochastic-rounding stream: retried, it gives what a backward that
// never failed gives (NVFP4 gradients use SR with one offset per backward).
TEST(Linear, AFailedBackwardLeavesTheRandomStreamAsItWas) {
  const Tensor x = random_tensor(DType::BF16, {32, 64}, Fill::Normal, 64);
  const Tensor dy = random_tensor(DType::BF16, {32, 32}, Fill::Normal, 65);
  const Tensor wrong = random_tensor(DType::BF16, {32, 16}, Fill::Normal, 66);
  const autocast scope(NVFP4BlockScaling{});
  Linear retried(64, 32, false, 11), direct(64, 32, false, 11);
  for (int step = 0; step < 2; ++step) {
    retried.forward(x.view());
    EXPECT_THROW(retried.backward(wrong.view()), Error);
    retried.backward(dy.view());
    direct.forward(x.view());
    direct.backward(dy.view());
  }
  const Tensor& a = retried.main_grad();
  const Tensor& b = direct.main_grad();
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()));
}

}  // namespace
}  // namespace microscale
