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

/// error_stats over the parts of one tensor, added one after the other (a tensor quantized in
/// slices, e.g. one MoE expert at a time): the same figures as one call over the whole.
class ErrorAccumulator {
 public:
  /// Over finite reference entries only (a NaN/Inf input has no meaningful error). A finite entry
  /// whose value came back NaN (an MX block holding a NaN input turns all its 32 values NaN) makes
  /// both figures NaN: the error there is not bounded, and a max that skipped it would understate it.
  void add(const float* ref, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(ref[i])) continue;
      const double d = static_cast<double>(ref[i]) - x[i];
      signal_ += static_cast<double>(ref[i]) * ref[i];
      noise_ += d * d;
      lost_ = lost_ || std::isnan(d);
      worst_ = std::fmax(worst_, std::fabs(d));
    }
  }

  ErrorStats result() const {
    ErrorStats s;
    s.max_abs_error = lost_ ? std::numeric_limits<double>::quiet_NaN() : worst_;
    if (noise_ == 0.0) {
      s.sqnr_db =
          signal_ == 0.0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    } else {
      s.sqnr_db = 10.0 * std::log10(signal_ / noise_);
    }
    return s;
  }

 private:
  double signal_ = 0.0, noise_ = 0.0, worst_ = 0.0;
  bool lost_ = false;  // a finite entry came back NaN
};

/// The error of `x` against `ref` over n entries (see ErrorAccumulator::add).
inline ErrorStats error_stats(const float* ref, const float* x, int64_t n) {
  ErrorAccumulator a;
  a.add(ref, x, n);
  return a.result();
}

}  // namespace microscale
