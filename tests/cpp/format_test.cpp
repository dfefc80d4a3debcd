// Formats: every code of every format decodes to its value; encode_rn / encode_sr on every grid
// point, midpoint (tie) and neighbour, on overflow, Inf, NaN and -0; the fast codecs equal them.
#include "microscale/format.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/encode_fast.hpp"
#include "microscale/error.hpp"
#include "microscale/half.hpp"

namespace microscale {
namespace {

const Format kElementFormats[] = {Format::E2M1, Format::E2M3, Format::E3M2, Format::E4M3, Format::E5M2};

// Independent decoder: the value of a code from its bit fields by the textbook formula.
double textbook_value(const FormatInfo& f, uint32_t code) {
  const uint32_t sign = f.has_sign ? (code >> (f.bits - 1)) & 1u : 0u;
  const uint32_t e = (code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1);
  const uint32_t mant = code & ((1u << f.mantissa_bits) - 1);
  const double m = static_cast<double>(mant) / (1 << f.mantissa_bits);
  const double v = e == 0 ? std::ldexp(m, 1 - f.bias) : std::ldexp(1.0 + m, static_cast<int>(e) - f.bias);
  return sign ? -v : v;
}

TEST(Format, TableRows) {
  EXPECT_EQ(format_info(Format::E2M1).max_normal, 6.0f);
  EXPECT_EQ(format_info(Format::E2M3).max_normal, 7.5f);
  EXPECT_EQ(format_info(Format::E3M2).max_normal, 28.0f);
  EXPECT_EQ(format_info(Format::E4M3).max_normal, 448.0f);
  EXPECT_EQ(format_info(Format::E5M2).max_normal, 57344.0f);
  EXPECT_EQ(format_info(Format::E8M0).max_normal, std::ldexp(1.0f, 127));
  for (Format f : kElementFormats) {
    const FormatInfo& info = format_info(f);
    EXPECT_EQ(decode(f, info.max_code), info.max_normal) << info.name;
    EXPECT_EQ(decode(f, 1), info.min_subnormal) << info.name;
    EXPECT_EQ(decode(f, static_cast<uint8_t>(1u << info.mantissa_bits)), info.min_normal) << info.name;
    EXPECT_EQ(parse_format(info.name), f);
  }
  EXPECT_THROW(parse_format("e9m9"), Error);
}

TEST(Format, EveryCodeDecodes) {
  for (Format format : kElementFormats) {
    const FormatInfo& f = format_info(format);
    for (uint32_t code = 0; code < (1u << f.bits); ++code) {
      const float v = decode(format, static_cast<uint8_t>(code));
      const uint32_t magnitude = code & ((1u << (f.bits - 1)) - 1);
      const uint32_t exponent_ones = ((1u << f.exponent_bits) - 1) << f.mantissa_bits;
      if (f.specials == Specials::NanOnlyOnes && magnitude == (1u << (f.bits - 1)) - 1) {
        EXPECT_TRUE(std::isnan(v)) << f.name << " code " << code;
      } else if (f.specials == Specials::Ieee && (magnitude & exponent_ones) == exponent_ones) {
        EXPECT_TRUE((magnitude == exponent_ones) ? std::isinf(v) : std::isnan(v))
            << f.name << " code " << code;
      } else {
        EXPECT_EQ(v, textbook_value(f, code)) << f.name << " code " << code;
        EXPECT_EQ(std::signbit(v), code >> (f.bits - 1) == 1) << f.name << " code " << code;
        // Round trip: a finite code encodes back to itself.
        EXPECT_EQ(encode_rn(format, v), code) << f.name << " code " << code;
      }
    }
    if (f.bits < 8) {
      EXPECT_THROW(decode(format, static_cast<uint8_t>(1u << f.bits)), Error) << f.name;
    }
  }
  // E8M0: 2^(code - 127), 0xFF NaN; UE4M3: the positive half of E4M3.
  for (int code = 0; code < 255; ++code) EXPECT_EQ(decode(Format::E8M0, code), std::ldexp(1.0f, code - 127));
  EXPECT_TRUE(std::isnan(decode(Format::E8M0, 0xFF)));
  for (int code = 0; code < 128; ++code) {
    const float a = decode(Format::UE4M3, code), b = decode(Format::E4M3, code);
    EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << code;
  }
  EXPECT_THROW(decode(Format::UE4M3, 0x80), Error);
}

// Sorted finite non-negative grid values of a format.
std::vector<double> grid(Format format) {
  const FormatInfo& f = format_info(format);
  std::vector<double> g;
  for (uint32_t code = 0; code < (1u << (f.bits - 1)); ++code) {
    const float v = decode(format, static_cast<uint8_t>(code));
    if (std::isfinite(v)) g.push_back(v);
  }
  return g;
}

float next_up(float x) { return std::nextafter(x, INFINITY); }
float next_down(float x) { return std::nextafter(x, -INFINITY); }

TEST(Format, RoundToNearestEvenAtEveryBoundary) {
  for (Format format : kElementFormats) {
    const FormatInfo& f = format_info(format);
    const std::vector<double> g = grid(format);
    for (size_t i = 0; i + 1 < g.size(); ++i) {
      const float lo = static_cast<float>(g[i]), hi = static_cast<float>(g[i + 1]);
      const float mid = static_cast<float>((g[i] + g[i + 1]) / 2);  // exact in fp32
      const uint8_t lo_code = encode_rn(format, lo), hi_code = encode_rn(format, hi);
      EXPECT_EQ(encode_rn(format, next_down(mid)), lo_code) << f.name << " below tie " << mid;
      EXPECT_EQ(encode_rn(format, next_up(mid)), hi_code) << f.name << " above tie " << mid;
      // A tie goes to the even code.
      EXPECT_EQ(encode_rn(format, mid), (lo_code % 2 == 0) ? lo_code : hi_code) << f.name << " tie " << mid;
      for (float s : {1.0f, -1.0f}) {
        const uint8_t neg = static_cast<uint8_t>(1u << (f.bits - 1));
        EXPECT_EQ(encode_rn(format, s * lo), s < 0 ? (lo_code | neg) : lo_code) << f.name << " " << s * lo;
      }
    }
    const uint8_t sign = static_cast<uint8_t>(1u << (f.bits - 1));
    // Saturation of finite overflow, both signs, up to the largest float.
    for (float big : {next_up(f.max_normal), f.max_normal * 1.5f, 1e30f, FLT_MAX}) {
      EXPECT_EQ(encode_rn(format, big), f.max_code) << f.name << " " << big;
      EXPECT_EQ(encode_rn(format, -big), f.max_code | sign) << f.name << " " << -big;
    }
    // Zeros keep their sign; values below half the smallest subnormal round to zero; the half is a tie to 0.
    EXPECT_EQ(encode_rn(format, 0.0f), 0);
    EXPECT_EQ(encode_rn(format, -0.0f), sign);
    EXPECT_EQ(encode_rn(format, f.min_subnormal / 2), 0);
    EXPECT_EQ(encode_rn(format, next_up(f.min_subnormal / 2)), 1);
    EXPECT_EQ(encode_rn(format, -std::numeric_limits<float>::denorm_min()), sign);
    // Inf and NaN (see format.hpp).
    const uint8_t inf_code = encode_rn(format, INFINITY), nan_code = encode_rn(format, NAN);
    if (f.specials == Specials::None) {
      EXPECT_EQ(inf_code, f.max_code);
      EXPECT_EQ(encode_rn(format, -INFINITY), f.max_code | sign);
      EXPECT_EQ(nan_code, f.max_code);
    } else {
      EXPECT_TRUE(std::isnan(decode(format, nan_code))) << f.name;
      EXPECT_EQ(std::isinf(decode(format, inf_code)), f.specials == Specials::Ieee) << f.name;
      EXPECT_EQ(std::isnan(decode(format, inf_code)), f.specials == Specials::NanOnlyOnes) << f.name;
    }
  }
  // E8M0 rounds the exponent, ties (1.5 * 2^k) up; saturates; NaN -> 0xFF.
  EXPECT_EQ(encode_rn(Format::E8M0, 1.0f), 127);
  EXPECT_EQ(encode_rn(Format::E8M0, 1.49f), 127);
  EXPECT_EQ(encode_rn(Format::E8M0, 1.5f), 128);
  EXPECT_EQ(encode_rn(Format::E8M0, 0.0f), 0);
  EXPECT_EQ(encode_rn(Format::E8M0, INFINITY), 0xFE);
  EXPECT_EQ(encode_rn(Format::E8M0, NAN), 0xFF);
}

TEST(Format, TieTablesFromTheSpecs) {
  // E2M1 (numerics-te.md §0, torchao test_kernels): 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  const std::pair<float, float> e2m1[] = {{0.25f, 0.f}, {0.75f, 1.f}, {1.25f, 1.f}, {1.75f, 2.f},
                                          {2.5f, 2.f},  {3.5f, 4.f},  {5.f, 4.f},   {6.1f, 6.f}};
  for (auto [x, want] : e2m1) {
    EXPECT_EQ(decode(Format::E2M1, encode_rn(Format::E2M1, x)), want) << x;
    EXPECT_EQ(decode(Format::E2M1, encode_rn(Format::E2M1, -x)), -want) << x;
  }
  // E3M2 (torchao): 29->0x1F, 26->0x1E, 0.1251->0x02, 0.0314->0x01, 0.03->0x00.
  EXPECT_EQ(encode_rn(Format::E3M2, 29.f), 0x1F);
  EXPECT_EQ(encode_rn(Format::E3M2, 26.f), 0x1E);
  EXPECT_EQ(encode_rn(Format::E3M2, 0.1251f), 0x02);
  EXPECT_EQ(encode_rn(Format::E3M2, 0.0314f), 0x01);
  EXPECT_EQ(encode_rn(Format::E3M2, 0.03f), 0x00);
  EXPECT_EQ(encode_rn(Format::E3M2, -26.f), 0x3E);
  // E4M3: 464 is the tie between 448 and 480 (the NaN pattern): saturates to 448.
  EXPECT_EQ(encode_rn(Format::E4M3, 464.f), 0x7E);
  EXPECT_EQ(encode_rn(Format::E4M3, 470.f), 0x7E);
}

TEST(Format, StochasticRounding) {
  for (Format format : kElementFormats) {
    const FormatInfo& f = format_info(format);
    const std::vector<double> g = grid(format);
    for (size_t i = 0; i + 1 < g.size(); ++i) {
      // x = lo + (k/256) step: rounds up exactly when random_bits >= 256 - k.
      const double step = g[i + 1] - g[i];
      for (int k : {0, 1, 64, 128, 255}) {
        const float x = static_cast<float>(g[i] + step * k / 256.0);
        if (static_cast<double>(x) != g[i] + step * k / 256.0) continue;
        for (int r : {0, 1, 127, 128, 255}) {
          const uint8_t code = encode_sr(format, x, static_cast<uint8_t>(r));
          const double want = (k + r >= 256) ? g[i + 1] : g[i];
          EXPECT_EQ(decode(format, code), want) << f.name << " x=" << x << " r=" << r;
        }
      }
    }
    EXPECT_EQ(encode_sr(format, f.max_normal, 255), f.max_code);
    EXPECT_EQ(encode_sr(format, 1e30f, 0), f.max_code);
  }
  EXPECT_EQ(encode_sr(Format::E2M1, NAN, 3), 0x7);  // NaN -> +6, as TE's emulation
  EXPECT_THROW(encode_sr(Format::E8M0, 1.0f, 0), Error);
}

// The branch-free codecs of the fast path against the reference codecs.
template <typename Codec>
void check_codec(Format format) {
  const FormatInfo& f = format_info(format);
  std::vector<float> inputs;
  for (uint32_t b = 0; b < 65536; ++b) inputs.push_back(bf16_to_float(static_cast<uint16_t>(b)));
  for (double v : grid(format)) {
    for (double w : {v, -v}) {
      float x = static_cast<float>(w);
      for (int d = 0; d < 4; ++d) {
        inputs.push_back(x);
        x = next_up(x);
      }
      x = static_cast<float>(w);
      for (int d = 0; d < 4; ++d) inputs.push_back(x = next_down(x));
    }
  }
  const std::vector<double> g = grid(format);
  for (size_t i = 0; i + 1 < g.size(); ++i) {
    const float mid = static_cast<float>((g[i] + g[i + 1]) / 2);
    for (float x : {mid, next_up(mid), next_down(mid), -mid}) inputs.push_back(x);
  }
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) inputs.push_back(bits_to_float(rng()));
  int64_t mismatches = 0;
  for (float x : inputs) {
    if (Codec::encode_rn(x) != encode_rn(format, x) && ++mismatches < 5) {
      ADD_FAILURE() << f.name << " rn x=" << x << " (0x" << std::hex << float_bits(x) << ")";
    }
    for (uint32_t r : {0u, 1u, 77u, 128u, 255u}) {
      if (Codec::encode_sr(x, r) != encode_sr(format, x, static_cast<uint8_t>(r)) && ++mismatches < 5) {
        ADD_FAILURE() << f.name << " sr x=" << x << " r=" << r << " (0x" << std::hex << float_bits(x) << ")";
      }
    }
  }
  for (uint32_t code = 0; code < (1u << f.bits); ++code) {
    const float want = decode(format, static_cast<uint8_t>(code)), got = Codec::decode(code);
    const bool same = std::isnan(want) ? std::isnan(got) : float_bits(got) == float_bits(want);
    if (!same && ++mismatches < 5) ADD_FAILURE() << f.name << " decode code=" << code << ": " << got;
  }
  EXPECT_EQ(mismatches, 0) << f.name;
}

TEST(FastCodec, EqualsReference) {
  check_codec<cpu::E2M1Codec>(Format::E2M1);
  check_codec<cpu::E2M3Codec>(Format::E2M3);
  check_codec<cpu::E3M2Codec>(Format::E3M2);
  check_codec<cpu::E4M3Codec>(Format::E4M3);
  check_codec<cpu::E5M2Codec>(Format::E5M2);
}

}  // namespace
}  // namespace microscale
