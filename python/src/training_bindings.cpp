// Training for Python: the recipes (TransformerEngine's names), the quantize options they give
// per tensor role, and the quantized Linear's forward / backward as functions; the PyTorch
// module (python/microscale/torch) holds the parameters and the autograd state.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "array_bridge.hpp"
#include "bindings.hpp"
#include "microscale/error.hpp"
#include "microscale/linear.hpp"
#include "microscale/recipe.hpp"

namespace microscale::python {
namespace {

TensorRole parse_role(const std::string& name) {
  if (name == "input") return TensorRole::Input;
  if (name == "weight") return TensorRole::Weight;
  if (name == "grad_output") return TensorRole::GradOutput;
  throw Error("unknown tensor role '" + name + "' (input, weight, grad_output)");
}

TensorView cpu_view(const AnyArray& a, const char* what) {
  TensorView v = view_of(a, what);
  if (v.device != Device::CPU) throw Error(std::string(what) + ": the Linear runs on the CPU only for now");
  return v;
}

// backward_override as TransformerEngine's recipes spell it: None, "high_precision" or "dequantized".
BackwardOverride override_from_python(const std::optional<std::string>& name) {
  if (!name) return BackwardOverride::None;
  for (const BackwardOverride o : {BackwardOverride::HighPrecision, BackwardOverride::Dequantized}) {
    if (*name == backward_override_name(o)) return o;
  }
  throw Error("unknown backward_override '" + *name + "' (None, 'high_precision', 'dequantized')");
}
std::optional<std::string> override_to_python(BackwardOverride o) {
  if (o == BackwardOverride::None) return std::nullopt;
  return std::string(backward_override_name(o));
}
std::string override_repr(BackwardOverride o) {
  return o == BackwardOverride::None ? "None" : "'" + std::string(backward_override_name(o)) + "'";
}

}  // namespace

void bind_training(nb::module_& m) {
  nb::enum_<MXFP8BlockScaling::Fp8Format>(m, "Format",
                                          "MXFP8 element formats: E4M3 everywhere, or HYBRID "
                                          "(E4M3 forward, E5M2 gradients)")
      .value("E4M3", MXFP8BlockScaling::Fp8Format::E4M3)
      .value("HYBRID", MXFP8BlockScaling::Fp8Format::HYBRID);

  nb::class_<NVFP4BlockScaling>(m, "NVFP4BlockScaling",
                                "TransformerEngine's NVFP4 recipe: inputs 1x16 with the RHT on columnwise, "
                                "weights 16x16, gradients 1x16 with the RHT and stochastic rounding.")
      .def(
          "__init__",
          [](NVFP4BlockScaling* self, bool disable_rht, bool disable_stochastic_rounding,
             bool disable_2d_quantization, const std::optional<std::string>& backward_override,
             const std::string& nvfp4_4over6, const std::string& nvfp4_4over6_e4m3_use_256,
             const std::string& nvfp4_4over6_err_mode, bool row_scaled_activation,
             bool nvfp4_4over6_err_use_fast_math) {
            new (self) NVFP4BlockScaling(NVFP4BlockScaling::Options{
                disable_rht, disable_stochastic_rounding, disable_2d_quantization,
                override_from_python(backward_override), parse_nvfp4_scope(nvfp4_4over6),
                parse_nvfp4_scope(nvfp4_4over6_e4m3_use_256),
                parse_four_over_six_err_mode(nvfp4_4over6_err_mode), row_scaled_activation,
                nvfp4_4over6_err_use_fast_math});
          },
          nb::kw_only(), nb::arg("disable_rht") = false, nb::arg("disable_stochastic_rounding") = false,
          nb::arg("disable_2d_quantization") = false, nb::arg("backward_override").none() = nb::none(),
          nb::arg("nvfp4_4over6") = "none", nb::arg("nvfp4_4over6_e4m3_use_256") = "all",
          nb::arg("nvfp4_4over6_err_mode") = "MAE", nb::arg("row_scaled_activation") = false,
          nb::arg("nvfp4_4over6_err_use_fast_math") = false)
      .def_prop_ro("disable_rht", &NVFP4BlockScaling::disable_rht)
      .def_prop_ro("disable_stochastic_rounding", &NVFP4BlockScaling::disable_stochastic_rounding)
      .def_prop_ro("disable_2d_quantization", &NVFP4BlockScaling::disable_2d_quantization)
      .def_prop_ro("backward_override",
                   [](const NVFP4BlockScaling& r) { return override_to_python(r.backward_override()); })
      .def_prop_ro("row_scaled_activation", &NVFP4BlockScaling::row_scaled_activation)
      .def_prop_ro("nvfp4_4over6_err_use_fast_math", &NVFP4BlockScaling::four_over_six_scaled_error)
      .def_prop_ro("nvfp4_4over6",
                   [](const NVFP4BlockScaling& r) { return nvfp4_scope_name(r.four_over_six()); })
      .def_prop_ro(
          "nvfp4_4over6_e4m3_use_256",
          [](const NVFP4BlockScaling& r) { return nvfp4_scope_name(r.four_over_six_e4m3_use_256()); })
      .def_prop_ro(
          "nvfp4_4over6_err_mode",
          [](const NVFP4BlockScaling& r) { return four_over_six_err_mode_name(r.four_over_six_err_mode()); })
      .def("__repr__", [](const NVFP4BlockScaling& r) {
        return std::string("NVFP4BlockScaling(disable_rht=") + (r.disable_rht() ? "True" : "False") +
               ", disable_stochastic_rounding=" + (r.disable_stochastic_rounding() ? "True" : "False") +
               ", disable_2d_quantization=" + (r.disable_2d_quantization() ? "True" : "False") +
               ", backward_override=" + override_repr(r.backward_override()) +
               ", row_scaled_activation=" + (r.row_scaled_activation() ? "True" : "False") +
               ", nvfp4_4over6='" + nvfp4_scope_name(r.four_over_six()) + "', nvfp4_4over6_e4m3_use_256='" +
               nvfp4_scope_name(r.four_over_six_e4m3_use_256()) + "', nvfp4_4over6_err_mode='" +
               (four_over_six_err_mode_name(r.four_over_six_err_mode())) + "'" +
               // (shown when on only; TE has it as NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH, not a field)
               (r.four_over_six_scaled_error() ? ", nvfp4_4over6_err_use_fast_math=True" : "") + ")";
      });

  nb::class_<MXFP8BlockScaling>(m, "MXFP8BlockScaling",
                                "TransformerEngine's MXFP8 recipe: blocks of 32, E8M0 scales (RCEIL), "
                                "round to nearest; enable_2d_quantization: weights in 32x32 tiles.")
      .def(
          "__init__",
          [](MXFP8BlockScaling* self, MXFP8BlockScaling::Fp8Format fp8_format,
             const std::optional<std::string>& backward_override, bool enable_2d_quantization) {
            new (self) MXFP8BlockScaling(fp8_format, override_from_python(backward_override),
                                         enable_2d_quantization);
          },
          nb::kw_only(), nb::arg("fp8_format") = MXFP8BlockScaling::Fp8Format::E4M3,
          nb::arg("backward_override").none() = nb::none(), nb::arg("enable_2d_quantization") = false)
      .def_prop_ro("fp8_format", &MXFP8BlockScaling::fp8_format)
      .def_prop_ro("enable_2d_quantization", &MXFP8BlockScaling::enable_2d_quantization)
      .def_prop_ro("backward_override",
                   [](const MXFP8BlockScaling& r) { return override_to_python(r.backward_override()); })
      .def("__repr__", [](const MXFP8BlockScaling& r) {
        return std::string("MXFP8BlockScaling(fp8_format=Format.") +
               (r.fp8_format() == MXFP8BlockScaling::Fp8Format::HYBRID ? "HYBRID" : "E4M3") +
               ", backward_override=" + override_repr(r.backward_override()) +
               ", enable_2d_quantization=" + (r.enable_2d_quantization() ? "True" : "False") + ")";
      });

  nb::class_<HighPrecision>(m, "HighPrecision", "No quantization: fp32 GEMMs on the inputs.")
      .def(nb::init<>())
      .def("__repr__", [](const HighPrecision&) { return std::string("HighPrecision()"); });

  m.def(
      "recipe_name", [](const Recipe& r) { return std::string(microscale::recipe_name(r)); },
      nb::arg("recipe"));

  m.def(
      "quantize_options",
      [](const Recipe& recipe, const std::string& role, uint64_t sr_seed, uint64_t sr_offset) {
        return microscale::quantize_options(recipe, parse_role(role), StochasticRounding{sr_seed, sr_offset});
      },
      nb::arg("recipe"), nb::arg("role"), nb::arg("sr_seed") = 0, nb::arg("sr_offset") = 0,
      "How the recipe quantizes a tensor of this role (both usages); None for HighPrecision.");

  nb::class_<LinearSaved>(m, "LinearContext", "What linear_forward keeps for linear_backward.")
      .def_prop_ro("recipe_name", [](const LinearSaved& s) {
        return std::string(s.recipe ? microscale::recipe_name(*s.recipe) : "none");
      });

  m.def(
      "linear_forward",
      [](const AnyArray& x, const AnyArray& weight, std::optional<AnyArray> bias, const Recipe& recipe,
         bool training, const QuantizedTensor* cached_weight, bool weight_grad) {
        const TensorView xv = cpu_view(x, "linear input"), wv = cpu_view(weight, "linear weight");
        std::optional<TensorView> bv;
        if (bias) bv = cpu_view(*bias, "linear bias");
        std::optional<LinearSaved> saved;
        if (training) saved.emplace();
        Tensor y;
        {
          nb::gil_scoped_release released;
          y = microscale::linear_forward(xv, wv, bv, recipe, saved ? &*saved : nullptr, cached_weight,
                                         weight_grad);
        }
        return std::make_pair(to_array(std::move(y)), std::move(saved));
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("recipe"), nb::arg("training") = true,
      nb::arg("cached_weight").none() = nb::none(), nb::arg("weight_grad") = true,
      "y = x W^T (+ b) under the recipe; returns (y, context for linear_backward or None). weight_grad=False "
      "(a frozen weight) keeps nothing for dW.");

  m.def(
      "linear_backward",
      [](const AnyArray& grad_output, const LinearSaved& saved, bool compute_grad_input,
         bool compute_grad_bias, std::optional<nb::ndarray<>> main_grad, uint64_t sr_seed, uint64_t sr_offset,
         bool compute_grad_weight) {
        LinearBackwardOptions o;
        o.compute_grad_input = compute_grad_input;
        o.compute_grad_weight = compute_grad_weight;
        o.compute_grad_bias = compute_grad_bias;
        o.stochastic_rounding = StochasticRounding{sr_seed, sr_offset};
        if (main_grad) {
          o.main_grad = view_of_output(*main_grad, "main_grad");
          if (o.main_grad->device != Device::CPU)
            throw Error("main_grad: the Linear runs on the CPU only for now");
        }
        const TensorView dy = cpu_view(grad_output, "linear grad_output");
        LinearGrads g;
        {
          nb::gil_scoped_release released;
          g = microscale::linear_backward(dy, saved, o);
        }
        return std::make_tuple(array_or_none(std::move(g.grad_input)),
                               array_or_none(std::move(g.grad_weight)),
                               array_or_none(std::move(g.grad_bias)));
      },
      nb::arg("grad_output"), nb::arg("context"), nb::arg("compute_grad_input") = true,
      nb::arg("compute_grad_bias") = true, nb::arg("main_grad").none() = nb::none(), nb::arg("sr_seed") = 0,
      nb::arg("sr_offset") = 0, nb::arg("compute_grad_weight") = true,
      "(dx, dW, db) of linear_forward (None for what was not asked for); with main_grad (float32 [N, K]) dW "
      "is added there and None returned.");
}

}  // namespace microscale::python
