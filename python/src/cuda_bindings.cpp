// Device quantization and the block-scaled GEMM for Python, built with the library's CUDA backend
// (microscale/cuda.hpp):
// the caller, the PyTorch frontend, allocates the outputs with its own allocator and passes its
// current stream, so nothing here allocates or synchronizes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "array_bridge.hpp"
#include "bindings.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"

namespace microscale::python {
namespace {

using DeviceArray = std::optional<nb::ndarray<>>;

TensorView device_view(const DeviceArray& a, const char* what) {
  if (!a) return {};
  TensorView v = view_of_output(*a, what);
  if (v.device != Device::CUDA) throw Error(std::string(what) + ": must be in CUDA memory");
  return v;
}

// The floats of a quantization's device amax: 2, or a row-scaled tensor's 2 + M + K
// (cuda::QuantizedViews::amax).
int64_t amax_floats(const std::vector<int64_t>& shape, const QuantizeOptions& options) {
  if (!options.row_scaled) return 2;
  const QuantizedShapes s = quantized_shapes(shape, options);
  return 2 + s.rows + s.cols;
}

// The outputs of a quantization as cuda::QuantizedViews (amax: float32 [amax_floats], or absent
// for MX).
cuda::QuantizedViews device_views(const DeviceArray& rowwise_data, const DeviceArray& rowwise_scale,
                                  const DeviceArray& columnwise_data, const DeviceArray& columnwise_scale,
                                  const DeviceArray& amax, int64_t amax_count) {
  cuda::QuantizedViews out;
  out.rowwise_data = device_view(rowwise_data, "rowwise_data");
  out.rowwise_scale = device_view(rowwise_scale, "rowwise_scale");
  out.columnwise_data = device_view(columnwise_data, "columnwise_data");
  out.columnwise_scale = device_view(columnwise_scale, "columnwise_scale");
  if (amax) {
    const TensorView a = device_view(amax, "amax");
    if (a.dtype != DType::F32 || a.numel() != amax_count || !a.is_contiguous())
      throw Error("amax: must be a contiguous float32 CUDA array of " + std::to_string(amax_count) +
                  " elements");
    out.amax = static_cast<float*>(a.data);
  }
  return out;
}

void* as_stream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

// `options` with the stochastic-rounding seed read from `seed` on the device: a uint64's 8 bytes
// (uint8 [8], 8-byte aligned; from Python, an int64 CUDA tensor's .view(torch.uint8)).
QuantizeOptions with_device_seed(const QuantizeOptions& options, const DeviceArray& seed) {
  if (!seed) return options;
  const TensorView s = device_view(seed, "sr_seed_device");
  if (s.dtype != DType::U8 || s.numel() != 8 || !s.is_contiguous() ||
      reinterpret_cast<uintptr_t>(s.data) % alignof(uint64_t) != 0)
    throw Error(
        "sr_seed_device: must be a uint64's 8 bytes in CUDA memory (a contiguous, 8-byte aligned uint8 "
        "array of 8 elements)");
  if (!options.stochastic_rounding)
    throw Error("sr_seed_device: these options have no stochastic rounding (give them an sr_seed)");
  QuantizeOptions o = options;
  o.stochastic_rounding->device_seed = static_cast<const uint64_t*>(s.data);
  return o;
}

// One block-scaled operand of gemm_cuda: codes and scales in CUDA memory (an MX columnwise output
// stored transposed, as GemmOperand::from gives it).
GemmOperand device_operand(const std::string& scheme, const AnyArray& data, const AnyArray& scales,
                           bool swizzle, bool stored_transposed, int nvfp4_e4m3_max, const char* what) {
  GemmOperand op;
  op.quantized = true;
  op.scheme = parse_scheme(scheme);
  op.data = view_of(data, what);
  op.scales = view_of(scales, what);
  op.scale_layout = swizzle ? ScaleLayout::Swizzled : ScaleLayout::Compact;
  op.stored_transposed = stored_transposed;
  op.nvfp4_e4m3_max = nvfp4_e4m3_max;
  return op;
}

cuda::GemmPath parse_gemm_path(const std::string& path) {
  if (path == "auto") return cuda::GemmPath::Auto;
  if (path == "fused") return cuda::GemmPath::Fused;
  if (path == "skinny") return cuda::GemmPath::Skinny;
  if (path == "expanded") return cuda::GemmPath::Expanded;
  throw Error("unknown GEMM path '" + path + "' (auto, fused, skinny, expanded)");
}

const float* device_amax(const DeviceArray& amax, const char* what) {
  if (!amax) return nullptr;
  const TensorView a = device_view(amax, what);
  if (a.dtype != DType::F32 || a.numel() < 1)
    throw Error(std::string(what) + ": must be a float32 CUDA array");
  return static_cast<const float*>(a.data);
}

}  // namespace

void bind_cuda(nb::module_& m) {
  m.def(
      "cuda_built", []() { return true; }, "Whether this build has the CUDA backend.");

  m.def(
      "quantize_cuda",
      [](const AnyArray& x, const QuantizeOptions& options, DeviceArray rowwise_data,
         DeviceArray rowwise_scale, DeviceArray columnwise_data, DeviceArray columnwise_scale,
         DeviceArray amax, uintptr_t stream, DeviceArray sr_seed_device) {
        const TensorView input = view_of(x, "quantize input");
        if (input.device != Device::CUDA) throw Error("quantize_cuda: the input must be in CUDA memory");
        cuda::quantize(input, with_device_seed(options, sr_seed_device),
                       device_views(rowwise_data, rowwise_scale, columnwise_data, columnwise_scale, amax,
                                    amax_floats(input.shape, options)),
                       as_stream(stream));
      },
      nb::arg("x"), nb::arg("options"), nb::arg("rowwise_data").none(), nb::arg("rowwise_scale").none(),
      nb::arg("columnwise_data").none(), nb::arg("columnwise_scale").none(), nb::arg("amax").none(),
      nb::arg("stream"), nb::arg("sr_seed_device").none() = nb::none(),
      "Quantizes a CUDA array into caller-allocated CUDA outputs (uint8, shaped as quantized_shapes "
      "gives; amax float32 [2] for NVFP4, [2 + M + K] row-scaled), asynchronously on `stream` (a "
      "cudaStream_t as an integer). "
      "sr_seed_device: the stochastic-rounding seed as a uint64's 8 bytes in CUDA memory, read when the "
      "kernel runs (CUDA graphs), in place of the options' seed.");

  m.def(
      "dequantize_cuda",
      [](DeviceArray rowwise_data, DeviceArray rowwise_scale, DeviceArray columnwise_data,
         DeviceArray columnwise_scale, DeviceArray amax, const std::vector<int64_t>& shape,
         const QuantizeOptions& options, const std::string& usage, nb::ndarray<> output, uintptr_t stream) {
        const cuda::QuantizedViews q = device_views(rowwise_data, rowwise_scale, columnwise_data,
                                                    columnwise_scale, amax, amax_floats(shape, options));
        cuda::dequantize(q, shape, options, parse_usage(usage), device_view(output, "dequantize output"),
                         as_stream(stream));
      },
      nb::arg("rowwise_data").none(), nb::arg("rowwise_scale").none(), nb::arg("columnwise_data").none(),
      nb::arg("columnwise_scale").none(), nb::arg("amax").none(), nb::arg("shape"), nb::arg("options"),
      nb::arg("usage"), nb::arg("output"), nb::arg("stream"),
      "Dequantizes one usage of quantize_cuda's outputs into a caller-allocated CUDA array.");

  m.def(
      "gemm_cuda",
      [](const AnyArray& a_data, const AnyArray& a_scales, DeviceArray a_amax, bool a_swizzle,
         const AnyArray& b_data, const AnyArray& b_scales, DeviceArray b_amax, bool b_swizzle, float alpha,
         float beta, std::optional<AnyArray> c, std::optional<AnyArray> bias, nb::ndarray<> d,
         uintptr_t stream, DeviceArray workspace, const std::string& path, const std::string& a_scheme,
         bool a_transposed, const std::string& b_scheme, bool b_transposed, int a_e4m3_max, int b_e4m3_max) {
        GemmProblem problem;
        problem.alpha = alpha;
        problem.beta = beta;
        if (c) problem.c = view_of(*c, "C");
        if (bias) problem.bias = view_of(*bias, "bias");
        const TensorView workspace_view = device_view(workspace, "workspace");
        const size_t workspace_bytes =
            workspace ? static_cast<size_t>(workspace_view.numel()) * dtype_size(workspace_view.dtype) : 0;
        cuda::gemm(
            device_operand(a_scheme, a_data, a_scales, a_swizzle, a_transposed, a_e4m3_max, "operand A"),
            device_operand(b_scheme, b_data, b_scales, b_swizzle, b_transposed, b_e4m3_max, "operand B"),
            problem, device_view(d, "D"), as_stream(stream), device_amax(a_amax, "A's amax"),
            device_amax(b_amax, "B's amax"), workspace_view.data, workspace_bytes, parse_gemm_path(path));
      },
      nb::arg("a_data"), nb::arg("a_scales"), nb::arg("a_amax").none(), nb::arg("a_swizzle"),
      nb::arg("b_data"), nb::arg("b_scales"), nb::arg("b_amax").none(), nb::arg("b_swizzle"),
      nb::arg("alpha"), nb::arg("beta"), nb::arg("c").none(), nb::arg("bias").none(), nb::arg("d"),
      nb::arg("stream"), nb::arg("workspace").none() = nb::none(), nb::arg("path") = "auto",
      nb::arg("a_scheme") = "nvfp4", nb::arg("a_transposed") = false, nb::arg("b_scheme") = "nvfp4",
      nb::arg("b_transposed") = false, nb::arg("a_e4m3_max") = 448, nb::arg("b_e4m3_max") = 448,
      "D = alpha * A B^T (+ beta C) (+ bias) for two block-scaled operands of one block size in CUDA memory "
      "(NVFP4 codes [rows, K/2(, L)] with optional device amaxes; MX codes [rows, K] or, a_transposed / "
      "b_transposed, an MX columnwise output [K, rows]; compact or swizzled scales), into the caller's CUDA "
      "array D, on `stream`; a_e4m3_max / b_e4m3_max: an NVFP4 operand's global-scale bound (448, or 256 "
      "for 4over6); workspace: contiguous CUDA memory of gemm_workspace_bytes (else the "
      "stream-ordered pool's); path: 'auto', 'fused', 'skinny' or 'expanded' (cuda::GemmPath).");

  m.def(
      "column_sums_cuda",
      [](const AnyArray& x, nb::ndarray<> out, uintptr_t stream, DeviceArray workspace) {
        const TensorView workspace_view = device_view(workspace, "workspace");
        const size_t workspace_bytes =
            workspace ? static_cast<size_t>(workspace_view.numel()) * dtype_size(workspace_view.dtype) : 0;
        cuda::column_sums(view_of(x, "column_sums input"), device_view(out, "column_sums output"),
                          as_stream(stream), workspace_view.data, workspace_bytes);
      },
      nb::arg("x"), nb::arg("out"), nb::arg("stream"), nb::arg("workspace").none() = nb::none(),
      "out[j] = the float64 sum over the rows of the CUDA array x [rows, cols] of column j, rounded to fp32, "
      "into the caller's contiguous float32 CUDA array out [cols], on `stream` (the Linear's bias "
      "gradient); workspace: contiguous CUDA memory of column_sums_workspace_bytes (else the "
      "stream-ordered pool's).");

  m.def("column_sums_workspace_bytes", &cuda::column_sums_workspace_bytes, nb::arg("rows"), nb::arg("cols"),
        "Bytes of scratch column_sums_cuda uses for an x of [rows, cols].");

  m.def(
      "gemm_workspace_bytes",
      [](int64_t m, int64_t n, int64_t k, int64_t batches, const std::string& path,
         const std::string& scheme) {
        return cuda::gemm_workspace_bytes(m, n, k, batches, parse_gemm_path(path), parse_scheme(scheme));
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("batches") = 1, nb::arg("path") = "auto",
      nb::arg("scheme") = "nvfp4",
      "Bytes of workspace gemm_cuda uses for [M, K] x [N, K]^T operands of `scheme` on the current CUDA "
      "device along `path` (0: none).");
}

}  // namespace microscale::python
