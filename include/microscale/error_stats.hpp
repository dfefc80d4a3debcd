// microscale/error_stats.hpp — quantization error of a dequantized tensor against its reference:
// SQNR (torchao's compute_error: 20 log10(||ref|| / ||ref - x||)) and the max abs error.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace microscale {

struct ErrorStats {
  double sqnr_db = 0.0;  // 20 log10(||ref|| / ||ref - x||); +inf when exact, NaN when both are zero
  double max_abs_error = 0.0;
};

/// Over finite reference entries only (a NaN/Inf input has no meaningful error). A finite entry
/// whose value came back NaN (an MX block holding a NaN input turns all its 32 values NaN) makes
/// both figures NaN: the error there is not bounded, and a max that skipped it would understate it.
inline ErrorStats error_stats(const float* ref, const float* x, int64_t n) {
  double signal = 0.0, noise = 0.0, worst = 0.0;
  bool lost = false;  // a finite entry came back NaN
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(ref[i])) continue;
    const double d = static_cast<double>(ref[i]) - x[i];
    signal += static_cast<double>(ref[i]) * ref[i];
    noise += d * d;
    lost = lost || std::isnan(d);
    worst = std::fmax(worst, std::fabs(d));
  }
  ErrorStats s;
  s.max_abs_error = lost ? std::numeric_limits<double>::quiet_NaN() : worst;
  if (noise == 0.0) {
    s.sqnr_db =
        signal == 0.0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    s.sqnr_db = 10.0 * std::log10(signal / noise);
  }
  return s;
}

}  // namespace microscale
