// quantize() / quantize_ref(): argument checks, output allocation, dispatch to the CPU kernels, and
// the scale layout pass (kernels see only validated inputs); the checks and compact scales that
// readers of a QuantizedTensor share (quantized_reading.hpp).
#include "microscale/quantize.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/ascii_lowercase.hpp"
#include "core/fp_environment.hpp"
#include "core/input_matrix.hpp"
#include "core/quantize_checks.hpp"
#include "core/quantized_reading.hpp"
#include "core/require.hpp"
#include "core/scale_math.hpp"
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

// Whether new output tensors start zeroed. The kernels write every byte of their outputs (reused
// ones hold the last call's bytes), so only the reference path, the oracle, keeps zeroed ones.
// NOTE: zeroing first took 3.6 ms of a 21 ms NVFP4 and 5.7 ms of a 20 ms MXFP8 row+col call at
// 4096 x 4096 on Zen 3 (docs/perf.md, fifty-third session).
enum class NewOutputs { Zeroed, Uninitialized };

Tensor new_tensor(NewOutputs outputs, DType dtype, const std::vector<int64_t>& shape) {
  return outputs == NewOutputs::Zeroed ? Tensor(dtype, shape) : Tensor::uninitialized(dtype, shape);
}

// `reuse`'s tensor when it is a `dtype` tensor of `shape` (quantize_into), else a new one.
Tensor output_tensor(const Tensor* reuse, NewOutputs outputs, DType dtype,
                     const std::vector<int64_t>& shape) {
  if (reuse != nullptr && reuse->defined() && reuse->dtype() == dtype && reuse->shape() == shape)
    return *reuse;
  return new_tensor(outputs, dtype, shape);
}

// The largest of a row-scaled direction's amaxes (NaN never in them: the kernels skip it).
float largest(const Tensor& amaxes) {
  float m = 0.0f;
  const auto* a = amaxes.data_as<float>();
  for (int64_t i = 0; i < amaxes.numel(); ++i) m = std::fmax(m, a[i]);
  return m;
}

QuantizedTensor allocate(const TensorView& input, const InputMatrix& x, const QuantizeOptions& o,
                         const QuantizedTensor* reuse, NewOutputs outputs) {
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
    Tensor t = output_tensor(reused, outputs, dtype, shape);
    if (std::find(taken.begin(), taken.end(), t.data()) != taken.end()) t = new_tensor(outputs, dtype, shape);
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
                    NewOutputs outputs, const QuantizedTensor* reuse = nullptr) {
  const IeeeSubnormals ieee;  // whatever FTZ/DAZ the caller set (fp_environment.hpp)
  const InputMatrix x = make_input_matrix(input);
  validate_quantize(x, options);
  require(!options.stochastic_rounding || options.stochastic_rounding->device_seed == nullptr,
          "a stochastic-rounding seed in device memory (device_seed) is for the CUDA backend; the CPU "
          "takes the seed by value");
  QuantizedTensor q = allocate(input, x, options, reuse, outputs);
  (options.scheme == Scheme::NVFP4 ? nvfp4 : mx)(x, options, q);
  if (q.rowwise_amaxes.defined()) q.rowwise_amax = largest(q.rowwise_amaxes);
  if (q.columnwise_amaxes.defined()) q.columnwise_amax = largest(q.columnwise_amaxes);
  if (options.scale_layout == ScaleLayout::Swizzled) swizzle_outputs(q);
  return q;
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

std::string_view tile_name(Tile tile, Scheme scheme) {
  return tile == Tile::k1x16 && is_mx(scheme) ? "1x32" : tile_name(tile);
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
  return run(input, options, cpu::quantize_nvfp4, cpu::quantize_mx, NewOutputs::Uninitialized);
}

void quantize_into(const TensorView& input, const QuantizeOptions& options, QuantizedTensor& out) {
  out = run(input, options, cpu::quantize_nvfp4, cpu::quantize_mx, NewOutputs::Uninitialized, &out);
}

QuantizedTensor quantize_ref(const TensorView& input, const QuantizeOptions& options) {
  return run(input, options, cpu::quantize_nvfp4_ref, cpu::quantize_mx_ref, NewOutputs::Zeroed);
}

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

}  // namespace microscale
