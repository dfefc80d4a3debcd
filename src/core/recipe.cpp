#include "microscale/recipe.hpp"

#include <string>

#include "core/ascii_lowercase.hpp"
#include "core/require.hpp"

namespace microscale {
namespace {

struct AutocastState {
  bool enabled = false;
  std::optional<Recipe> recipe;
};

AutocastState& state() {
  thread_local AutocastState s;
  return s;
}

QuantizeOptions both_usages(Scheme scheme) {
  QuantizeOptions o;
  o.scheme = scheme;
  o.rowwise = o.columnwise = true;
  return o;
}

// Whether `scope` takes a tensor of `role` (gradients: never).
bool in_scope(Nvfp4Scope scope, TensorRole role) {
  if (role == TensorRole::GradOutput) return false;
  const bool weight = role == TensorRole::Weight;
  return scope == Nvfp4Scope::All || (scope == Nvfp4Scope::Weights && weight) ||
         (scope == Nvfp4Scope::Activations && !weight);
}

constexpr Nvfp4Scope kScopes[] = {Nvfp4Scope::None, Nvfp4Scope::Weights, Nvfp4Scope::Activations,
                                  Nvfp4Scope::All};

}  // namespace

const char* nvfp4_scope_name(Nvfp4Scope scope) {
  switch (scope) {
    case Nvfp4Scope::None: return "none";
    case Nvfp4Scope::Weights: return "weights";
    case Nvfp4Scope::Activations: return "activations";
    case Nvfp4Scope::All: return "all";
  }
  throw Error("unknown NVFP4 scope id " + std::to_string(static_cast<int>(scope)));
}

Nvfp4Scope parse_nvfp4_scope(std::string_view name) {
  const std::string lower = ascii_lowercase(name);
  for (Nvfp4Scope scope : kScopes) {
    if (lower == nvfp4_scope_name(scope)) return scope;
  }
  throw Error("unknown NVFP4 scope '" + std::string(name) + "' (expected none, weights, activations or all)");
}

const char* four_over_six_err_mode_name(FourOverSix mode) {
  switch (mode) {
    case FourOverSix::MinMae: return "MAE";
    case FourOverSix::MinMse: return "MSE";
    default: break;
  }
  throw Error("nvfp4_4over6_err_mode must be MAE or MSE, not the mode id " +
              std::to_string(static_cast<int>(mode)));
}

FourOverSix parse_four_over_six_err_mode(std::string_view name) {
  const std::string lower = ascii_lowercase(name);
  if (lower == "mae") return FourOverSix::MinMae;
  if (lower == "mse") return FourOverSix::MinMse;
  throw Error("nvfp4_4over6_err_mode must be MAE or MSE, not '" + std::string(name) + "'");
}

NVFP4BlockScaling::NVFP4BlockScaling(Options options) : options_(options) {
  static_cast<void>(nvfp4_scope_name(options.four_over_six));  // throw for an unknown id
  static_cast<void>(nvfp4_scope_name(options.four_over_six_e4m3_use_256));
  static_cast<void>(four_over_six_err_mode_name(options.four_over_six_err_mode));  // MAE or MSE only
  require(!in_scope(options.four_over_six, TensorRole::Input) || options.disable_rht,
          std::string("nvfp4_4over6='") + nvfp4_scope_name(options.four_over_six) +
              "' puts the input under 4over6, which does not take the RHT (TransformerEngine has no 4over6 "
              "with the RHT): pass disable_rht=True too, or nvfp4_4over6='weights'");
  if (options.row_scaled_activation) {
    require(options.disable_rht,
            "row_scaled_activation makes the input row-scaled, which does not take the RHT (as in "
            "TransformerEngine): pass disable_rht=True too");
  }
}

std::optional<QuantizeOptions> quantize_options(const Recipe& recipe, TensorRole role,
                                                StochasticRounding sr) {
  if (const auto* r = std::get_if<NVFP4BlockScaling>(&recipe)) {
    QuantizeOptions o = both_usages(Scheme::NVFP4);
    if (role == TensorRole::Weight) {
      o.tile = r->disable_2d_quantization() ? Tile::k1x16 : Tile::k16x16;
    } else {
      o.rht = !r->disable_rht();
    }
    if (role == TensorRole::GradOutput && !r->disable_stochastic_rounding()) o.stochastic_rounding = sr;
    if (role == TensorRole::Input) o.row_scaled = r->row_scaled_activation();
    if (in_scope(r->four_over_six(), role)) {
      o.four_over_six = r->four_over_six_err_mode();
      o.nvfp4_e4m3_max = in_scope(r->four_over_six_e4m3_use_256(), role) ? 256 : 448;
      o.four_over_six_scaled_error = r->four_over_six_scaled_error();
    }
    return o;
  }
  if (const auto* r = std::get_if<MXFP8BlockScaling>(&recipe)) {
    const bool e5m2 =
        role == TensorRole::GradOutput && r->fp8_format() == MXFP8BlockScaling::Fp8Format::HYBRID;
    QuantizeOptions o = both_usages(e5m2 ? Scheme::MXFP8_E5M2 : Scheme::MXFP8_E4M3);
    o.scale_mode = ScaleMode::RCeil;
    if (role == TensorRole::Weight && r->enable_2d_quantization()) o.tile = Tile::k32x32;
    return o;
  }
  return std::nullopt;
}

const char* backward_override_name(BackwardOverride o) {
  switch (o) {
    case BackwardOverride::HighPrecision: return "high_precision";
    case BackwardOverride::Dequantized: return "dequantized";
    default: return "none";
  }
}

BackwardOverride backward_override(const Recipe& recipe) {
  if (const auto* r = std::get_if<NVFP4BlockScaling>(&recipe)) return r->backward_override();
  if (const auto* r = std::get_if<MXFP8BlockScaling>(&recipe)) return r->backward_override();
  return BackwardOverride::None;
}

const char* recipe_name(const Recipe& recipe) {
  if (std::holds_alternative<NVFP4BlockScaling>(recipe)) return "nvfp4";
  if (const auto* r = std::get_if<MXFP8BlockScaling>(&recipe)) {
    return r->fp8_format() == MXFP8BlockScaling::Fp8Format::HYBRID ? "mxfp8_hybrid" : "mxfp8";
  }
  return "high_precision";
}

autocast::autocast(Recipe recipe, bool enabled)
    : previous_enabled_(state().enabled), previous_recipe_(state().recipe) {
  state().enabled = enabled;
  state().recipe = std::move(recipe);
}

autocast::~autocast() {
  state().enabled = previous_enabled_;
  state().recipe = std::move(previous_recipe_);
}

Recipe current_recipe() {
  const AutocastState& s = state();
  if (s.enabled && s.recipe) return *s.recipe;
  return HighPrecision{};
}

bool autocast_enabled() { return state().enabled; }

}  // namespace microscale
