// microscale::cuda::gemm: the operands and epilogue tensors checked on the host (device memory,
// shapes, strides, alignment), then one of the three paths launched: the fused kernel
// (src/cuda/gemm_nvfp4.cu), a skinny kernel for few rows of A (src/cuda/gemm_nvfp4_skinny.cu,
// src/cuda/gemm_mx_skinny.cu) or the expanded path (src/cuda/gemm_expanded.cu). The numerics are
// core/gemm.cpp's: D = alpha' * sum over blocks (sa * sb * sum a*b) [+ beta C]
// [+ bias], fp32 accumulation, alpha' folding in the NVFP4 global amaxes.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/view_extent.hpp"
#include "cuda/gemm_expanded.hpp"
#include "cuda/gemm_mx_skinny.hpp"
#include "cuda/gemm_nvfp4.hpp"
#include "cuda/gemm_nvfp4_skinny.hpp"
#include "cuda/gemm_split.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"
#include "microscale/layout.hpp"

namespace microscale::cuda {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error("cuda::gemm: " + message);
}

// Checks a block-scaled operand [rows, K(, L)] on the device (what both paths read); returns
// it with its rows, K and batches.
GemmDeviceOperand device_operand(const GemmOperand& op, const float* device_amax, const char* name,
                                 int64_t& rows, int64_t& k, int64_t& batches) {
  const std::string who = std::string("operand ") + name;
  require(op.quantized, who + " must be block-scaled (dense operands run on the CPU)");
  const bool nvfp4 = op.scheme == Scheme::NVFP4;
  require(!(nvfp4 && op.stored_transposed), who + ": NVFP4 data is K-major, never stored transposed");
  const TensorView& d = op.data;
  const TensorView& s = op.scales;
  require(d.device == Device::CUDA && s.device == Device::CUDA, who + " data and scales must be CUDA memory");
  require(d.dtype == DType::U8 && s.dtype == DType::U8, who + " data and scales must be u8");
  require(d.data != nullptr && s.data != nullptr, who + " has a null pointer");
  require(d.ndim() == 2 || d.ndim() == 3,
          who + " data must be 2-D or 3-D (stored rows, their bytes(, L)), got " + shape_string(d.shape));
  const std::vector<int64_t> ds = d.effective_strides();
  const int64_t per_byte = element_format(op.scheme) == Format::E2M1 ? 2 : 1;
  const int64_t stored_rows = d.shape[0], stored_cols = d.shape[1] * per_byte;
  rows = op.stored_transposed ? stored_cols : stored_rows;
  k = op.stored_transposed ? stored_rows : stored_cols;
  batches = d.ndim() == 3 ? d.shape[2] : 1;
  require(rows > 0 && k > 0 && batches > 0, who + " is empty: " + shape_string(d.shape));
  const int64_t block = block_size(op.scheme);
  require(k % block == 0, who + ": K = " + std::to_string(k) + " is not a multiple of the block size " +
                              std::to_string(block));
  require(ds[1] == 1 && ds[0] > 0 && (batches == 1 || ds[2] > 0),
          who + " data must have contiguous rows and positive strides (strides " + shape_string(ds) + ")");
  GemmDeviceOperand out;
  out.scheme = op.scheme;
  out.stored_transposed = op.stored_transposed;
  out.data = static_cast<const uint8_t*>(d.data);
  out.row_bytes = ds[0];
  out.batch_bytes = batches > 1 ? ds[2] : 0;
  out.scales = static_cast<const uint8_t*>(s.data);
  out.swizzled = op.scale_layout == ScaleLayout::Swizzled;
  const int64_t scale_cols = k / block;
  if (out.swizzled) {
    const int64_t image = swizzled_rows(rows) * swizzled_cols(scale_cols);
    require(s.is_contiguous() && s.numel() == batches * image,
            who + " swizzled scales must be contiguous, " + std::to_string(batches * image) + " bytes");
    out.scale_batch_bytes = image;
  } else {
    std::vector<int64_t> want = op.stored_transposed ? std::vector<int64_t>{scale_cols, rows}
                                                     : std::vector<int64_t>{rows, scale_cols};
    if (d.ndim() == 3) want.push_back(batches);
    require(s.shape == want,
            who + " compact scales are " + shape_string(s.shape) + ", expected " + shape_string(want));
    const std::vector<int64_t> ss = s.effective_strides();
    require(ss[1] == 1 && ss[0] > 0 && (batches == 1 || ss[2] > 0),
            who + " compact scales must have contiguous rows and positive strides (strides " +
                shape_string(ss) + ")");
    out.scale_row_bytes = ss[0];
    out.scale_batch_bytes = batches > 1 ? ss[2] : 0;
  }
  require(!(op.amax && device_amax), who + " has both a host amax and a device amax");
  require(
      op.row_amaxes.data == nullptr,
      who +
          ": the CUDA GEMM takes no row-scaled operand: run it with unit amaxes into fp32 and scale its "
          "output by the row amaxes (as the torch frontend's gemm does, TransformerEngine's general_gemm)");
  require(nvfp4 || !(op.amax || device_amax), who + ": only NVFP4 operands carry an amax");
  if (op.amax) {
    require(std::isfinite(*op.amax) && *op.amax >= 0.0f, who + ": amax must be finite and >= 0");
    out.has_amax = true;
    out.amax_value = *op.amax;
  } else if (device_amax) {
    out.has_amax = true;
    out.amax = device_amax;
  }
  require(
      op.nvfp4_e4m3_max == 448 || (out.has_amax && op.nvfp4_e4m3_max == 256),
      who +
          ": nvfp4_e4m3_max must be 448, or 256 for an NVFP4 operand with an amax (its global scale); got " +
          std::to_string(op.nvfp4_e4m3_max));
  out.e4m3_max = op.nvfp4_e4m3_max;
  return out;
}

bool is_mxfp8(Scheme scheme) { return scheme == Scheme::MXFP8_E4M3 || scheme == Scheme::MXFP8_E5M2; }

// What the fused and skinny kernels need beyond device_operand: rows of codes 16-byte aligned
// (their cp.async copies); compact scale rows on 4-byte boundaries or 16-byte aligned swizzled
// images (the fused kernel's copies), 2-byte boundaries for both (the skinny kernels read a
// thread's two block scales as one 16-bit word). The MX skinny kernel also
// needs K-major MXFP8 codes, compact scale rows of an even number of scales (it reads a chunk's
// two as one word) and a batch's codes and scales within 2 GiB (its 32-bit offsets).
// Empty when `op` (of `rows` rows) has them, else the reason.
std::string kernel_layout_problem(const GemmDeviceOperand& op, int64_t rows, int64_t k, bool skinny) {
  const bool mx = op.scheme != Scheme::NVFP4;  // only the skinny kernel reads MX (route)
  if (mx && !is_mxfp8(op.scheme))
    return std::string("the skinny path reads MXFP8 codes (E4M3, E5M2), not ") +
           std::string(scheme_name(op.scheme));
  if (mx && op.stored_transposed)
    return "MX codes stored transposed (a columnwise output) run on the expanded path";
  if (mx && !op.swizzled && (k / 32) % 2 != 0)
    return "compact MX scale rows of an odd number of scales (K % 64 = 32) run on the expanded path";
  if (mx) {
    const int64_t code_span = (rows - 1) * op.row_bytes + k;
    const int64_t scale_span =
        op.swizzled ? swizzled_rows(rows) * swizzled_cols(k / 32) : (rows - 1) * op.scale_row_bytes + k / 32;
    if (code_span > INT32_MAX || scale_span > INT32_MAX)
      return "a batch of codes or scales over 2 GiB runs on the expanded path";
  }
  if (op.row_bytes % 16 != 0 || op.batch_bytes % 16 != 0 || !aligned(op.data, 16))
    return "rows of codes must start 16-byte aligned";
  const int64_t scale_alignment = skinny ? 2 : op.swizzled ? 16 : 4;
  if (op.swizzled && !aligned(op.scales, scale_alignment))
    return "swizzled scales must be " + std::to_string(scale_alignment) + "-byte aligned";
  if (!op.swizzled && (op.scale_row_bytes % scale_alignment != 0 ||
                       op.scale_batch_bytes % scale_alignment != 0 || !aligned(op.scales, scale_alignment)))
    return "compact scale rows must start on " + std::to_string(scale_alignment) + "-byte boundaries";
  return {};
}

// A 2-D or 3-D epilogue tensor [M, N(, L)] on the device.
EpilogueTensor epilogue_tensor(const TensorView& v, const std::vector<int64_t>& want, const char* what) {
  require(v.device == Device::CUDA && v.data != nullptr, std::string(what) + " must be CUDA memory");
  require(v.dtype == DType::F32 || v.dtype == DType::BF16 || v.dtype == DType::F16,
          std::string(what) + " must be f32, bf16 or f16");
  require(v.shape == want,
          std::string(what) + " is " + shape_string(v.shape) + ", expected " + shape_string(want));
  const std::vector<int64_t> s = v.effective_strides();
  for (int64_t x : s) require(x > 0, std::string(what) + " must have positive strides");
  require(aligned(v.data, static_cast<int64_t>(dtype_size(v.dtype))), std::string(what) + " is misaligned");
  EpilogueTensor e;
  e.data = v.data;
  e.dtype = v.dtype;
  for (size_t i = 0; i < s.size(); ++i) e.strides[i] = s[i];
  return e;
}

// The largest element offset a view reaches (its strides are positive: epilogue_tensor).
int64_t reach_of(const TensorView& v, const char* what) {
  const std::optional<int64_t> reach = last_element_offset(v);
  require(reach.has_value(),
          std::string(what) + " has strides " + shape_string(v.effective_strides()) + " out of range");
  return *reach;
}

// C is read and D written by different threads: C must be D itself (each element read, then
// written, by one thread) or lie apart from D's bytes.
void require_c_apart_from_d(const TensorView& c, const TensorView& d) {
  if (c.data == d.data && c.dtype == d.dtype && c.effective_strides() == d.effective_strides()) return;
  const auto first = [](const TensorView& v) { return reinterpret_cast<uintptr_t>(v.data); };
  const auto last = [](const TensorView& v, int64_t reach) {
    return reinterpret_cast<uintptr_t>(v.data) + static_cast<uintptr_t>(reach + 1) * dtype_size(v.dtype);
  };
  const uintptr_t c_end = last(c, reach_of(c, "C")), d_end = last(d, reach_of(d, "D"));
  require(c_end <= first(d) || d_end <= first(c), "C overlaps D without being D itself");
}

// The kernel a GEMM runs on.
enum class Route { Fused, Skinny, Expanded };

// The route of `path` for an operand pair whose A is of `scheme`. The fused kernel takes NVFP4
// pairs whose K is a multiple of its K tile, the skinny ones NVFP4 pairs whose K is a multiple of
// 32 and MXFP8 pairs, each only where it can read the layouts (`fused_layouts`, `skinny_layouts`:
// for MX also B's scheme and both orientations). Auto picks a skinny kernel for few rows of A,
// else the fused one or the expanded path by shape (gemm_split.hpp), the fused one where the
// expanded path's int sizes (M, N and K times L below 2^31) would not hold.
Route route(GemmPath path, Scheme scheme, int64_t m, int64_t n, int64_t k, int64_t batches,
            bool fused_layouts = true, bool skinny_layouts = true) {
  const bool nvfp4 = scheme == Scheme::NVFP4;
  const bool fused_takes = nvfp4 && k % kNvfp4GemmK == 0;
  const bool skinny_takes = nvfp4 ? k % kNvfp4SkinnyK == 0 : is_mxfp8(scheme);
  switch (path) {
    case GemmPath::Fused:
      require(fused_takes, "the fused path takes NVFP4 pairs whose K is a multiple of " +
                               std::to_string(kNvfp4GemmK) + " (GemmPath::Expanded or Auto take the rest)");
      return Route::Fused;
    case GemmPath::Skinny:
      require(skinny_takes, "the skinny path takes NVFP4 pairs whose K is a multiple of " +
                                std::to_string(kNvfp4SkinnyK) +
                                " and MXFP8 pairs (GemmPath::Expanded or Auto take the rest)");
      require(skinny_row_steps(m) <= 65535, "too many rows of A for the skinny path");
      return Route::Skinny;
    case GemmPath::Expanded: return Route::Expanded;
    default: break;
  }
  if (skinny_takes && skinny_layouts && m <= kSkinnyMaxRows) return Route::Skinny;
  if (!fused_takes || !fused_layouts) return Route::Expanded;
  return prefer_expanded_gemm(m, n) && std::max({m, n, k}) <= INT_MAX / batches ? Route::Expanded
                                                                                : Route::Fused;
}

}  // namespace

void gemm(const GemmOperand& a, const GemmOperand& b, const GemmProblem& problem, const TensorView& d,
          void* stream, const float* a_amax, const float* b_amax, void* workspace, size_t workspace_bytes,
          GemmPath path) {
  GemmDeviceParams p;
  int64_t m = 0, ka = 0, la = 0, n = 0, kb = 0, lb = 0;
  p.a = device_operand(a, a_amax, "A", m, ka, la);
  p.b = device_operand(b, b_amax, "B", n, kb, lb);
  require(ka == kb, "A is [" + std::to_string(m) + ", " + std::to_string(ka) + "] and B is [" +
                        std::to_string(n) + ", " + std::to_string(kb) + "]: their K differ");
  require(la == lb, "A has " + std::to_string(la) + " batches and B has " + std::to_string(lb));
  require(la <= 65535 && (m + 127) / 128 <= 65535, "too many batches or rows for one launch");
  require(block_size(a.scheme) == block_size(b.scheme), std::string("A and B use different block sizes (") +
                                                            std::string(scheme_name(a.scheme)) + " x " +
                                                            std::string(scheme_name(b.scheme)) + ")");
  std::vector<int64_t> want = {m, n};
  if (la > 1 || d.ndim() == 3) want.push_back(la);
  p.d = epilogue_tensor(d, want, "D");
  reach_of(d, "D");
  require(elements_distinct(d),
          "D has strides " + shape_string(d.effective_strides()) + " that make its elements overlap");
  if (problem.c) {
    p.has_c = true;
    p.c = epilogue_tensor(*problem.c, want, "C");
    require_c_apart_from_d(*problem.c, d);
  }
  if (problem.bias) {
    const TensorView& bias = *problem.bias;
    require(bias.device == Device::CUDA && bias.data != nullptr, "bias must be CUDA memory");
    require(bias.ndim() == 1 && bias.shape[0] == n && bias.is_contiguous(),
            "bias must be a contiguous [N] = [" + std::to_string(n) + "]");
    require(bias.dtype == DType::F32 || bias.dtype == DType::BF16 || bias.dtype == DType::F16,
            "bias must be f32, bf16 or f16");
    require(aligned(bias.data, static_cast<int64_t>(dtype_size(bias.dtype))), "bias is misaligned");
    p.bias = bias.data;
    p.bias_dtype = bias.dtype;
  }
  p.m = m;
  p.n = n;
  p.k = ka;
  p.batches = la;
  p.alpha = problem.alpha;
  p.beta = problem.beta;
  const std::string fused_a = kernel_layout_problem(p.a, m, ka, false);
  const std::string fused_b = kernel_layout_problem(p.b, n, ka, false);
  const std::string skinny_a = kernel_layout_problem(p.a, m, ka, true);
  const std::string skinny_b = kernel_layout_problem(p.b, n, ka, true);
  const Route r = route(path, a.scheme, m, n, ka, la, fused_a.empty() && fused_b.empty(),
                        skinny_a.empty() && skinny_b.empty());
  if (r == Route::Expanded) {
    launch_expanded_gemm(p, static_cast<cudaStream_t>(stream), workspace, workspace_bytes);
    return;
  }
  const bool skinny = r == Route::Skinny;
  const std::string& problem_a = skinny ? skinny_a : fused_a;
  const std::string& problem_b = skinny ? skinny_b : fused_b;
  const std::string kernel = skinny ? " (skinny path): " : " (fused path): ";
  require(problem_a.empty(), "operand A" + kernel + problem_a);
  require(problem_b.empty(), "operand B" + kernel + problem_b);
  if (skinny && a.scheme != Scheme::NVFP4) {
    launch_mx_skinny_gemm(p, static_cast<cudaStream_t>(stream), workspace, workspace_bytes);
  } else if (skinny) {
    launch_nvfp4_skinny_gemm(p, static_cast<cudaStream_t>(stream), workspace, workspace_bytes);
  } else {
    launch_nvfp4_gemm(p, static_cast<cudaStream_t>(stream), workspace, workspace_bytes);
  }
}

size_t gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches, GemmPath path, Scheme scheme) {
  require(m > 0 && n > 0 && k > 0 && batches > 0, "gemm_workspace_bytes: sizes must be positive");
  switch (route(path, scheme, m, n, k, batches)) {
    case Route::Expanded: return expanded_gemm_workspace_bytes(m, n, k, batches);
    case Route::Skinny:
      return scheme == Scheme::NVFP4 ? nvfp4_skinny_workspace_bytes(m, n, k, batches)
                                     : mx_skinny_workspace_bytes(m, n, k, batches);
    default: return nvfp4_gemm_workspace_bytes(m, n, k, batches);
  }
}

}  // namespace microscale::cuda
