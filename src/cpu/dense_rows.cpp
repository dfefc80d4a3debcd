// Dense rows to fp32 and back (see dense_rows.hpp): the scalar conversions of half.hpp in loops that
// vectorise (bf16 both ways and f16 to fp32 are branch-free; fp32 to f16 has branches and stays
// scalar).
#include "cpu/dense_rows.hpp"

#include <cstring>

#include "cpu/cpu_dispatch.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {

MICROSCALE_CPU_DISPATCH void dense_row(DType dtype, const void* row, int64_t count, float* out) {
  if (dtype == DType::BF16) {
    const auto* bits = static_cast<const uint16_t*>(row);
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) out[j] = bf16_to_float(bits[j]);
  } else if (dtype == DType::F16) {
    const auto* bits = static_cast<const uint16_t*>(row);
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) out[j] = half_to_float(bits[j]);
  } else {
    std::memcpy(out, row, static_cast<size_t>(count) * sizeof(float));
  }
}

MICROSCALE_CPU_DISPATCH void store_row(DType dtype, const float* in, int64_t count, void* out) {
  if (dtype == DType::BF16) {
    auto* bits = static_cast<uint16_t*>(out);
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) bits[j] = float_to_bf16(in[j]);
  } else if (dtype == DType::F16) {
    auto* bits = static_cast<uint16_t*>(out);
    for (int64_t j = 0; j < count; ++j) bits[j] = float_to_half(in[j]);  // (branches: stays scalar)
  } else {
    std::memcpy(out, in, static_cast<size_t>(count) * sizeof(float));
  }
}

}  // namespace microscale::cpu
