// The E2M1 element codes by thresholds (src/cpu/e2m1_thresholds.hpp), which the portable bf16/f16
// kernels run, against the reference's per-element code, for every bf16 and f16 pattern (NaN, Inf,
// subnormals and both zeros included):
// - NVFP4: every E4M3 block scale code and global scales from tiny to huge amaxes;
//   code_by_thresholds equals select(x * e == 0, 0, E2M1 encode_rn(x * e)) with e the block's
//   encode scale.
// - MXFP4: every E8M0 scale byte; code_by_thresholds equals encode_rn(E2M1,
//   mx_scaled_element(x, mx_inverse_scale(S))) for every pattern a block with that byte can hold
//   (finite ones below 0xFF; any, NaN and Inf included, for 0xFF).
// Runs on every CPU.
#include "cpu/e2m1_thresholds.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "core/scale_math.hpp"
#include "cpu/avx2.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/kernel_set.hpp"
#include "microscale/format.hpp"
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

// The windowed search (what the kernels use) and the full one (its fallback where a guess's
// window fails, which no table above needs) give the same NVFP4 tables.
TEST(E2m1Thresholds, WindowedSearchEqualsFullSearch) {
  for (DType input : {DType::BF16, DType::F16}) {
    for (float amax : kAmaxes) {
      const float s_dec = 1.0f / nvfp4_global_encode_scale(amax);
      cpu::E2m1Thresholds windowed, full;
      cpu::build_e2m1_thresholds(input, s_dec, windowed, cpu::ThresholdSearch::Windowed);
      cpu::build_e2m1_thresholds(input, s_dec, full, cpu::ThresholdSearch::Full);
      for (int code = 0; code < 127; ++code) {
        for (int k = 0; k < 8; ++k) {
          ASSERT_EQ(windowed.below[code][k], full.below[code][k])
              << dtype_name(input) << " amax " << amax << " scale code " << code << " step " << k;
        }
      }
    }
  }
}

// The doubling form (what the AVX2 NVFP4 chunk compares with) gives the thresholds' codes for every
// pattern and sign, for each block scale code from the one build_e2m1_doubling_form returns; and
// it holds from code 1 where the thresholds are normal patterns, from a later code or for none
// where they are not.
TEST(E2m1Thresholds, DoublingFormEqualsThresholds) {
  const float more_amaxes[] = {4.5f, 1.0e-20f, 1.0e20f, 3.0e38f};
  for (DType input : {DType::BF16, DType::F16}) {
    for (int set = 0; set < 2; ++set) {
      for (float amax : set == 0 ? std::vector<float>(std::begin(kAmaxes), std::end(kAmaxes))
                                 : std::vector<float>(std::begin(more_amaxes), std::end(more_amaxes))) {
        const float s_dec = 1.0f / nvfp4_global_encode_scale(amax);
        cpu::E2m1Thresholds t, d;
        cpu::build_e2m1_thresholds(input, s_dec, t);
        const int first = cpu::build_e2m1_doubling_form(input, t, d);
        ASSERT_GE(first, 1) << "code 0's thresholds are subnormal patterns";
        ASSERT_LE(first, 127);
        const int shift = cpu::doubling_shift(input);
        for (int code = first; code < 127; ++code) {
          for (uint32_t p = 0; p < 0x10000; ++p) {  // a plain compare: ~10^8 of them
            const auto a = static_cast<int16_t>(p & 0x7FFF);
            const uint16_t sign = (p & 0x8000u) != 0 ? 8 : 0;
            const uint16_t got = cpu::e2m1_code_by_doubling(a, sign, d.below[code], shift);
            const uint16_t want = cpu::e2m1_code_by_thresholds(a, sign, t.below[code]);
            if (got != want) {
              FAIL() << dtype_name(input) << " amax " << amax << " scale code " << code << " pattern 0x"
                     << std::hex << p << ": " << got << ", thresholds " << want;
            }
          }
        }
      }
    }
  }
  // Where each path is taken (the kernel's tests, quantize_test.cpp, rely on these).
  const auto first_of = [](DType input, float amax) {
    cpu::E2m1Thresholds t, d;
    cpu::build_e2m1_thresholds(input, 1.0f / nvfp4_global_encode_scale(amax), t);
    return cpu::build_e2m1_doubling_form(input, t, d);
  };
  EXPECT_EQ(first_of(DType::BF16, 1.0f), 1);
  EXPECT_EQ(first_of(DType::F16, 2688.0f), 1);
  EXPECT_GT(first_of(DType::F16, 1.0f), 1);
  EXPECT_LT(first_of(DType::F16, 1.0f), 127);
  EXPECT_EQ(first_of(DType::F16, 3.0e6f), 127);
}

#ifdef MICROSCALE_HAVE_AVX2_KERNELS
// e2m1_codes_doubling (the AVX2 chunk's, avx2.hpp) of 16 patterns with sign lanes `sign`.
template <int kShift>
MICROSCALE_AVX2 void doubling_codes_avx2(const uint16_t* a, const uint16_t* sign, const int16_t* d,
                                         uint16_t* out) {
  __m256i t[5];
  for (int k = 0; k < 5; ++k) t[k] = _mm256_set1_epi16(d[k]);
  const __m256i codes =
      cpu::e2m1_codes_doubling<kShift>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)),
                                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sign)), t);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), codes);
}

// The AVX2 form gives e2m1_code_by_doubling's code in every lane: every pattern and sign, every
// code where a form holds, for bf16 and f16.
TEST(E2m1Thresholds, Avx2DoublingCodesEqualScalar) {
  if (cpu::cpu_kernel_set() < cpu::KernelSet::Avx2) GTEST_SKIP() << "no AVX2 on this CPU";
  for (DType input : {DType::BF16, DType::F16}) {
    for (float amax : {1.0f, 2688.0f, 0.3748f}) {
      cpu::E2m1Thresholds t, d;
      cpu::build_e2m1_thresholds(input, 1.0f / nvfp4_global_encode_scale(amax), t);
      const int first = cpu::build_e2m1_doubling_form(input, t, d);
      const int shift = cpu::doubling_shift(input);
      for (int code = first; code < 127; ++code) {
        for (uint32_t p0 = 0; p0 < 0x10000; p0 += 16) {
          alignas(32) uint16_t a[16], sign[16], got[16];
          for (int l = 0; l < 16; ++l) {
            a[l] = static_cast<uint16_t>((p0 + l) & 0x7FFF);
            sign[l] = ((p0 + l) & 0x8000u) != 0 ? 8 : 0;
          }
          if (input == DType::BF16) {
            doubling_codes_avx2<cpu::doubling_shift(DType::BF16)>(a, sign, d.below[code], got);
          } else {
            doubling_codes_avx2<cpu::doubling_shift(DType::F16)>(a, sign, d.below[code], got);
          }
          for (int l = 0; l < 16; ++l) {
            const uint16_t want =
                cpu::e2m1_code_by_doubling(static_cast<int16_t>(a[l]), sign[l], d.below[code], shift);
            if (got[l] != want) {
              FAIL() << dtype_name(input) << " amax " << amax << " scale code " << code << " pattern 0x"
                     << std::hex << p0 + l << ": " << got[l] << ", scalar " << want;
            }
          }
        }
      }
    }
  }
}
#endif  // MICROSCALE_HAVE_AVX2_KERNELS

// The MXFP4 table of `input` against the reference kernel's code (quantize_mx_ref.cpp).
void expect_mx_thresholds_equal_reference(DType input) {
  const cpu::MxE2m1Thresholds& t = cpu::mx_e2m1_thresholds(input);
  const uint32_t inf_bits = input == DType::BF16 ? 0x7F80u : 0x7C00u;
  int failures = 0;
  for (uint32_t byte = 0; byte < 256 && failures < 10; ++byte) {
    const float inverse = mx_inverse_scale(static_cast<uint8_t>(byte));
    for (uint32_t p = 0; p < 0x10000 && failures < 10; ++p) {
      const auto a = static_cast<int16_t>(p & 0x7FFF);
      // Inf and NaN make their block's byte 0xFF: with another byte no block holds them.
      if (byte != 0xFF && static_cast<uint32_t>(a) >= inf_bits) continue;
      const float x = input == DType::BF16 ? bf16_to_float(static_cast<uint16_t>(p))
                                           : half_to_float(static_cast<uint16_t>(p));
      const auto sign = static_cast<uint16_t>((p >> 12) & 8);  // as the kernel takes it
      const uint32_t got = cpu::e2m1_code_by_thresholds(a, sign, t.below[byte]);
      const uint32_t want = encode_rn(Format::E2M1, mx_scaled_element(x, inverse));
      if (got != want) {
        ++failures;
        ADD_FAILURE() << dtype_name(input) << " scale byte 0x" << std::hex << byte << " pattern 0x" << p
                      << ": code " << got << ", reference " << want;
      }
    }
  }
}

TEST(E2m1Thresholds, MxBf16CodesEqualReferenceEncoder) { expect_mx_thresholds_equal_reference(DType::BF16); }

TEST(E2m1Thresholds, MxF16CodesEqualReferenceEncoder) { expect_mx_thresholds_equal_reference(DType::F16); }

}  // namespace
}  // namespace microscale
