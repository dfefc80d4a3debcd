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

// Largest |v| of a block, or NaN when any element is NaN (torch.amax propagates NaN).
float block_amax(const float* v, int64_t stride) {
  float m = 0.0f;
  bool any_nan = false;
  for (int i = 0; i < kBlock; ++i) {
    const float a = std::fabs(v[i * stride]);
    any_nan |= a != a;
    m = a > m ? a : m;
  }
  return any_nan ? NAN : m;
}

// Writes n codes of one row: one per byte, or two per byte (even element low) when packed.
template <typename Codec, bool kPacked>
void encode_row(const float* v, const float* inverse, int64_t inverse_stride, int64_t n, uint8_t* out) {
  if constexpr (kPacked) {
    for (int64_t c = 0; c < n; c += 2) {
      const uint8_t lo = Codec::encode_rn(v[c] * inverse[(c)*inverse_stride]);
      const uint8_t hi = Codec::encode_rn(v[c + 1] * inverse[(c + 1) * inverse_stride]);
      out[c / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  } else {
    for (int64_t c = 0; c < n; ++c) out[c] = Codec::encode_rn(v[c] * inverse[c * inverse_stride]);
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
      std::vector<float> inverse(static_cast<size_t>(k / kBlock));
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
            const float inv = mx_inverse_scale(s);
            float inv_block[kBlock];
            std::fill_n(inv_block, kBlock, inv);
            encode_row<Codec, kPacked>(v + blk * kBlock, inv_block, 1, kBlock,
                                       data + row * data_cols + (kPacked ? blk * kBlock / 2 : blk * kBlock));
          }
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
#pragma omp for schedule(static)
      for (int64_t b = 0; b < bands; ++b) {
        load_rows(x, b * kBlock, kBlock, band.data());
        for (int64_t c = 0; c < k; ++c) {
          const uint8_t s = mx_scale_byte(block_amax(band.data() + c, k), p.rule, p.emax, p.mantissa_bits, p.max_normal);
          scale[b * k + c] = s;
          inverse[c] = mx_inverse_scale(s);
        }
        for (int i = 0; i < kBlock; ++i) {
          encode_row<Codec, kPacked>(band.data() + i * k, inverse.data(), 1, k, data + (b * kBlock + i) * data_cols);
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
