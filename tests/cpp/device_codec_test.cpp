// The CUDA kernels' E2M1 encoder (cuda/fast_codec.cuh, e2m1_rn: one definition for host and
// device) against the reference encode_rn, on the host. Every fp32 pattern whose low byte is one of
// {0x00, 0x01, 0x7F, 0x80, 0xFF}: every tie of every grid and the values just beside it, with
// every sign, exponent and upper significand (every bf16 value among them). All 2^32 patterns
// were also checked once, equal, when the encoder was written (13 s on two cores: too slow for
// the suite's sanitizer run).
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

template <bool kZeroUnsigned>
void check_e2m1() {
  int64_t mismatches = 0;
  auto check = [&](uint32_t bits) {
    const float x = bits_to_float(bits);
    if (cuda::e2m1_rn<kZeroUnsigned>(x) != reference_code<kZeroUnsigned>(x) && ++mismatches <= 5) {
      ADD_FAILURE() << "e2m1_rn<" << kZeroUnsigned << "> of 0x" << std::hex << bits << ": "
                    << cuda::e2m1_rn<kZeroUnsigned>(x) << ", encode_rn " << reference_code<kZeroUnsigned>(x);
    }
  };
  for (uint32_t high = 0; high < (1u << 24); ++high) {
    for (uint32_t low : {0x00u, 0x01u, 0x7Fu, 0x80u, 0xFFu}) check((high << 8) | low);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DeviceCodec, E2m1EqualsEncodeRn) { check_e2m1<false>(); }

TEST(DeviceCodec, E2m1ZeroUnsignedEqualsEncodeRnButZeros) { check_e2m1<true>(); }

}  // namespace
}  // namespace microscale
