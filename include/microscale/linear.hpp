// microscale/linear.hpp — the quantized Linear layer: y = x W^T + b, forward and backward.
//
// x: [..., K] (f32/bf16/f16, leading dims folded into M), W: [N, K], b: [N], y: [..., N] in x's
// dtype. As in TransformerEngine, each GEMM accumulates in fp32, adds the bias, and rounds once to
// its output dtype: y to x's, dx and db to dy's, a returned dW to x's (dW added into an fp32
// main_grad stays fp32).
//
// linear_forward quantizes x and W under the recipe (recipe.hpp) and runs the fprop GEMM
//   y = x.rowwise * W.rowwise^T          (TE layout "TN"; blocks along K)
// and, when training, saves for backward (LinearSaved):
//   - x quantized: its columnwise output (X^T, blocks along M; through the RHT for NVFP4) feeds wgrad;
//   - W quantized: its columnwise output (W^T, blocks along N; 16x16 tiles for NVFP4) feeds dgrad;
//   - for HighPrecision, x and W as f32.
// linear_backward quantizes dy (stochastic rounding for NVFP4 grads) and runs
//   dgrad  dx = dy.rowwise * (W.columnwise)^T        (layout "NN"; blocks along N)
//   wgrad  dW = dy.columnwise * (x.columnwise)^T     (layout "NT"; blocks along M; RHT on both)
//   bgrad  db = sum over rows of the unquantized dy (in double, rounded to fp32, then to dy's dtype)
// The RHT is defined on bf16 tensors (as in TE, which takes bf16 only there): under an RHT recipe
// an f32/f16 x or dy is rounded to bf16 before it is quantized, in training and inference alike.
// A recipe's backward_override (recipe.hpp) replaces the quantized backward: "high_precision" keeps
// x and W unquantized (as f32) and runs dgrad and wgrad on them and the unquantized dy;
// "dequantized" keeps x's and W's rowwise quantizations (no X^T is made) and runs the two GEMMs on
// their values, dequantized to x's dtype, and the unquantized dy. Both: fp32 accumulation, one
// rounding to each output's dtype, as an unquantized Linear.
// Rule for weight gradients: with `main_grad` (fp32 [N, K]) dW is ADDED into it (+=), as TE's
// fuse_wgrad_accumulation does across micro-batches; otherwise it is returned (=).
#pragma once

#include <cstdint>
#include <optional>

#include "microscale/recipe.hpp"
#include "microscale/tensor.hpp"

namespace microscale {

/// @brief What forward keeps for backward (see the header comment).
struct LinearSaved {
  std::optional<Recipe> recipe;
  QuantizedTensor input;   ///< quantized recipes: x (columnwise used by wgrad)
  QuantizedTensor weight;  ///< quantized recipes: W (columnwise used by dgrad)
  Tensor input_f32;        ///< HighPrecision (or its backward override): x as f32 [M, K]
  Tensor weight_f32;       ///< HighPrecision (or its backward override): W as f32 [N, K]
  std::vector<int64_t> input_shape;
  DType input_dtype = DType::F32;  ///< x's: the dtype of a returned weight gradient
  bool weight_grad = true;         ///< whether the forward kept what wgrad reads
  int64_t m = 0, k = 0, n = 0;
};

struct LinearBackwardOptions {
  bool compute_grad_input = true;
  bool compute_grad_weight = true;  ///< false: no wgrad GEMM (a frozen weight); main_grad untouched
  bool compute_grad_bias = true;
  std::optional<TensorView> main_grad;     ///< f32 [N, K]: dW is accumulated here (+=)
  StochasticRounding stochastic_rounding;  ///< seed/offset for the gradient's SR (NVFP4)
};

struct LinearGrads {
  Tensor grad_input;   ///< [..., K] in dy's dtype, the shape of x
  Tensor grad_weight;  ///< [N, K] in x's dtype (undefined when accumulated into main_grad)
  Tensor grad_bias;    ///< [N] in dy's dtype (the unquantized dy's column sums)
};

/// @brief y = x W^T (+ bias) under `recipe`; fills `saved` when given (training).
/// `cached_weight`, when given, is W already quantized with the recipe's weight options (both
/// usages), e.g. reused across micro-batches. `weight_grad` false (a frozen weight): what only
/// wgrad reads, x's columnwise output (the f32 x for HighPrecision), is neither made nor saved,
/// and backward must not ask for dW.
Tensor linear_forward(const TensorView& x, const TensorView& weight, const std::optional<TensorView>& bias,
                      const Recipe& recipe, LinearSaved* saved = nullptr,
                      const QuantizedTensor* cached_weight = nullptr, bool weight_grad = true);

/// @brief dgrad, wgrad and bgrad of linear_forward from dy [..., N].
LinearGrads linear_backward(const TensorView& grad_output, const LinearSaved& saved,
                            const LinearBackwardOptions& options = {});

/// @brief A Linear layer holding fp32 parameters, their fp32 gradients, and the weight's
/// quantization cached across forward calls until the weight changes. Forward runs under
/// current_recipe() (the autocast scope); backward uses the context of the last forward, once:
/// a second backward without a forward in between is an error (as in autograd).
class Linear {
 public:
  /// Weights U(-1/sqrt(K), 1/sqrt(K)) from `seed` (PyTorch's default Linear init range).
  Linear(int64_t in_features, int64_t out_features, bool bias, uint64_t seed);

  Tensor forward(const TensorView& x);
  /// Returns dx and accumulates dW, db into main_grad() / bias_grad(); frees the forward's context.
  Tensor backward(const TensorView& grad_output);

  Tensor& weight() { return weight_; }          ///< f32 [N, K]; call weight_updated() after changing it
  Tensor& bias() { return bias_; }              ///< f32 [N] (undefined without bias)
  Tensor& main_grad() { return main_grad_; }    ///< f32 [N, K], accumulated by backward
  Tensor& bias_grad() { return bias_grad_; }    ///< f32 [N]
  void weight_updated() { ++weight_version_; }  ///< invalidates the cached quantized weight
  void zero_grad();
  /// Plain SGD on the accumulated gradients, then weight_updated() and zero_grad().
  void sgd_step(float learning_rate);
  /// How many times the weight was quantized (for tests of the cache).
  int64_t weight_quantizations() const { return weight_quantizations_; }

 private:
  Tensor weight_, bias_, main_grad_, bias_grad_;
  uint64_t seed_;
  uint64_t backward_calls_ = 0;
  int64_t weight_version_ = 0;
  int64_t cached_version_ = -1;
  std::optional<QuantizeOptions> cached_options_;  ///< what cached_weight_ was quantized with
  QuantizedTensor cached_weight_;
  int64_t weight_quantizations_ = 0;
  LinearSaved saved_;
};

}  // namespace microscale
