// build_e2m1_thresholds (e2m1_thresholds.hpp): a bisection per block scale code and step on the
// reference encoder's codes, vectorised across the 128 codes.
#include "cpu/e2m1_thresholds.hpp"

#include "core/scale_math.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/input16.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {
namespace {

constexpr int kScaleCodes = 128;
// The bisection interval starts at [0, Inf pattern], under 2^15 wide: 15 halvings (of the larger
// half) leave it one wide; one more is a no-op kept for margin.
constexpr int kBisectionSteps = 16;

template <DType kIn>
MICROSCALE_CPU_DISPATCH void build(float s_dec, E2m1Thresholds& out) {
  float encode_scale[kScaleCodes];
  for (int c = 0; c < kScaleCodes; ++c)
    encode_scale[c] = nvfp4_block_encode_scale(e4m3_code_value(static_cast<uint32_t>(c)), s_dec);
  for (int k = 0; k < 8; ++k) {
    // Invariant: the step is not reached at lo (|x| = 0 gives code 0 and a zero product) and is at
    // hi (Inf gives an Inf product, code 7).
    uint32_t lo[kScaleCodes], hi[kScaleCodes];
    for (int c = 0; c < kScaleCodes; ++c) {
      lo[c] = 0;
      hi[c] = kInf16Bits<kIn>;
    }
    for (int step = 0; step < kBisectionSteps; ++step) {
      for (int c = 0; c < kScaleCodes; ++c) {
        const uint32_t mid = (lo[c] + hi[c]) / 2;
        const float scaled = widen16<kIn>(static_cast<uint16_t>(mid)) * encode_scale[c];
        const uint32_t magnitude = E2M1Codec::encode_rn(scaled) & 7u;
        const bool reached = k == 0 ? scaled != 0.0f : magnitude >= static_cast<uint32_t>(k);
        hi[c] = select(reached, mid, hi[c]);
        lo[c] = select(reached, lo[c], mid);
      }
    }
    for (int c = 0; c < kScaleCodes; ++c) out.below[c][k] = static_cast<int16_t>(hi[c] - 1);
  }
}

}  // namespace

void build_e2m1_thresholds(DType input, float s_dec, E2m1Thresholds& out) {
  if (input == DType::BF16) {
    build<DType::BF16>(s_dec, out);
  } else {
    build<DType::F16>(s_dec, out);
  }
}

}  // namespace microscale::cpu
