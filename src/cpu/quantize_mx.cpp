// MX fast path: threads over row bands, vectorisable inner loops, branch-free encoders.
// Equal bit for bit to quantize_mx_ref.cpp (tests/cpp/quantize_test.cpp, golden_test.cpp).
//
// Rowwise: each row's 32-element blocks. Columnwise: bands of 32 rows; per column, the block amax
// over the band, then every row of the band encoded with its column's scale (still row-major, so
// the stores stay contiguous).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/encode_fast.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/row_loader.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 32;

struct MxParams {
  MxScaleRule rule;
  int emax;
  int mantissa_bits;
  float max_normal;
};

// Largest |v| of the 32 elements v[0], v[stride], ..., or NaN when any is NaN (torch.amax
// propagates NaN). NOTE: computed on the bits: for |v| the integer order of the patterns is the
// float order, and any NaN pattern is above +Inf's, so one vectorisable integer max does both.
float block_amax(const float* v, int64_t stride) {
  uint32_t m = 0;
  for (int i = 0; i < kBlock; ++i) {
    const uint32_t a = to_bits(v[i * stride]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m > 0x7F800000u ? NAN : from_bits(m);
}

// codes[c] of n elements v[c] * inverse[c] (per-element scale) ...
template <typename Codec>
void encode_scaled(const float* v, const float* inverse, int64_t n, uint8_t* codes) {
  for (int64_t c = 0; c < n; ++c) codes[c] = Codec::encode_rn(v[c] * inverse[c]);
}
// ... or v[c] * inverse (one scale for the run).
template <typename Codec>
void encode_scaled(const float* v, float inverse, int64_t n, uint8_t* codes) {
  for (int64_t c = 0; c < n; ++c) codes[c] = Codec::encode_rn(v[c] * inverse);
}

// Stores n codes: one per byte, or two per byte (even element in the low nibble) when packed.
template <bool kPacked>
void store_codes(const uint8_t* codes, int64_t n, uint8_t* out) {
  if constexpr (kPacked) {
    for (int64_t j = 0; j < n / 2; ++j) out[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
  } else {
    std::copy_n(codes, n, out);
  }
}

template <typename Codec, bool kPacked>
void quantize_mx_with(const InputMatrix& x, const QuantizeOptions& o, const MxParams& p, QuantizedTensor& out) {
  const int64_t m = x.rows, k = x.cols;
  const int64_t data_cols = kPacked ? k / 2 : k;
  const int threads = thread_count(o.num_threads);

  if (o.rowwise) {
    constexpr int64_t kRowsPerBand = 16;
    const int64_t bands = (m + kRowsPerBand - 1) / kRowsPerBand;
    auto* data = out.rowwise_data.data_as<uint8_t>();    // (M, data_cols)
    auto* scale = out.rowwise_scale.data_as<uint8_t>();  // (M, K/32)
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> band(static_cast<size_t>(kRowsPerBand * k));
      std::vector<uint8_t> codes(static_cast<size_t>(k));
#pragma omp for schedule(static)
      for (int64_t b = 0; b < bands; ++b) {
        const int64_t rows = std::min(kRowsPerBand, m - b * kRowsPerBand);
        load_rows(x, b * kRowsPerBand, rows, band.data());
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = b * kRowsPerBand + r;
          const float* v = band.data() + r * k;
          for (int64_t blk = 0; blk < k / kBlock; ++blk) {
            const uint8_t s = mx_scale_byte(block_amax(v + blk * kBlock, 1), p.rule, p.emax, p.mantissa_bits, p.max_normal);
            scale[row * (k / kBlock) + blk] = s;
            encode_scaled<Codec>(v + blk * kBlock, mx_inverse_scale(s), kBlock, codes.data() + blk * kBlock);
          }
          store_codes<kPacked>(codes.data(), k, data + row * data_cols);
        }
      }
    }
  }
  if (o.columnwise) {
    const int64_t bands = m / kBlock;
    auto* data = out.columnwise_data.data_as<uint8_t>();    // (M, data_cols)
    auto* scale = out.columnwise_scale.data_as<uint8_t>();  // (M/32, K)
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> band(static_cast<size_t>(kBlock * k));
      std::vector<float> inverse(static_cast<size_t>(k));
      std::vector<uint8_t> codes(static_cast<size_t>(k));
#pragma omp for schedule(static)
      for (int64_t b = 0; b < bands; ++b) {
        load_rows(x, b * kBlock, kBlock, band.data());
        for (int64_t c = 0; c < k; ++c) {
          const uint8_t s = mx_scale_byte(block_amax(band.data() + c, k), p.rule, p.emax, p.mantissa_bits, p.max_normal);
          scale[b * k + c] = s;
          inverse[c] = mx_inverse_scale(s);
        }
        for (int i = 0; i < kBlock; ++i) {
          encode_scaled<Codec>(band.data() + i * k, inverse.data(), k, codes.data());
          store_codes<kPacked>(codes.data(), k, data + (b * kBlock + i) * data_cols);
        }
      }
    }
  }
}

}  // namespace

void quantize_mx(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const FormatInfo& f = format_info(element_format(o.scheme));
  const MxParams p{mx_scale_rule(o.scale_mode), f.emax, f.mantissa_bits, f.max_normal};
  switch (o.scheme) {
    case Scheme::MXFP8_E4M3: return quantize_mx_with<E4M3Codec, false>(x, o, p, out);
    case Scheme::MXFP8_E5M2: return quantize_mx_with<E5M2Codec, false>(x, o, p, out);
    case Scheme::MXFP6_E2M3: return quantize_mx_with<E2M3Codec, false>(x, o, p, out);
    case Scheme::MXFP6_E3M2: return quantize_mx_with<E3M2Codec, false>(x, o, p, out);
    case Scheme::MXFP4: return quantize_mx_with<E2M1Codec, true>(x, o, p, out);
    case Scheme::NVFP4: break;
  }
}

}  // namespace microscale::cpu
