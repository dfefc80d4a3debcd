// The AVX-512 encoders (src/cpu/avx512_codecs.hpp) lane by lane against the scalar codecs and
// scale formulas they replace: every bf16 pattern, every grid point and midpoint of each format
// with its fp32 neighbours, random fp32 patterns; all E4M3 scale codes, all E8M0 bytes; the bf16
// MX encoders on every bf16 pattern and scale byte; the transposing max tree against a scalar max;
// both bf16 roundings of fp32 lanes against float_to_bf16. Skipped on CPUs without AVX-512.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/avx512_codecs.hpp"
#include "cpu/kernel_set.hpp"
#include "microscale/format.hpp"
#include "microscale/half.hpp"

#ifdef MICROSCALE_HAVE_AVX512_KERNELS

namespace microscale {
namespace {

using namespace cpu::avx512;
using cpu::cpu_kernel_set;
using cpu::KernelSet;
using cpu::Mx16Format;

// Inputs that probe every rounding decision: all bf16 patterns, each format's grid points and
// midpoints (scaled by powers of two) with their fp32 neighbours, and random fp32 patterns.
std::vector<float> probe_inputs() {
  std::vector<float> v;
  for (uint32_t h = 0; h < 65536; ++h) v.push_back(bits_to_float(h << 16));
  for (Format f : {Format::E2M1, Format::E2M3, Format::E3M2, Format::E4M3, Format::E5M2}) {
    const int codes = 1 << (format_info(f).bits - 1);
    for (int c = 0; c + 1 < codes; ++c) {
      const float lo = decode(f, static_cast<uint8_t>(c)), hi = decode(f, static_cast<uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      for (float p : {lo, hi, 0.5f * (lo + hi)}) {
        for (int e = -3; e <= 3; ++e) {
          const float s = std::ldexp(p, e);
          for (float q : {s, std::nextafter(s, 0.0f), std::nextafter(s, INFINITY)}) {
            v.push_back(q);
            v.push_back(-q);
          }
        }
      }
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < (1 << 20); ++i) v.push_back(bits_to_float(rng()));
  while (v.size() % 16 != 0) v.push_back(0.0f);
  return v;
}

template <typename Codec>
MICROSCALE_AVX512 void encode_all(const std::vector<float>& in, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < in.size(); i += 16) {
    _mm512_storeu_si512(&out[i], encode_rn<Codec>(_mm512_loadu_ps(&in[i])));
  }
}

MICROSCALE_AVX512 void encode_nvfp4_all(const std::vector<float>& in, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < in.size(); i += 16) {
    _mm512_storeu_si512(&out[i], nvfp4_encode_e2m1(_mm512_loadu_ps(&in[i])));
  }
}

// The bounded form (no clamp, no absolute value), on inputs with |x| < 7 only.
MICROSCALE_AVX512 void encode_nvfp4_bounded_all(const std::vector<float>& in, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < in.size(); i += 16) {
    const __m512 x = _mm512_loadu_ps(&in[i]);
    _mm512_storeu_si512(&out[i], nvfp4_e2m1_codes<true>(nvfp4_e2m1_index<true, true>(x), is_negative(x), 0));
  }
}

template <typename Codec>
void expect_codec(const std::vector<float>& in, const char* name) {
  std::vector<uint32_t> out(in.size());
  encode_all<Codec>(in, out);
  int failures = 0;
  for (size_t i = 0; i < in.size() && failures < 10; ++i) {
    const uint32_t expected = Codec::encode_rn(in[i]);
    if (out[i] != expected) {
      ++failures;
      ADD_FAILURE() << name << " x=" << in[i] << " (0x" << std::hex << float_bits(in[i]) << ") got 0x"
                    << out[i] << " want 0x" << expected;
    }
  }
}

TEST(Avx512Codec, ElementEncodersEqualScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  const std::vector<float> in = probe_inputs();
  expect_codec<E2M1Codec>(in, "E2M1");
  expect_codec<E2M3Codec>(in, "E2M3");
  expect_codec<E3M2Codec>(in, "E3M2");
  expect_codec<E4M3Codec>(in, "E4M3");
  expect_codec<E5M2Codec>(in, "E5M2");
}

// NVFP4 element codes `out` of `in` against the scalar codec (any zero gives code 0, TE's rule).
void expect_nvfp4_codes(const std::vector<float>& in, const std::vector<uint32_t>& out) {
  int failures = 0;
  for (size_t i = 0; i < in.size() && failures < 10; ++i) {
    const uint32_t expected = in[i] == 0.0f ? 0u : E2M1Codec::encode_rn(in[i]);
    if (out[i] != expected) {
      ++failures;
      ADD_FAILURE() << "x=" << in[i] << " got " << out[i] << " want " << expected;
    }
  }
}

TEST(Avx512Codec, Nvfp4ElementEncoderEqualsScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  const std::vector<float> in = probe_inputs();
  std::vector<uint32_t> out(in.size());
  encode_nvfp4_all(in, out);
  expect_nvfp4_codes(in, out);
}

TEST(Avx512Codec, Nvfp4BoundedElementEncoderEqualsScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> in;
  for (float x : probe_inputs()) {
    if (std::fabs(x) < 7.0f) in.push_back(x);
  }
  for (float x : {7.0f, -7.0f}) in.push_back(std::nextafter(x, 0.0f));  // the largest inputs it takes
  in.resize((in.size() + 15) / 16 * 16, 0.0f);
  std::vector<uint32_t> out(in.size());
  encode_nvfp4_bounded_all(in, out);
  expect_nvfp4_codes(in, out);
}

// round_to_bf16 and round_to_bf16_normal on 16 inputs -> fp32 bit patterns.
MICROSCALE_AVX512 void round_lanes(const float* in, uint32_t* integer_steps, uint32_t* fma) {
  const __m512 x = _mm512_loadu_ps(in);
  _mm512_storeu_si512(integer_steps, _mm512_castps_si512(round_to_bf16(x)));
  _mm512_storeu_si512(fma, _mm512_castps_si512(round_to_bf16_normal(x)));
}

// Both roundings of the NVFP4 kernel's RHT outputs equal float_to_bf16 (nearest even): the integer
// steps on every finite input, the two FMAs on zeros and normals below 2^111. Inputs: every bf16
// value's high half with low halves at and around the tie, next to the grid points and just below
// the next bf16 value (y within 2^-16 of a power of two, where the sum C + y would change binade),
// plus random patterns. (All 2^32 patterns were checked by a scratch program; see docs/perf.md.)
TEST(Avx512Codec, Bf16RoundingsEqualScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> in;
  std::mt19937 rng(11);
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x007Fu, 0x0080u, 0x7FFFu, 0x8000u, 0x8001u, 0xFF00u, 0xFF01u,
                         0xFF80u, 0xFFFFu, static_cast<uint32_t>(rng()) & 0xFFFFu}) {
      in.push_back(bits_to_float(high << 16 | low));
    }
  }
  for (int i = 0; i < (1 << 20); ++i) in.push_back(bits_to_float(static_cast<uint32_t>(rng())));
  in.resize(in.size() / 16 * 16);
  int failures = 0;
  for (size_t i = 0; i < in.size() && failures < 10; i += 16) {
    uint32_t integer_steps[16], fma[16];
    round_lanes(&in[i], integer_steps, fma);
    for (int lane = 0; lane < 16; ++lane) {
      const float x = in[i + lane];
      if (!std::isfinite(x)) continue;
      const uint32_t expected = static_cast<uint32_t>(float_to_bf16(x)) << 16;
      if (integer_steps[lane] != expected) {
        ++failures;
        ADD_FAILURE() << "integer steps x=" << x << " got 0x" << std::hex << integer_steps[lane] << " want 0x"
                      << expected;
      }
      const bool normal_range = x == 0.0f || (std::fpclassify(x) == FP_NORMAL && std::fabs(x) < 0x1p111f);
      if (normal_range && fma[lane] != expected) {
        ++failures;
        ADD_FAILURE() << "fma x=" << x << " got 0x" << std::hex << fma[lane] << " want 0x" << expected;
      }
    }
  }
}

MICROSCALE_AVX512 void scale_lanes(const float* amax, float multiplier, float s_dec, uint32_t* codes,
                                   float* enc) {
  __m512i c;
  const Nvfp4EncodeScaleTable table = nvfp4_encode_scale_table(s_dec);
  _mm512_storeu_ps(enc, nvfp4_block_scales(_mm512_loadu_si512(amax), multiplier, table, &c));
  _mm512_storeu_si512(codes, c);
}

TEST(Avx512Codec, Nvfp4BlockScalesEqualScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(9);
  for (float global_amax : {1.0f, 3.7f, 1e-30f, 6e4f, 3e38f, 0.0f, INFINITY}) {
    const float s_enc = nvfp4_global_encode_scale(global_amax);
    const float multiplier = nvfp4_block_scale_multiplier(s_enc), s_dec = 1.0f / s_enc;
    for (int trial = 0; trial < 4096; ++trial) {
      alignas(64) float amax[16], enc[16];
      alignas(64) uint32_t codes[16];
      for (float& a : amax) {
        if (trial < 1024) {  // within 2^14 of the tensor's amax: every code normal (the short form)
          a = std::ldexp(static_cast<float>(1 + rng() % 4096) / 4096.0f, -static_cast<int>(rng() % 14));
        } else if (trial < 2048) {
          a = std::ldexp(static_cast<float>(rng() % 4096) / 4096.0f, static_cast<int>(rng() % 40) - 20);
        } else {
          a = bits_to_float(rng() % 0x7F800001u);  // any finite or +Inf
        }
        a = std::fabs(a) * (global_amax > 0.0f && std::isfinite(global_amax) ? global_amax : 1.0f);
      }
      scale_lanes(amax, multiplier, s_dec, codes, enc);
      for (int i = 0; i < 16; ++i) {
        const uint8_t code = E4M3Codec::encode_rn(std::fmin(amax[i] * multiplier, FLT_MAX));
        ASSERT_EQ(codes[i], code) << amax[i];
        ASSERT_EQ(float_bits(enc[i]), float_bits(nvfp4_block_encode_scale(e4m3_code_value(code), s_dec)))
            << amax[i];
      }
    }
  }
}

template <MxScaleRule kRule>
MICROSCALE_AVX512 void mx_bytes(const uint32_t* amax_bits, int emax, int mantissa_bits, float max_normal,
                                uint32_t* bytes, float* inverse) {
  const __m512i b = mx_scale_bytes<kRule>(_mm512_loadu_si512(amax_bits), emax, mantissa_bits, max_normal);
  _mm512_storeu_si512(bytes, b);
  _mm512_storeu_ps(inverse, mx_inverse_scales(b));
}

template <MxScaleRule kRule>
void expect_mx_rule() {
  for (Format f : {Format::E2M1, Format::E2M3, Format::E3M2, Format::E4M3, Format::E5M2}) {
    const FormatInfo& info = format_info(f);
    // Every bf16 magnitude (NaN patterns included), then random fp32 magnitudes.
    std::vector<uint32_t> amax;
    for (uint32_t h = 0; h < 32768; ++h) amax.push_back(h << 16);
    std::mt19937 rng(3);
    for (int i = 0; i < 65536; ++i) amax.push_back(rng() & 0x7FFFFFFFu);
    std::vector<uint32_t> bytes(amax.size());
    std::vector<float> inverse(amax.size());
    for (size_t i = 0; i < amax.size(); i += 16) {
      mx_bytes<kRule>(&amax[i], info.emax, info.mantissa_bits, info.max_normal, &bytes[i], &inverse[i]);
    }
    for (size_t i = 0; i < amax.size(); ++i) {
      const uint8_t expected =
          mx_scale_byte(bits_to_float(amax[i]), kRule, info.emax, info.mantissa_bits, info.max_normal);
      ASSERT_EQ(bytes[i], expected) << format_info(f).name << " amax bits 0x" << std::hex << amax[i];
      ASSERT_EQ(float_bits(inverse[i]), float_bits(mx_inverse_scale(expected)));
    }
  }
}

TEST(Avx512Codec, MxScaleBytesEqualScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  expect_mx_rule<MxScaleRule::Floor>();
  expect_mx_rule<MxScaleRule::Ceil>();
  expect_mx_rule<MxScaleRule::Even>();
  expect_mx_rule<MxScaleRule::RCeil>();
}

// The 16-bit MX encoders (kIn: bf16 or f16) on `x` (a multiple of 32 patterns) with scale byte
// `scale`: every lane by the general form (mx_bf16_codes, mx_f16_codes) into `general`; by
// mx16_codes_normal into `normal`, and whether its lane is outside the normal form's range
// (mx16_normal_terms) into `outside`.
template <typename Codec, DType kIn>
MICROSCALE_AVX512 void mx16_lanes(const std::vector<uint16_t>& x, uint8_t scale,
                                  std::vector<uint16_t>& general, std::vector<uint16_t>& normal,
                                  std::vector<uint8_t>& outside) {
  using F = Mx16Format<Codec, kIn>;
  const __m512i s = _mm512_set1_epi16(scale), one = _mm512_set1_epi16(1);
  __m512i lower, limit;
  mx16_normal_terms<Codec, kIn>(s, &lower, &limit);
  for (size_t i = 0; i < x.size(); i += 32) {
    const __m512i v = _mm512_loadu_si512(&x[i]);
    const __m512i abs = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
    const __m512i shifted = _mm512_srli_epi16(v, F::kSignShift);
    if constexpr (kIn == DType::BF16) {
      _mm512_storeu_si512(&general[i], mx_bf16_codes<Codec>(abs, shifted, s));
    } else {
      _mm512_storeu_si512(&general[i], mx_f16_codes<Codec>(v, s));
    }
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(abs, F::kDrop), one);
    _mm512_storeu_si512(&normal[i], mx16_codes_normal<Codec, kIn>(_mm512_add_epi16(abs, lsb), shifted, lower,
                                                                  _mm512_test_epi16_mask(abs, abs)));
    const __mmask32 out = _mm512_cmple_epu16_mask(_mm512_sub_epi16(abs, one), limit);
    for (int l = 0; l < 32; ++l) outside[i + l] = (out >> l) & 1;
  }
}

// Every finite bf16 or f16 pattern against every scale byte a block of such inputs can have
// (bf16: from the format's bias B to 0xFE, 0xFF being NaN; the kernel sends smaller bytes to the
// fp32 encoders. f16: from 0, an all-zero block's byte, to that of the largest f16 with a margin
// of two), wherever the scaled value is below 2^(emax + 1) (the range every MX scale rule keeps a
// block in).
template <typename Codec, DType kIn>
void expect_mx16(Format format) {
  const FormatInfo& f = format_info(format);
  const bool bf16 = kIn == DType::BF16;
  std::vector<uint16_t> x;
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool finite = bf16 ? ((h >> 7) & 0xFF) != 0xFF : ((h >> 10) & 0x1F) != 0x1F;
    if (finite) x.push_back(static_cast<uint16_t>(h));
  }
  while (x.size() % 32 != 0) x.push_back(0);
  std::vector<uint16_t> general(x.size()), normal(x.size());
  std::vector<uint8_t> outside(x.size());
  int failures = 0, normal_lanes = 0;
  // Nonzero f16 amaxes lie in [2^-24, 65504]: scale bytes floor/ceil(log2 amax) - emax + 127.
  const int first = bf16 ? f.bias : 0, last = bf16 ? 254 : 127 + 16 - f.emax + 2;
  for (int scale = first; scale <= last; ++scale) {
    mx16_lanes<Codec, kIn>(x, static_cast<uint8_t>(scale), general, normal, outside);
    const float inverse = mx_inverse_scale(static_cast<uint8_t>(scale));
    for (size_t i = 0; i < x.size() && failures < 10; ++i) {
      const float v = bf16 ? bits_to_float(uint32_t{x[i]} << 16) : half_to_float(x[i]);
      if (std::ldexp(std::fabs(static_cast<double>(v)), 127 - scale) >= std::ldexp(1.0, f.emax + 1)) continue;
      const uint8_t expected = Codec::encode_rn(mx_scaled_element(v, inverse));
      if (general[i] != expected || (!outside[i] && normal[i] != expected)) {
        ++failures;
        ADD_FAILURE() << f.name << (bf16 ? " bf16" : " f16") << " S=" << scale << " x=0x" << std::hex << x[i]
                      << " want 0x" << int{expected} << " general 0x" << general[i] << " normal 0x"
                      << normal[i] << (outside[i] ? " (outside)" : "");
      }
      normal_lanes += !outside[i];
    }
  }
  EXPECT_GT(normal_lanes, 100000) << f.name;  // the normal form did run (every binade of its range)
}

TEST(Avx512Codec, MxBf16EncodersEqualScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  expect_mx16<E2M1Codec, DType::BF16>(Format::E2M1);
  expect_mx16<E2M3Codec, DType::BF16>(Format::E2M3);
  expect_mx16<E3M2Codec, DType::BF16>(Format::E3M2);
  expect_mx16<E4M3Codec, DType::BF16>(Format::E4M3);
  expect_mx16<E5M2Codec, DType::BF16>(Format::E5M2);
}

TEST(Avx512Codec, MxF16EncodersEqualScalar) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  expect_mx16<E2M3Codec, DType::F16>(Format::E2M3);
  expect_mx16<E3M2Codec, DType::F16>(Format::E3M2);
  expect_mx16<E4M3Codec, DType::F16>(Format::E4M3);
  expect_mx16<E5M2Codec, DType::F16>(Format::E5M2);
}

MICROSCALE_AVX512 void transpose_max(const uint32_t* in, uint32_t* out) {
  __m512i v[16];
  for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_si512(in + 16 * i);
  _mm512_storeu_si512(out, transpose_max16(v));
}

TEST(Avx512Codec, TransposeMaxIsPerRegisterMax) {
  if (cpu_kernel_set() != KernelSet::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(4);
  for (int trial = 0; trial < 1000; ++trial) {
    uint32_t in[256], out[16];
    for (uint32_t& x : in) x = rng() >> (rng() % 32);
    transpose_max(in, out);
    for (int r = 0; r < 16; ++r) {
      uint32_t m = 0;
      for (int l = 0; l < 16; ++l) m = std::max(m, in[16 * r + l]);
      ASSERT_EQ(out[r], m) << "register " << r;
    }
  }
}

}  // namespace
}  // namespace microscale

#endif
