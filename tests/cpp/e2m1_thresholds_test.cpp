// The NVFP4 element codes by thresholds (src/cpu/e2m1_thresholds.hpp), which the portable bf16/f16
// kernel runs, against the reference's per-element code: for every bf16 and f16 pattern (NaN, Inf,
// subnormals and both zeros included), every E4M3 block scale code and global scales from tiny to
// huge amaxes, code_by_thresholds equals select(x * e == 0, 0, E2M1 encode_rn(x * e)) with e the
// block's encode scale. Runs on every CPU.
#include "cpu/e2m1_thresholds.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <cstdint>
#include <string>

#include "core/scale_math.hpp"
#include "cpu/encode_fast.hpp"
#include "microscale/half.hpp"

namespace microscale {
namespace {

// The reference kernels' code of x in a block with encode scale e (quantize_nvfp4_ref.cpp).
uint32_t reference_code(float x, float encode_scale) {
  const float scaled = x * encode_scale;
  return scaled == 0.0f ? 0u : E2M1Codec::encode_rn(scaled);
}

void expect_thresholds_equal_reference(DType input, float amax) {
  const float s_dec = 1.0f / nvfp4_global_encode_scale(amax);
  cpu::E2m1Thresholds t;
  cpu::build_e2m1_thresholds(input, s_dec, t);
  const uint32_t inf_bits = input == DType::BF16 ? 0x7F80u : 0x7C00u;
  int failures = 0;
  for (uint32_t code = 0; code < 127 && failures < 10; ++code) {  // 127 (NaN) is never a block scale
    const float encode_scale = nvfp4_block_encode_scale(e4m3_code_value(code), s_dec);
    for (uint32_t p = 0; p < 0x10000 && failures < 10; ++p) {
      const float x = input == DType::BF16 ? bf16_to_float(static_cast<uint16_t>(p))
                                           : half_to_float(static_cast<uint16_t>(p));
      const auto a = static_cast<int16_t>(p & 0x7FFF);
      const uint16_t sign = (p & 0x8000u) != 0 && static_cast<uint32_t>(a) <= inf_bits ? 8 : 0;
      const uint32_t got = cpu::e2m1_code_by_thresholds(a, sign, t.below[code]);
      const uint32_t want = reference_code(x, encode_scale);
      if (got != want) {
        ++failures;
        ADD_FAILURE() << dtype_name(input) << " amax " << amax << " scale code " << code << " pattern 0x"
                      << std::hex << p << ": code " << got << ", reference " << want;
      }
    }
  }
}

// Amaxes: 1 (S_enc > 1), 2688 (S_enc = 1), a large one (S_enc < 1), FLT_MAX and 0 (S_enc clamped
// and replaced), a subnormal one (S_enc clamped to FLT_MAX), and one with a long significand.
const float kAmaxes[] = {1.0f, 2688.0f, 3.0e6f, FLT_MAX, 0.0f, 1.0e-40f, 0.3748f};

TEST(E2m1Thresholds, Bf16CodesEqualReferenceEncoder) {
  for (float amax : kAmaxes) expect_thresholds_equal_reference(DType::BF16, amax);
}

TEST(E2m1Thresholds, F16CodesEqualReferenceEncoder) {
  for (float amax : kAmaxes) expect_thresholds_equal_reference(DType::F16, amax);
}

}  // namespace
}  // namespace microscale
