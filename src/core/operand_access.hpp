// OperandReader: element access to a validated GemmOperand (dense or block-scaled, any layout),
// and exact dequantization of a K-panel to fp32 — the reference way to read an operand, shared by
// the CPU GEMM and the tests.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fp_environment.hpp"
#include "microscale/error.hpp"
#include "microscale/format.hpp"
#include "microscale/gemm.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"

namespace microscale {

class OperandReader {
 public:
  explicit OperandReader(const GemmOperand& op) : op_(op) {
    if (op.quantized) {
      format_ = element_format(op.scheme);
      block_ = block_size(op.scheme);
      packed_ = format_ == Format::E2M1;
      // A 6-bit format's bytes must have their two high bits clear; an FP4 byte holds two codes
      // (each read as a nibble), an 8-bit format uses every byte.
      const int bits = format_info(format_).bits;
      if (bits == 6) invalid_bits_ = 0xC0;
      for (int c = 0; c < (1 << bits); ++c) codes_[c] = decode(format_, static_cast<uint8_t>(c));
      for (int c = 0; c < 256; ++c) {
        scale_values_[c] = op.scheme == Scheme::NVFP4 ? decode(Format::E4M3, static_cast<uint8_t>(c))
                           : c == 0xFF                ? NAN
                                                      : std::ldexp(1.0f, c - 127);
      }
      data_strides_ = op.data.effective_strides();
      scale_strides_ = op.scales.effective_strides();
    } else {
      data_strides_ = op.dense.effective_strides();
    }
  }

  /// Logical rows and K of the operand.
  int64_t rows() const {
    if (!op_.quantized) return op_.dense.shape[0];
    return op_.stored_transposed ? op_.data.shape[1] * (packed_ ? 2 : 1) : op_.data.shape[0];
  }
  int64_t k() const {
    if (!op_.quantized) return op_.dense.shape[1];
    return op_.stored_transposed ? op_.data.shape[0] : op_.data.shape[1] * (packed_ ? 2 : 1);
  }
  int64_t batches() const {
    const TensorView& v = op_.quantized ? op_.data : op_.dense;
    return v.ndim() == 3 ? v.shape[2] : 1;
  }

  /// Exact value of logical element (r, k) of batch l, without any global (amax) scale.
  /// Throws on a byte that is not a code of the operand's format.
  float at(int64_t l, int64_t r, int64_t k) const {
    unsigned seen_invalid = 0;
    const float v = value_at(l, r, k, seen_invalid);
    if (seen_invalid != 0) throw_invalid_codes();
    return v;
  }

  /// out[r * width + j] = at(l, r, k0 + j) for every row: the fp32 panel sgemm reads.
  /// k0 and width are multiples of the block size (the GEMM's panels are). Throws (after the
  /// panel) if the panel holds a byte that is not a code of the operand's format.
  void dequantize_panel(int64_t l, int64_t k0, int64_t width, float* out) const {
    panel_rows(
        l, k0, width, [out, width](int64_t r) { return out + r * width; },
        [](int64_t, const float*) { return 0u; });
  }

  /// dequantize_panel's walk for callers that store the values their own way (the CPU GEMM's
  /// bf16 panels): for every row r of the panel (rows in parallel, under IEEE subnormals), row
  /// r's width values are written to target(r) (a float*), then done(r, target(r)) is called.
  /// Returns the OR of done's results (unsigned). k0 and width are multiples of the block size.
  /// Throws (after the panel) if the panel holds a byte that is not a code of the format.
  template <class RowTarget, class RowDone>
  unsigned panel_rows(int64_t l, int64_t k0, int64_t width, RowTarget target, RowDone done) const {
    const int64_t n = rows();
    unsigned seen_invalid = 0;  // OR of every code's invalid bits (checked once, after the threads)
    unsigned finished = 0;
    if (!op_.quantized || op_.stored_transposed || data_strides_[1] != 1) {
#pragma omp parallel reduction(| : seen_invalid, finished)
      {
        const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; ++r) {
          float* dst = target(r);
          for (int64_t j = 0; j < width; ++j) dst[j] = value_at(l, r, k0 + j, seen_invalid);
          finished |= done(r, dst);
        }
      }
      if (seen_invalid != 0) throw_invalid_codes();
      return finished;
    }
    // K-major codes: one scale lookup per block, then a table decode per element.
    const auto* bytes = static_cast<const uint8_t*>(op_.data.data);
    const int64_t batch_offset = data_strides_.size() == 3 ? l * data_strides_[2] : 0;
#pragma omp parallel reduction(| : seen_invalid, finished)
    {
      const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        const uint8_t* row = bytes + r * data_strides_[0] + batch_offset;
        float* dst = target(r);
        for (int64_t kb = k0 / block_; kb < (k0 + width) / block_; ++kb) {
          const float scale = block_scale(l, r, kb);
          const int64_t first = kb * block_;
          for (int64_t j = 0; j < block_; ++j) {
            const int64_t k = first + j;
            const uint8_t code =
                packed_ ? static_cast<uint8_t>((row[k / 2] >> (4 * (k % 2))) & 0x0F) : row[k];
            seen_invalid |= code & invalid_bits_;
            dst[k - k0] = codes_[code] * scale;
          }
        }
        finished |= done(r, dst);
      }
    }
    if (seen_invalid != 0) throw_invalid_codes();
    return finished;
  }

 private:
  // at() without the throw (callable inside a parallel region): ORs the code's invalid bits into
  // `seen_invalid`.
  float value_at(int64_t l, int64_t r, int64_t k, unsigned& seen_invalid) const {
    if (!op_.quantized) return dense_at(l, r, k);
    const uint8_t code = code_at(l, r, k);
    seen_invalid |= code & invalid_bits_;
    return codes_[code] * block_scale(l, r, k / block_);
  }

  float dense_at(int64_t l, int64_t r, int64_t k) const {
    const int64_t i =
        r * data_strides_[0] + k * data_strides_[1] + (data_strides_.size() == 3 ? l * data_strides_[2] : 0);
    switch (op_.dense.dtype) {
      case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(op_.dense.data)[i]);
      case DType::F16: return half_to_float(static_cast<const uint16_t*>(op_.dense.data)[i]);
      default: return static_cast<const float*>(op_.dense.data)[i];
    }
  }

  uint8_t code_at(int64_t l, int64_t r, int64_t k) const {
    // Storage coordinates: (row, element column) of the stored matrix.
    const int64_t sr = op_.stored_transposed ? k : r, sc = op_.stored_transposed ? r : k;
    const int64_t batch_offset = data_strides_.size() == 3 ? l * data_strides_[2] : 0;
    const auto* bytes = static_cast<const uint8_t*>(op_.data.data);
    const uint8_t byte =
        bytes[sr * data_strides_[0] + (packed_ ? sc / 2 : sc) * data_strides_[1] + batch_offset];
    if (!packed_) return byte;
    return sc % 2 == 0 ? (byte & 0x0F) : static_cast<uint8_t>(byte >> 4);
  }

  float block_scale(int64_t l, int64_t r, int64_t kb) const {
    const auto* s = static_cast<const uint8_t*>(op_.scales.data);
    uint8_t byte;
    if (op_.scale_layout == ScaleLayout::Swizzled) {
      const int64_t blocks = k() / block_;
      const int64_t image = swizzled_rows(rows()) * swizzled_cols(blocks);
      byte = s[l * image + swizzled_offset(r, kb, blocks)];
    } else {
      const int64_t sr = op_.stored_transposed ? kb : r, sc = op_.stored_transposed ? r : kb;
      const int64_t batch_offset = scale_strides_.size() == 3 ? l * scale_strides_[2] : 0;
      byte = s[sr * scale_strides_[0] + sc * scale_strides_[1] + batch_offset];
    }
    return scale_values_[byte];
  }

  [[noreturn]] void throw_invalid_codes() const {
    throw Error(std::string("a ") + std::string(scheme_name(op_.scheme)) +
                " operand holds bytes that are not " + std::string(format_info(format_).name) +
                " codes (a 6-bit code has its two high bits clear)");
  }

  const GemmOperand& op_;
  Format format_ = Format::E2M1;
  unsigned invalid_bits_ = 0;  // bits no code of the format sets
  int block_ = 16;
  bool packed_ = false;
  std::array<float, 256> codes_{};         // element code -> value
  std::array<float, 256> scale_values_{};  // scale byte -> value (E4M3, or E8M0 2^(b-127))
  std::vector<int64_t> data_strides_, scale_strides_;
};

}  // namespace microscale
