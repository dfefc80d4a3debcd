// Rows of dense f32 / bf16 / f16 values to fp32 and back, vectorised (compiled per x86-64 level):
// the CPU GEMM's dense operands, dequantize's bf16 and f16 outputs.
#pragma once

#include <cstdint>

#include "microscale/tensor.hpp"

namespace microscale::cpu {

/// out[j] = the fp32 value of element j < count of a contiguous dense row (f32, bf16 or f16).
void dense_row(DType dtype, const void* row, int64_t count, float* out);

/// out[j] = in[j] rounded once (RNE) to `dtype` (f32, bf16 or f16), for j < count.
void store_row(DType dtype, const float* in, int64_t count, void* out);

}  // namespace microscale::cpu
