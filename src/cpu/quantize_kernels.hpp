// CPU quantization kernels: the reference (_ref, plain loops) and the fast path (threads + SIMD).
//
// The caller (src/core/quantize.cpp) has validated the options and shapes and allocated every
// requested output in the compact layout (see quantize.hpp for shapes); kernels fill them in and
// set the NVFP4 amaxes. Scale swizzling happens afterwards in the core.
#pragma once

#include <cstdint>

#include "core/input_matrix.hpp"
#include "core/scale_math.hpp"
#include "core/scale_rule.hpp"
#include "microscale/quantize.hpp"

namespace microscale::cpu {

/// Outputs from this size on are written with streaming stores of whole 64-byte lines, where the
/// kernel writes whole aligned lines: they cannot stay cached anyway, and a streamed whole line
/// skips the read for ownership (measured on the AVX-512 kernels and the portable NVFP4 one).
constexpr int64_t kStreamBytes = int64_t{8} << 20;

/// Whether an output of `bytes`, written as whole lines that start on multiples of `row_bytes`
/// from `base`, is streamed: kStreamBytes and more, and the lines aligned.
inline bool streamable(int64_t bytes, int64_t row_bytes, const void* base) {
  return bytes >= kStreamBytes && row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(base) % 64 == 0;
}

/// An MX element format's terms of mx_scale_byte, and the scale rule (the portable MX kernels').
struct MxParams {
  MxScaleRule rule;
  int emax;
  int mantissa_bits;
  float max_normal;
};

void quantize_nvfp4_ref(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);
void quantize_mx_ref(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);

void quantize_nvfp4(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);
void quantize_mx(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);
/// quantize_nvfp4's 4over6 form (options.four_over_six set).
void quantize_nvfp4_four_over_six(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);

// The AVX-512 kernels (quantize_*_avx512.cpp), tried first by the fast path: they return false,
// having written nothing, when they do not apply (see kernel_set.hpp; stochastic rounding and
// strided columns), and the portable kernels run instead.
bool quantize_nvfp4_avx512(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);
bool quantize_mx_avx512(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out);

}  // namespace microscale::cpu
