// The block-scaled GEMM for Python: operands from a QuantizedTensor, from raw codes and scales
// (e.g. the GPU MODE NVFP4 interface) or dense arrays, and D = alpha * A B^T [+ beta C] [+ bias]
// on the CPU backend (microscale/gemm.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "array_bridge.hpp"
#include "bindings.hpp"
#include "microscale/error.hpp"
#include "microscale/gemm.hpp"

namespace microscale::python {
namespace {

// A GemmOperand and what keeps the memory of its views alive: the arrays it was made from
// (their DLPack imports hold the producers' buffers) or the QuantizedTensor object.
struct PyGemmOperand {
  GemmOperand op;
  std::vector<AnyArray> arrays;
  nb::object quantized;
};

PyGemmOperand from_quantized(nb::object q, const std::string& usage) {
  PyGemmOperand p;
  p.op = GemmOperand::from(nb::cast<const QuantizedTensor&>(q), parse_usage(usage));
  p.quantized = std::move(q);
  return p;
}

PyGemmOperand dense_operand(const AnyArray& x) {
  PyGemmOperand p;
  p.op = GemmOperand::from_dense(view_of(x, "dense GEMM operand"));
  p.arrays.push_back(x);
  return p;
}

PyGemmOperand raw_operand(const std::string& scheme, const AnyArray& data, const AnyArray& scales,
                          bool swizzle, std::optional<float> amax, bool stored_transposed, int nvfp4_e4m3_max,
                          const std::optional<AnyArray>& row_amaxes) {
  PyGemmOperand p;
  p.op.quantized = true;
  p.op.scheme = parse_scheme(scheme);
  p.op.data = view_of(data, "GEMM operand data");
  p.op.scales = view_of(scales, "GEMM operand scales");
  p.op.scale_layout = swizzle ? ScaleLayout::Swizzled : ScaleLayout::Compact;
  p.op.amax = amax;
  p.op.stored_transposed = stored_transposed;
  p.op.nvfp4_e4m3_max = nvfp4_e4m3_max;
  p.arrays = {data, scales};
  if (row_amaxes) {
    p.op.row_amaxes = view_of(*row_amaxes, "GEMM operand row_amaxes");
    p.arrays.push_back(*row_amaxes);
  }
  return p;
}

ResultArray run_gemm(const PyGemmOperand& a, const PyGemmOperand& b, float alpha, float beta,
                     std::optional<AnyArray> c, std::optional<AnyArray> bias, const std::string& out_dtype) {
  GemmProblem problem;
  problem.alpha = alpha;
  problem.beta = beta;
  if (c) problem.c = view_of(*c, "C");
  if (bias) problem.bias = view_of(*bias, "bias");
  problem.out_dtype = parse_float_dtype(out_dtype);
  Tensor d;
  {
    nb::gil_scoped_release released;
    d = gemm(a.op, b.op, problem);
  }
  return to_array(std::move(d));
}

}  // namespace

void bind_gemm(nb::module_& m) {
  nb::class_<PyGemmOperand>(m, "GemmOperand",
                            "One operand of gemm, a logical [rows, K] (or [rows, K, L]) matrix, K the "
                            "contraction (and blocked) dimension; keeps its memory alive.")
      .def_static("from_quantized", &from_quantized, nb::arg("q"), nb::arg("usage") = "rowwise",
                  "A QuantizedTensor's rowwise ([M, K]) or columnwise output (NVFP4: X^T [K, M]; MX: read "
                  "as the transpose [K, M]).")
      .def_static("dense", &dense_operand, nb::arg("x"), "A float32/bfloat16/float16 array [rows, K(, L)].")
      .def_static("quantized", &raw_operand, nb::arg("scheme"), nb::arg("data"), nb::arg("scales"),
                  nb::kw_only(), nb::arg("swizzle") = false, nb::arg("amax") = nb::none(),
                  nb::arg("stored_transposed") = false, nb::arg("nvfp4_e4m3_max") = 448,
                  nb::arg("row_amaxes").none() = nb::none(),
                  "Codes [rows, K] (FP4: [rows, K/2]) and block scales (compact [rows, K/block] or, "
                  "swizzle=True, the 128x4 layout), optionally with a batch dim L last; amax: NVFP4's "
                  "global amax (None: the scales carry everything, as GPU MODE's interface); nvfp4_e4m3_max: "
                  "its bound, 448 or 256 (4over6), S_enc = 6 * bound / amax; row_amaxes: a row-scaled NVFP4 "
                  "operand's float32 [rows] global amaxes, in place of amax.")
      .def_prop_ro("is_quantized", [](const PyGemmOperand& p) { return p.op.quantized; });

  m.def("gemm", &run_gemm, nb::arg("a"), nb::arg("b"), nb::arg("alpha") = 1.0f, nb::arg("beta") = 0.0f,
        nb::arg("c").none() = nb::none(), nb::arg("bias").none() = nb::none(),
        nb::arg("out_dtype") = "float32",
        "D = alpha * A B^T (+ beta C) (+ bias) on the CPU: blocks dequantized exactly, fp32 accumulation.");
}

}  // namespace microscale::python
