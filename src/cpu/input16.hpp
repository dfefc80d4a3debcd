// 16-bit inputs (bf16, f16) as bit patterns, which the 16-bit kernels work on: the value of a
// pattern and the |x| pattern of +Inf.
#pragma once

#include <cstdint>

#include "cpu/cpu_dispatch.hpp"
#include "microscale/half.hpp"
#include "microscale/tensor.hpp"  // DType

namespace microscale::cpu {

/// The |x| pattern of +Inf in a 16-bit input type: |x| patterns above it are NaN. For both types
/// the |x| patterns order as the magnitudes.
template <DType kIn>
constexpr uint16_t kInf16Bits = kIn == DType::BF16 ? 0x7F80 : 0x7C00;

/// The value of a bf16 or f16 pattern (exact).
template <DType kIn>
MICROSCALE_CPU_INLINE float widen16(uint16_t bits) {
  return kIn == DType::BF16 ? bf16_to_float(bits) : half_to_float(bits);
}

}  // namespace microscale::cpu
