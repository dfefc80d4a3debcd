// Argument checks shared by every quantize backend (CPU and CUDA), so each rejects the same inputs
// with the same messages.
#pragma once

#include <string>

#include "core/input_matrix.hpp"
#include "microscale/quantize.hpp"

namespace microscale {

/// Throws microscale::Error when `options` cannot quantize the (flattened) input `x`.
void validate_quantize(const InputMatrix& x, const QuantizeOptions& options);

/// Throws microscale::Error unless 0 <= num_threads <= kMaxThreads (0: all hardware threads).
void validate_thread_count(int num_threads);

/// Throws microscale::Error, "`who` has an unknown scale layout id N", unless `layout` is one of
/// ScaleLayout's values (a hand-built struct can hold any byte).
void validate_scale_layout(ScaleLayout layout, const std::string& who);

}  // namespace microscale
