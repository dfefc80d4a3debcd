// build_e2m1_thresholds and mx_e2m1_thresholds (e2m1_thresholds.hpp): a bisection per block
// scale and step on the reference encoder's codes, vectorised across the block scales.
#include "cpu/e2m1_thresholds.hpp"

#include "core/fp_environment.hpp"
#include "core/scale_math.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/input16.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {
namespace {

// The bisection interval starts at [0, Inf pattern], under 2^15 wide: 15 halvings (of the larger
// half) leave it one wide; one more is a no-op kept for margin.
constexpr int kBisectionSteps = 16;

// below[s][k] for steps k = first_step..7 of the `count` block scales whose element is
// x * multiplier[s], with the codes of `Scaled`: scaled(x, multiplier) -> the product the
// reference encodes. Step 0 is the first nonzero product.
template <DType kIn, int kScales, typename Scaled>
MICROSCALE_CPU_INLINE void bisect(const float* multiplier, int first_step, Scaled scaled,
                                  E2m1ThresholdTable<kScales>& out) {
  for (int k = first_step; k < 8; ++k) {
    // Invariant: the step is not reached at lo (|x| = 0 gives code 0 and a zero product) and is at
    // hi (Inf gives an Inf product, code 7).
    uint32_t lo[kScales], hi[kScales];
    for (int s = 0; s < kScales; ++s) {
      lo[s] = 0;
      hi[s] = kInf16Bits<kIn>;
    }
    for (int step = 0; step < kBisectionSteps; ++step) {
      for (int s = 0; s < kScales; ++s) {
        const uint32_t mid = (lo[s] + hi[s]) / 2;
        const float product = scaled(widen16<kIn>(static_cast<uint16_t>(mid)), multiplier[s]);
        const uint32_t magnitude = E2M1Codec::encode_rn(product) & 7u;
        const bool reached = k == 0 ? product != 0.0f : magnitude >= static_cast<uint32_t>(k);
        hi[s] = select(reached, mid, hi[s]);
        lo[s] = select(reached, lo[s], mid);
      }
    }
    for (int s = 0; s < kScales; ++s) out.below[s][k] = static_cast<int16_t>(hi[s] - 1);
  }
}

template <DType kIn>
MICROSCALE_CPU_DISPATCH void build_nvfp4(float s_dec, E2m1Thresholds& out) {
  constexpr int kScaleCodes = 128;
  float encode_scale[kScaleCodes];
  for (int c = 0; c < kScaleCodes; ++c)
    encode_scale[c] = nvfp4_block_encode_scale(e4m3_code_value(static_cast<uint32_t>(c)), s_dec);
  bisect<kIn>(
      encode_scale, 0, [](float x, float e) { return x * e; }, out);
}

template <DType kIn>
MxE2m1Thresholds build_mx() {
  const IeeeSubnormals ieee;  // products by 2^-127 (byte 0xFE) are fp32 subnormals
  MxE2m1Thresholds out;
  float inverse[256];
  for (int s = 0; s < 256; ++s) inverse[s] = mx_inverse_scale(static_cast<uint8_t>(s));
  // Finite blocks (byte < 0xFF): each element x * 2^(127 - S), exactly as mx_scaled_element.
  bisect<kIn>(
      inverse, 1, [](float x, float inv) { return mx_scaled_element(x, inv); }, out);
  for (int s = 0; s < 0xFF; ++s) out.below[s][0] = -1;  // -0 included: encode_rn keeps the sign
  // A NaN scale makes every product NaN, whose code is +6 (no sign): every magnitude step, no sign.
  for (int k = 1; k < 8; ++k) out.below[0xFF][k] = -1;
  out.below[0xFF][0] = 0x7FFF;
  return out;
}

}  // namespace

void build_e2m1_thresholds(DType input, float s_dec, E2m1Thresholds& out) {
  if (input == DType::BF16) {
    build_nvfp4<DType::BF16>(s_dec, out);
  } else {
    build_nvfp4<DType::F16>(s_dec, out);
  }
}

const MxE2m1Thresholds& mx_e2m1_thresholds(DType input) {
  if (input == DType::BF16) {
    static const MxE2m1Thresholds bf16 = build_mx<DType::BF16>();  // built on the first bf16 call only
    return bf16;
  }
  static const MxE2m1Thresholds f16 = build_mx<DType::F16>();
  return f16;
}

}  // namespace microscale::cpu
