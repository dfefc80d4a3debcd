// MX reference quantizer: plain loops following numerics-mx.md §3 (torchao main to_mx).
//
// Rowwise blocks are 32 consecutive elements of a row; columnwise blocks are 32 consecutive
// elements of a column, stored in place (the TE MXFP8 layout: data [M, K], scales [M/32, K]).
// With 32x32 tiles (TE's MXFP8 2D quantization) one scale serves a whole tile in both directions.
#include <algorithm>
#include <cmath>

#include "core/scale_math.hpp"
#include "cpu/quantize_kernels.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 32;

// The running amax after one more value: torch.amax propagates NaN, so a block (or tile) with a NaN
// gets a NaN amax, and its scale becomes NaN.
float amax_with(float amax, float v) {
  const float a = std::fabs(v);
  return std::isnan(a) || std::isnan(amax) ? NAN : std::fmax(amax, a);
}

// Quantizes the 32 values of one block; `store(i, code)` places element i's code.
template <typename Load, typename Store>
uint8_t quantize_block(const FormatInfo& f, Format format, MxScaleRule rule, Load load, Store store) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = amax_with(amax, load(i));
  const uint8_t scale = mx_scale_byte(amax, rule, f.emax, f.mantissa_bits, f.max_normal);
  const float inverse = mx_inverse_scale(scale);
  for (int i = 0; i < kBlock; ++i) store(i, encode_rn(format, mx_scaled_element(load(i), inverse)));
  return scale;
}

void put_code(uint8_t* row, int64_t column, uint8_t code, bool packed_fp4) {
  if (!packed_fp4) {
    row[column] = code;
    return;
  }
  uint8_t& byte = row[column / 2];
  byte = (column % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0) | code)
                           : static_cast<uint8_t>((byte & 0x0F) | (code << 4));
}

// 32x32 tiles: tile (ti, tj) covers rows [32 ti, 32 ti + 32) and columns [32 tj, 32 tj + 32), cut
// at the matrix's edge (a dimension not quantized along need not be a multiple of 32). Its scale
// comes from its amax, every element is encoded with it, and each direction gets the same code;
// the tile's rows repeat the scale in the rowwise scales [M, K/32], its columns in the columnwise
// scales [M/32, K].
void quantize_tiles(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out) {
  const Format format = element_format(options.scheme);
  const FormatInfo& f = format_info(format);
  const bool packed = format == Format::E2M1;
  const int64_t m = x.rows, k = x.cols, data_cols = packed ? k / 2 : k;
  const MxScaleRule rule = mx_scale_rule(options.scale_mode);
  for (int64_t r0 = 0; r0 < m; r0 += kBlock) {
    for (int64_t c0 = 0; c0 < k; c0 += kBlock) {
      const int64_t r1 = std::min(r0 + kBlock, m), c1 = std::min(c0 + kBlock, k);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = amax_with(amax, x.at(r, c));
      }
      const uint8_t scale = mx_scale_byte(amax, rule, f.emax, f.mantissa_bits, f.max_normal);
      const float inverse = mx_inverse_scale(scale);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t code = encode_rn(format, mx_scaled_element(x.at(r, c), inverse));
          if (options.rowwise) put_code(out.rowwise_data.data_as<uint8_t>() + r * data_cols, c, code, packed);
          if (options.columnwise)
            put_code(out.columnwise_data.data_as<uint8_t>() + r * data_cols, c, code, packed);
        }
      }
      if (options.rowwise) {
        for (int64_t r = r0; r < r1; ++r)
          out.rowwise_scale.data_as<uint8_t>()[r * (k / kBlock) + c0 / kBlock] = scale;
      }
      if (options.columnwise) {
        for (int64_t c = c0; c < c1; ++c)
          out.columnwise_scale.data_as<uint8_t>()[(r0 / kBlock) * k + c] = scale;
      }
    }
  }
}

}  // namespace

void quantize_mx_ref(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out) {
  if (options.tile == Tile::k32x32) return quantize_tiles(x, options, out);
  const Format format = element_format(options.scheme);
  const FormatInfo& f = format_info(format);
  const MxScaleRule rule = mx_scale_rule(options.scale_mode);
  const bool packed = format == Format::E2M1;
  const int64_t m = x.rows, k = x.cols;
  const int64_t data_cols = packed ? k / 2 : k;

  if (options.rowwise) {
    auto* data = out.rowwise_data.data_as<uint8_t>();    // (M, K) or (M, K/2)
    auto* scale = out.rowwise_scale.data_as<uint8_t>();  // (M, K/32)
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < k / kBlock; ++b) {
        scale[r * (k / kBlock) + b] = quantize_block(
            f, format, rule, [&](int i) { return x.at(r, b * kBlock + i); },
            [&](int i, uint8_t code) { put_code(data + r * data_cols, b * kBlock + i, code, packed); });
      }
    }
  }
  if (options.columnwise) {
    auto* data = out.columnwise_data.data_as<uint8_t>();    // (M, K) or (M, K/2)
    auto* scale = out.columnwise_scale.data_as<uint8_t>();  // (M/32, K)
    for (int64_t b = 0; b < m / kBlock; ++b) {
      for (int64_t c = 0; c < k; ++c) {
        scale[b * k + c] = quantize_block(
            f, format, rule, [&](int i) { return x.at(b * kBlock + i, c); },
            [&](int i, uint8_t code) { put_code(data + (b * kBlock + i) * data_cols, c, code, packed); });
      }
    }
  }
}

}  // namespace microscale::cpu
