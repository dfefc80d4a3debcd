// The MX scale rule of a ScaleMode, for every backend (scale_math.hpp itself stays free of the
// public API types so that device code can include it alone).
#pragma once

#include "core/scale_math.hpp"
#include "microscale/quantize.hpp"

namespace microscale {

inline MxScaleRule mx_scale_rule(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::Floor: return MxScaleRule::Floor;
    case ScaleMode::Ceil: return MxScaleRule::Ceil;
    case ScaleMode::Even: return MxScaleRule::Even;
    case ScaleMode::RCeil: break;
  }
  return MxScaleRule::RCeil;
}

}  // namespace microscale
