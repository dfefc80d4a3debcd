// rht_band (rht_band.hpp): a 4-stage butterfly vectorised across columns where its sums are
// exact, the reference's order elsewhere.
#include "cpu/rht_band.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/scale_math.hpp"  // min_nonnegative
#include "cpu/cpu_dispatch.hpp"
#include "cpu/encode_fast.hpp"  // select
#include "microscale/half.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 16;

// Column c's 16 RHT outputs (x[0], x[stride], ...) without fp32: a butterfly in double when
// `exact_in_double` (every partial sum exact in double, so equal to the reference's sum: nonzero
// inputs normal and within 40 binades for bf16 values, 25 for fp32 ones), else the reference order.
void rht_column(const float* x, int64_t stride, const RhtCoefficients& t, bool exact_in_double, float* out) {
  if (!exact_in_double) {
    for (int j = 0; j < kBlock; ++j) out[j] = rht_output_reference_order(t, x, stride, j);
    return;
  }
  double z[kBlock];
  for (int i = 0; i < kBlock; ++i) z[i] = t[i * 16] * static_cast<double>(x[i * stride]);  // exact
  fwht16(z);
  for (int j = 0; j < kBlock; ++j) out[j] = rht_output_to_bf16_value(z[j]);
}

constexpr int64_t kChunk = 64;  // columns transformed together

// out[c * 16 + j] = RHT of column c0 + c's 16 values of the band (c < w <= kChunk), rounded as
// rht16 does.
// A 4-stage butterfly in fp32 (Sylvester order: y_j = sum_i (-1)^popcount(i&j) s_i x_i / 4),
// vectorised across columns, gives the reference's bits for every column whose nonzero inputs
// are bf16 values, normal, below 2^121 and within 12 binades: each partial sum is then a multiple
// of 2^(emin - 9) below 2^(emax + 3), exact in fp32's 24 bits, and so is the double sum of the
// reference. The other columns (a few in a thousand for Gaussian data) go to rht_column_exact.
MICROSCALE_CPU_INLINE void rht_chunk(const float* band, int64_t k, int64_t c0, int64_t w,
                                     const RhtCoefficients& t, float* out) {
  float z[kBlock][kChunk];
  float sign[kBlock];  // s_i / 4, exact in fp32
  for (int i = 0; i < kBlock; ++i) sign[i] = static_cast<float>(t[i * 16]);
  // Signed inputs and the exactness tests' terms: nonzero exponents' range, subnormal/Inf/NaN
  // inputs (`special`), inputs that are not bf16 values (fp32 inputs with low bits).
  uint32_t emax[kChunk], emin[kChunk], special[kChunk], wide[kChunk];
  for (int64_t c = 0; c < w; ++c) {
    emax[c] = 0;
    emin[c] = 255;
    special[c] = 0;
    wide[c] = 0;
  }
  for (int i = 0; i < kBlock; ++i) {
    const float* x = band + i * k + c0;
    for (int64_t c = 0; c < w; ++c) {
      const uint32_t u = float_bits(x[c]);
      const uint32_t e = (u >> 23) & 0xFFu;
      const uint32_t nonzero = static_cast<uint32_t>((u & 0x7FFFFFFFu) != 0);
      special[c] |= (e == 0u || e == 255u) & nonzero;
      wide[c] |= static_cast<uint32_t>((u & 0xFFFFu) != 0);
      emax[c] = select(nonzero && e > emax[c], e, emax[c]);
      emin[c] = select(nonzero && e < emin[c], e, emin[c]);
      z[i][c] = sign[i] * x[c];  // exact wherever the fp32 result is used
    }
  }
  for (int h = 1; h < kBlock; h <<= 1) {
    for (int i = 0; i < kBlock; ++i) {
      if (i & h) continue;
      for (int64_t c = 0; c < w; ++c) {
        const float a = z[i][c], b = z[i + h][c];
        z[i][c] = a + b;
        z[i + h][c] = a - b;
      }
    }
  }
  for (int64_t c = 0; c < w; ++c) {
    float* y = out + c * kBlock;
    const bool all_zero = emax[c] < emin[c];
    const uint32_t span = all_zero ? 0 : emax[c] - emin[c];
    if (!special[c] && !wide[c] && emax[c] < 127 + 121 && span <= 12) {
      // The sum is exact in fp32, so the reference's truncation to fp32 changes nothing.
      for (int j = 0; j < kBlock; ++j) y[j] = bf16_to_float(float_to_bf16(z[j][c]));
    } else {
      rht_column_exact(band + c0 + c, k, t, y);
    }
  }
}

}  // namespace

void rht_column_exact(const float* x, int64_t stride, const RhtCoefficients& t, float* out) {
  // The terms of rht_chunk's tests for one column (see rht_column).
  uint32_t emax = 0, emin = 255;
  bool special = false, wide = false;
  for (int i = 0; i < kBlock; ++i) {
    const uint32_t u = float_bits(x[i * stride]);
    const uint32_t e = (u >> 23) & 0xFFu;
    if ((u & 0x7FFFFFFFu) == 0) continue;
    special = special || e == 0u || e == 255u;
    wide = wide || (u & 0xFFFFu) != 0;
    emax = std::max(emax, e);
    emin = std::min(emin, e);
  }
  const uint32_t span = emax < emin ? 0 : emax - emin;
  rht_column(x, stride, t, !special && span <= (wide ? 25u : 40u), out);
}

MICROSCALE_CPU_DISPATCH void rht_band(const float* band, int64_t k, const RhtCoefficients& t, float* tile) {
  for (int64_t c0 = 0; c0 < k; c0 += kChunk)
    rht_chunk(band, k, c0, std::min(kChunk, k - c0), t, tile + c0 * kBlock);
}

// NOTE: |y_j| <= sum_i |x_i| / 4 (the triangle inequality). The fp32 sum of 16 non-negative terms
// is within 15 * 2^-24 of the exact one, relatively (exact among subnormals), so times
// (1 + 2^-18) it is an upper bound unless it overflows, and a chunk whose columns' bounds are all
// <= 4 * at_least (FLT_MAX when that overflows: a finite bound / 4 is then below at_least) cannot
// raise the max: every output, rounded monotonically, stays <= at_least, a bf16 value. A NaN or
// Inf input makes the bound NaN or Inf, and its chunk is transformed.
MICROSCALE_CPU_DISPATCH float rht_band_max_abs(const float* band, int64_t k, const RhtCoefficients& t,
                                               float at_least) {
  uint32_t max_bits = float_bits(at_least);
  const float limit = min_nonnegative(4.0f * at_least, FLT_MAX);
  float y[kChunk * kBlock];
  for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
    const int64_t w = std::min(kChunk, k - c0);
    float sum[kChunk] = {};
    for (int i = 0; i < kBlock; ++i) {
      for (int64_t c = 0; c < w; ++c) sum[c] += std::fabs(band[i * k + c0 + c]);
    }
    uint32_t raise = 0;  // a column's bound is above the limit (or NaN)
    for (int64_t c = 0; c < w; ++c) raise |= static_cast<uint32_t>(!(sum[c] * (1.0f + 0x1p-18f) <= limit));
    if (raise == 0) continue;
    rht_chunk(band, k, c0, w, t, y);
    for (int64_t n = 0; n < w * kBlock; ++n) {  // NaN outputs dropped, as amaxes drop NaN
      const uint32_t a = float_bits(y[n]) & 0x7FFFFFFFu;
      max_bits = std::max(max_bits, a & (0u - static_cast<uint32_t>(a <= 0x7F800000u)));
    }
  }
  return bits_to_float(max_bits);
}

}  // namespace microscale::cpu
