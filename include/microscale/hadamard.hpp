// microscale/hadamard.hpp — the 16-point random Hadamard transform as a standalone operation.
//
// quantize() applies it inside NVFP4's columnwise path (options.rht); this entry point exists for
// analysis: undoing the transform of a dequantized columnwise output to compare it with X^T, or
// producing the transformed tensor TE's tests compare against.
#pragma once

#include <cstdint>

#include "microscale/tensor.hpp"

namespace microscale {

/// @brief y = x M along the last dim in 16-element chunks, M = diag(s) H16 / 4 (s from the mask).
///
/// x: f32/bf16/f16 [..., C] with C % 16 == 0. Sums are exact (double), then rounded once to f32.
/// M is orthogonal, so `inverse` (y = x M^T) undoes the forward transform up to that rounding.
/// (quantize() additionally rounds its transform to bf16 as TE does; see src/cpu/rht.hpp.)
Tensor hadamard16(const TensorView& x, uint16_t sign_mask = 0xD7E8, bool inverse = false);

}  // namespace microscale
