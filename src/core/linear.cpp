// linear_forward / linear_backward / Linear: the three GEMMs of a Linear layer under a recipe.
#include "microscale/linear.hpp"

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "core/float_store.hpp"
#include "core/fp_environment.hpp"
#include "core/input_matrix.hpp"
#include "microscale/error.hpp"
#include "microscale/gemm.hpp"
#include "microscale/half.hpp"

namespace microscale {
namespace {

// [rows, cols] view of a contiguous f32 tensor, transposed: [cols, rows] with strides (1, cols).
TensorView transposed(const Tensor& t) {
  TensorView v = t.view();
  v.shape = {t.shape()[1], t.shape()[0]};
  v.strides = {1, t.shape()[1]};
  return v;
}

// The input's view folded to 2-D [M, K] (quantize() folds the same way).
TensorView folded(const TensorView& x, int64_t m, int64_t k) {
  const InputMatrix im = make_input_matrix(x);
  TensorView v = x;
  v.shape = {m, k};
  v.strides = {im.row_stride, im.col_stride};
  return v;
}

bool is_high_precision(const Recipe& r) { return std::holds_alternative<HighPrecision>(r); }

// The RHT is defined on bf16 tensors only (as in TransformerEngine, whose NVFP4 training runs in
// bf16): under an RHT recipe an f32/f16 activation or gradient is rounded to bf16 first, for both
// usages, so that a forward quantizes x alike whether or not it trains (the RHT serves its
// columnwise copy only). Returns the tensor to quantize ([rows, cols] view) and keeps the bf16
// copy alive in `storage`.
TensorView rht_ready(const TensorView& x, int64_t rows, int64_t cols, const QuantizeOptions& o,
                     Tensor& storage) {
  TensorView v = folded(x, rows, cols);
  if (!o.rht || v.dtype == DType::BF16) return v;
  const InputMatrix im = make_input_matrix(v);
  storage = Tensor(DType::BF16, {rows, cols});
  auto* out = storage.data_as<uint16_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = float_to_bf16(im.at(r, c));
  }
  return storage.view();
}

// The sums of the unquantized dy over its rows ([M, N] -> [N]), in `dtype` (as TransformerEngine
// gives the bias gradient in dy's dtype): in double, rounded to fp32, then to `dtype`.
Tensor column_sums(const InputMatrix& dy, DType dtype) {
  Tensor out(dtype, {dy.cols});
  for (int64_t j = 0; j < dy.cols; ++j) {
    double sum = 0.0;
    for (int64_t i = 0; i < dy.rows; ++i) sum += dy.at(i, j);
    store_float(dtype, out.data(), j, static_cast<float>(sum));  // dy's dtype: f32, bf16 or f16
  }
  return out;
}

// Whether two option sets quantize a tensor to the same bytes (what Linear's weight cache needs).
bool same_quantization(const QuantizeOptions& a, const QuantizeOptions& b) {
  const auto sr = [](const QuantizeOptions& o) {
    return o.stochastic_rounding
               ? std::optional(std::pair(o.stochastic_rounding->seed, o.stochastic_rounding->offset))
               : std::nullopt;
  };
  return a.scheme == b.scheme && a.rowwise == b.rowwise && a.columnwise == b.columnwise &&
         a.scale_mode == b.scale_mode && a.tile == b.tile && a.rht == b.rht &&
         a.rht_sign_mask == b.rht_sign_mask && sr(a) == sr(b) && a.amax_rowwise == b.amax_rowwise &&
         a.amax_columnwise == b.amax_columnwise && a.scale_layout == b.scale_layout &&
         a.four_over_six == b.four_over_six && a.four_over_six_scaled_error == b.four_over_six_scaled_error &&
         a.nvfp4_e4m3_max == b.nvfp4_e4m3_max && a.row_scaled == b.row_scaled;
}

// dgrad and wgrad as an unquantized Linear computes them, from f32 copies of dy [M, N], the weight
// [N, K] and x [M, K] (x may be undefined when no wgrad is asked for): fp32 accumulation, one
// rounding to each problem's output dtype. HighPrecision recipes and the backward overrides.
void dense_backward(const Tensor& dy, const Tensor& weight, const Tensor& input,
                    const LinearBackwardOptions& options, const GemmProblem& dgrad_problem,
                    const GemmProblem& wgrad_problem, LinearGrads& grads) {
  if (options.compute_grad_input) {  // dx = dy W
    grads.grad_input =
        gemm(GemmOperand::from_dense(dy.view()), GemmOperand::from_dense(transposed(weight)), dgrad_problem);
  }
  if (options.compute_grad_weight) {  // dW = dy^T x
    const GemmOperand a = GemmOperand::from_dense(transposed(dy)),
                      b = GemmOperand::from_dense(transposed(input));
    if (options.main_grad) {
      gemm_into(a, b, wgrad_problem, *options.main_grad);
    } else {
      grads.grad_weight = gemm(a, b, wgrad_problem);
    }
  }
}

// A saved quantization's rowwise values as backward_override "dequantized" reads them: dequantized
// to the activation's dtype (TransformerEngine's dequantize(dtype=activation_dtype)), then as f32.
Tensor dequantized_rowwise(const QuantizedTensor& q, DType activation_dtype) {
  return to_f32_matrix(dequantize(q, Usage::Rowwise, activation_dtype).view());
}

// quantize() of one of the layer's tensors; its errors say which tensor ("weight: ...").
QuantizedTensor quantize_operand(const TensorView& v, const QuantizeOptions& o, const std::string& what) {
  try {
    return quantize(v, o);
  } catch (const Error& e) {
    throw Error(what + ": " + e.reason());  // the reason gives the shape
  }
}

}  // namespace

Tensor linear_forward(const TensorView& x, const TensorView& weight, const std::optional<TensorView>& bias,
                      const Recipe& recipe, LinearSaved* saved, const QuantizedTensor* cached_weight,
                      bool weight_grad) {
  const IeeeSubnormals ieee;  // whatever FTZ/DAZ the caller set (fp_environment.hpp)
  const InputMatrix xm = make_input_matrix(x);
  const InputMatrix wm = make_input_matrix(weight);
  if (weight.ndim() != 2) throw Error("weight must be 2-D [N, K], got " + shape_string(weight.shape));
  if (xm.cols != wm.cols) {
    throw Error("x has K = " + std::to_string(xm.cols) + " but weight " + shape_string(weight.shape) +
                " has K = " + std::to_string(wm.cols));
  }
  const int64_t m = xm.rows, k = xm.cols, n = wm.rows;
  GemmProblem problem;
  if (bias) problem.bias = *bias;
  problem.out_dtype = x.dtype;  // y in the activation's dtype, rounded once (TE's fprop)

  Tensor y;
  if (is_high_precision(recipe)) {
    Tensor xf = to_f32_matrix(x), wf = to_f32_matrix(weight);
    y = gemm(GemmOperand::from_dense(xf.view()), GemmOperand::from_dense(wf.view()), problem);
    if (saved) {
      if (weight_grad) saved->input_f32 = xf;
      saved->weight_f32 = wf;
    }
  } else {
    // A backward override runs no quantized wgrad: X^T is not made (TransformerEngine's rowwise-only x).
    const BackwardOverride override = backward_override(recipe);
    QuantizeOptions xo = *quantize_options(recipe, TensorRole::Input);
    xo.columnwise = saved != nullptr && weight_grad && override == BackwardOverride::None;  // X^T feeds wgrad
    Tensor x_bf16;
    const QuantizedTensor xq = quantize_operand(rht_ready(x, m, k, xo, x_bf16), xo, "x");
    const QuantizeOptions wo = *quantize_options(recipe, TensorRole::Weight);
    if (cached_weight) {  // it must be what quantize(weight, wo) would give, at least in kind and shape
      const QuantizedTensor& c = *cached_weight;
      if (c.scheme != wo.scheme || c.tile != wo.tile || c.rows != n || c.cols != k ||
          !c.has(Usage::Rowwise) || c.nvfp4_e4m3_max != wo.nvfp4_e4m3_max) {
        throw Error("the cached weight is " + std::string(scheme_name(c.scheme)) + " [" +
                    std::to_string(c.rows) + ", " + std::to_string(c.cols) + "]" +
                    (c.has(Usage::Rowwise) ? "" : " without rowwise data") +
                    (c.scheme == Scheme::NVFP4 ? ", bound " + std::to_string(c.nvfp4_e4m3_max) : "") +
                    "; this recipe's weight is " + std::string(scheme_name(wo.scheme)) + " [" +
                    std::to_string(n) + ", " + std::to_string(k) + "] with rowwise data" +
                    (wo.scheme == Scheme::NVFP4 ? ", bound " + std::to_string(wo.nvfp4_e4m3_max) : ""));
      }
    }
    const QuantizedTensor wq = cached_weight ? *cached_weight : quantize_operand(weight, wo, "weight");
    const auto [first, second] = te_gemm_operands(wq, xq, "TN");  // y = x W^T
    y = gemm(first, second, problem);
    if (saved && override == BackwardOverride::HighPrecision) {  // the unquantized x and W
      if (weight_grad) saved->input_f32 = to_f32_matrix(x);
      saved->weight_f32 = to_f32_matrix(weight);
    } else if (saved) {  // Dequantized reads their rowwise outputs, None x's columnwise and W's
      saved->input = xq;
      saved->weight = wq;
    }
  }
  if (saved) {
    saved->recipe = recipe;
    saved->input_dtype = x.dtype;
    saved->weight_grad = weight_grad;
    saved->input_shape = x.shape;
    saved->m = m;
    saved->k = k;
    saved->n = n;
  }
  std::vector<int64_t> out_shape = x.shape;
  out_shape.back() = n;
  return y.reshaped(out_shape);
}

LinearGrads linear_backward(const TensorView& grad_output, const LinearSaved& saved,
                            const LinearBackwardOptions& options) {
  const IeeeSubnormals ieee;  // the bias gradient sums in fp32 (fp_environment.hpp)
  if (!saved.recipe) throw Error("linear_backward needs the context saved by a training linear_forward");
  const InputMatrix dym = make_input_matrix(grad_output);
  if (dym.rows != saved.m || dym.cols != saved.n) {
    throw Error("grad_output " + shape_string(grad_output.shape) + " does not match the forward output [" +
                std::to_string(saved.m) + ", " + std::to_string(saved.n) + "]");
  }
  if (options.compute_grad_weight && !saved.weight_grad) {
    throw Error(
        "linear_backward: the weight gradient was asked for, but the forward ran with weight_grad = false "
        "and kept no x for it");
  }
  if (options.main_grad) {
    const TensorView& g = *options.main_grad;
    if (g.dtype != DType::F32 || g.shape != std::vector<int64_t>{saved.n, saved.k} || g.data == nullptr) {
      throw Error("main_grad must be f32 [" + std::to_string(saved.n) + ", " + std::to_string(saved.k) + "]");
    }
  }
  const Recipe& recipe = *saved.recipe;
  LinearGrads grads;
  // dx in dy's dtype, a returned dW in the activation's (TE's dgrad and wgrad outputs).
  GemmProblem dgrad_problem, wgrad_problem;
  dgrad_problem.out_dtype = grad_output.dtype;
  wgrad_problem.out_dtype = saved.input_dtype;
  if (options.main_grad) {  // dW += into main_grad: D = 1 * dW + 1 * C with C = D = main_grad
    wgrad_problem.c = *options.main_grad;
    wgrad_problem.beta = 1.0f;
    wgrad_problem.out_dtype = DType::F32;
  }

  const BackwardOverride override = backward_override(recipe);
  if (is_high_precision(recipe) || override == BackwardOverride::HighPrecision) {
    dense_backward(to_f32_matrix(grad_output), saved.weight_f32, saved.input_f32, options, dgrad_problem,
                   wgrad_problem, grads);
  } else if (override == BackwardOverride::Dequantized) {
    dense_backward(
        to_f32_matrix(grad_output),
        options.compute_grad_input ? dequantized_rowwise(saved.weight, saved.input_dtype) : Tensor(),
        options.compute_grad_weight ? dequantized_rowwise(saved.input, saved.input_dtype) : Tensor(), options,
        dgrad_problem, wgrad_problem, grads);
  } else if (options.compute_grad_input || options.compute_grad_weight) {
    // dy's rowwise output feeds dgrad, its columnwise output wgrad: each only when asked for (one
    // direction's bytes do not depend on whether the other is made, stochastic rounding included).
    QuantizeOptions go = *quantize_options(recipe, TensorRole::GradOutput, options.stochastic_rounding);
    go.rowwise = options.compute_grad_input;
    go.columnwise = options.compute_grad_weight;
    Tensor dy_bf16;
    const QuantizedTensor dyq =
        quantize_operand(rht_ready(grad_output, saved.m, saved.n, go, dy_bf16), go, "grad_output");
    if (options.compute_grad_input) {
      const auto [first, second] = te_gemm_operands(saved.weight, dyq, "NN");  // dx = dy W
      grads.grad_input = gemm(first, second, dgrad_problem);
    }
    if (options.compute_grad_weight) {
      const auto [first, second] = te_gemm_operands(saved.input, dyq, "NT");  // dW = dy^T x
      if (options.main_grad) {
        gemm_into(first, second, wgrad_problem, *options.main_grad);
      } else {
        grads.grad_weight = gemm(first, second, wgrad_problem);
      }
    }
  }
  if (grads.grad_input.defined()) grads.grad_input = grads.grad_input.reshaped(saved.input_shape);
  if (options.compute_grad_bias) grads.grad_bias = column_sums(dym, grad_output.dtype);
  return grads;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, uint64_t seed)
    : weight_(DType::F32, {out_features, in_features}),
      main_grad_(DType::F32, {out_features, in_features}),
      bias_grad_(DType::F32, {out_features}),
      seed_(seed) {
  if (in_features <= 0 || out_features <= 0)
    throw Error("Linear needs positive in_features and out_features");
  std::mt19937_64 rng(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  std::uniform_real_distribution<float> uniform(-bound, bound);
  for (int64_t i = 0; i < weight_.numel(); ++i) weight_.data_as<float>()[i] = uniform(rng);
  if (bias) {
    bias_ = Tensor(DType::F32, {out_features});
    for (int64_t i = 0; i < out_features; ++i) bias_.data_as<float>()[i] = uniform(rng);
  }
}

Tensor Linear::forward(const TensorView& x) {
  const Recipe recipe = current_recipe();
  const QuantizedTensor* cached = nullptr;
  if (!std::holds_alternative<HighPrecision>(recipe)) {
    // Keyed on the weight's options, not the recipe's name: two NVFP4 recipes may quantize the
    // weight differently (16x16 tiles or 1x16 blocks).
    const QuantizeOptions options = *quantize_options(recipe, TensorRole::Weight);
    if (cached_version_ != weight_version_ || !cached_options_ ||
        !same_quantization(*cached_options_, options)) {
      cached_weight_ = quantize_operand(weight_.view(), options, "weight");
      cached_version_ = weight_version_;
      cached_options_ = options;
      ++weight_quantizations_;
    }
    cached = &cached_weight_;
  }
  std::optional<TensorView> b;
  if (bias_.defined()) b = bias_.view();
  return linear_forward(x, weight_.view(), b, recipe, &saved_, cached);
}

Tensor Linear::backward(const TensorView& grad_output) {
  const IeeeSubnormals ieee;  // the bias gradient accumulates in fp32 (fp_environment.hpp)
  // As in autograd, one backward per forward: a second would add the same gradients again.
  if (!saved_.recipe)
    throw Error("Linear::backward needs a forward first (each forward serves one backward)");
  LinearBackwardOptions o;
  o.main_grad = main_grad_.view();
  o.compute_grad_bias = bias_.defined();
  o.stochastic_rounding = StochasticRounding{seed_, backward_calls_};  // a fresh stream per step
  LinearGrads g = linear_backward(grad_output, saved_, o);
  ++backward_calls_;  // after success: a retried backward draws what the first would have
  if (bias_.defined()) {
    const Tensor db = to_f32_matrix(g.grad_bias.view());  // in dy's dtype
    for (int64_t j = 0; j < bias_grad_.numel(); ++j) bias_grad_.data_as<float>()[j] += db.data_as<float>()[j];
  }
  saved_ = LinearSaved{};  // used up (the quantized input freed; the weight's stays cached)
  return g.grad_input;
}

void Linear::zero_grad() {
  std::fill_n(main_grad_.data_as<float>(), main_grad_.numel(), 0.0f);
  std::fill_n(bias_grad_.data_as<float>(), bias_grad_.numel(), 0.0f);
}

void Linear::sgd_step(float learning_rate) {
  const IeeeSubnormals ieee;  // the update is fp32 arithmetic (fp_environment.hpp)
  for (int64_t i = 0; i < weight_.numel(); ++i)
    weight_.data_as<float>()[i] -= learning_rate * main_grad_.data_as<float>()[i];
  if (bias_.defined()) {
    for (int64_t i = 0; i < bias_.numel(); ++i)
      bias_.data_as<float>()[i] -= learning_rate * bias_grad_.data_as<float>()[i];
  }
  weight_updated();
  zero_grad();
}

}  // namespace microscale
