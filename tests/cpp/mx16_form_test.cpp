// The per-lane 16-bit MX form (src/cpu/mx16_form.hpp), which the portable bf16/f16 kernel runs,
// against the scalar codec: every finite bf16 and f16 pattern against every scale byte a block of
// such inputs can have, for each byte-sized MX element format and E2M1's two-step form; and the
// branch-free scale byte it uses against mx_scale_byte. Runs on every CPU.
#include "cpu/mx16_form.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/scale_math.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "cpu/encode_fast.hpp"
#include "microscale/format.hpp"
#include "microscale/half.hpp"

namespace microscale {
namespace {

using cpu::Mx16Terms;

// Wherever a lane is not outside the normal form (mx16_outside) and its scaled value is below
// 2^(emax + 1) (the range every MX scale rule keeps a block in), mx16_code_normal equals
// encode_rn(mx_scaled_element(x, mx_inverse_scale(S))). Scale bytes: bf16 every byte but 0xFF
// (NaN); f16 from 0 (an all-zero block's byte) to that of the largest f16 with a margin of two.
// Also: the normal form took many lanes (it did run), and lanes under kMx16AllOutside are all
// outside.
template <typename Codec, DType kIn>
void expect_normal_form(Format format) {
  const FormatInfo& f = format_info(format);
  const bool bf16 = kIn == DType::BF16;
  const int last = bf16 ? 254 : 127 + 16 - f.emax + 2;
  int failures = 0;
  int64_t normal_lanes = 0;
  for (int scale = 0; scale <= last && failures < 10; ++scale) {
    const Mx16Terms t = cpu::mx16_terms<Codec, kIn>(static_cast<uint8_t>(scale));
    const float inverse = mx_inverse_scale(static_cast<uint8_t>(scale));
    for (uint32_t h = 0; h < 0x10000 && failures < 10; ++h) {
      const auto x = static_cast<uint16_t>(h);
      const bool finite = bf16 ? ((h >> 7) & 0xFF) != 0xFF : ((h >> 10) & 0x1F) != 0x1F;
      ASSERT_TRUE(cpu::mx16_outside(x, cpu::kMx16AllOutside.limit));
      if (!finite || cpu::mx16_outside(x, t.limit)) continue;
      const float v = bf16 ? bits_to_float(uint32_t{x} << 16) : half_to_float(x);
      if (std::ldexp(std::fabs(static_cast<double>(v)), 127 - scale) >= std::ldexp(1.0, f.emax + 1)) continue;
      const auto expected = static_cast<uint8_t>(Codec::encode_rn(mx_scaled_element(v, inverse)));
      const uint8_t got = cpu::mx16_code_normal<Codec, kIn>(x, t.lower);
      ++normal_lanes;
      if (got != expected) {
        ++failures;
        ADD_FAILURE() << f.name << (bf16 ? " bf16" : " f16") << " S=" << scale << " x=0x" << std::hex << h
                      << " want 0x" << int{expected} << " got 0x" << int{got};
      }
    }
  }
  EXPECT_GT(normal_lanes, 100000) << f.name;
}

TEST(Mx16Form, Bf16NormalFormEqualsScalarCodec) {
  expect_normal_form<E2M3Codec, DType::BF16>(Format::E2M3);
  expect_normal_form<E3M2Codec, DType::BF16>(Format::E3M2);
  expect_normal_form<E4M3Codec, DType::BF16>(Format::E4M3);
  expect_normal_form<E5M2Codec, DType::BF16>(Format::E5M2);
}

TEST(Mx16Form, F16NormalFormEqualsScalarCodec) {
  expect_normal_form<E2M3Codec, DType::F16>(Format::E2M3);
  expect_normal_form<E3M2Codec, DType::F16>(Format::E3M2);
  expect_normal_form<E4M3Codec, DType::F16>(Format::E4M3);
  expect_normal_form<E5M2Codec, DType::F16>(Format::E5M2);
}

// The subnormal form (FP6 in AVX2): wherever a lane is outside the normal form of a block with a
// scale byte from Mx16Subnormals::kMinScale on, mx16_code_subnormal with the input's sign equals
// encode_rn(mx_scaled_element(x, mx_inverse_scale(S))). Scale bytes as in expect_normal_form.
// Also: the multiplier is exact, and the form took many lanes, codes above 0 among them.
template <typename Codec, DType kIn>
void expect_subnormal_form(Format format) {
  using Subnormals = cpu::Mx16Subnormals<Codec, kIn>;
  const FormatInfo& f = format_info(format);
  const bool bf16 = kIn == DType::BF16;
  const int last = bf16 ? 254 : 127 + 16 - f.emax + 2;
  int failures = 0;
  int64_t subnormal_lanes = 0, nonzero_codes = 0;
  for (int scale = Subnormals::kMinScale; scale <= last && failures < 10; ++scale) {
    const Mx16Terms t = cpu::mx16_terms<Codec, kIn>(static_cast<uint8_t>(scale));
    const float inverse = mx_inverse_scale(static_cast<uint8_t>(scale));
    const float multiplier = Subnormals::multiplier(inverse);
    ASSERT_EQ(multiplier, std::ldexp(1.0f, 127 - scale + f.mantissa_bits - (1 - f.bias)))
        << f.name << " " << scale;
    for (uint32_t h = 0; h < 0x10000 && failures < 10; ++h) {
      const auto x = static_cast<uint16_t>(h);
      const bool finite = bf16 ? ((h >> 7) & 0xFF) != 0xFF : ((h >> 10) & 0x1F) != 0x1F;
      if (!finite || !cpu::mx16_outside(x, t.limit)) continue;
      const float v = bf16 ? bits_to_float(uint32_t{x} << 16) : half_to_float(x);
      const auto expected = static_cast<uint8_t>(Codec::encode_rn(mx_scaled_element(v, inverse)));
      const uint8_t magnitude = cpu::mx16_code_subnormal<Codec, kIn>(x, multiplier);
      const auto got = static_cast<uint8_t>(
          magnitude | ((x >> cpu::Mx16Format<Codec, kIn>::kSignShift) & Codec::kSignBit));
      ++subnormal_lanes;
      nonzero_codes += magnitude != 0;
      if (got != expected) {
        ++failures;
        ADD_FAILURE() << f.name << (bf16 ? " bf16" : " f16") << " S=" << scale << " x=0x" << std::hex << h
                      << " want 0x" << int{expected} << " got 0x" << int{got};
      }
    }
  }
  EXPECT_GT(subnormal_lanes, 100000) << f.name;
  EXPECT_GT(nonzero_codes, 1000) << f.name;
}

TEST(Mx16Form, SubnormalFormEqualsScalarCodec) {
  expect_subnormal_form<E2M3Codec, DType::BF16>(Format::E2M3);
  expect_subnormal_form<E3M2Codec, DType::BF16>(Format::E3M2);
  expect_subnormal_form<E2M3Codec, DType::F16>(Format::E2M3);
  expect_subnormal_form<E3M2Codec, DType::F16>(Format::E3M2);
}

// The two-step form of E2M1 (MXFP4 in AVX2): wherever a block's scale byte is from
// Mx16Fp4TwoStep::kMinScale on and a lane's scaled value is below 8 (2^(emax + 1)), mx16_fp4_code
// with the byte's terms equals encode_rn(mx_scaled_element(x, mx_inverse_scale(S))); under every
// byte but 0xFF (blocks of zeros have any), +-0 give the codes of +-0. Scale bytes as in
// expect_normal_form. Also: the form took many lanes, each code among them, and its steps are the
// thresholds of the MXFP4 kernels (e2m1_thresholds.hpp) wherever it holds.
template <DType kIn>
void expect_fp4_two_step_form() {
  using TwoStep = cpu::Mx16Fp4TwoStep<kIn>;
  const FormatInfo& f = format_info(Format::E2M1);
  const bool bf16 = kIn == DType::BF16;
  const int last = bf16 ? 254 : 127 + 16 - f.emax + 2;
  for (int scale = 0; scale < 0xFF; ++scale) {
    const auto t = TwoStep::terms(static_cast<uint8_t>(scale));
    ASSERT_EQ(cpu::mx16_fp4_code<kIn>(0x0000, t), 0x0) << scale;
    ASSERT_EQ(cpu::mx16_fp4_code<kIn>(0x8000, t), 0x8) << scale;
  }
  const cpu::MxE2m1Thresholds& thresholds = cpu::mx_e2m1_thresholds(kIn);
  int failures = 0;
  int64_t lanes = 0;
  int64_t lanes_of_code[8] = {};
  for (int scale = TwoStep::kMinScale; scale <= last && failures < 10; ++scale) {
    const auto t = TwoStep::terms(static_cast<uint8_t>(scale));
    const Mx16Terms normal = cpu::mx16_terms<E2M1Codec, kIn>(static_cast<uint8_t>(scale));
    ASSERT_EQ(t.lower, normal.lower) << scale;
    ASSERT_EQ(t.step1, thresholds.below[scale][1]) << scale;
    ASSERT_EQ(t.step2, thresholds.below[scale][2]) << scale;
    const float inverse = mx_inverse_scale(static_cast<uint8_t>(scale));
    for (uint32_t h = 0; h < 0x10000 && failures < 10; ++h) {
      const auto x = static_cast<uint16_t>(h);
      const bool finite = bf16 ? ((h >> 7) & 0xFF) != 0xFF : ((h >> 10) & 0x1F) != 0x1F;
      if (!finite) continue;
      const float v = bf16 ? bits_to_float(uint32_t{x} << 16) : half_to_float(x);
      if (std::ldexp(std::fabs(static_cast<double>(v)), 127 - scale) >= std::ldexp(1.0, f.emax + 1)) continue;
      const auto expected = static_cast<uint8_t>(E2M1Codec::encode_rn(mx_scaled_element(v, inverse)));
      const uint8_t got = cpu::mx16_fp4_code<kIn>(x, t);
      ++lanes;
      ++lanes_of_code[expected & 7];
      if (got != expected) {
        ++failures;
        ADD_FAILURE() << "E2M1" << (bf16 ? " bf16" : " f16") << " S=" << scale << " x=0x" << std::hex << h
                      << " want 0x" << int{expected} << " got 0x" << int{got};
      }
    }
  }
  EXPECT_GT(lanes, 100000);
  for (int64_t n : lanes_of_code) EXPECT_GT(n, 1000);
}

TEST(Mx16Form, Fp4TwoStepFormEqualsScalarCodec) {
  expect_fp4_two_step_form<DType::BF16>();
  expect_fp4_two_step_form<DType::F16>();
}

// Every bf16 and f16 value (the amaxes the kernel has), fp32 patterns around every binade's ends
// and random ones, under every rule and element format: the same byte as mx_scale_byte.
template <MxScaleRule kRule>
void expect_branch_free_scale_bytes(const std::vector<float>& amaxes) {
  for (Format format : {Format::E2M1, Format::E2M3, Format::E3M2, Format::E4M3, Format::E5M2}) {
    const FormatInfo& f = format_info(format);
    for (float amax : amaxes) {
      const uint8_t expected = mx_scale_byte(amax, kRule, f.emax, f.mantissa_bits, f.max_normal);
      ASSERT_EQ(mx_scale_byte_branch_free<kRule>(amax, f.emax, f.mantissa_bits, f.max_normal), expected)
          << f.name << " rule " << static_cast<int>(kRule) << " amax bits 0x" << std::hex << float_bits(amax);
    }
  }
}

TEST(Mx16Form, BranchFreeScaleByteEqualsMxScaleByte) {
  std::vector<float> amaxes;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    amaxes.push_back(bits_to_float(h << 16));
    amaxes.push_back(half_to_float(static_cast<uint16_t>(h)));
  }
  for (uint32_t e = 0; e < 256; ++e) {
    for (uint32_t m : {0u, 1u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFEu, 0x7FFFFFu})
      amaxes.push_back(bits_to_float(e << 23 | m));
  }
  std::mt19937 rng(5);
  for (int i = 0; i < (1 << 18); ++i) amaxes.push_back(bits_to_float(static_cast<uint32_t>(rng())));
  expect_branch_free_scale_bytes<MxScaleRule::Floor>(amaxes);
  expect_branch_free_scale_bytes<MxScaleRule::Ceil>(amaxes);
  expect_branch_free_scale_bytes<MxScaleRule::Even>(amaxes);
  expect_branch_free_scale_bytes<MxScaleRule::RCeil>(amaxes);
}

TEST(Mx16Form, InverseScaleOfEveryByte) {
  // The multiplier the kernels apply (mx_inverse_scale chooses it by selects): 2^(127 - byte),
  // NaN for 0xFF.
  for (int byte = 0; byte < 256; ++byte) {
    const float inverse = mx_inverse_scale(static_cast<uint8_t>(byte));
    if (byte == 0xFF) {
      EXPECT_TRUE(std::isnan(inverse));
    } else {
      EXPECT_EQ(inverse, std::ldexp(1.0f, 127 - byte)) << "byte " << byte;
    }
  }
}

}  // namespace
}  // namespace microscale
