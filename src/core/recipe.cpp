#include "microscale/recipe.hpp"

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

}  // namespace

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
    return o;
  }
  if (const auto* r = std::get_if<MXFP8BlockScaling>(&recipe)) {
    const bool e5m2 =
        role == TensorRole::GradOutput && r->fp8_format() == MXFP8BlockScaling::Fp8Format::HYBRID;
    QuantizeOptions o = both_usages(e5m2 ? Scheme::MXFP8_E5M2 : Scheme::MXFP8_E4M3);
    o.scale_mode = ScaleMode::RCeil;
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
