// MX fast path: threads over row bands, vectorisable inner loops, branch-free encoders.
// Equal bit for bit to quantize_mx_ref.cpp (tests/cpp/quantize_test.cpp, golden_test.cpp).
//
// One pass over the input in bands of rows. Rowwise: each row's 32-element blocks. Columnwise
// (bands of 32 rows): per column, the block amax over the band, then every row of the band encoded
// with its column's scale (still row-major, so the stores stay contiguous). MXFP8 and MXFP4 of
// bf16 and f16 inputs with contiguous rows take quantize_mx16.cpp instead (16-bit lanes, no
// widening), and so does MXFP6 where the CPU has AVX2 (see mx16_applies). 32x32 scale tiles take
// quantize_mx16.cpp's chunks where it applies, else tiles_band below.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp_environment.hpp"
#include "cpu/cpu_dispatch.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/quantize_mx16.hpp"
#include "cpu/row_loader.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 32;

// The amax whose |x| bit pattern is `max_bits`, or NaN for a NaN pattern. NOTE: amaxes are
// computed on the bits: for |v| the integer order of the patterns is the float order, and any NaN
// pattern is above +Inf's, so one vectorisable integer max does both (torch.amax propagates NaN).
float amax_from_bits(uint32_t max_bits) { return max_bits > 0x7F800000u ? NAN : bits_to_float(max_bits); }

// Largest |v| of the 32 elements v[0..31], or NaN when any is NaN.
float block_amax(const float* v) {
  uint32_t m = 0;
  for (int i = 0; i < kBlock; ++i) m = std::max(m, float_bits(v[i]) & 0x7FFFFFFFu);  // std::max vectorises
  return amax_from_bits(m);
}

// codes[c] of n elements v[c] * inverse[c] (per-element scale) ...
template <typename Codec>
void encode_scaled(const float* v, const float* inverse, int64_t n, uint8_t* codes) {
  for (int64_t c = 0; c < n; ++c) codes[c] = Codec::encode_rn(mx_scaled_element(v[c], inverse[c]));
}
// ... or v[c] * inverse (one scale for the run).
template <typename Codec>
void encode_scaled(const float* v, float inverse, int64_t n, uint8_t* codes) {
  for (int64_t c = 0; c < n; ++c) codes[c] = Codec::encode_rn(mx_scaled_element(v[c], inverse));
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

// Rowwise: rows [row0, row0 + rows) of `band` ([rows, k] fp32): scales along each row.
template <typename Codec, bool kPacked>
MICROSCALE_CPU_DISPATCH void rowwise_rows(const float* band, int64_t rows, int64_t k, int64_t row0,
                                          const MxParams& p, uint8_t* codes, uint8_t* data, uint8_t* scale) {
  const int64_t data_cols = kPacked ? k / 2 : k;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = row0 + r;
    const float* v = band + r * k;
    for (int64_t blk = 0; blk < k / kBlock; ++blk) {
      const uint8_t s =
          mx_scale_byte(block_amax(v + blk * kBlock), p.rule, p.emax, p.mantissa_bits, p.max_normal);
      scale[row * (k / kBlock) + blk] = s;
      encode_scaled<Codec>(v + blk * kBlock, mx_inverse_scale(s), kBlock, codes + blk * kBlock);
    }
    store_codes<kPacked>(codes, k, data + row * data_cols);
  }
}

// max_bits[c]: the largest |x| bit pattern of column c over the band's rows ([rows, k] fp32), on
// the bits as block_amax. Every column at once, row after row: contiguous loads that vectorise
// across columns, where one column at a time reads 32 lines k floats apart (measured: 80 % of
// columnwise_band's time at K = 4096).
MICROSCALE_CPU_DISPATCH void column_max_bits(const float* band, int64_t rows, int64_t k,
                                             uint32_t* __restrict max_bits) {
  std::fill_n(max_bits, k, 0u);
  for (int64_t i = 0; i < rows; ++i) {
    const float* __restrict row = band + i * k;
    for (int64_t c = 0; c < k; ++c) max_bits[c] = std::max(max_bits[c], float_bits(row[c]) & 0x7FFFFFFFu);
  }
}

// Columnwise: the 32 rows of band `b` ([32, k] fp32) form one block per column. `amax` is
// scratch ([k]).
template <typename Codec, bool kPacked>
MICROSCALE_CPU_DISPATCH void columnwise_band(const float* band, int64_t k, int64_t b, const MxParams& p,
                                             uint32_t* amax, float* inverse, uint8_t* codes, uint8_t* data,
                                             uint8_t* scale) {
  const int64_t data_cols = kPacked ? k / 2 : k;
  const uint32_t* max_bits = amax;
  column_max_bits(band, kBlock, k, amax);
  for (int64_t c = 0; c < k; ++c) {
    const uint8_t s =
        mx_scale_byte(amax_from_bits(max_bits[c]), p.rule, p.emax, p.mantissa_bits, p.max_normal);
    scale[b * k + c] = s;
    inverse[c] = mx_inverse_scale(s);
  }
  for (int i = 0; i < kBlock; ++i) {
    encode_scaled<Codec>(band + i * k, inverse, k, codes);
    store_codes<kPacked>(codes, k, data + (b * kBlock + i) * data_cols);
  }
}

// 32x32 tiles: band `b` ([rows, k] fp32, rows <= 32, the last band of a rowwise-only call may be
// short) is one row of tiles. Each column's max |x| bits down the band (as columnwise_band), then
// each tile's max over its 32 columns (fewer at a ragged right edge, columnwise only), its scale;
// every element is encoded once, with its tile's scale, and the codes go to each direction asked
// for (the same bytes: data [M, K] in both layouts). `amax` is scratch ([k]).
template <typename Codec, bool kPacked>
MICROSCALE_CPU_DISPATCH void tiles_band(const float* band, int64_t rows, int64_t k, int64_t b,
                                        const QuantizeOptions& o, const MxParams& p, uint32_t* amax,
                                        float* inverse, uint8_t* codes, QuantizedTensor& out) {
  const int64_t data_cols = kPacked ? k / 2 : k;
  const uint32_t* max_bits = amax;
  column_max_bits(band, rows, k, amax);
  for (int64_t c0 = 0; c0 < k; c0 += kBlock) {
    const int64_t c1 = std::min(c0 + kBlock, k);
    const uint32_t tile_bits = *std::max_element(max_bits + c0, max_bits + c1);
    const uint8_t s = mx_scale_byte(amax_from_bits(tile_bits), p.rule, p.emax, p.mantissa_bits, p.max_normal);
    std::fill(inverse + c0, inverse + c1, mx_inverse_scale(s));
    if (o.rowwise) {
      uint8_t* scale = out.rowwise_scale.data_as<uint8_t>();  // [M, K/32]
      for (int64_t i = 0; i < rows; ++i) scale[(b * kBlock + i) * (k / kBlock) + c0 / kBlock] = s;
    }
    if (o.columnwise)
      std::fill(out.columnwise_scale.data_as<uint8_t>() + b * k + c0,
                out.columnwise_scale.data_as<uint8_t>() + b * k + c1, s);  // [M/32, K]
  }
  for (int64_t i = 0; i < rows; ++i) {
    encode_scaled<Codec>(band + i * k, inverse, k, codes);
    const int64_t at = (b * kBlock + i) * data_cols;
    if (o.rowwise) store_codes<kPacked>(codes, k, out.rowwise_data.data_as<uint8_t>() + at);
    if (o.columnwise) store_codes<kPacked>(codes, k, out.columnwise_data.data_as<uint8_t>() + at);
  }
}

// One pass over the input: each band of rows is loaded once and feeds both directions.
template <typename Codec, bool kPacked>
void quantize_mx_with(const InputMatrix& x, const QuantizeOptions& o, const MxParams& p,
                      QuantizedTensor& out) {
  const int64_t m = x.rows, k = x.cols;
  // Columnwise blocks and tiles need bands of 32 rows (M % 32 == 0 is checked for columnwise
  // output); rowwise blocks alone take 16.
  const bool tiles = o.tile == Tile::k32x32;
  const int64_t band_rows = o.columnwise || tiles ? kBlock : 16;
  const int64_t bands = (m + band_rows - 1) / band_rows;
#pragma omp parallel num_threads(thread_count(o.num_threads))
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
    std::vector<float> band(static_cast<size_t>(band_rows * k));
    std::vector<float> inverse(static_cast<size_t>(k));
    std::vector<uint32_t> column_amax(static_cast<size_t>(k));
    std::vector<uint8_t> codes(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t rows = std::min(band_rows, m - b * band_rows);
      load_rows(x, b * band_rows, rows, band.data());
      if (tiles) {
        tiles_band<Codec, kPacked>(band.data(), rows, k, b, o, p, column_amax.data(), inverse.data(),
                                   codes.data(), out);
        continue;
      }
      if (o.rowwise) {
        rowwise_rows<Codec, kPacked>(band.data(), rows, k, b * band_rows, p, codes.data(),
                                     out.rowwise_data.data_as<uint8_t>(),
                                     out.rowwise_scale.data_as<uint8_t>());
      }
      if (o.columnwise) {
        columnwise_band<Codec, kPacked>(band.data(), k, b, p, column_amax.data(), inverse.data(),
                                        codes.data(), out.columnwise_data.data_as<uint8_t>(),
                                        out.columnwise_scale.data_as<uint8_t>());
      }
    }
  }
}

}  // namespace

void quantize_mx(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const bool tiles = o.tile == Tile::k32x32;
  if (!tiles && quantize_mx_avx512(x, o, out)) return;
  const FormatInfo& f = format_info(element_format(o.scheme));
  const MxParams p{mx_scale_rule(o.scale_mode), f.emax, f.mantissa_bits, f.max_normal};
  if (mx16_applies(x, o.scheme)) return quantize_mx16(x, o, p, out);  // 16-bit lanes, no widening
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
