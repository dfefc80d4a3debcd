// NVFP4 element codes of 16-bit inputs by comparisons: per E4M3 block scale code, the |x| patterns
// at which the E2M1 code of RN(x * encode scale) steps up (quantize_nvfp4_16.cpp).
//
// Why: in the fp32 form each element costs a widening, a multiply and a ~20-operation encoder on
// 8 lanes (AVX2). The code is a monotone function of |x|: for a given encode scale there are 7
// patterns where its magnitude steps from k - 1 to k, and one below which the product rounds to
// zero (code 0 with no sign, as the reference gives any zero). A direction has one global scale,
// so each of the 127 block scale codes has one encode scale and one set of such patterns per
// call; with them an element's code is 8 compares of its 16-bit |x| pattern (16 lanes on AVX2).
//
// The thresholds come from the reference encoder itself (a bisection on its codes), so they are
// exact wherever the code is monotone in |x|, which holds for RN products with an encode scale
// > 0 (tests/cpp/e2m1_thresholds_test.cpp checks every bf16 and f16 pattern against the encoder).
#pragma once

#include <cstdint>

#include "cpu/cpu_dispatch.hpp"
#include "microscale/tensor.hpp"  // DType

namespace microscale::cpu {

/// below[c][k] for the E4M3 block scale code c (0..126; 127, NaN, never occurs) is B - 1, where B
/// is the smallest |x| pattern (0 .. the Inf pattern) with: k = 0, a nonzero RN(|x| * encode
/// scale); k = 1..7, an E2M1 magnitude code >= k. (B >= 1 always: |x| = 0 gives code 0.)
struct E2m1Thresholds {
  alignas(64) int16_t below[128][8];
};

/// The thresholds of one direction of a call: the encode scale of code c is
/// nvfp4_block_encode_scale(e4m3_code_value(c), s_dec). `input` is BF16 or F16.
void build_e2m1_thresholds(DType input, float s_dec, E2m1Thresholds& out);

/// The code (sign in bit 3) of an element with |x| pattern `a` (NaN patterns included) and sign
/// bit `sign` (8 or 0; 0 for a NaN) against one block's row of thresholds `t`. NOTE: `a` and `t`
/// are int16 so that the compares are single signed 16-bit compares (patterns <= 0x7FFF).
MICROSCALE_CPU_INLINE uint16_t e2m1_code_by_thresholds(int16_t a, uint16_t sign, const int16_t* t) {
  const int magnitude =
      (a > t[1]) + (a > t[2]) + (a > t[3]) + (a > t[4]) + (a > t[5]) + (a > t[6]) + (a > t[7]);
  return static_cast<uint16_t>(magnitude | (sign & (0u - static_cast<unsigned>(a > t[0]))));
}

}  // namespace microscale::cpu
