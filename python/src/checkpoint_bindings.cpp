// Checkpoints for Python: the CLI's `microscale quantize` as a function (microscale/checkpoint.hpp's
// convert_checkpoint, returning its per-tensor report), and the quantized weights of a checkpoint
// in any supported convention, dequantized (read_quantized_weights, what `inspect` reads).
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <string>
#include <vector>

#include "array_bridge.hpp"
#include "bindings.hpp"
#include "microscale/checkpoint.hpp"

namespace microscale::python {
namespace {

nb::dict report_dict(const TensorReport& r) {
  nb::dict d;
  d["name"] = r.name;
  d["shape"] = r.shape;
  d["dtype"] = r.dtype;
  d["quantized"] = r.quantized;
  d["kept_because"] = r.kept_because;
  d["sqnr_db"] = r.sqnr_db;
  d["max_abs_error"] = r.max_abs_error;
  d["bytes_before"] = r.bytes_before;
  d["bytes_after"] = r.bytes_after;
  return d;
}

nb::list convert(const std::string& input, const std::string& output_dir, const std::string& format,
                 const std::string& convention, const std::vector<std::string>& skip,
                 const std::vector<std::string>& only, bool default_skips, const std::string& scale_mode,
                 const std::string& calibration, int num_threads, const std::string& four_over_six,
                 bool four_over_six_scaled_error, int nvfp4_e4m3_max, nb::object progress) {
  ConvertOptions o = convert_options(input, format, convention, scale_mode);
  o.four_over_six = parse_four_over_six(four_over_six);
  o.four_over_six_scaled_error = four_over_six_scaled_error;
  o.nvfp4_e4m3_max = nvfp4_e4m3_max;
  if (!default_skips) o.rules.skip.clear();
  o.rules.skip.insert(o.rules.skip.end(), skip.begin(), skip.end());
  o.rules.only = only;
  o.calibration = calibration;
  o.num_threads = num_threads;
  if (!progress.is_none()) {
    // Called on this thread between tensors, with the GIL released around the conversion: take it
    // back for the call. A Python exception from it ends the conversion, which removes its files.
    o.progress = [progress](size_t done, size_t total, const TensorReport& r) {
      nb::gil_scoped_acquire gil;
      progress(done, total, report_dict(r));
    };
  }
  std::vector<TensorReport> reports;
  {
    nb::gil_scoped_release released;
    reports = convert_checkpoint(input, output_dir, o);
  }
  nb::list out;
  for (const TensorReport& r : reports) out.append(report_dict(r));
  return out;
}

nb::list quantized_weights(const std::string& path) {
  std::vector<DetectedWeight> weights;
  {
    nb::gil_scoped_release released;
    weights = read_quantized_weights(Checkpoint::open(path));
  }
  nb::list out;
  for (DetectedWeight& w : weights) {
    nb::dict d;
    d["name"] = w.name;
    d["format"] = checkpoint_format_name(w.format);
    d["convention"] = convention_name(w.convention);
    d["values"] = to_array(std::move(w.values));
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  m.def(
      "read_quantized_weights", &quantized_weights, nb::arg("path"),
      "The quantized weights of a checkpoint (a file or a model directory) in any supported convention, "
      "each a dict: name (the original weight's), format, convention, values (float32, the original shape).");
  m.def("convert_checkpoint", &convert, nb::arg("input"), nb::arg("output_dir"), nb::kw_only(),
        nb::arg("format"), nb::arg("convention") = "", nb::arg("skip") = std::vector<std::string>{},
        nb::arg("only") = std::vector<std::string>{}, nb::arg("default_skips") = true,
        nb::arg("scale_mode") = "", nb::arg("calibration") = "", nb::arg("num_threads") = 0,
        nb::arg("four_over_six") = "off", nb::arg("four_over_six_scaled_error") = false,
        nb::arg("nvfp4_e4m3_max") = 448, nb::arg("progress").none() = nb::none(),
        "Converts a safetensors checkpoint (a file or a model directory) into `output_dir` in a serving "
        "convention, as `microscale quantize` does; returns one dict per input tensor (name, shape, dtype, "
        "quantized, kept_because, sqnr_db, max_abs_error, bytes_before, bytes_after).");
}

}  // namespace microscale::python
