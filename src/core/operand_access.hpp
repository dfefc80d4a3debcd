// OperandReader: element access to a validated GemmOperand (dense or block-scaled, any layout),
// and exact dequantization of a K-panel to fp32, shared by the CPU GEMM and the tests. at() is
// the reference way to read an operand (a table lookup per code); panels are decoded by the
// vectorised loops of cpu/decode_codes.hpp, the same fp32 products, so equal to at() bit for bit.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fp_environment.hpp"
#include "core/quantized_reading.hpp"
#include "cpu/decode_codes.hpp"
#include "cpu/dense_rows.hpp"
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
      scale_values_ = scale_byte_values(op.scheme);
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
  /// bf16 panels): row r's width values are written to target(r) (a float*), then done(r,
  /// target(r)) is called (under IEEE subnormals, on the OpenMP team). Rows go in parallel, except
  /// that a transposed operand's are decoded kColumnGroup at a time (one K index's codes of
  /// consecutive rows are contiguous): so target(r) of rows in one aligned group of kColumnGroup
  /// must not overlap, and a group's done calls may come after all its rows are written.
  /// Returns the OR of done's results (unsigned). k0 and width are multiples of the block size.
  /// Throws (after the panel) if the panel holds a byte that is not a code of the format.
  template <class RowTarget, class RowDone>
  unsigned panel_rows(int64_t l, int64_t k0, int64_t width, RowTarget target, RowDone done) const {
    const int64_t n = rows();
    const Walk walk = walk_of();
    // Per thread: the block scales of a row ([width / block]) or of a transposed group's rows
    // ([width / block][kColumnGroup]), sized here: nothing in the parallel region allocates.
    const int64_t scales_per_thread = (width / block_) * cpu::kColumnGroup;
    std::vector<float> scale_buffers(static_cast<size_t>(omp_get_max_threads() * scales_per_thread));
    unsigned seen_invalid = 0;  // OR of every code's invalid bits (checked once, after the threads)
    unsigned finished = 0;
#pragma omp parallel reduction(| : seen_invalid, finished)
    {
      const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
      float* scales = scale_buffers.data() + omp_get_thread_num() * scales_per_thread;
      if (walk == Walk::ColumnCodes) {
        const int64_t groups = (n + cpu::kColumnGroup - 1) / cpu::kColumnGroup;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r0 = g * cpu::kColumnGroup, r1 = std::min(n, r0 + cpu::kColumnGroup);
          seen_invalid |= column_group(l, r0, r1, k0, width, target, scales);
          for (int64_t r = r0; r < r1; ++r) finished |= done(r, target(r));
        }
      } else {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; ++r) {
          float* dst = target(r);
          if (walk == Walk::RowCodes) {
            for (int64_t kb = 0; kb < width / block_; ++kb) scales[kb] = block_scale(l, r, k0 / block_ + kb);
            seen_invalid |= cpu::decode_row(op_.scheme, row_bytes(l, r), k0, width, scales, dst);
          } else if (walk == Walk::DenseRows) {
            cpu::dense_row(op_.dense.dtype, dense_row_at(l, r, k0), width, dst);
          } else {
            for (int64_t j = 0; j < width; ++j) dst[j] = value_at(l, r, k0 + j, seen_invalid);
          }
          finished |= done(r, dst);
        }
      }
    }
    if (seen_invalid != 0) throw_invalid_codes();
    return finished;
  }

 private:
  // How panel_rows reads the operand: codes of K-major rows (a row's codes contiguous), codes of a
  // transposed operand (MX columnwise: a K index's codes of consecutive rows contiguous), dense
  // rows with unit stride along K, or element by element (any other strides).
  enum class Walk { RowCodes, ColumnCodes, DenseRows, Elements };

  Walk walk_of() const {
    if (data_strides_[1] != 1) return Walk::Elements;
    if (!op_.quantized) return Walk::DenseRows;
    return op_.stored_transposed ? Walk::ColumnCodes : Walk::RowCodes;
  }

  int64_t batch_offset(int64_t l) const { return data_strides_.size() == 3 ? l * data_strides_[2] : 0; }

  // Codes of logical row r of a K-major operand.
  const uint8_t* row_bytes(int64_t l, int64_t r) const {
    return static_cast<const uint8_t*>(op_.data.data) + r * data_strides_[0] + batch_offset(l);
  }

  // Element (r, k) of a dense operand whose K stride is 1.
  const void* dense_row_at(int64_t l, int64_t r, int64_t k) const {
    const int64_t i = r * data_strides_[0] + k + batch_offset(l);
    return static_cast<const char*>(op_.dense.data) + i * dtype_size(op_.dense.dtype);
  }

  // Rows [r0, r1) of a transposed operand, K indices [k0, k0 + width): block scales gathered into
  // `scales` ([width / block][kColumnGroup]), then the group decoded into the rows' targets.
  template <class RowTarget>
  unsigned column_group(int64_t l, int64_t r0, int64_t r1, int64_t k0, int64_t width, RowTarget& target,
                        float* scales) const {
    const int rows = static_cast<int>(r1 - r0);
    for (int64_t kb = 0; kb < width / block_; ++kb) {
      for (int i = 0; i < cpu::kColumnGroup; ++i)
        scales[kb * cpu::kColumnGroup + i] = i < rows ? block_scale(l, r0 + i, k0 / block_ + kb) : 0.0f;
    }
    std::array<float*, cpu::kColumnGroup> outputs{};
    for (int i = 0; i < rows; ++i) outputs[i] = target(r0 + i);
    // Stored (k0, r0): stored row k0, stored column r0 (FP4: byte r0 / 2; r0 is a multiple of 16).
    const uint8_t* codes = static_cast<const uint8_t*>(op_.data.data) + k0 * data_strides_[0] +
                           (packed_ ? r0 / 2 : r0) + batch_offset(l);
    return cpu::decode_columns(op_.scheme, codes, data_strides_[0], rows, width, scales, outputs.data());
  }

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
