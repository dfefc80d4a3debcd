// dequantize() / dequantize_ref(): one usage of a QuantizedTensor back to f32, bf16 or f16. The
// reference is one loop over the elements (a table lookup per code and per scale byte); the fast
// path decodes rows in parallel with the vectorised loops of cpu/decode_codes.hpp. Both compute
// every value as the same fp32 product, so they give the same bytes.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/float_store.hpp"
#include "core/fp_environment.hpp"
#include "core/quantized_reading.hpp"
#include "core/scale_math.hpp"
#include "cpu/decode_codes.hpp"
#include "cpu/dense_rows.hpp"
#include "microscale/error.hpp"
#include "microscale/quantize.hpp"

namespace microscale {
namespace {

void store(DType dtype, void* out, int64_t i, float v) {
  if (!store_float(dtype, out, i, v)) throw Error("dequantize output dtype must be f32, bf16 or f16");
}

uint8_t code_at(const uint8_t* row, int64_t column, bool packed_fp4) {
  if (!packed_fp4) return row[column];
  const uint8_t byte = row[column / 2];
  return column % 2 == 0 ? (byte & 0x0F) : static_cast<uint8_t>(byte >> 4);
}

// One usage of a quantized tensor as dequantize and dequantize_ref read it: codes of the logical
// [rows, cols] output (NVFP4 columnwise holds X^T) and its compact scales, after the checks.
struct DequantizeSource {
  Scheme scheme = Scheme::NVFP4;
  bool nvfp4 = false;
  bool packed = false;         // FP4: two codes a byte
  bool mx_columnwise = false;  // blocks along the rows: compact scales [rows / block, cols]
  bool transposed = false;     // the output is X^T (NVFP4 columnwise): not reshaped to q.shape
  int block = 0;
  int64_t rows = 0, cols = 0, data_cols = 0;  // data_cols: bytes per row of codes
  const uint8_t* codes = nullptr;
  Tensor scales;  // compact u8: [rows, cols / block], or [rows / block, cols] when mx_columnwise
};

DequantizeSource dequantize_source(const QuantizedTensor& q, Usage usage, DType out_dtype) {
  if (!q.has(usage)) {
    throw Error(std::string("this quantized tensor has no ") +
                (usage == Usage::Rowwise ? "rowwise" : "columnwise") + " data");
  }
  check_consistent(q, usage);
  if (out_dtype != DType::F32 && out_dtype != DType::BF16 && out_dtype != DType::F16)
    throw Error("dequantize output dtype must be f32, bf16 or f16");
  DequantizeSource src;
  src.scheme = q.scheme;
  src.nvfp4 = q.scheme == Scheme::NVFP4;
  src.packed = element_format(q.scheme) == Format::E2M1;
  src.block = block_size(q.scheme);
  src.transposed = src.nvfp4 && usage == Usage::Columnwise;
  src.mx_columnwise = !src.nvfp4 && usage == Usage::Columnwise;
  src.rows = src.transposed ? q.cols : q.rows;
  src.cols = src.transposed ? q.rows : q.cols;
  src.data_cols = src.packed ? src.cols / 2 : src.cols;
  src.codes = (usage == Usage::Rowwise ? q.rowwise_data : q.columnwise_data).data_as<uint8_t>();
  src.scales = compact_scales(q, usage);
  return src;
}

// NVFP4's decode scale of output row r, RN(1 / S_enc) with the row's amax when row-scaled.
float nvfp4_s_dec(const QuantizedTensor& q, Usage usage, int64_t r) {
  return 1.0f / nvfp4_global_encode_scale(q.amax_of_row(usage, r), q.nvfp4_e4m3_max);
}

[[noreturn]] void throw_invalid_codes(Scheme scheme) {
  throw Error(std::string("this ") + std::string(scheme_name(scheme)) + " tensor holds bytes that are not " +
              std::string(format_info(element_format(scheme)).name) +
              " codes (a 6-bit code has its two high bits clear)");
}

Tensor shaped_output(Tensor out, const QuantizedTensor& q, const DequantizeSource& src) {
  if (!src.transposed) return out.reshaped(q.shape);
  return out;
}

}  // namespace

Tensor dequantize_ref(const QuantizedTensor& q, Usage usage, DType out_dtype) {
  const IeeeSubnormals ieee;  // code x scale can be subnormal (fp_environment.hpp)
  const DequantizeSource src = dequantize_source(q, usage, out_dtype);
  const Format format = element_format(q.scheme);
  Tensor out(out_dtype, {src.rows, src.cols});
  const auto* scale = src.scales.data_as<uint8_t>();
  // Every code's value and every scale byte's factor, looked up per element: value = element *
  // factor, exact in fp32 (at most 3 mantissa bits times a power of two >= 2^-127), NaN for the
  // MX scale byte 0xFF. A row-scaled tensor's rows each have their own S_dec: its factors are
  // made again per row.
  std::array<float, 256> element{}, factor{};
  const int codes_of_format = 1 << format_info(format).bits;
  for (int code = 0; code < codes_of_format; ++code)
    element[code] = decode(format, static_cast<uint8_t>(code));
  const std::array<float, 256> scale_value = scale_byte_values(src.scheme);
  const auto make_factors = [&](int64_t r) {
    const float s_dec = src.nvfp4 ? nvfp4_s_dec(q, usage, r) : 0.0f;
    for (int s = 0; s < 256; ++s) factor[s] = src.nvfp4 ? scale_value[s] * s_dec : scale_value[s];
  };
  for (int64_t r = 0; r < src.rows; ++r) {
    if (r == 0 || q.row_scaled) make_factors(r);
    for (int64_t c = 0; c < src.cols; ++c) {
      const uint8_t code = code_at(src.codes + r * src.data_cols, c, src.packed);
      if (code >= codes_of_format) throw_invalid_codes(q.scheme);
      const uint8_t s = src.mx_columnwise ? scale[(r / src.block) * src.cols + c]
                                          : scale[r * (src.cols / src.block) + c / src.block];
      // MX's scale byte 0xFF: the canonical NaN whatever the code (a product would pass on a NaN
      // code's own sign and payload).
      const float value = !src.nvfp4 && s == 0xFF ? NAN : element[code] * factor[s];
      store(out_dtype, out.data(), r * src.cols + c, value);
    }
  }
  return shaped_output(std::move(out), q, src);
}

Tensor dequantize(const QuantizedTensor& q, Usage usage, DType out_dtype) {
  const IeeeSubnormals ieee;  // the scale table holds subnormals (2^-127) (fp_environment.hpp)
  const DequantizeSource src = dequantize_source(q, usage, out_dtype);
  // Not zeroed first: every row is written whole below (zeroing its 32 MiB first took a third of
  // a 4096 x 4096 NVFP4 call to bf16: docs/perf.md, fifty-third session).
  Tensor out = Tensor::uninitialized(out_dtype, {src.rows, src.cols});
  const auto* scale = src.scales.data_as<uint8_t>();
  const std::array<float, 256> scale_value = scale_byte_values(src.scheme);
  const int64_t blocks = src.cols / src.block;  // per row (K-major); MX columnwise: blocks of rows
  const int64_t factors_per_row = src.mx_columnwise ? src.cols : blocks;
  const bool f32_out = out_dtype == DType::F32;
  const size_t element_bytes = dtype_size(out_dtype);
  // Per thread: the row's factors and (for bf16 / f16 output) the row's fp32 values, sized here.
  const auto threads = static_cast<int64_t>(omp_get_max_threads());
  std::vector<float> factor_buffers(static_cast<size_t>(threads * factors_per_row));
  std::vector<float> row_buffers(f32_out ? 0 : static_cast<size_t>(threads * src.cols));
  unsigned invalid = 0;
#pragma omp parallel reduction(| : invalid)
  {
    const IeeeSubnormals thread_ieee;  // per thread: code x scale can be subnormal
    const int64_t t = omp_get_thread_num();
    float* factors = factor_buffers.data() + t * factors_per_row;
    float* values = f32_out ? nullptr : row_buffers.data() + t * src.cols;
    int64_t cached_row_block = -1;  // MX columnwise: the block of rows whose factors `factors` holds
    // NVFP4: the tensor's decode scale, or (row-scaled) each row's, made in the loop
    float s_dec = src.nvfp4 && !q.row_scaled ? nvfp4_s_dec(q, usage, 0) : 0.0f;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < src.rows; ++r) {
      if (src.nvfp4 && q.row_scaled) s_dec = nvfp4_s_dec(q, usage, r);
      float* row_out = f32_out ? out.data_as<float>() + r * src.cols : values;  // [cols] fp32
      const uint8_t* codes = src.codes + r * src.data_cols;
      // The scale bytes of this row's elements: [blocks] one per block, or [cols] one per column.
      const uint8_t* row_scales = src.mx_columnwise ? scale + (r / src.block) * src.cols : scale + r * blocks;
      if (src.mx_columnwise) {
        if (cached_row_block != r / src.block) {
          for (int64_t c = 0; c < src.cols; ++c) factors[c] = scale_value[row_scales[c]];
          cached_row_block = r / src.block;
        }
        invalid |= cpu::decode_scaled(src.scheme, codes, src.cols, factors, row_out);
      } else {
        for (int64_t b = 0; b < blocks; ++b)
          factors[b] = src.nvfp4 ? scale_value[row_scales[b]] * s_dec : scale_value[row_scales[b]];
        invalid |= cpu::decode_row(src.scheme, codes, 0, src.cols, factors, row_out);
      }
      // MX's NaN scale byte: the canonical NaN (as dequantize_ref). NOTE: memchr first: the byte
      // loop alone, one compare per element of a columnwise row, took ~1/3 of such a call.
      if (!src.nvfp4 && std::memchr(row_scales, 0xFF, static_cast<size_t>(factors_per_row)) != nullptr) {
        const int64_t per_byte = src.mx_columnwise ? 1 : src.block;
        for (int64_t i = 0; i < factors_per_row; ++i) {
          if (row_scales[i] == 0xFF) std::fill_n(row_out + i * per_byte, per_byte, NAN);
        }
      }
      if (!f32_out) {
        cpu::store_row(out_dtype, values, src.cols,
                       static_cast<char*>(out.data()) + r * src.cols * element_bytes);
      }
    }
  }
  if (invalid != 0) throw_invalid_codes(q.scheme);
  return shaped_output(std::move(out), q, src);
}

}  // namespace microscale
