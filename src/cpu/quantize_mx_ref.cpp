// MX reference quantizer: plain loops following numerics-mx.md §3 (torchao main to_mx).
//
// Rowwise blocks are 32 consecutive elements of a row; columnwise blocks are 32 consecutive
// elements of a column, stored in place (the TE MXFP8 layout: data [M, K], scales [M/32, K]).
#include <cmath>

#include "core/scale_math.hpp"
#include "cpu/quantize_kernels.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 32;

// Quantizes the 32 values of one block; `store(i, code)` places element i's code.
template <typename Load, typename Store>
uint8_t quantize_block(const FormatInfo& f, Format format, MxScaleRule rule, Load load, Store store) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) {
    const float a = std::fabs(load(i));
    if (std::isnan(a) || std::isnan(amax)) {
      amax = NAN;  // torch.amax propagates NaN: the block's scale becomes NaN
    } else {
      amax = std::fmax(amax, a);
    }
  }
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

}  // namespace

void quantize_mx_ref(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out) {
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
