// Element and scale formats: the table and the generic (reference) codecs derived from it.
//
// These codecs are written for clarity, in double precision, where every step is exact: the value
// of a code, and the rounding of a double to the grid of a format. The fast CPU and CUDA paths use
// bit tricks instead and are tested against these on every code and every bf16 input.
#include "microscale/format.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "core/ascii_lowercase.hpp"
#include "microscale/error.hpp"

namespace microscale {
namespace {

constexpr float kTwoPow(int e) {
  float v = 1.0f;
  for (int i = 0; i < (e < 0 ? -e : e); ++i) v = e < 0 ? v * 0.5f : v * 2.0f;
  return v;
}

// clang-format off
constexpr std::array<FormatInfo, 7> kFormats = {{
  // name     bits sign  e  m  bias specials               max          min_normal    min_subnormal  emax max   nan
  {"e2m1",    4,  true,  2, 1, 1,   Specials::None,        6.0f,        1.0f,         0.5f,          2,   0x07, 0x07},
  {"e2m3",    6,  true,  2, 3, 1,   Specials::None,        7.5f,        1.0f,         0.125f,        2,   0x1F, 0x1F},
  {"e3m2",    6,  true,  3, 2, 3,   Specials::None,        28.0f,       0.25f,        0.0625f,       4,   0x1F, 0x1F},
  {"e4m3",    8,  true,  4, 3, 7,   Specials::NanOnlyOnes, 448.0f,      kTwoPow(-6),  kTwoPow(-9),   8,   0x7E, 0x7F},
  {"e5m2",    8,  true,  5, 2, 15,  Specials::Ieee,        57344.0f,    kTwoPow(-14), kTwoPow(-16),  15,  0x7B, 0x7F},
  {"e8m0",    8,  false, 8, 0, 127, Specials::NanCodeFF,   kTwoPow(127),kTwoPow(-127),kTwoPow(-127), 127, 0xFE, 0xFF},
  {"ue4m3",   7,  false, 4, 3, 7,   Specials::NanOnlyOnes, 448.0f,      kTwoPow(-6),  kTwoPow(-9),   8,   0x7E, 0x7F},
}};
// clang-format on

uint8_t sign_bit(const FormatInfo& f, bool negative) {
  return (f.has_sign && negative) ? static_cast<uint8_t>(1u << (f.bits - 1)) : 0;
}

// Code of a magnitude that is already on the grid of the format (0 <= value <= max_normal).
uint8_t encode_on_grid(const FormatInfo& f, double value) {
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  if (value < std::ldexp(1.0, emin)) {
    // subnormal (or zero): exponent field 0, mantissa counts multiples of min_subnormal
    return static_cast<uint8_t>(value / std::ldexp(1.0, emin - f.mantissa_bits));
  }
  int e = 0;
  std::frexp(value, &e);  // value = frac * 2^e, frac in [0.5, 1)
  const int exponent = e - 1;
  const int mantissa =
      static_cast<int>(value / std::ldexp(1.0, exponent - f.mantissa_bits)) - (1 << f.mantissa_bits);
  return static_cast<uint8_t>(((exponent + f.bias) << f.mantissa_bits) | mantissa);
}

// Grid spacing (one unit in the last place) of the format at magnitude a >= 0.
double grid_step(const FormatInfo& f, double a) {
  const int emin = 1 - f.bias;
  int e = 0;
  std::frexp(a, &e);
  const int exponent = (a == 0.0) ? emin : std::max(e - 1, emin);
  return std::ldexp(1.0, exponent - f.mantissa_bits);
}

uint8_t encode_nan(const FormatInfo& f, bool negative) {
  if (f.specials == Specials::None) return f.nan_code;  // no NaN: +max, as the hardware cvt does
  return static_cast<uint8_t>(f.nan_code | sign_bit(f, negative));
}

uint8_t encode_e8m0_rn(float x) {
  if (std::isnan(x)) return 0xFF;
  if (!(x > 0.0f)) return 0x00;
  if (std::isinf(x)) return 0xFE;
  int e = 0;
  const double frac = std::frexp(static_cast<double>(x), &e);  // x = frac * 2^e
  int exponent = e - 1;
  if (frac >= 0.75) ++exponent;  // mantissa 1.5 or more rounds up (a tie goes up)
  return static_cast<uint8_t>(std::clamp(exponent + 127, 0, 254));
}

}  // namespace

const FormatInfo& format_info(Format format) {
  const auto index = static_cast<size_t>(format);
  if (index >= kFormats.size()) throw Error("unknown element format id " + std::to_string(index));
  return kFormats[index];
}

Format parse_format(std::string_view name) {
  const std::string lower = ascii_lowercase(name);
  for (size_t i = 0; i < kFormats.size(); ++i) {
    if (kFormats[i].name == lower) return static_cast<Format>(i);
  }
  throw Error("unknown element format '" + std::string(name) +
              "' (expected e2m1, e2m3, e3m2, e4m3, e5m2, e8m0 or ue4m3)");
}

float decode(Format format, uint8_t code) {
  const FormatInfo& f = format_info(format);
  if (f.bits < 8 && code >= (1u << f.bits)) {
    throw Error("code " + std::to_string(code) + " does not fit the " + std::to_string(f.bits) +
                "-bit format " + std::string(f.name));
  }
  if (f.specials == Specials::NanCodeFF) {
    return code == 0xFF ? NAN : static_cast<float>(std::ldexp(1.0, code - f.bias));
  }
  const bool negative = f.has_sign && ((code >> (f.bits - 1)) & 1u);
  const int exponent_field = (code >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  const int exponent_ones = (1 << f.exponent_bits) - 1;
  const int mantissa_ones = (1 << f.mantissa_bits) - 1;
  double magnitude = 0.0;
  if (f.specials == Specials::NanOnlyOnes && exponent_field == exponent_ones && mantissa == mantissa_ones) {
    magnitude = NAN;
  } else if (f.specials == Specials::Ieee && exponent_field == exponent_ones) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (exponent_field == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - f.bias - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(1.0 + std::ldexp(mantissa, -f.mantissa_bits), exponent_field - f.bias);
  }
  return static_cast<float>(negative ? -magnitude : magnitude);
}

uint8_t encode_rn(Format format, float x) {
  const FormatInfo& f = format_info(format);
  if (f.specials == Specials::NanCodeFF) return encode_e8m0_rn(x);
  const bool negative = std::signbit(x);
  if (std::isnan(x)) return encode_nan(f, negative);
  if (negative && !f.has_sign) return 0x00;  // unsigned formats saturate negatives to zero
  const double a = std::fabs(static_cast<double>(x));
  // Infs are not clamped (OCP MX, torch's casts, the golden element table): E5M2 keeps them,
  // E4M3 (no Inf) makes them NaN; only the formats without special values saturate them.
  if (std::isinf(a) && f.specials == Specials::Ieee)
    return static_cast<uint8_t>(0x7C | sign_bit(f, negative));
  if (std::isinf(a) && f.specials == Specials::NanOnlyOnes) return encode_nan(f, negative);
  if (a >= f.max_normal) return static_cast<uint8_t>(f.max_code | sign_bit(f, negative));
  const double step = grid_step(f, a);
  // a / step is exact (power-of-two step); nearbyint rounds half to even in the default mode.
  const double rounded = std::min(std::nearbyint(a / step) * step, static_cast<double>(f.max_normal));
  return static_cast<uint8_t>(encode_on_grid(f, rounded) | sign_bit(f, negative));
}

uint8_t encode_sr(Format format, float x, uint8_t random_bits) {
  const FormatInfo& f = format_info(format);
  if (f.specials == Specials::NanCodeFF || !f.has_sign) {
    throw Error("stochastic rounding is defined for element formats only, not " + std::string(f.name));
  }
  const bool negative = std::signbit(x);
  if (std::isnan(x)) return encode_nan(f, negative);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= f.max_normal) return static_cast<uint8_t>(f.max_code | sign_bit(f, negative));
  // Add the random bits just below the last place, then truncate (all exact in double).
  const double t = a + (random_bits / 256.0) * grid_step(f, a);
  const double step_t = grid_step(f, t);
  const double truncated = std::min(std::floor(t / step_t) * step_t, static_cast<double>(f.max_normal));
  return static_cast<uint8_t>(encode_on_grid(f, truncated) | sign_bit(f, negative));
}

}  // namespace microscale
