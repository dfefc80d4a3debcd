// build_e2m1_thresholds and mx_e2m1_thresholds (e2m1_thresholds.hpp): a bisection per block
// scale and step on the reference encoder's codes, in a window around a guess where it can, and
// vectorised across the block scales.
#include "cpu/e2m1_thresholds.hpp"

#include <algorithm>

#include "core/fp_environment.hpp"
#include "core/scale_math.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/input16.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {
namespace {

// Step k is reached by a product above (at, for some ties) kStepProduct[k]: E2M1's midpoints, and
// for step 0 half the smallest fp32 subnormal, above which a product rounds to nonzero.
constexpr double kStepProduct[8] = {0x1p-150, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};

// The search window around a guessed threshold, in patterns either side. The guess is the pattern
// nearest kStepProduct[k] / multiplier. The threshold is the first pattern whose product rounds
// past kStepProduct[k], and a product's rounding error is far below a pattern's step, so it is
// the guess or a neighbour. Where it is not, the window check catches it and the full bisection
// runs (the tests compare it with ThresholdSearch::Full, which always takes the full bisection).
constexpr uint32_t kWindow = 1;
constexpr int kWindowSteps = 1;  // halvings that take a window of 2 x kWindow to one pattern
static_assert((1u << kWindowSteps) >= 2 * kWindow);  // each halving keeps the larger half

// The bisection over [0, Inf pattern], under 2^15 wide: 15 halvings (of the larger half) leave it
// one wide; one more is a no-op kept for margin.
constexpr int kBisectionSteps = 16;

// A guess of the pattern of kIn nearest to v (0 for NaN or v <= 0, the Inf pattern for v at or
// above it): nearest but for ties and f16's subnormal range (a guess needs to be within the search
// window, not exact). Branch-free, so the loop over block scales vectorises.
// NOTE: with float_to_bf16 and float_to_half (their branches) the loop stayed scalar, and the
// guesses were the largest part of a small call's tables (docs/perf.md, twenty-ninth session).
template <DType kIn>
MICROSCALE_CPU_INLINE uint32_t guess_pattern(double v) {
  const float f = static_cast<float>(v);  // may round to Inf or 0
  const uint32_t u = float_bits(f);
  uint32_t pattern;
  if constexpr (kIn == DType::BF16) {
    pattern = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // Inf stays Inf (0x7F800000 + 0x7FFF: 0x7F80)
  } else {
    // Normal f16: the fp32 pattern rebased by 112 binades, rounded at 13 bits; below 2^-14
    // (f16 subnormals, where that rebasing wraps) the value in steps of 2^-24.
    const uint32_t normal = (u - (112u << 23) + 0xFFFu + ((u >> 13) & 1u)) >> 13;
    const bool below_normal = (f > 0.0f) & (f < 0x1p-14f);
    // In [0, 2^-14), so its conversion cannot overflow; chosen on the bits (a float `?:` stayed a
    // branch in GCC 12), and converted through int32 (AVX2 converts floats to signed integers only).
    const float small = bits_to_float(select(below_normal, u, 0u));
    const auto subnormal = static_cast<uint32_t>(static_cast<int32_t>(small * 0x1p24f + 0.5f));
    pattern = select(below_normal, subnormal, normal);
  }
  pattern = std::min(pattern, uint32_t{kInf16Bits<kIn>});
  return select(f > 0.0f, pattern, 0u);  // NaN: 0
}

// below[s][k] for steps k = first_step..7 of the kScales block scales whose element is
// x * multiplier[s], with the codes of `Scaled`: scaled(x, multiplier) -> the product the
// reference encodes. Step 0 is the first nonzero product.
// Each threshold is the smallest pattern at which the step is reached: a bisection on the
// reference encoder's codes, which are monotone in |x|. It starts in a window of 2 x kWindow
// patterns around a guess, once both ends are checked (not reached at the low end, reached at the
// high one); where either check fails, over all patterns. So the guess changes the cost, never
// the result.
// NOTE: over all patterns every threshold took 16 encodes, and an NVFP4 call builds two tables of
// 1024 (~1.1 M instructions: ~0.12 ms on Zen 3, 88 % of a 128 x 128 call); now 3 encodes and a
// guess, ~0.07 M instructions per call (docs/perf.md, twenty-eighth session).
template <DType kIn, int kScales, typename Scaled>
MICROSCALE_CPU_INLINE void bisect(const float* multiplier, int first_step, Scaled scaled,
                                  ThresholdSearch search, E2m1ThresholdTable<kScales>& out) {
  for (int k = first_step; k < 8; ++k) {
    // Whether pattern p reaches step k in block scale s. Invariant: the step is not reached at 0
    // (|x| = 0 gives code 0 and a zero product) and is at the Inf pattern (an Inf product, code 7).
    const auto reached = [ k, multiplier, scaled ](uint32_t p, int s) __attribute__((always_inline)) {
      const float product = scaled(widen16<kIn>(static_cast<uint16_t>(p)), multiplier[s]);
      const uint32_t magnitude = E2M1Codec::encode_rn(product) & 7u;
      // A magnitude code >= 1 implies a nonzero product: one expression, no branch, for every k.
      return (product != 0.0f) & (magnitude >= static_cast<uint32_t>(k));
    };
    uint32_t lo[kScales], hi[kScales];
    for (int s = 0; s < kScales; ++s) {
      const uint32_t guess = guess_pattern<kIn>(kStepProduct[k] / static_cast<double>(multiplier[s]));
      lo[s] = guess > kWindow ? guess - kWindow : 0;
      hi[s] = guess + kWindow < kInf16Bits<kIn> ? guess + kWindow : kInf16Bits<kIn>;
    }
    // NOTE: & and |, not && and ||: without branches the loop vectorises.
    const bool windowed = search == ThresholdSearch::Windowed;
    bool in_window[kScales];
    uint32_t any_outside = 0;  // the fallback is rare (no tested table takes it): tested once
    for (int s = 0; s < kScales; ++s) {
      in_window[s] =
          windowed & ((lo[s] == 0) | !reached(lo[s], s)) & ((hi[s] == kInf16Bits<kIn>) | reached(hi[s], s));
      any_outside |= static_cast<uint32_t>(!in_window[s]);
    }
    for (int step = 0; step < kWindowSteps; ++step) {
      for (int s = 0; s < kScales; ++s) {
        const uint32_t mid = (lo[s] + hi[s]) / 2;
        const bool r = reached(mid, s);
        hi[s] = select(r, mid, hi[s]);
        lo[s] = select(r, lo[s], mid);
      }
    }
    for (int s = 0; any_outside != 0 && s < kScales; ++s) {
      if (in_window[s]) continue;
      lo[s] = 0;
      hi[s] = kInf16Bits<kIn>;
      for (int step = 0; step < kBisectionSteps; ++step) {
        const uint32_t mid = (lo[s] + hi[s]) / 2;
        if (reached(mid, s)) {
          hi[s] = mid;
        } else {
          lo[s] = mid;
        }
      }
    }
    for (int s = 0; s < kScales; ++s) out.below[s][k] = static_cast<int16_t>(hi[s] - 1);
  }
}

template <DType kIn>
MICROSCALE_CPU_DISPATCH void build_nvfp4(float s_dec, ThresholdSearch search, E2m1Thresholds& out) {
  constexpr int kScaleCodes = 128;
  float encode_scale[kScaleCodes];
  for (int c = 0; c < kScaleCodes; ++c)
    encode_scale[c] = nvfp4_block_encode_scale(e4m3_code_value(static_cast<uint32_t>(c)), s_dec);
  bisect<kIn>(
      encode_scale, 0, [](float x, float e) { return x * e; }, search, out);
}

template <DType kIn>
MxE2m1Thresholds build_mx() {
  const IeeeSubnormals ieee;  // products by 2^-127 (byte 0xFE) are fp32 subnormals
  MxE2m1Thresholds out;
  float inverse[256];
  for (int s = 0; s < 256; ++s) inverse[s] = mx_inverse_scale(static_cast<uint8_t>(s));
  // Finite blocks (byte < 0xFF): each element x * 2^(127 - S), exactly as mx_scaled_element.
  bisect<kIn>(
      inverse, 1, [](float x, float inv) { return mx_scaled_element(x, inv); }, ThresholdSearch::Windowed,
      out);
  for (int s = 0; s < 0xFF; ++s) out.below[s][0] = -1;  // -0 included: encode_rn keeps the sign
  // A NaN scale makes every product NaN, whose code is +6 (no sign): every magnitude step, no sign.
  for (int k = 1; k < 8; ++k) out.below[0xFF][k] = -1;
  out.below[0xFF][0] = 0x7FFF;
  return out;
}

}  // namespace

void build_e2m1_thresholds(DType input, float s_dec, E2m1Thresholds& out, ThresholdSearch search) {
  if (input == DType::BF16) {
    build_nvfp4<DType::BF16>(s_dec, search, out);
  } else {
    build_nvfp4<DType::F16>(s_dec, search, out);
  }
}

int build_e2m1_doubling_form(DType input, const E2m1Thresholds& thresholds, E2m1Thresholds& doubling) {
  const int period = 1 << doubling_shift(input);
  // As a compare's threshold: every value at or above 0x7FFF is never reached by a pattern.
  const auto as_compare = [](int v) { return std::min(v, 0x7FFF); };
  int first = 127;
  for (int code = 126; code >= 0; --code) {  // 127 (NaN) is never a block scale
    const int16_t* t = thresholds.below[code];
    bool holds = t[3] >= period - 1 && t[4] >= period - 1 &&  // the subtrahends are >= 0
                 as_compare(t[3] + period) == as_compare(t[5]) &&
                 as_compare(t[3] + 2 * period) == as_compare(t[7]) &&
                 as_compare(t[4] + period) == as_compare(t[6]);
    for (int k = 1; k < 7; ++k) holds = holds && t[k] <= t[k + 1];  // the codes are monotone in |x|
    if (!holds) break;
    first = code;
    int16_t* d = doubling.below[code];
    d[0] = t[0];
    d[1] = t[1];
    d[2] = t[2];
    d[3] = static_cast<int16_t>(t[3] - (period - 1));
    d[4] = static_cast<int16_t>(t[4] - (period - 1));
    d[5] = d[6] = d[7] = 0;
  }
  return first;
}

const MxE2m1Thresholds& mx_e2m1_thresholds(DType input) {
  if (input == DType::BF16) {
    static const MxE2m1Thresholds bf16 = build_mx<DType::BF16>();  // built on the first bf16 call only
    return bf16;
  }
  static const MxE2m1Thresholds f16 = build_mx<DType::F16>();
  return f16;
}

const E2m1ThresholdPairTable<256>& mx_e2m1_threshold_pairs(DType input) {
  if (input == DType::BF16) {
    static const E2m1ThresholdPairTable<256> bf16(mx_e2m1_thresholds(DType::BF16));
    return bf16;
  }
  static const E2m1ThresholdPairTable<256> f16(mx_e2m1_thresholds(DType::F16));
  return f16;
}

}  // namespace microscale::cpu
