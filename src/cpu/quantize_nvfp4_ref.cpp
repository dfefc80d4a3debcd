// NVFP4 reference quantizer: plain loops that follow numerics-te.md §1-4 line by line.
//
// Each direction is quantized from a materialised fp32 source matrix: X itself (rowwise), or X^T
// (columnwise), transformed by the RHT and rounded to bf16 when asked. That costs memory, not
// clarity; the fast path (quantize_nvfp4.cpp) must equal this bit for bit.
#include <cmath>
#include <vector>

#include "core/scale_math.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/rht.hpp"
#include "microscale/philox.hpp"

namespace microscale::cpu {
namespace {

constexpr int kBlock = 16;

// src: [rows, cols] fp32 row-major. Writes data [rows, cols/2], scale [rows, cols/16]; returns amax.
float quantize_direction(const std::vector<float>& src, int64_t rows, int64_t cols,
                         const QuantizeOptions& options, std::optional<float> amax_override,
                         uint64_t sr_first_block, uint8_t* data, uint8_t* scale) {
  float amax = 0.0f;
  for (float v : src) amax = max_abs_skipping_nan(amax, v);
  if (amax_override) amax = *amax_override;

  const float s_enc = nvfp4_global_encode_scale(amax);
  const float s_dec = 1.0f / s_enc;
  const float multiplier = nvfp4_block_scale_multiplier(s_enc);
  const bool tile_2d = options.tile == Tile::k16x16;

  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / kBlock; ++b) {
      // Block amax: this row's 16 elements, or the whole 16x16 tile for 2-D scaling.
      const int64_t r0 = tile_2d ? r / kBlock * kBlock : r;
      const int64_t r1 = tile_2d ? r0 + kBlock : r + 1;
      float block_amax = 0.0f;
      for (int64_t rr = r0; rr < r1; ++rr) {
        for (int i = 0; i < kBlock; ++i) {
          block_amax = max_abs_skipping_nan(block_amax, src[rr * cols + b * kBlock + i]);
        }
      }
      const float scale_f32 = std::fmin(block_amax * multiplier, FLT_MAX);
      const uint8_t scale_code = encode_rn(Format::E4M3, scale_f32);
      scale[r * (cols / kBlock) + b] = scale_code;
      const float encode_scale = nvfp4_block_encode_scale(decode(Format::E4M3, scale_code), s_dec);

      uint32_t random_words[4] = {0, 0, 0, 0};
      if (options.stochastic_rounding) {
        const uint64_t block_index = sr_first_block + static_cast<uint64_t>(r * (cols / kBlock) + b);
        sr_block_bits(options.stochastic_rounding->seed, options.stochastic_rounding->offset, block_index,
                      random_words);
      }
      for (int i = 0; i < kBlock; ++i) {
        const float scaled = src[r * cols + b * kBlock + i] * encode_scale;
        uint8_t code;
        if (scaled == 0.0f) {
          code = 0x0;  // -0.0 too: TE's reference maps any zero to code 0 (see docs/formats.md)
        } else if (options.stochastic_rounding) {
          const auto random_byte = static_cast<uint8_t>(random_words[i / 4] >> (8 * (i % 4)));
          code = encode_sr(Format::E2M1, scaled, random_byte);
        } else {
          code = encode_rn(Format::E2M1, scaled);
        }
        const int64_t column = b * kBlock + i;
        uint8_t& byte = data[r * (cols / 2) + column / 2];
        byte = (column % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0) | code)
                                 : static_cast<uint8_t>((byte & 0x0F) | (code << 4));
      }
    }
  }
  return amax;
}

}  // namespace

void quantize_nvfp4_ref(const InputMatrix& x, const QuantizeOptions& options, QuantizedTensor& out) {
  const int64_t m = x.rows, k = x.cols;
  if (options.rowwise) {
    std::vector<float> src(static_cast<size_t>(m * k));  // (M, K)
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < k; ++c) src[r * k + c] = x.at(r, c);
    }
    out.rowwise_amax =
        quantize_direction(src, m, k, options, options.amax_rowwise, 0, out.rowwise_data.data_as<uint8_t>(),
                           out.rowwise_scale.data_as<uint8_t>());
  }
  if (options.columnwise) {
    std::vector<float> src(static_cast<size_t>(k * m));  // (K, M) = X^T
    for (int64_t c = 0; c < k; ++c) {
      for (int64_t r = 0; r < m; ++r) src[c * m + r] = x.at(r, c);
    }
    if (options.rht) {
      for (int64_t c = 0; c < k; ++c) {
        for (int64_t b = 0; b < m / kBlock; ++b) {
          float* chunk = &src[c * m + b * kBlock];
          float transformed[kBlock];
          rht16(chunk, options.rht_sign_mask, transformed);
          std::copy(transformed, transformed + kBlock, chunk);
        }
      }
    }
    const auto first_block = static_cast<uint64_t>(m * k / kBlock);  // after the rowwise blocks
    out.columnwise_amax =
        quantize_direction(src, k, m, options, options.amax_columnwise, first_block,
                           out.columnwise_data.data_as<uint8_t>(), out.columnwise_scale.data_as<uint8_t>());
  }
}

}  // namespace microscale::cpu
