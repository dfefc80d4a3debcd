// NVFP4 reference quantizer: plain loops that follow numerics-te.md §1-4 line by line, and TE's
// reference_nvfp4.py for 4over6 and row-scaled tensors.
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

void put_code(uint8_t* data, int64_t cols, int64_t r, int64_t column, uint8_t code) {
  uint8_t& byte = data[r * (cols / 2) + column / 2];
  byte = (column % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0) | code)
                           : static_cast<uint8_t>((byte & 0x0F) | (code << 4));
}

// One 4over6 candidate of a block: its E4M3 scale, codes and error against the input.
struct Candidate {
  uint8_t scale = 0;
  uint8_t codes[kBlock] = {};
  float error = 0.0f;
};

// The candidate of scale `scale_f32` for the 16 elements at `x` (TE's reference: the elements
// times the block's encode scale, rounded to E2M1 (clamped to 6), dequantized again, and the
// error terms added in element order).
Candidate four_over_six_candidate(const float* x, float scale_f32, float s_enc, float amax,
                                  const QuantizeOptions& options) {
  Candidate c;
  c.scale = encode_rn(Format::E4M3, scale_f32);
  const float block_scale = decode(Format::E4M3, c.scale);
  const float encode_scale = nvfp4_block_encode_scale(block_scale, 1.0f / s_enc);
  const auto denominator = static_cast<float>(6 * options.nvfp4_e4m3_max);
  const bool scaled_error = options.four_over_six_scaled_error;
  for (int i = 0; i < kBlock; ++i) {
    const float scaled = x[i] * encode_scale;
    c.codes[i] = scaled == 0.0f ? uint8_t{0} : encode_rn(Format::E2M1, scaled);  // any zero -> 0
    const float candidate = four_over_six_candidate_value(decode(Format::E2M1, c.codes[i]), block_scale, amax,
                                                          denominator, scaled_error);
    c.error += four_over_six_error_term(candidate, four_over_six_input_value(x[i], s_enc, scaled_error),
                                        options.four_over_six == FourOverSix::MinMse);
  }
  return c;
}

// 4over6 (FourOverSix in quantize.hpp): both candidates of every block, then the pick per block,
// or per 16x16 tile from its 16 rows' errors. src, data, scale, row_amax as in quantize_direction.
void quantize_direction_four_over_six(const std::vector<float>& src, int64_t rows, int64_t cols,
                                      const std::vector<float>& row_amax, const QuantizeOptions& options,
                                      uint8_t* data, uint8_t* scale) {
  const bool tile_2d = options.tile == Tile::k16x16;
  const int64_t blocks = cols / kBlock;
  std::vector<Candidate> map4(static_cast<size_t>(rows * blocks)), map6(map4.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float amax = row_amax[r];
    const float s_enc = nvfp4_global_encode_scale(amax, options.nvfp4_e4m3_max);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = tile_2d ? r / kBlock * kBlock : r;
      const int64_t r1 = tile_2d ? r0 + kBlock : r + 1;
      float block_amax = 0.0f;
      for (int64_t rr = r0; rr < r1; ++rr) {
        for (int i = 0; i < kBlock; ++i)
          block_amax = max_abs_skipping_nan(block_amax, src[rr * cols + b * kBlock + i]);
      }
      const float base = four_over_six_base_scale(block_amax, s_enc);
      const float* x = &src[r * cols + b * kBlock];
      map4[r * blocks + b] = four_over_six_candidate(x, four_over_six_map4_scale(base), s_enc, amax, options);
      map6[r * blocks + b] = four_over_six_candidate(x, std::fmin(base, 448.0f), s_enc, amax, options);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      float error4 = map4[r * blocks + b].error, error6 = map6[r * blocks + b].error;
      if (tile_2d) {  // the tile's rows r0..r0+15, as TE's warp adds them
        float rows4[kBlock], rows6[kBlock];
        const int64_t r0 = r / kBlock * kBlock;
        for (int i = 0; i < kBlock; ++i) {
          rows4[i] = map4[(r0 + i) * blocks + b].error;
          rows6[i] = map6[(r0 + i) * blocks + b].error;
        }
        error4 = four_over_six_tile_error(rows4, 1);
        error6 = four_over_six_tile_error(rows6, 1);
      }
      const Candidate& pick =
          error4 < error6 ? map4[r * blocks + b] : map6[r * blocks + b];  // a tie: map to 6
      scale[r * blocks + b] = pick.scale;
      for (int i = 0; i < kBlock; ++i) put_code(data, cols, r, b * kBlock + i, pick.codes[i]);
    }
  }
}

// src: [rows, cols] fp32 row-major. Writes data [rows, cols/2], scale [rows, cols/16]; returns amax.
// Row-scaled (options.row_scaled): each row's own amax gives its global scale, and row_amaxes
// [rows] receives them.
float quantize_direction(const std::vector<float>& src, int64_t rows, int64_t cols,
                         const QuantizeOptions& options, std::optional<float> amax_override,
                         uint64_t sr_first_block, uint8_t* data, uint8_t* scale, float* row_amaxes) {
  float amax = 0.0f;
  for (float v : src) amax = max_abs_skipping_nan(amax, v);
  if (amax_override) amax = *amax_override;
  std::vector<float> row_amax(static_cast<size_t>(rows), amax);  // the global amax of each row
  if (options.row_scaled) {
    for (int64_t r = 0; r < rows; ++r) {
      row_amax[r] = 0.0f;
      for (int64_t c = 0; c < cols; ++c) row_amax[r] = max_abs_skipping_nan(row_amax[r], src[r * cols + c]);
      row_amaxes[r] = row_amax[r];
    }
  }
  if (options.four_over_six != FourOverSix::Off) {
    quantize_direction_four_over_six(src, rows, cols, row_amax, options, data, scale);
    return amax;
  }

  const bool tile_2d = options.tile == Tile::k16x16;
  for (int64_t r = 0; r < rows; ++r) {
    const float s_enc = nvfp4_global_encode_scale(row_amax[r]);
    const float s_dec = 1.0f / s_enc;
    const float multiplier = nvfp4_block_scale_multiplier(s_enc);
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
        put_code(data, cols, r, b * kBlock + i, code);
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
                           out.rowwise_scale.data_as<uint8_t>(),
                           options.row_scaled ? out.rowwise_amaxes.data_as<float>() : nullptr);
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
                           out.columnwise_data.data_as<uint8_t>(), out.columnwise_scale.data_as<uint8_t>(),
                           options.row_scaled ? out.columnwise_amaxes.data_as<float>() : nullptr);
  }
}

}  // namespace microscale::cpu
