// microscale/recipe.hpp — training recipes and the autocast scope.
//
// A recipe says, for each tensor role of a Linear layer, how it is quantized; it produces
// QuantizeOptions and nothing else (kernels never read recipes). Recipes are immutable values.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include "microscale/quantize.hpp"

namespace microscale {

/// @brief How a quantized recipe's backward GEMMs run (TransformerEngine's recipe field
/// `backward_override`). The forward is the recipe's either way; the bias gradient is dy's column
/// sums either way.
enum class BackwardOverride : uint8_t {
  None,           ///< quantized as the recipe says: dy quantized, dgrad and wgrad on quantized operands
  HighPrecision,  ///< "high_precision": dy, W and x as given (forward keeps x and W unquantized):
                  ///< the backward of an unquantized Linear
  Dequantized,    ///< "dequantized": dy as given; W and x are the forward's rowwise quantizations,
                  ///< dequantized to x's dtype
};

/// @brief "none", "high_precision", "dequantized" (TransformerEngine's spellings, where None is "none").
const char* backward_override_name(BackwardOverride o);

/// @brief The tensors an NVFP4 recipe option applies to (TransformerEngine's "none", "weights",
/// "activations", "all"). Activations are the Linear's input; gradients are never in the scope.
enum class Nvfp4Scope : uint8_t { None, Weights, Activations, All };

/// @brief "none", "weights", "activations", "all" and back (any ASCII case; throws microscale::Error).
const char* nvfp4_scope_name(Nvfp4Scope scope);
Nvfp4Scope parse_nvfp4_scope(std::string_view name);

/// @brief TransformerEngine's nvfp4_4over6_err_mode spellings: "MAE" (FourOverSix::MinMae), "MSE"
/// (MinMse) and back (any ASCII case; anything else, "off" too, throws microscale::Error).
const char* four_over_six_err_mode_name(FourOverSix mode);
FourOverSix parse_four_over_six_err_mode(std::string_view name);

/// @brief NVFP4 training, TransformerEngine's NVFP4BlockScaling (numerics-te.md §8).
///
/// Every tensor: E2M1 elements, E4M3 block scales, an FP32 global scale from the tensor amax
/// (TE >= 2.14 formulas), rowwise and columnwise outputs, each direction re-quantized from high
/// precision (never from the other direction). Immutable once built, like TE's QParams.
///  - input x:      1x16 blocks; RHT on the columnwise output (the wgrad operand); round to nearest.
///  - weight W:     16x16 blocks (so W and W^T quantize to the same values); no RHT; nearest.
///  - grad dy:      1x16 blocks; RHT on columnwise; stochastic rounding on both directions.
/// 4over6 (FourOverSix, quantize.hpp) for the tensors in `four_over_six`'s scope, with the bound 256
/// for those also in `four_over_six_e4m3_use_256`'s (TE's nvfp4_4over6, nvfp4_4over6_e4m3_use_256,
/// nvfp4_4over6_err_mode); an input in the scope needs disable_rht (TE has no 4over6 with the RHT).
/// row_scaled_activation (TE's): the input's global scales per row of x (rowwise) and per column
/// (columnwise, the wgrad operand), QuantizeOptions::row_scaled; it needs disable_rht, and with
/// 4over6 on the input, training needs a backward_override (row-scaled 4over6 is rowwise only, and
/// the quantized wgrad reads the input's columnwise output), as in TE.
/// GEMMs (y = x W^T): fprop x.row x W.row, dgrad dy.row x W.col, wgrad dy.col x x.col; the
/// quantized dimension is always the contraction dimension.
class NVFP4BlockScaling {
 public:
  struct Options {
    bool disable_rht = false;                  ///< no RHT on input/grad columnwise outputs
    bool disable_stochastic_rounding = false;  ///< round grads to nearest
    bool disable_2d_quantization = false;      ///< weights in 1x16 blocks
    BackwardOverride backward_override = BackwardOverride::None;
    Nvfp4Scope four_over_six = Nvfp4Scope::None;               ///< tensors quantized with 4over6
    Nvfp4Scope four_over_six_e4m3_use_256 = Nvfp4Scope::All;   ///< of those, the ones with the bound 256
    FourOverSix four_over_six_err_mode = FourOverSix::MinMae;  ///< MinMae or MinMse
    bool row_scaled_activation = false;                        ///< the input row-scaled (x's rows)
    /// 4over6's error in the scaled domain (QuantizeOptions::four_over_six_scaled_error) for the
    /// tensors in four_over_six's scope: what TE's NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH does.
    bool four_over_six_scaled_error = false;
  };
  NVFP4BlockScaling() = default;
  /// Throws microscale::Error for options TransformerEngine refuses (4over6 on an input with the
  /// RHT; an error mode that is not MAE or MSE; a row-scaled input with the RHT).
  explicit NVFP4BlockScaling(Options options);
  bool disable_rht() const { return options_.disable_rht; }
  bool disable_stochastic_rounding() const { return options_.disable_stochastic_rounding; }
  bool disable_2d_quantization() const { return options_.disable_2d_quantization; }
  BackwardOverride backward_override() const { return options_.backward_override; }
  Nvfp4Scope four_over_six() const { return options_.four_over_six; }
  Nvfp4Scope four_over_six_e4m3_use_256() const { return options_.four_over_six_e4m3_use_256; }
  FourOverSix four_over_six_err_mode() const { return options_.four_over_six_err_mode; }
  bool row_scaled_activation() const { return options_.row_scaled_activation; }
  bool four_over_six_scaled_error() const { return options_.four_over_six_scaled_error; }

 private:
  Options options_;  // fixed at construction: a recipe is a value, not a setting to flip
};

/// @brief MXFP8 training, TransformerEngine's MXFP8BlockScaling (numerics-te.md §7) with torchao's
/// RCEIL scales (numerics-mx.md §3.3): blocks of 32 along the contraction dimension, E8M0 scales,
/// round to nearest, no global scale, no RHT, no SR. enable_2d_quantization (TE's field) gives the
/// weights 32x32 tiles (Tile::k32x32), so that W and W^T quantize to the same values, as NVFP4's
/// 16x16 weight tiles do; inputs and gradients keep their 1-D blocks.
class MXFP8BlockScaling {
 public:
  enum class Fp8Format { E4M3, HYBRID };  ///< HYBRID: E4M3 forward, E5M2 gradients
  MXFP8BlockScaling() = default;
  explicit MXFP8BlockScaling(Fp8Format format, BackwardOverride backward_override = BackwardOverride::None,
                             bool enable_2d_quantization = false)
      : fp8_format_(format),
        backward_override_(backward_override),
        enable_2d_quantization_(enable_2d_quantization) {}
  Fp8Format fp8_format() const { return fp8_format_; }
  BackwardOverride backward_override() const { return backward_override_; }
  bool enable_2d_quantization() const { return enable_2d_quantization_; }

 private:
  Fp8Format fp8_format_ = Fp8Format::E4M3;
  BackwardOverride backward_override_ = BackwardOverride::None;
  bool enable_2d_quantization_ = false;  ///< weights in 32x32 tiles
};

/// @brief No quantization: fp32 GEMMs on the (f32/bf16/f16) inputs.
struct HighPrecision {};

using Recipe = std::variant<HighPrecision, NVFP4BlockScaling, MXFP8BlockScaling>;

/// @brief The tensors a Linear layer quantizes.
enum class TensorRole { Input, Weight, GradOutput };

/// @brief How `recipe` quantizes a tensor of `role` (both usages); nullopt for HighPrecision.
/// `sr` seeds the stochastic rounding of gradients where the recipe uses it.
std::optional<QuantizeOptions> quantize_options(const Recipe& recipe, TensorRole role,
                                                StochasticRounding sr = {});

/// @brief "nvfp4", "mxfp8", "mxfp8_hybrid" or "high_precision".
const char* recipe_name(const Recipe& recipe);

/// @brief The recipe's backward_override (None for HighPrecision, whose backward is unquantized).
BackwardOverride backward_override(const Recipe& recipe);

/// @brief RAII scope setting the recipe of the current thread; scopes nest, the inner one wins,
/// and leaving a scope (also by an exception) restores the outer state.
class autocast {
 public:
  explicit autocast(Recipe recipe, bool enabled = true);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  bool previous_enabled_;
  std::optional<Recipe> previous_recipe_;
};

/// @brief The recipe in force on this thread: the innermost enabled autocast's, else HighPrecision.
Recipe current_recipe();
/// @brief Whether an enabled autocast scope is active on this thread.
bool autocast_enabled();

}  // namespace microscale
