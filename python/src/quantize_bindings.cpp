// Quantization for Python: options, QuantizedTensor, quantize, dequantize, output shapes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <string>

#include "array_bridge.hpp"
#include "bindings.hpp"
#include "microscale/error.hpp"
#include "microscale/quantize.hpp"

namespace microscale::python {
namespace {

QuantizeOptions make_options(const std::string& scheme, bool rowwise, bool columnwise,
                             const std::string& scale_mode, const std::string& tile, bool rht,
                             std::optional<uint64_t> sr_seed, uint64_t sr_offset,
                             std::optional<float> amax_rowwise, std::optional<float> amax_columnwise,
                             bool swizzle, int num_threads, const std::string& four_over_six,
                             bool four_over_six_scaled_error, int nvfp4_e4m3_max, bool row_scaled) {
  QuantizeOptions o;
  o.scheme = parse_scheme(scheme);
  o.rowwise = rowwise;
  o.columnwise = columnwise;
  o.scale_mode = parse_scale_mode(scale_mode);
  o.tile = parse_tile(tile, o.scheme);
  o.rht = rht;
  if (sr_seed) o.stochastic_rounding = StochasticRounding{*sr_seed, sr_offset};
  o.amax_rowwise = amax_rowwise;
  o.amax_columnwise = amax_columnwise;
  o.scale_layout = swizzle ? ScaleLayout::Swizzled : ScaleLayout::Compact;
  o.num_threads = num_threads;
  o.four_over_six = parse_four_over_six(four_over_six);
  o.four_over_six_scaled_error = four_over_six_scaled_error;
  o.nvfp4_e4m3_max = nvfp4_e4m3_max;
  o.row_scaled = row_scaled;
  return o;
}

// A host u8 array's bytes copied into a new Tensor of `shape` (checked: dtype, device, shape).
Tensor copy_u8(const AnyArray& a, const std::vector<int64_t>& shape, const char* what) {
  const TensorView v = view_of(a, what);
  if (v.dtype != DType::U8 || v.device != Device::CPU || v.shape != shape || !v.is_contiguous())
    throw Error(std::string(what) + ": expected a contiguous uint8 CPU array of shape " +
                shape_string(shape) + ", got " + std::string(dtype_name(v.dtype)) + " " +
                shape_string(v.shape));
  Tensor t(DType::U8, shape);
  if (t.nbytes() > 0) std::memcpy(t.data(), v.data, t.nbytes());
  return t;
}

// A host float32 [n] array copied into a new Tensor (a row-scaled tensor's amaxes).
Tensor copy_amaxes(const AnyArray& a, int64_t n, const char* what) {
  const TensorView v = view_of(a, what);
  if (v.dtype != DType::F32 || v.device != Device::CPU || v.shape != std::vector<int64_t>{n} ||
      !v.is_contiguous())
    throw Error(std::string(what) + ": expected a contiguous float32 CPU array of shape [" +
                std::to_string(n) + "], got " + std::string(dtype_name(v.dtype)) + " " +
                shape_string(v.shape));
  Tensor t(DType::F32, {n});
  if (t.nbytes() > 0) std::memcpy(t.data(), v.data, t.nbytes());
  return t;
}

// A QuantizedTensor from the arrays quantize() gave for an input of `shape` with `options` (the
// PyTorch frontend's tensors, e.g. after they passed through a custom op). Copies the bytes.
QuantizedTensor quantized_from_arrays(const std::vector<int64_t>& shape, const QuantizeOptions& options,
                                      const std::optional<AnyArray>& rowwise_data,
                                      const std::optional<AnyArray>& rowwise_scale,
                                      const std::optional<AnyArray>& columnwise_data,
                                      const std::optional<AnyArray>& columnwise_scale, float rowwise_amax,
                                      float columnwise_amax, const std::optional<AnyArray>& rowwise_amaxes,
                                      const std::optional<AnyArray>& columnwise_amaxes) {
  const QuantizedShapes s = microscale::quantized_shapes(shape, options);
  QuantizedTensor q;
  q.scheme = options.scheme;
  q.tile = options.tile;
  q.rht = options.rht;
  q.nvfp4_e4m3_max = options.nvfp4_e4m3_max;
  q.scale_layout = options.scale_layout;
  q.shape = shape;
  q.rows = s.rows;
  q.cols = s.cols;
  q.rowwise_amax = rowwise_amax;
  q.columnwise_amax = columnwise_amax;
  q.row_scaled = options.row_scaled;
  if (options.row_scaled) {  // the amaxes per row; the scalar fields hold their largest
    if (options.rowwise) {
      if (!rowwise_amaxes) throw Error("a row-scaled tensor needs its rowwise_amaxes");
      q.rowwise_amaxes = copy_amaxes(*rowwise_amaxes, s.rows, "rowwise_amaxes");
    }
    if (options.columnwise) {
      if (!columnwise_amaxes) throw Error("a row-scaled tensor needs its columnwise_amaxes");
      q.columnwise_amaxes = copy_amaxes(*columnwise_amaxes, s.cols, "columnwise_amaxes");
    }
  }
  if (options.rowwise) {
    if (!rowwise_data || !rowwise_scale) throw Error("rowwise data and scale are required by these options");
    q.rowwise_data = copy_u8(*rowwise_data, s.rowwise_data, "rowwise_data");
    q.rowwise_scale = copy_u8(*rowwise_scale, s.rowwise_scale, "rowwise_scale");
  }
  if (options.columnwise) {
    if (!columnwise_data || !columnwise_scale)
      throw Error("columnwise data and scale are required by these options");
    q.columnwise_data = copy_u8(*columnwise_data, s.columnwise_data, "columnwise_data");
    q.columnwise_scale = copy_u8(*columnwise_scale, s.columnwise_scale, "columnwise_scale");
  }
  return q;
}

}  // namespace

Usage parse_usage(const std::string& name) {
  if (name == "rowwise") return Usage::Rowwise;
  if (name == "columnwise") return Usage::Columnwise;
  throw Error("unknown usage '" + name + "' (rowwise, columnwise)");
}

void bind_quantize(nb::module_& m) {
  nb::class_<QuantizeOptions>(m, "QuantizeOptions",
                              "How to quantize (microscale::QuantizeOptions); names as the CLI's flags.")
      .def(nb::new_(&make_options), nb::arg("scheme") = "nvfp4", nb::arg("rowwise") = true,
           nb::arg("columnwise") = false, nb::arg("scale_mode") = "rceil", nb::arg("tile") = "1x16",
           nb::arg("rht") = false, nb::arg("sr_seed") = nb::none(), nb::arg("sr_offset") = 0,
           nb::arg("amax_rowwise") = nb::none(), nb::arg("amax_columnwise") = nb::none(),
           nb::arg("swizzle") = false, nb::arg("num_threads") = 0, nb::arg("four_over_six") = "off",
           nb::arg("four_over_six_scaled_error") = false, nb::arg("nvfp4_e4m3_max") = 448,
           nb::arg("row_scaled") = false)
      .def_prop_ro("scheme", [](const QuantizeOptions& o) { return std::string(scheme_name(o.scheme)); })
      .def_ro("rowwise", &QuantizeOptions::rowwise)
      .def_ro("columnwise", &QuantizeOptions::columnwise)
      .def_prop_ro("scale_mode",
                   [](const QuantizeOptions& o) { return std::string(scale_mode_name(o.scale_mode)); })
      .def_prop_ro("tile", [](const QuantizeOptions& o) { return std::string(tile_name(o.tile, o.scheme)); })
      .def_ro("rht", &QuantizeOptions::rht)
      .def_prop_ro("four_over_six",
                   [](const QuantizeOptions& o) { return std::string(four_over_six_name(o.four_over_six)); })
      .def_ro("four_over_six_scaled_error", &QuantizeOptions::four_over_six_scaled_error)
      .def_ro("nvfp4_e4m3_max", &QuantizeOptions::nvfp4_e4m3_max)
      .def_ro("row_scaled", &QuantizeOptions::row_scaled)
      .def_prop_ro("sr_seed",
                   [](const QuantizeOptions& o) -> std::optional<uint64_t> {
                     if (!o.stochastic_rounding) return std::nullopt;
                     return o.stochastic_rounding->seed;
                   })
      .def_prop_ro("swizzle",
                   [](const QuantizeOptions& o) { return o.scale_layout == ScaleLayout::Swizzled; });

  nb::class_<QuantizedTensor>(m, "QuantizedTensor",
                              "Data + scales (+ NVFP4 amaxes) of a quantization; arrays share its memory.")
      .def_prop_ro("scheme", [](const QuantizedTensor& q) { return std::string(scheme_name(q.scheme)); })
      .def_prop_ro("tile", [](const QuantizedTensor& q) { return std::string(tile_name(q.tile, q.scheme)); })
      .def_ro("rht", &QuantizedTensor::rht)
      .def_ro("nvfp4_e4m3_max", &QuantizedTensor::nvfp4_e4m3_max)
      .def_ro("row_scaled", &QuantizedTensor::row_scaled)
      .def_prop_ro("swizzle",
                   [](const QuantizedTensor& q) { return q.scale_layout == ScaleLayout::Swizzled; })
      .def_ro("shape", &QuantizedTensor::shape)
      .def_ro("rows", &QuantizedTensor::rows)
      .def_ro("cols", &QuantizedTensor::cols)
      .def_prop_ro(
          "rowwise_data", [](const QuantizedTensor& q) { return array_or_none(q.rowwise_data); },
          nb::rv_policy::reference)
      .def_prop_ro(
          "rowwise_scale", [](const QuantizedTensor& q) { return array_or_none(q.rowwise_scale); },
          nb::rv_policy::reference)
      .def_prop_ro(
          "columnwise_data", [](const QuantizedTensor& q) { return array_or_none(q.columnwise_data); },
          nb::rv_policy::reference)
      .def_prop_ro(
          "columnwise_scale", [](const QuantizedTensor& q) { return array_or_none(q.columnwise_scale); },
          nb::rv_policy::reference)
      .def_prop_ro("rowwise_amax",
                   [](const QuantizedTensor& q) -> std::optional<float> {
                     if (q.scheme != Scheme::NVFP4 || !q.has(Usage::Rowwise)) return std::nullopt;
                     return q.rowwise_amax;
                   })
      .def_prop_ro("columnwise_amax",
                   [](const QuantizedTensor& q) -> std::optional<float> {
                     if (q.scheme != Scheme::NVFP4 || !q.has(Usage::Columnwise)) return std::nullopt;
                     return q.columnwise_amax;
                   })
      .def_prop_ro(
          "rowwise_amaxes", [](const QuantizedTensor& q) { return array_or_none(q.rowwise_amaxes); },
          nb::rv_policy::reference)
      .def_prop_ro(
          "columnwise_amaxes", [](const QuantizedTensor& q) { return array_or_none(q.columnwise_amaxes); },
          nb::rv_policy::reference);

  m.def(
      "quantize",
      [](const AnyArray& x, const QuantizeOptions& options, bool reference) {
        const TensorView input = view_of(x, "quantize input");
        if (input.device != Device::CPU)
          throw Error(
              "quantize: the input is in CUDA memory; the Python frontend takes CPU arrays only for now");
        nb::gil_scoped_release released;  // the fast path runs its own threads
        return reference ? quantize_ref(input, options) : microscale::quantize(input, options);
      },
      nb::arg("x"), nb::arg("options"), nb::arg("reference") = false,
      "Quantizes a CPU array (f32/bf16/f16, N-D, any strides); reference=True runs the plain-loop path.");

  m.def(
      "dequantize",
      [](const QuantizedTensor& q, const std::string& usage, const std::string& dtype) {
        const Usage u = parse_usage(usage);
        const DType out = parse_float_dtype(dtype);
        Tensor t;
        {
          nb::gil_scoped_release released;
          t = microscale::dequantize(q, u, out);
        }
        return to_array(std::move(t));
      },
      nb::arg("q"), nb::arg("usage") = "rowwise", nb::arg("dtype") = "float32",
      "One usage back to float32/bfloat16/float16 (NVFP4 columnwise: X^T).");

  m.def(
      "quantized_tensor", &quantized_from_arrays, nb::arg("shape"), nb::arg("options"),
      nb::arg("rowwise_data").none(), nb::arg("rowwise_scale").none(), nb::arg("columnwise_data").none(),
      nb::arg("columnwise_scale").none(), nb::arg("rowwise_amax") = 0.0f, nb::arg("columnwise_amax") = 0.0f,
      nb::arg("rowwise_amaxes").none() = nb::none(), nb::arg("columnwise_amaxes").none() = nb::none(),
      "A QuantizedTensor from host uint8 arrays (copied) shaped as quantized_shapes(shape, options) gives.");

  m.def(
      "quantized_shapes",
      [](const std::vector<int64_t>& shape, const QuantizeOptions& options) {
        const QuantizedShapes s = microscale::quantized_shapes(shape, options);
        nb::dict d;
        d["rowwise_data"] = s.rowwise_data;
        d["rowwise_scale"] = s.rowwise_scale;
        d["columnwise_data"] = s.columnwise_data;
        d["columnwise_scale"] = s.columnwise_scale;
        return d;
      },
      nb::arg("shape"), nb::arg("options"), "The u8 output shapes quantize() gives (empty: not asked for).");

  m.def("release_cached_host_memory", &microscale::release_cached_host_memory,
        "Frees the large host buffers (1 MiB or more, at most 512 MiB) that results left behind for reuse; "
        "returns "
        "the bytes freed. Arrays still alive keep theirs.");
}

}  // namespace microscale::python
