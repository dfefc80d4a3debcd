// Loads a band of input rows into a contiguous fp32 buffer (exact widening), the first step of
// the portable fp32 kernels: after it, they see plain float rows whatever the dtype and strides.
#pragma once

#include <omp.h>

#include "core/input_matrix.hpp"

namespace microscale::cpu {

/// out[(r - first_row) * x.cols + c] = x(r, c) for r in [first_row, first_row + rows).
/// NOTE: out of line and cloned (cpu_dispatch.hpp): inlined into an OpenMP region's body, which
/// is not a clone, it ran as baseline x86-64 code.
void load_rows(const InputMatrix& x, int64_t first_row, int64_t rows, float* out);

/// Threads to use: the option, or all hardware threads when it is 0.
inline int thread_count(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

}  // namespace microscale::cpu
