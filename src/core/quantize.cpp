// quantize() / quantize_ref() / dequantize() / dequantize_ref(): argument checks, output allocation, dispatch
// to the CPU kernels, and the scale layout pass. Kernels see only validated inputs.
#include "microscale/quantize.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/ascii_lowercase.hpp"
#include "core/float_store.hpp"
#include "core/fp_environment.hpp"
#include "core/input_matrix.hpp"
#include "core/quantize_checks.hpp"
#include "core/require.hpp"
#include "core/scale_math.hpp"
#include "cpu/decode_codes.hpp"
#include "cpu/quantize_kernels.hpp"
#include "microscale/error.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"

namespace microscale {
namespace {

struct SchemeRow {
  Scheme scheme;
  std::string_view name;
  Format format;
  int block;
};

constexpr std::array<SchemeRow, 6> kSchemes = {{
    {Scheme::NVFP4, "nvfp4", Format::E2M1, 16},
    {Scheme::MXFP8_E4M3, "mxfp8_e4m3", Format::E4M3, 32},
    {Scheme::MXFP8_E5M2, "mxfp8_e5m2", Format::E5M2, 32},
    {Scheme::MXFP6_E2M3, "mxfp6_e2m3", Format::E2M3, 32},
    {Scheme::MXFP6_E3M2, "mxfp6_e3m2", Format::E3M2, 32},
    {Scheme::MXFP4, "mxfp4", Format::E2M1, 32},
}};

const SchemeRow& scheme_row(Scheme scheme) {
  for (const SchemeRow& row : kSchemes) {
    if (row.scheme == scheme) return row;
  }
  throw Error("unknown scheme id " + std::to_string(static_cast<int>(scheme)));
}

}  // namespace

void validate_scale_layout(ScaleLayout layout, const std::string& who) {
  require(layout == ScaleLayout::Compact || layout == ScaleLayout::Swizzled,
          who + " has an unknown scale layout id " + std::to_string(static_cast<int>(layout)));
}

void validate_thread_count(int num_threads) {
  require(num_threads >= 0 && num_threads <= kMaxThreads,
          "num_threads must be from 0 (all hardware threads) to " + std::to_string(kMaxThreads));
}

void validate_quantize(const InputMatrix& x, const QuantizeOptions& o) {
  const SchemeRow& s = scheme_row(o.scheme);
  const std::string name(s.name);
  // NOTE: appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "[" + to_string(...).
  std::string shape = "[";
  shape += std::to_string(x.rows);
  shape += ", ";
  shape += std::to_string(x.cols);
  shape += "]";
  require(o.rowwise || o.columnwise, "ask for rowwise and/or columnwise output");
  validate_thread_count(o.num_threads);
  validate_scale_layout(o.scale_layout, "QuantizeOptions");
  if (o.rowwise) {
    require(x.cols % s.block == 0, name + " rowwise needs the last dim divisible by " +
                                       std::to_string(s.block) + "; input (flattened) is " + shape);
  }
  if (o.columnwise) {
    require(x.rows % s.block == 0, name + " columnwise needs the flattened leading dims divisible by " +
                                       std::to_string(s.block) + "; input (flattened) is " + shape);
    // MXFP4's columnwise data keeps the input's layout with two codes per byte along its rows (a
    // columnwise-only call otherwise takes any last dim).
    require(o.scheme != Scheme::MXFP4 || x.cols % 2 == 0,
            name + " columnwise needs an even last dim (two codes per byte); input (flattened) is " + shape);
  }
  if (o.scheme == Scheme::NVFP4) {
    require(o.tile == Tile::k1x16 || o.tile == Tile::k16x16,
            "nvfp4 takes 1x16 blocks or 16x16 tiles (32x32 tiles are MX's)");
    if (o.tile == Tile::k16x16) {
      require(x.rows % 16 == 0 && x.cols % 16 == 0,
              "nvfp4 16x16 tiles need both dims divisible by 16; input (flattened) is " + shape);
      require(!o.rht, "RHT is for 1x16 activations and gradients, not 16x16 weight tiles");
    }
    if (o.rht && o.columnwise) {
      require(x.dtype == DType::BF16, "RHT is only supported for bf16 input (as in TransformerEngine)");
    }
    for (const auto& amax : {o.amax_rowwise, o.amax_columnwise}) {
      if (amax) require(std::isfinite(*amax) && *amax >= 0.0f, "an amax override must be finite and >= 0");
    }
    const bool four_over_six = o.four_over_six != FourOverSix::Off;
    require(o.four_over_six == FourOverSix::Off || o.four_over_six == FourOverSix::MinMae ||
                o.four_over_six == FourOverSix::MinMse,
            "unknown 4over6 error mode id " + std::to_string(static_cast<int>(o.four_over_six)));
    require(o.nvfp4_e4m3_max == 448 || (four_over_six && o.nvfp4_e4m3_max == 256),
            "nvfp4_e4m3_max must be 448, or 256 with 4over6 (as in TransformerEngine); got " +
                std::to_string(o.nvfp4_e4m3_max));
    require(four_over_six || !o.four_over_six_scaled_error,
            "four_over_six_scaled_error applies to 4over6 only");
    if (four_over_six) {
      require(!o.rht, "4over6 does not take the RHT (TransformerEngine has no 4over6 with RHT)");
      require(!o.stochastic_rounding, "4over6 rounds to nearest; it does not take stochastic rounding");
    }
    if (o.row_scaled) {  // TransformerEngine's checks for row_scaled_nvfp4
      require(o.tile == Tile::k1x16, "row-scaled nvfp4 takes 1x16 blocks only, not 16x16 tiles");
      require(!o.rht, "row-scaled nvfp4 does not take the RHT (as in TransformerEngine)");
      require(!o.stochastic_rounding,
              "row-scaled nvfp4 does not take stochastic rounding (as in TransformerEngine)");
      require(
          !o.amax_rowwise && !o.amax_columnwise,
          "row-scaled nvfp4 measures each row's amax: it takes no amax override (TransformerEngine refuses "
          "an amax reduction)");
      require(o.rowwise, "row-scaled nvfp4 needs the rowwise output (as in TransformerEngine)");
      require(!four_over_six || !o.columnwise,
              "row-scaled nvfp4 with 4over6 is rowwise only (as in TransformerEngine): a Linear's quantized "
              "backward needs the input's columnwise output, so pass the recipe a backward_override");
    }
  } else {
    require(o.tile == Tile::k1x16 || o.tile == Tile::k32x32,
            name +
                " takes 1-D blocks of 32 (tile 1x16 or 1x32, the default) or 32x32 tiles (16x16 tiles are "
                "nvfp4's)");
    require(!o.rht, "RHT applies to nvfp4 only");
    require(o.four_over_six == FourOverSix::Off && !o.four_over_six_scaled_error,
            "4over6 applies to nvfp4 only");
    require(o.nvfp4_e4m3_max == 448, "nvfp4_e4m3_max applies to nvfp4 only");
    require(!o.row_scaled, "row_scaled applies to nvfp4 only (MX has no global scale)");
    require(!o.stochastic_rounding, "stochastic rounding applies to nvfp4 only");
    require(!o.amax_rowwise && !o.amax_columnwise,
            "amax overrides apply to nvfp4 only (MX has no global scale)");
    require(o.scale_mode == ScaleMode::Floor || o.scale_mode == ScaleMode::Ceil ||
                o.scale_mode == ScaleMode::Even || o.scale_mode == ScaleMode::RCeil,
            "unknown scale mode");
  }
}

namespace {

// `reuse`'s tensor when it is a `dtype` tensor of `shape` (quantize_into), else a new zeroed one.
Tensor output_tensor(const Tensor* reuse, DType dtype, const std::vector<int64_t>& shape) {
  if (reuse != nullptr && reuse->defined() && reuse->dtype() == dtype && reuse->shape() == shape)
    return *reuse;
  return Tensor(dtype, shape);
}

// The largest of a row-scaled direction's amaxes (NaN never in them: the kernels skip it).
float largest(const Tensor& amaxes) {
  float m = 0.0f;
  const auto* a = amaxes.data_as<float>();
  for (int64_t i = 0; i < amaxes.numel(); ++i) m = std::fmax(m, a[i]);
  return m;
}

QuantizedTensor allocate(const TensorView& input, const InputMatrix& x, const QuantizeOptions& o,
                         const QuantizedTensor* reuse) {
  QuantizedTensor q;
  q.scheme = o.scheme;
  q.tile = o.tile;
  q.rht = o.rht;
  q.nvfp4_e4m3_max = o.nvfp4_e4m3_max;
  q.row_scaled = o.row_scaled;
  q.scale_layout = ScaleLayout::Compact;
  q.shape = input.shape;
  q.rows = x.rows;
  q.cols = x.cols;
  // The kernels fill compact scales; swizzle_outputs() brings them to the asked layout.
  QuantizeOptions compact = o;
  compact.scale_layout = ScaleLayout::Compact;
  const QuantizedShapes s = quantized_shapes(input.shape, compact);
  // Reused tensors that share their bytes (a caller set two fields to one Tensor) would have two
  // outputs written over each other: each buffer is reused once at most.
  std::vector<const void*> taken;
  auto output = [&](const Tensor* reused, const std::vector<int64_t>& shape, DType dtype = DType::U8) {
    Tensor t = output_tensor(reused, dtype, shape);
    if (std::find(taken.begin(), taken.end(), t.data()) != taken.end()) t = Tensor(dtype, shape);
    taken.push_back(t.data());
    return t;
  };
  if (o.rowwise) {
    q.rowwise_data = output(reuse ? &reuse->rowwise_data : nullptr, s.rowwise_data);
    q.rowwise_scale = output(reuse ? &reuse->rowwise_scale : nullptr, s.rowwise_scale);
  }
  if (o.columnwise) {
    q.columnwise_data = output(reuse ? &reuse->columnwise_data : nullptr, s.columnwise_data);
    q.columnwise_scale = output(reuse ? &reuse->columnwise_scale : nullptr, s.columnwise_scale);
  }
  if (o.row_scaled && o.rowwise)  // f32 amaxes per row of X and of X^T, which the kernels fill
    q.rowwise_amaxes = output(reuse ? &reuse->rowwise_amaxes : nullptr, {x.rows}, DType::F32);
  if (o.row_scaled && o.columnwise)
    q.columnwise_amaxes = output(reuse ? &reuse->columnwise_amaxes : nullptr, {x.cols}, DType::F32);
  return q;
}

Tensor transpose_u8(const Tensor& t) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  Tensor out(DType::U8, {cols, rows});
  const auto* src = t.data_as<uint8_t>();
  auto* dst = out.data_as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
  return out;
}

// MX columnwise scales [M/32, K] are swizzled as their transpose [K, M/32] (the GEMM reads the
// columnwise operand as if transposed); every other scale matrix is swizzled as it is.
bool swizzled_as_transpose(const QuantizedTensor& q, Usage usage) {
  return usage == Usage::Columnwise && is_mx(q.scheme);
}

void swizzle_outputs(QuantizedTensor& q) {
  if (q.rowwise_scale.defined()) q.rowwise_scale = swizzle_scales(q.rowwise_scale.view());
  if (q.columnwise_scale.defined()) {
    q.columnwise_scale = swizzled_as_transpose(q, Usage::Columnwise)
                             ? swizzle_scales(transpose_u8(q.columnwise_scale).view())
                             : swizzle_scales(q.columnwise_scale.view());
  }
  q.scale_layout = ScaleLayout::Swizzled;
}

using Kernel = void (*)(const InputMatrix&, const QuantizeOptions&, QuantizedTensor&);

QuantizedTensor run(const TensorView& input, const QuantizeOptions& options, Kernel nvfp4, Kernel mx,
                    const QuantizedTensor* reuse = nullptr) {
  const IeeeSubnormals ieee;  // whatever FTZ/DAZ the caller set (fp_environment.hpp)
  const InputMatrix x = make_input_matrix(input);
  validate_quantize(x, options);
  require(!options.stochastic_rounding || options.stochastic_rounding->device_seed == nullptr,
          "a stochastic-rounding seed in device memory (device_seed) is for the CUDA backend; the CPU "
          "takes the seed by value");
  QuantizedTensor q = allocate(input, x, options, reuse);
  (options.scheme == Scheme::NVFP4 ? nvfp4 : mx)(x, options, q);
  if (q.rowwise_amaxes.defined()) q.rowwise_amax = largest(q.rowwise_amaxes);
  if (q.columnwise_amaxes.defined()) q.columnwise_amax = largest(q.columnwise_amaxes);
  if (options.scale_layout == ScaleLayout::Swizzled) swizzle_outputs(q);
  return q;
}

// Compact scales of one usage, whatever layout q holds them in.
Tensor compact_scales(const QuantizedTensor& q, Usage usage) {
  const Tensor& scales = usage == Usage::Rowwise ? q.rowwise_scale : q.columnwise_scale;
  if (q.scale_layout == ScaleLayout::Compact) return scales;
  const int block = block_size(q.scheme);
  // Shape of the matrix that was swizzled: rowwise [M, K/block]; columnwise, NVFP4's [K, M/16]
  // and the transpose of MX's [M/32, K], i.e. [K, M/block] in both cases.
  const int64_t rows = usage == Usage::Rowwise ? q.rows : q.cols;
  const int64_t cols = usage == Usage::Rowwise ? q.cols / block : q.rows / block;
  Tensor compact = unswizzle_scales(scales.view(), rows, cols);
  return swizzled_as_transpose(q, usage) ? transpose_u8(compact) : compact;
}

void store(DType dtype, void* out, int64_t i, float v) {
  if (!store_float(dtype, out, i, v)) throw Error("dequantize output dtype must be f32, bf16 or f16");
}

uint8_t code_at(const uint8_t* row, int64_t column, bool packed_fp4) {
  if (!packed_fp4) return row[column];
  const uint8_t byte = row[column / 2];
  return column % 2 == 0 ? (byte & 0x0F) : static_cast<uint8_t>(byte >> 4);
}

}  // namespace

bool QuantizedTensor::has(Usage usage) const {
  return usage == Usage::Rowwise ? rowwise_data.defined() : columnwise_data.defined();
}

float QuantizedTensor::amax_of_row(Usage usage, int64_t r) const {
  if (!row_scaled) return usage == Usage::Rowwise ? rowwise_amax : columnwise_amax;
  return (usage == Usage::Rowwise ? rowwise_amaxes : columnwise_amaxes).data_as<float>()[r];
}

QuantizedShapes quantized_shapes(const std::vector<int64_t>& shape, const QuantizeOptions& o) {
  if (shape.empty()) throw Error("input must have at least one dimension");
  QuantizedShapes s;
  s.cols = shape.back();
  s.rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) {
    if (shape[i] < 0 || __builtin_mul_overflow(s.rows, shape[i], &s.rows))
      throw Error("input shape " + shape_string(shape) + " has a negative dimension or too many elements");
  }
  if (s.cols < 0) throw Error("input shape " + shape_string(shape) + " has a negative dimension");
  const int64_t m = s.rows, k = s.cols;
  const int block = block_size(o.scheme);
  const bool swizzled = o.scale_layout == ScaleLayout::Swizzled;
  auto scale_shape = [swizzled](int64_t rows, int64_t cols) -> std::vector<int64_t> {
    if (swizzled) return {swizzled_rows(rows), swizzled_cols(cols)};
    return {rows, cols};
  };
  if (o.scheme == Scheme::NVFP4) {
    if (o.rowwise) {
      s.rowwise_data = {m, k / 2};
      s.rowwise_scale = scale_shape(m, k / block);
    }
    if (o.columnwise) {
      s.columnwise_data = {k, m / 2};
      s.columnwise_scale = scale_shape(k, m / block);
    }
  } else {
    const int64_t data_cols = element_format(o.scheme) == Format::E2M1 ? k / 2 : k;
    if (o.rowwise) {
      s.rowwise_data = {m, data_cols};
      s.rowwise_scale = scale_shape(m, k / block);
    }
    if (o.columnwise) {
      s.columnwise_data = {m, data_cols};
      // compact [M/32, K]; swizzled as its transpose [K, M/32]
      s.columnwise_scale = swizzled ? scale_shape(k, m / block) : std::vector<int64_t>{m / block, k};
    }
  }
  return s;
}

Format element_format(Scheme scheme) { return scheme_row(scheme).format; }
int block_size(Scheme scheme) { return scheme_row(scheme).block; }
bool is_mx(Scheme scheme) { return scheme != Scheme::NVFP4; }
std::string_view scheme_name(Scheme scheme) { return scheme_row(scheme).name; }

Scheme parse_scheme(std::string_view name) {
  const std::string lower = ascii_lowercase(name);
  for (const SchemeRow& row : kSchemes) {
    if (row.name == lower) return row.scheme;
  }
  throw Error("unknown scheme '" + std::string(name) +
              "' (expected nvfp4, mxfp8_e4m3, mxfp8_e5m2, mxfp6_e2m3, mxfp6_e3m2 or mxfp4)");
}

std::string_view scale_mode_name(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::Floor: return "floor";
    case ScaleMode::Ceil: return "ceil";
    case ScaleMode::Even: return "even";
    case ScaleMode::RCeil: return "rceil";
  }
  throw Error("unknown scale mode id " + std::to_string(static_cast<int>(mode)));
}

std::string_view tile_name(Tile tile) {
  switch (tile) {
    case Tile::k1x16: return "1x16";
    case Tile::k16x16: return "16x16";
    case Tile::k32x32: return "32x32";
  }
  throw Error("unknown tile id " + std::to_string(static_cast<int>(tile)));
}

Tile parse_tile(std::string_view name, Scheme scheme) {
  const std::string lower = ascii_lowercase(name);
  if (lower == "1x32") {  // MX's 1-D blocks by their own size
    require(is_mx(scheme), "nvfp4 takes 1x16 blocks or 16x16 tiles; 1x32 blocks are MX's");
    return Tile::k1x16;
  }
  for (Tile tile : {Tile::k1x16, Tile::k16x16, Tile::k32x32}) {
    if (tile_name(tile) == lower) return tile;
  }
  throw Error("unknown tile '" + std::string(name) +
              "' (expected 1x16 or 16x16 for nvfp4, 1x32 or 32x32 for MX)");
}

std::string_view four_over_six_name(FourOverSix mode) {
  switch (mode) {
    case FourOverSix::Off: return "off";
    case FourOverSix::MinMae: return "mae";
    case FourOverSix::MinMse: return "mse";
  }
  throw Error("unknown 4over6 error mode id " + std::to_string(static_cast<int>(mode)));
}

FourOverSix parse_four_over_six(std::string_view name) {
  const std::string lower = ascii_lowercase(name);
  for (FourOverSix mode : {FourOverSix::Off, FourOverSix::MinMae, FourOverSix::MinMse}) {
    if (four_over_six_name(mode) == lower) return mode;
  }
  throw Error("unknown 4over6 error mode '" + std::string(name) + "' (expected off, mae or mse)");
}

ScaleMode parse_scale_mode(std::string_view name) {
  const std::string lower = ascii_lowercase(name);
  for (ScaleMode mode : {ScaleMode::Floor, ScaleMode::Ceil, ScaleMode::Even, ScaleMode::RCeil}) {
    if (scale_mode_name(mode) == lower) return mode;
  }
  throw Error("unknown scale mode '" + std::string(name) + "' (expected floor, rceil, ceil or even)");
}

QuantizedTensor quantize(const TensorView& input, const QuantizeOptions& options) {
  return run(input, options, cpu::quantize_nvfp4, cpu::quantize_mx);
}

void quantize_into(const TensorView& input, const QuantizeOptions& options, QuantizedTensor& out) {
  out = run(input, options, cpu::quantize_nvfp4, cpu::quantize_mx, &out);
}

QuantizedTensor quantize_ref(const TensorView& input, const QuantizeOptions& options) {
  return run(input, options, cpu::quantize_nvfp4_ref, cpu::quantize_mx_ref);
}

namespace {

// A QuantizedTensor's fields agree with each other for `usage` (one filled in by hand may not):
// a known scheme and layout, a blockable [rows, cols], and u8 data and scales of the sizes
// quantize gives them. Reading it then stays inside its tensors.
void check_consistent(const QuantizedTensor& q, Usage usage) {
  const std::string which = usage == Usage::Rowwise ? "rowwise" : "columnwise";
  static_cast<void>(scheme_row(q.scheme));  // throws for an unknown scheme
  validate_scale_layout(q.scale_layout, "the quantized tensor");
  require(q.rows >= 0 && q.cols >= 0, "the quantized tensor's rows and cols must be >= 0");
  require(q.nvfp4_e4m3_max == 448 || (q.scheme == Scheme::NVFP4 && q.nvfp4_e4m3_max == 256),
          "the quantized tensor's nvfp4_e4m3_max must be 448, or 256 for nvfp4; got " +
              std::to_string(q.nvfp4_e4m3_max));
  if (q.row_scaled) {
    require(q.scheme == Scheme::NVFP4, "only an nvfp4 quantized tensor can be row-scaled");
    const Tensor& amaxes = usage == Usage::Rowwise ? q.rowwise_amaxes : q.columnwise_amaxes;
    const int64_t n = usage == Usage::Rowwise ? q.rows : q.cols;
    require(amaxes.defined() && amaxes.dtype() == DType::F32 && amaxes.shape() == std::vector<int64_t>{n},
            "a row-scaled tensor's " + which + " amaxes must be f32 [" + std::to_string(n) + "]");
  }
  const int block = block_size(q.scheme);
  const bool packed = element_format(q.scheme) == Format::E2M1;
  if (usage == Usage::Rowwise) {
    require(q.cols % block == 0,
            "a rowwise quantized tensor needs cols divisible by " + std::to_string(block));
  } else {
    require(q.rows % block == 0,
            "a columnwise quantized tensor needs rows divisible by " + std::to_string(block));
    require(!(packed && is_mx(q.scheme)) || q.cols % 2 == 0,
            "MXFP4 columnwise data needs an even number of cols");
  }
  QuantizeOptions o;
  o.scheme = q.scheme;
  o.scale_layout = q.scale_layout;
  o.rowwise = usage == Usage::Rowwise;
  o.columnwise = usage == Usage::Columnwise;
  const QuantizedShapes expected = quantized_shapes({q.rows, q.cols}, o);
  const Tensor& data = usage == Usage::Rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scales = usage == Usage::Rowwise ? q.rowwise_scale : q.columnwise_scale;
  const std::vector<int64_t>& data_shape =
      usage == Usage::Rowwise ? expected.rowwise_data : expected.columnwise_data;
  const std::vector<int64_t>& scale_shape =
      usage == Usage::Rowwise ? expected.rowwise_scale : expected.columnwise_scale;
  require(data.dtype() == DType::U8 && data.shape() == data_shape,
          "the " + which + " data is " + std::string(dtype_name(data.dtype())) + " " +
              shape_string(data.shape()) + "; a " + std::string(scheme_name(q.scheme)) + " tensor of [" +
              std::to_string(q.rows) + ", " + std::to_string(q.cols) + "] has u8 " +
              shape_string(data_shape));
  require(scales.dtype() == DType::U8 && scales.shape() == scale_shape,
          "the " + which + " scales are " + std::string(dtype_name(scales.dtype())) + " " +
              shape_string(scales.shape()) + "; this tensor's " +
              (q.scale_layout == ScaleLayout::Swizzled ? "swizzled" : "compact") + " scales are u8 " +
              shape_string(scale_shape));
}

}  // namespace

namespace {

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

// Scale byte -> its value: E4M3 (NVFP4), or 2^(s - 127) (MX; its NaN byte 0xFF gives Inf here, and
// the callers write the canonical NaN). A code's value is multiplied by value * s_dec (NVFP4) or
// by the value (MX).
std::array<float, 256> scale_values(bool nvfp4) {
  std::array<float, 256> values{};
  for (int s = 0; s < 256; ++s)
    values[s] = nvfp4 ? decode(Format::E4M3, static_cast<uint8_t>(s)) : std::ldexp(1.0f, s - 127);
  return values;
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
  const std::array<float, 256> scale_value = scale_values(src.nvfp4);
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
  Tensor out(out_dtype, {src.rows, src.cols});
  const auto* scale = src.scales.data_as<uint8_t>();
  const std::array<float, 256> scale_value = scale_values(src.nvfp4);
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
    int64_t factors_of = -1;  // the row group whose factors `factors` holds (MX columnwise)
    float s_dec = src.nvfp4 ? nvfp4_s_dec(q, usage, 0) : 0.0f;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < src.rows; ++r) {
      if (src.nvfp4 && q.row_scaled) s_dec = nvfp4_s_dec(q, usage, r);
      float* row_out = f32_out ? out.data_as<float>() + r * src.cols : values;  // [cols] fp32
      const uint8_t* codes = src.codes + r * src.data_cols;
      // The scale bytes of this row's elements: [blocks] one per block, or [cols] one per column.
      const uint8_t* row_scales = src.mx_columnwise ? scale + (r / src.block) * src.cols : scale + r * blocks;
      if (src.mx_columnwise) {
        if (factors_of != r / src.block) {
          for (int64_t c = 0; c < src.cols; ++c) factors[c] = scale_value[row_scales[c]];
          factors_of = r / src.block;
        }
        invalid |= cpu::decode_scaled(src.scheme, codes, src.cols, factors, row_out);
      } else {
        for (int64_t b = 0; b < blocks; ++b)
          factors[b] = src.nvfp4 ? scale_value[row_scales[b]] * s_dec : scale_value[row_scales[b]];
        invalid |= cpu::decode_row(src.scheme, codes, 0, src.cols, factors, row_out);
      }
      if (!src.nvfp4) {  // MX's NaN scale byte: the canonical NaN (as dequantize_ref)
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
