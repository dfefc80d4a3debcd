// The CUDA kernels' E2M1 encoder (cuda/fast_codec.cuh, e2m1x8_rn: one definition for host and
// device) against the reference encode_rn, on the host. Every fp32 pattern whose low byte is one of
// {0x00, 0x01, 0x7F, 0x80, 0xFF}: every tie of every grid and the values just beside it, with
// every sign, exponent and upper significand (every bf16 value among them). Each pattern is
// tested once, in a word of eight taken in a scrambled order (index times an odd constant, modulo
// the count), so that a word mixes signs, exponents and grids and every nibble sees all kinds.
// All 2^32 patterns were also checked once, equal, when the encoder was written (too slow for the
// suite's sanitizer run). On the device one_if_negative is PTX's set.lt.f32.f32 (the GPU test
// checks the kernels there).
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/fast_codec.cuh"
#include "microscale/format.hpp"
#include "microscale/half.hpp"

namespace microscale {
namespace {

// encode_rn, with the NVFP4 kernels' rule when kZeroUnsigned: any zero (-0.0 too) gives code 0.
template <bool kZeroUnsigned>
uint32_t reference_code(float x) {
  if (kZeroUnsigned && (float_bits(x) & 0x7FFFFFFFu) == 0) return 0;
  return encode_rn(Format::E2M1, x);
}

// The n-th tested pattern: high bits n / 5, low byte the n % 5-th of the list above.
uint32_t tested_pattern(uint64_t n) {
  constexpr uint32_t kLow[5] = {0x00u, 0x01u, 0x7Fu, 0x80u, 0xFFu};
  return static_cast<uint32_t>((n / 5) << 8) | kLow[n % 5];
}

template <bool kZeroUnsigned>
void check_e2m1x8() {
  constexpr uint64_t kCount = uint64_t{5} << 24;  // a multiple of 8
  constexpr uint64_t kStep = 0x9E3779B1u;         // odd and not a multiple of 5: coprime to kCount
  int64_t mismatches = 0;
  for (uint64_t word = 0; word < kCount / 8; ++word) {
    float x[8];
    uint32_t expected = 0;
    for (int i = 0; i < 8; ++i) {
      uint32_t pattern = tested_pattern((word * 8 + static_cast<uint64_t>(i)) * kStep % kCount);
      // Without kZeroUnsigned the precondition: no NaN with its sign bit set (the device's
      // products are the positive canonical NaN), so such patterns enter as their positive twin.
      if (!kZeroUnsigned && (pattern & 0x7FFFFFFFu) > 0x7F800000u) pattern &= 0x7FFFFFFFu;
      x[i] = bits_to_float(pattern);
      expected |= reference_code<kZeroUnsigned>(x[i]) << (4 * i);
    }
    const uint32_t got = cuda::e2m1x8_rn<kZeroUnsigned>(x);
    if (got != expected && ++mismatches <= 5) {
      ADD_FAILURE() << "e2m1x8_rn<" << kZeroUnsigned << "> of word " << word << ": 0x" << std::hex << got
                    << ", encode_rn 0x" << expected;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// 4over6's encoder (the CPU fast path and the CUDA kernel): the code of encode_rn with NVFP4's
// zero rule, and that code's decoded value, bit for bit, on every tested pattern.
TEST(DeviceCodec, E2m1CodeAndValueEqualsEncodeRnAndDecode) {
  constexpr uint64_t kCount = uint64_t{5} << 24;
  int64_t mismatches = 0;
  for (uint64_t n = 0; n < kCount; ++n) {
    const float x = bits_to_float(tested_pattern(n));
    float value = 0.0f;
    const uint32_t code = cuda::e2m1_code_and_value(x, value);
    const uint32_t want = reference_code<true>(x);
    const float want_value = decode(Format::E2M1, static_cast<uint8_t>(want));
    if ((code != want || float_bits(value) != float_bits(want_value)) && ++mismatches <= 5) {
      ADD_FAILURE() << "x = 0x" << std::hex << float_bits(x) << ": code 0x" << code << " value 0x"
                    << float_bits(value) << ", want 0x" << want << " value 0x" << float_bits(want_value);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DeviceCodec, E2m1x8EqualsEncodeRn) { check_e2m1x8<false>(); }

TEST(DeviceCodec, E2m1x8ZeroUnsignedEqualsEncodeRnButZeros) { check_e2m1x8<true>(); }

}  // namespace
}  // namespace microscale
