// Random inputs for the quantizer tests: normal, heavy-tailed and with special values.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "microscale/half.hpp"
#include "microscale/tensor.hpp"

namespace microscale::testing_data {

// Specials: 1 in 64 elements NaN, Inf, -0, a subnormal, 0 or 60000 (most blocks hold a NaN);
// SpecialsNoNan: the same without NaN; Extreme: magnitudes 2^-130..2^120 (products that underflow);
// Sparse: half the elements +0 or -0, 1 in 16 of the others scaled by 2^-20 (finite, and zeros and
// small values beside large ones in most blocks); Tiny: magnitudes 2^-136..2^-110 (blocks of
// bf16 and fp16 subnormals, the smallest block scales); LowNormal: magnitudes in [2^-126, 2^-118),
// normal in fp32 and bf16, random signs (sums of a few cancel to subnormals: RHT outputs).
enum class Fill { Normal, Heavy, Specials, SpecialsNoNan, Extreme, Sparse, Tiny, LowNormal };

/// A tensor of `dtype` and `shape` filled from `fill` with a fixed seed.
inline Tensor random_tensor(DType dtype, std::vector<int64_t> shape, Fill fill, uint32_t seed) {
  Tensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-30.0f, 10.0f);
  std::uniform_real_distribution<float> extreme(-130.0f, 120.0f);
  std::uniform_real_distribution<float> tiny(-136.0f, -110.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = normal(rng);
    if (fill == Fill::Heavy) v *= std::exp2(uniform(rng));
    if (fill == Fill::Extreme) v *= std::exp2(extreme(rng));
    if (fill == Fill::Tiny) v *= std::exp2(tiny(rng));
    if (fill == Fill::LowNormal) {
      v = std::ldexp(1.0f + static_cast<float>(rng() % 128) / 128.0f, -126 + static_cast<int>(rng() % 8));
      if (rng() % 2 != 0) v = -v;
    }
    if (fill == Fill::Sparse) {
      const uint32_t pick = rng() % 32;
      if (pick < 8) v = 0.0f;
      if (pick >= 8 && pick < 16) v = -0.0f;
      if (pick == 16) v *= 0x1p-20f;
    }
    if (fill == Fill::Specials || fill == Fill::SpecialsNoNan) {
      const uint32_t pick = rng() % 64;
      if (pick == 0) v = NAN;
      if (pick == 1) v = INFINITY;
      if (pick == 2) v = -0.0f;
      if (pick == 3) v = 1e-40f;  // fp32 subnormal
      if (pick == 4) v = 0.0f;
      if (pick == 5) v = 60000.0f;
      if (pick == 6) v = -NAN;
      if (pick == 7) v = -INFINITY;
      if (fill == Fill::SpecialsNoNan && std::isnan(v)) v = -0.0f;
    }
    switch (dtype) {
      case DType::F32: t.data_as<float>()[i] = v; break;
      case DType::BF16: t.data_as<uint16_t>()[i] = float_to_bf16(v); break;
      case DType::F16: t.data_as<uint16_t>()[i] = float_to_half(v); break;
      case DType::U8: t.data_as<uint8_t>()[i] = static_cast<uint8_t>(rng()); break;
    }
  }
  return t;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace microscale::testing_data
