// GPU tests of the CUDA GEMM, NVFP4 and MX (plain main; run by tests/gpu/run.sh on a GPU machine).
//
// The oracle is a float64 sum of the exactly dequantized operands (OperandReader, the CPU GEMM's
// reader), finished with the CPU GEMM's fp32 epilogue. Where every partial sum is exact in fp32
// (scales from {0, 1, 2, 3} as GPU MODE's generator draws them; or only subnormal E4M3 scales),
// the device must match it bit for bit, in every output dtype; elsewhere within the fp32
// accumulation bound K * 2^-23 * sum |a*b|. Also: swizzled scales, batches, ragged M and N, K
// split over several blocks (small grids), host and device amaxes, alpha / beta / C / bias,
// strided and in-place D, operands from quantize() (TE's fprop "TN" and wgrad "NT" operands), and
// each bad argument a microscale::Error. MX pairs run on the expanded path (run_mx_checks) and,
// MXFP8, on the skinny one (run_mx_skinny_checks); NVFP4 with K not a multiple of 64 on the skinny
// and expanded paths, within the bound.
// Exit status = number of failures (capped).
//
// Every other check runs on all three paths (cuda::GemmPath::Fused, ::Skinny and ::Expanded).
// Usage: gemm_gpu_test [--quick] [--kernels-only] | --time M N K [fused|skinny|expanded|auto] [mxfp8]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/operand_access.hpp"
#include "core/view_extent.hpp"
#include "device_buffer.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"
#include "microscale/format.hpp"
#include "microscale/gemm.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"
#include "microscale/quantize.hpp"

using namespace microscale;

namespace {

int g_failures = 0, g_checks = 0;
// Every check runs on each path of cuda::gemm (GemmPath): the fused kernel, the skinny one and the
// expanded path.
cuda::GemmPath g_path = cuda::GemmPath::Fused;
bool g_kernels_only = false;  // --kernels-only: no call may reach cuBLAS (the expanded path)

const char* path_name(cuda::GemmPath path) {
  switch (path) {
    case cuda::GemmPath::Expanded: return "expanded";
    case cuda::GemmPath::Skinny: return "skinny";
    case cuda::GemmPath::Auto: return "auto";
    default: return "fused";
  }
}

void fail(const std::string& what) {
  ++g_failures;
  std::printf("FAIL [%s] %s\n", path_name(g_path), what.c_str());
}

// An NVFP4 operand [rows, K(, L)] in host memory: codes [L][rows][K/2] (viewed [rows, K/2, L] as
// GPU MODE's tensors are) and compact scales [L][rows][K/16], plus the swizzled images.
struct HostOperand {
  int64_t rows = 0, k = 0, batches = 1;
  bool three_d = false;
  std::vector<uint8_t> codes, compact, swizzled;
  std::optional<float> amax;

  std::vector<int64_t> data_shape() const {
    return three_d ? std::vector<int64_t>{rows, k / 2, batches} : std::vector<int64_t>{rows, k / 2};
  }
  std::vector<int64_t> data_strides() const {
    return three_d ? std::vector<int64_t>{k / 2, 1, rows * k / 2} : std::vector<int64_t>{k / 2, 1};
  }
  std::vector<int64_t> scale_shape() const {
    return three_d ? std::vector<int64_t>{rows, k / 16, batches} : std::vector<int64_t>{rows, k / 16};
  }
  std::vector<int64_t> scale_strides() const {
    return three_d ? std::vector<int64_t>{k / 16, 1, rows * k / 16} : std::vector<int64_t>{k / 16, 1};
  }

  // The operand over `data` and `scales` (host or device copies of codes and compact/swizzled).
  GemmOperand view(const void* data, const void* scales, bool swizzle, Device device) const {
    GemmOperand op;
    op.quantized = true;
    op.scheme = Scheme::NVFP4;
    op.data = TensorView{const_cast<void*>(data), DType::U8, data_shape(), data_strides(), device};
    if (swizzle) {
      op.scales = TensorView{
          const_cast<void*>(scales), DType::U8, {static_cast<int64_t>(swizzled.size())}, {}, device};
      op.scale_layout = ScaleLayout::Swizzled;
    } else {
      op.scales = TensorView{const_cast<void*>(scales), DType::U8, scale_shape(), scale_strides(), device};
    }
    op.amax = amax;
    return op;
  }

  void make_swizzled() {
    const int64_t cols = k / 16, image = swizzled_rows(rows) * swizzled_cols(cols);
    swizzled.assign(static_cast<size_t>(batches * image), 0);
    for (int64_t l = 0; l < batches; ++l) {
      const Tensor s = swizzle_scales(TensorView::from_buffer(
          compact.data() + l * rows * cols, static_cast<size_t>(rows * cols), DType::U8, {rows, cols}));
      std::memcpy(swizzled.data() + l * image, s.data(), static_cast<size_t>(image));
    }
  }
};

// Random codes (every byte value) and scales drawn from `scale_codes`.
HostOperand random_operand(int64_t rows, int64_t k, int64_t batches, const std::vector<uint8_t>& scale_codes,
                           std::mt19937_64& rng) {
  HostOperand op;
  op.rows = rows;
  op.k = k;
  op.batches = batches;
  op.three_d = batches > 1;
  op.codes.resize(static_cast<size_t>(batches * rows * k / 2));
  for (auto& c : op.codes) c = static_cast<uint8_t>(rng());
  op.compact.resize(static_cast<size_t>(batches * rows * k / 16));
  for (auto& s : op.compact) s = scale_codes[rng() % scale_codes.size()];
  op.make_swizzled();
  return op;
}

float dtype_round(DType dtype, float v) {
  if (dtype == DType::BF16) return bf16_to_float(float_to_bf16(v));
  if (dtype == DType::F16) return half_to_float(float_to_half(v));
  return v;
}

float read_value(DType dtype, const std::vector<uint8_t>& bytes, int64_t i) {
  if (dtype == DType::F32) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return dtype == DType::BF16 ? bf16_to_float(h) : half_to_float(h);
}

void write_value(DType dtype, std::vector<uint8_t>& bytes, int64_t i, float v) {
  if (dtype == DType::F32) {
    std::memcpy(bytes.data() + 4 * i, &v, 4);
  } else {
    const uint16_t h = dtype == DType::BF16 ? float_to_bf16(v) : float_to_half(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
}

struct Epilogue {
  float alpha = 1.0f, beta = 0.0f;
  bool with_c = false, with_bias = false, in_place = false;
  DType out = DType::F32, c_dtype = DType::F32, bias_dtype = DType::F32;
  int64_t d_row_pad = 0;  // D's row stride is N + d_row_pad
  bool amax_on_device = false;
  bool workspace = false;  // pass cuda::gemm a workspace (else a split K takes the stream's pool)
};

// Scale layouts of the two operands (each its own kernel instantiation).
struct Layouts {
  bool swizzle_a, swizzle_b;
};

// Runs one GEMM on the device (operands `ga`, `gb` in device memory) and checks every element of
// D against the oracle over `host_a`, `host_b` (the same operands in host memory, with their
// amaxes); `exact` asks for equal bits, else the fp32 accumulation bound plus `abs_slack`.
void check_operands(const std::string& name, const GemmOperand& host_a, const GemmOperand& host_b,
                    GemmOperand ga, GemmOperand gb, const Epilogue& e, bool exact, std::mt19937_64& rng,
                    double abs_slack = 1e-30) {
  const OperandReader ra(host_a), rb(host_b);  // they keep references to the operands
  const int64_t m = ra.rows(), n = rb.rows(), k = ra.k(), batches = ra.batches();
  const bool three_d = host_a.data.ndim() == 3;
  std::optional<DeviceBuffer> amax_a, amax_b;
  if (e.amax_on_device) {
    if (host_a.amax) amax_a.emplace(&*host_a.amax, sizeof(float));
    if (host_b.amax) amax_b.emplace(&*host_b.amax, sizeof(float));
    ga.amax.reset();
    gb.amax.reset();
  }

  // D [M, N(, L)] with row stride N + pad (batch stride M * that); C contiguous, or D itself.
  const int64_t row_stride = n + e.d_row_pad, batch_stride = m * row_stride;
  const size_t d_elems = static_cast<size_t>(batches * batch_stride);
  std::vector<int64_t> shape = {m, n}, d_strides = {row_stride, 1};
  if (three_d) {
    shape.push_back(batches);
    d_strides.push_back(batch_stride);
  }
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<uint8_t> c_host;
  const DType c_dtype = e.in_place ? e.out : e.c_dtype;
  if (e.with_c) {
    c_host.resize(d_elems * dtype_size(c_dtype));
    for (size_t i = 0; i < d_elems; ++i) write_value(c_dtype, c_host, static_cast<int64_t>(i), normal(rng));
  }
  std::vector<uint8_t> bias_host(static_cast<size_t>(n) * dtype_size(e.bias_dtype));
  for (int64_t j = 0; j < n; ++j) write_value(e.bias_dtype, bias_host, j, normal(rng));
  // D is poisoned (NaN bytes) unless it is C itself.
  std::vector<uint8_t> d_init = e.in_place ? c_host : std::vector<uint8_t>(d_elems * dtype_size(e.out), 0xFF);
  DeviceBuffer dd(d_init.data(), d_init.size());
  std::optional<DeviceBuffer> dc, dbias;
  GemmProblem problem;
  problem.alpha = e.alpha;
  problem.beta = e.beta;
  if (e.with_c) {
    if (!e.in_place) dc.emplace(c_host.data(), c_host.size());
    problem.c = TensorView{e.in_place ? dd.p : dc->p, c_dtype, shape, d_strides, Device::CUDA};
  }
  if (e.with_bias) {
    dbias.emplace(bias_host.data(), bias_host.size());
    problem.bias = TensorView{dbias->p, e.bias_dtype, {n}, {}, Device::CUDA};
  }
  const TensorView d{dd.p, e.out, shape, d_strides, Device::CUDA};
  const size_t workspace_bytes =
      e.workspace ? cuda::gemm_workspace_bytes(m, n, k, batches, g_path, host_a.scheme) : 0;
  if (e.workspace && workspace_bytes == 0)
    fail(name + ": expected a workspace (a split K, or the expanded path)");
  DeviceBuffer workspace(workspace_bytes);
  try {
    cuda::gemm(ga, gb, problem, d, nullptr, amax_a ? static_cast<const float*>(amax_a->p) : nullptr,
               amax_b ? static_cast<const float*>(amax_b->p) : nullptr, e.workspace ? workspace.p : nullptr,
               workspace_bytes, g_path);
    CK(cudaDeviceSynchronize());
  } catch (const Error& err) {
    fail(name + ": threw " + err.what());
    return;
  }
  std::vector<uint8_t> got(d_init.size());
  CK(cudaMemcpy(got.data(), dd.p, got.size(), cudaMemcpyDeviceToHost));

  // The oracle: float64 sums of the exact operands, then core/gemm.cpp's fp32 epilogue.
  const std::optional<float> a_amax = host_a.amax, b_amax = host_b.amax;
  float alpha = e.alpha;
  if (a_amax && b_amax) {
    alpha = ((alpha * *a_amax) * *b_amax) * (1.0f / 7225344.0f);
  } else if (a_amax || b_amax) {
    alpha = (alpha * (a_amax ? *a_amax : *b_amax)) * (1.0f / 2688.0f);
  }
  std::vector<float> av(static_cast<size_t>(m * k)), bv(static_cast<size_t>(n * k));
  int64_t bad = 0;
  std::string first;
  ++g_checks;
  for (int64_t l = 0; l < batches; ++l) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t x = 0; x < k; ++x) av[static_cast<size_t>(i * k + x)] = ra.at(l, i, x);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t x = 0; x < k; ++x) bv[static_cast<size_t>(j * k + x)] = rb.at(l, j, x);
#pragma omp parallel for reduction(+ : bad) schedule(dynamic, 4)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0, abs_sum = 0.0;
        for (int64_t x = 0; x < k; ++x) {
          const double p =
              static_cast<double>(av[static_cast<size_t>(i * k + x)]) * bv[static_cast<size_t>(j * k + x)];
          sum += p;
          abs_sum += std::fabs(p);
        }
        const int64_t at = l * batch_stride + i * row_stride + j;
        float want = alpha * static_cast<float>(sum);
        if (e.with_c) want = want + e.beta * read_value(c_dtype, c_host, at);
        if (e.with_bias) want = want + read_value(e.bias_dtype, bias_host, j);
        want = dtype_round(e.out, want);
        const float have = read_value(e.out, got, at);
        bool ok;
        if (exact) {
          ok = std::memcmp(&want, &have, 4) == 0 || (std::isnan(want) && std::isnan(have));
        } else if (std::isnan(want) || std::isinf(want)) {
          ok = std::isnan(want) ? std::isnan(have) : have == want;
        } else {
          const double bound = std::fabs(alpha) * (static_cast<double>(k) + 2) * std::ldexp(abs_sum, -23) +
                               std::fabs(want) * (e.out == DType::F32    ? 0x1p-22
                                                  : e.out == DType::BF16 ? 0x1p-7
                                                                         : 0x1p-10) +
                               abs_slack;
          ok = std::fabs(static_cast<double>(have) - want) <= bound;
        }
        if (!ok) {
#pragma omp critical
          if (first.empty()) {
            char buf[200];
            std::snprintf(buf, sizeof buf, "(%lld, %lld, %lld): gpu %.9g, want %.9g",
                          static_cast<long long>(i), static_cast<long long>(j), static_cast<long long>(l),
                          have, want);
            first = buf;
          }
          ++bad;
        }
      }
    }
  }
  // Padding between rows of a strided D must be untouched.
  if (e.d_row_pad > 0 && !e.in_place) {
    for (int64_t l = 0; l < batches; ++l)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = n; j < row_stride; ++j) {
          const int64_t at = l * batch_stride + i * row_stride + j;
          for (size_t byte = 0; byte < dtype_size(e.out); ++byte)
            if (got[static_cast<size_t>(at) * dtype_size(e.out) + byte] != 0xFF) {
              if (first.empty()) first = "a padding byte of D was written";
              ++bad;
            }
        }
  }
  if (bad) fail(name + ": " + std::to_string(bad) + " elements differ, first " + first);
}

// check_operands for two NVFP4 HostOperands (copied to the device in `layouts`).
void check_gemm(const std::string& name, const HostOperand& a, const HostOperand& b, Layouts layouts,
                const Epilogue& e, bool exact, std::mt19937_64& rng) {
  DeviceBuffer da(a.codes.data(), a.codes.size()), db(b.codes.data(), b.codes.size());
  const auto& as = layouts.swizzle_a ? a.swizzled : a.compact;
  const auto& bs = layouts.swizzle_b ? b.swizzled : b.compact;
  DeviceBuffer das(as.data(), as.size()), dbs(bs.data(), bs.size());
  check_operands(name, a.view(a.codes.data(), a.compact.data(), false, Device::CPU),
                 b.view(b.codes.data(), b.compact.data(), false, Device::CPU),
                 a.view(da.p, das.p, layouts.swizzle_a, Device::CUDA),
                 b.view(db.p, dbs.p, layouts.swizzle_b, Device::CUDA), e, exact, rng);
}

void check_gemm(const std::string& name, const HostOperand& a, const HostOperand& b, bool swizzle,
                const Epilogue& e, bool exact, std::mt19937_64& rng) {
  check_gemm(name, a, b, Layouts{swizzle, swizzle}, e, exact, rng);
}

std::vector<uint8_t> e4m3_codes_of(std::initializer_list<float> values) {
  std::vector<uint8_t> codes;
  for (float v : values) codes.push_back(encode_rn(Format::E4M3, v));
  return codes;
}

// Operands produced by microscale::quantize (the CPU path), as a TE Linear's GEMMs read them.
HostOperand from_quantized(const QuantizedTensor& q, Usage usage) {
  const GemmOperand g = GemmOperand::from(q, usage);
  HostOperand op;
  op.rows = g.data.shape[0];
  op.k = g.data.shape[1] * 2;
  const auto* codes = static_cast<const uint8_t*>(g.data.data);
  op.codes.assign(codes, codes + g.data.numel());
  std::vector<uint8_t> scales;
  if (g.scale_layout == ScaleLayout::Swizzled) {
    const Tensor c = unswizzle_scales(g.scales, op.rows, op.k / 16);
    const auto* p = static_cast<const uint8_t*>(c.data());
    op.compact.assign(p, p + c.numel());
  } else {
    const auto* p = static_cast<const uint8_t*>(g.scales.data);
    op.compact.assign(p, p + g.scales.numel());
  }
  op.make_swizzled();
  op.amax = g.amax;
  return op;
}

// `host` (data and scales in host memory, positive strides) copied to the device, every byte up to
// each view's last element (padding between rows included); `keep` owns the copies.
GemmOperand on_device(const GemmOperand& host, std::vector<std::unique_ptr<DeviceBuffer>>& keep) {
  GemmOperand d = host;
  for (TensorView* v : {&d.data, &d.scales}) {
    const size_t bytes = static_cast<size_t>(*last_element_offset(*v) + 1);  // u8: elements are bytes
    keep.push_back(std::make_unique<DeviceBuffer>(v->data, bytes));
    v->data = keep.back()->p;
    v->device = Device::CUDA;
  }
  return d;
}

// check_operands for host operands, copied to the device.
void check_host_operands(const std::string& name, const GemmOperand& a, const GemmOperand& b,
                         const Epilogue& e, std::mt19937_64& rng, double abs_slack = 1e-30) {
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  check_operands(name, a, b, on_device(a, keep), on_device(b, keep), e, false, rng, abs_slack);
}

// An MX operand [rows, K(, L)] built by hand: random finite codes of `scheme` and scales drawn
// from `scale_codes`, K-major or stored transposed ([K, rows], as MX columnwise outputs are);
// `pad` bytes after each stored row of codes (a row step that is no multiple of 16: the copy's
// byte loads), compact scales or their swizzled images.
struct ManualMx {
  Scheme scheme = Scheme::MXFP8_E4M3;
  bool transposed = false;
  int64_t rows = 0, k = 0, batches = 1, pad = 0;
  bool swizzle = false;
  std::vector<uint8_t> codes, scales, swizzled;  // scales: compact, [L][K/32][rows] when transposed

  int64_t stored_rows() const { return transposed ? k : rows; }
  int64_t row_bytes() const {
    const int64_t cols = transposed ? rows : k;
    return element_format(scheme) == Format::E2M1 ? cols / 2 : cols;
  }
  int64_t row_step() const { return row_bytes() + pad; }
  GemmOperand view() const {
    GemmOperand op;
    op.quantized = true;
    op.scheme = scheme;
    op.stored_transposed = transposed;
    const int64_t sr = stored_rows(), step = row_step();
    const int64_t scale_rows = transposed ? k / 32 : rows, scale_cols = transposed ? rows : k / 32;
    const auto shape3 = [this](int64_t r, int64_t c) {
      return batches > 1 ? std::vector<int64_t>{r, c, batches} : std::vector<int64_t>{r, c};
    };
    const auto strides3 = [this](int64_t r, int64_t row_stride) {
      return batches > 1 ? std::vector<int64_t>{row_stride, 1, r * row_stride}
                         : std::vector<int64_t>{row_stride, 1};
    };
    op.data = TensorView{const_cast<uint8_t*>(codes.data()), DType::U8, shape3(sr, row_bytes()),
                         strides3(sr, step), Device::CPU};
    if (swizzle) {
      op.scales = TensorView{const_cast<uint8_t*>(swizzled.data()),
                             DType::U8,
                             {static_cast<int64_t>(swizzled.size())},
                             {},
                             Device::CPU};
      op.scale_layout = ScaleLayout::Swizzled;
    } else {
      op.scales = TensorView{const_cast<uint8_t*>(scales.data()), DType::U8, shape3(scale_rows, scale_cols),
                             strides3(scale_rows, scale_cols), Device::CPU};
    }
    return op;
  }
};

ManualMx manual_mx(Scheme scheme, bool transposed, int64_t rows, int64_t k, int64_t batches,
                   const std::vector<uint8_t>& scale_codes, std::mt19937_64& rng, int64_t pad = 0,
                   bool swizzle = false) {
  ManualMx op;
  op.scheme = scheme;
  op.transposed = transposed;
  op.rows = rows;
  op.k = k;
  op.batches = batches;
  op.pad = pad;
  op.swizzle = swizzle;
  const Format format = element_format(scheme);
  const bool packed = format == Format::E2M1;
  const uint8_t mask = static_cast<uint8_t>((1u << format_info(format).bits) - 1);
  op.codes.resize(static_cast<size_t>(batches * op.stored_rows() * op.row_step()));
  for (auto& c : op.codes) {
    do {  // finite codes only (a NaN code would poison whole rows of D)
      c = packed ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(rng() & mask);
    } while (!packed && !std::isfinite(decode(format, c)));
  }
  const int64_t blocks = k / 32;
  op.scales.resize(static_cast<size_t>(batches * rows * blocks));
  for (auto& s : op.scales) s = scale_codes[rng() % scale_codes.size()];
  if (swizzle) {  // one image per batch of the logical [rows, K/32]
    for (int64_t l = 0; l < batches; ++l) {
      std::vector<uint8_t> logical(static_cast<size_t>(rows * blocks));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < blocks; ++b)
          logical[static_cast<size_t>(r * blocks + b)] = op.scales[static_cast<size_t>(
              l * rows * blocks + (transposed ? b * rows + r : r * blocks + b))];
      const Tensor image =
          swizzle_scales(TensorView::from_buffer(logical.data(), logical.size(), DType::U8, {rows, blocks}));
      const auto* p = static_cast<const uint8_t*>(image.data());
      op.swizzled.insert(op.swizzled.end(), p, p + image.numel());
    }
  }
  return op;
}

std::vector<float> gaussian(int64_t n, std::mt19937_64& rng, float sigma) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

void expect_error(const std::string& name, const std::function<void()>& call) {
  ++g_checks;
  try {
    call();
    fail(name + ": no microscale::Error");
  } catch (const Error&) {
  }
}

}  // namespace

// --time M N K: one GEMM shape timed (no checks), for profiling: the median of 7 runs of 20
// back-to-back calls (so that the host's cost per call, tens of microseconds, hides behind the
// GPU's work instead of adding to a lone call's time).
int time_one_shape(int64_t m, int64_t n, int64_t k, cuda::GemmPath path, Scheme scheme) {
  std::mt19937_64 rng(1);
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  GemmOperand ga, gb;
  if (scheme == Scheme::NVFP4) {
    const auto scales = e4m3_codes_of({0.5f, 1.0f, 1.5f, 2.0f});
    const HostOperand a = random_operand(m, k, 1, scales, rng), b = random_operand(n, k, 1, scales, rng);
    ga = on_device(a.view(a.codes.data(), a.compact.data(), false, Device::CPU), keep);
    gb = on_device(b.view(b.codes.data(), b.compact.data(), false, Device::CPU), keep);
  } else {
    const std::vector<uint8_t> scales = {120, 121, 122, 123};
    ga = on_device(manual_mx(scheme, false, m, k, 1, scales, rng).view(), keep);
    gb = on_device(manual_mx(scheme, false, n, k, 1, scales, rng).view(), keep);
  }
  DeviceBuffer dd(static_cast<size_t>(m * n * 2));
  const TensorView d{dd.p, DType::BF16, {m, n}, {}, Device::CUDA};
  const size_t workspace_bytes = cuda::gemm_workspace_bytes(m, n, k, 1, path, scheme);
  DeviceBuffer workspace(workspace_bytes);
  const auto call = [&] {
    cuda::gemm(ga, gb, {}, d, nullptr, nullptr, nullptr, workspace.p, workspace_bytes, path);
  };
  call();
  CK(cudaDeviceSynchronize());
  constexpr int kCalls = 20;
  std::vector<float> ms;
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  for (int run = 0; run < 7; ++run) {
    CK(cudaEventRecord(start));
    for (int i = 0; i < kCalls; ++i) call();
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float t = 0;
    CK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / kCalls);
  }
  std::sort(ms.begin(), ms.end());
  const double us = ms[ms.size() / 2] * 1e3;
  std::printf("%s %s %lld x %lld x %lld: %.1f us, %.0f TFLOP/s\n", std::string(scheme_name(scheme)).c_str(),
              path_name(path), static_cast<long long>(m), static_cast<long long>(n),
              static_cast<long long>(k), us, 2.0 * m * n * k / us / 1e6);
  return 0;
}

// The MX GEMM (the expanded path only): every element format, the three Linear GEMMs' operands
// (rowwise and the transposed columnwise outputs) from quantize(), compact and swizzled scales,
// E4M3 x E5M2 (the HYBRID recipe's dgrad), batches, the epilogue, odd stored rows (the copy's tail
// and byte loads), blocks of values below bf16's range (the exact fallback, on both of its routes),
// NaN scales, and bytes that are no FP6 code.
void run_mx_checks(std::mt19937_64& rng) {
  const Scheme schemes[] = {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2,
                            Scheme::MXFP4};
  const int64_t tokens = 256, in = 512, out = 384;
  const auto x = gaussian(tokens * in, rng, 1.0f), w = gaussian(out * in, rng, 0.02f),
             dy = gaussian(tokens * out, rng, 1e-3f);
  const auto view = [](const std::vector<float>& v, int64_t r, int64_t c) {
    return TensorView::from_buffer(const_cast<float*>(v.data()), v.size() * 4, DType::F32, {r, c});
  };
  for (Scheme scheme : schemes) {
    for (bool swizzle : {false, true}) {
      QuantizeOptions o;
      o.scheme = scheme;
      o.rowwise = true;
      o.columnwise = true;
      o.scale_layout = swizzle ? ScaleLayout::Swizzled : ScaleLayout::Compact;
      const QuantizedTensor qx = quantize(view(x, tokens, in), o), qw = quantize(view(w, out, in), o),
                            qdy = quantize(view(dy, tokens, out), o);
      const std::string tag = std::string(scheme_name(scheme)) + (swizzle ? " swizzled" : " compact");
      Epilogue e;
      e.out = DType::BF16;
      const auto [fa, fb] = te_gemm_operands(qw, qx, "TN");
      check_host_operands("MX fprop TN " + tag, fa, fb, e, rng);
      const auto [da, db] = te_gemm_operands(qw, qdy, "NN");
      check_host_operands("MX dgrad NN " + tag, da, db, e, rng);
      const auto [wa, wb] = te_gemm_operands(qx, qdy, "NT");
      e.out = DType::F32;
      check_host_operands("MX wgrad NT " + tag, wa, wb, e, rng);
    }
  }
  {  // HYBRID: dy in E5M2, W in E4M3; with C, bias and a strided f16 D (the epilogue kernel)
    QuantizeOptions o;
    o.scheme = Scheme::MXFP8_E4M3;
    o.rowwise = true;
    o.columnwise = true;
    const QuantizedTensor qw = quantize(view(w, out, in), o);
    o.scheme = Scheme::MXFP8_E5M2;
    const QuantizedTensor qdy = quantize(view(dy, tokens, out), o);
    const auto [da, db] = te_gemm_operands(qw, qdy, "NN");
    Epilogue e;
    e.out = DType::F16;
    e.alpha = 0.75f;
    e.beta = -1.0f;
    e.with_c = true;
    e.with_bias = true;
    e.d_row_pad = 3;
    e.workspace = true;
    check_host_operands("MX dgrad E5M2 x E4M3, C bias strided f16, caller's workspace", da, db, e, rng);
  }
  std::vector<uint8_t> normal_scales;  // 2^-7 .. 2^2
  for (int c = 120; c <= 129; ++c) normal_scales.push_back(static_cast<uint8_t>(c));
  // Batched, both orientations; 40 stored values per row (a 16-value tail) and FP4 rows of 20
  // bytes (no vector loads).
  for (Scheme scheme : {Scheme::MXFP8_E4M3, Scheme::MXFP4}) {
    const ManualMx a = manual_mx(scheme, false, 72, 128, 3, normal_scales, rng);
    const ManualMx b = manual_mx(scheme, true, 40, 128, 3, normal_scales, rng);
    Epilogue e;
    check_host_operands(
        std::string("MX batched, B transposed with 40 rows ") + std::string(scheme_name(scheme)), a.view(),
        b.view(), e, rng);
    const ManualMx at = manual_mx(scheme, true, 40, 96, 1, normal_scales, rng);
    const ManualMx bk = manual_mx(scheme, false, 24, 96, 1, normal_scales, rng);
    e.with_bias = true;
    check_host_operands(std::string("MX A transposed with 40 rows, bias ") + std::string(scheme_name(scheme)),
                        at.view(), bk.view(), e, rng);
  }
  // Rows of codes whose byte step is no multiple of 16 (the copy's byte loads), every format but
  // the two above, both orientations, swizzled scales, batches.
  for (Scheme scheme : {Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2}) {
    const ManualMx a = manual_mx(scheme, false, 56, 96, 2, normal_scales, rng, 3, true);
    const ManualMx b = manual_mx(scheme, true, 48, 96, 2, normal_scales, rng, 5, true);
    check_host_operands(std::string("MX byte loads, batched, swizzled ") + std::string(scheme_name(scheme)),
                        a.view(), b.view(), Epilogue{}, rng);
  }
  // Values below bf16's range: A's blocks all of scales 2^-127 .. 2^-125 (E4M3) or below 2^-118
  // (E5M2), so that each row's sums are tiny too and a rounded copy would miss the bound; the
  // slack is fp32's smallest step per term.
  for (Scheme scheme : {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2}) {
    const std::vector<uint8_t> tiny =
        scheme == Scheme::MXFP8_E4M3 ? std::vector<uint8_t>{0, 1, 2} : std::vector<uint8_t>{0, 3, 6, 9};
    const ManualMx a = manual_mx(scheme, false, 70, 256, 1, tiny, rng);
    const ManualMx b = manual_mx(scheme, true, 90, 256, 1, normal_scales, rng);
    const double slack = 256 * 0x1p-149;
    Epilogue direct;  // f32 contiguous D, no C: cuBLAS writes D, the fallback rewrites it
    check_host_operands(std::string("MX tiny blocks, direct route ") + std::string(scheme_name(scheme)),
                        a.view(), b.view(), direct, rng, slack);
    Epilogue epilogue;  // with a bias: the fallback writes the fp32 product
    epilogue.with_bias = true;
    epilogue.bias_dtype = DType::F32;
    check_host_operands(std::string("MX tiny blocks, epilogue route ") + std::string(scheme_name(scheme)),
                        a.view(), b.view(), epilogue, rng, slack);
  }
  // The fallback with the tiny blocks in B, a transposed operand, batches and swizzled scales.
  {
    const ManualMx a = manual_mx(Scheme::MXFP8_E4M3, false, 40, 128, 2, normal_scales, rng, 0, true);
    const ManualMx b = manual_mx(Scheme::MXFP8_E4M3, true, 36, 128, 2, {0, 1, 2}, rng, 0, true);
    Epilogue e;
    e.out = DType::BF16;
    check_host_operands("MX tiny blocks in a transposed B, batched, swizzled", a.view(), b.view(), e, rng,
                        128 * 0x1p-149);
  }
  // NaN scales (0xFF): NaN rows, also with alpha = 0 (0 * NaN is NaN).
  {
    ManualMx a = manual_mx(Scheme::MXFP8_E4M3, false, 64, 128, 1, normal_scales, rng);
    a.scales[5] = 0xFF;  // row 1, block 1
    const ManualMx b = manual_mx(Scheme::MXFP8_E4M3, false, 48, 128, 1, normal_scales, rng);
    Epilogue e;
    check_host_operands("MX NaN scale", a.view(), b.view(), e, rng);
    e.alpha = 0.0f;
    check_host_operands("MX NaN scale, alpha 0", a.view(), b.view(), e, rng);
  }
  // A byte that is no FP6 code reads as NaN (the CPU GEMM throws; a kernel cannot).
  {
    ManualMx a = manual_mx(Scheme::MXFP6_E2M3, false, 32, 64, 1, normal_scales, rng);
    a.codes[2 * 64 + 7] = 0xC1;  // row 2
    const ManualMx b = manual_mx(Scheme::MXFP6_E2M3, false, 16, 64, 1, normal_scales, rng);
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    DeviceBuffer dd(32 * 16 * 4);
    ++g_checks;
    try {
      cuda::gemm(on_device(a.view(), keep), on_device(b.view(), keep), {},
                 TensorView{dd.p, DType::F32, {32, 16}, {}, Device::CUDA}, nullptr, nullptr, nullptr, nullptr,
                 0, g_path);
      CK(cudaDeviceSynchronize());
      std::vector<float> got(32 * 16);
      CK(cudaMemcpy(got.data(), dd.p, got.size() * 4, cudaMemcpyDeviceToHost));
      int wrong = 0;
      for (int i = 0; i < 32; ++i)
        for (int j = 0; j < 16; ++j) wrong += std::isnan(got[i * 16 + j]) != (i == 2);
      if (wrong)
        fail("FP6 byte that is no code: " + std::to_string(wrong) + " elements not NaN in row 2 only");
    } catch (const Error& err) {
      fail(std::string("FP6 byte that is no code: threw ") + err.what());
    }
  }
}

// The MX skinny kernel (GemmPath::Skinny): K-major MXFP8 pairs, E4M3, E5M2 and mixed, at its
// three row tilings (M = 1, 5, 16, 31, and 256 over many row steps), compact and swizzled scales,
// K whose last chunk of two blocks is half past K (swizzled), batches, a split K, the epilogue,
// operands from quantize() (rows of zeros: 2^-127 scales), the exact form of the scales (A's
// scales tiny, huge, or beside huge B's), NaN scales, and the layouts it leaves to others.
void run_mx_skinny_checks(std::mt19937_64& rng) {
  std::vector<uint8_t> normal_scales;  // 2^-7 .. 2^2
  for (int c = 120; c <= 129; ++c) normal_scales.push_back(static_cast<uint8_t>(c));
  struct Shape {
    int64_t m, n, k, l;
  };
  const Shape shapes[] = {{1, 200, 256, 1},  {5, 130, 1024, 2}, {16, 64, 128, 1},
                          {31, 72, 2048, 1}, {256, 48, 192, 1}, {16, 136, 8192, 1}};
  for (const Shape& s : shapes) {
    for (Scheme sa : {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2}) {
      for (Scheme sb : {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2}) {
        for (bool swizzle : {false, true}) {
          const ManualMx a = manual_mx(sa, false, s.m, s.k, s.l, normal_scales, rng, 0, swizzle);
          const ManualMx b = manual_mx(sb, false, s.n, s.k, s.l, normal_scales, rng, 0, swizzle);
          char name[160];
          std::snprintf(name, sizeof name, "MX skinny %lldx%lldx%lld L%lld %s x %s %s",
                        static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
                        static_cast<long long>(s.l), std::string(scheme_name(sa)).c_str(),
                        std::string(scheme_name(sb)).c_str(), swizzle ? "swizzled" : "compact");
          Epilogue e;
          e.out = sa == sb ? DType::BF16 : DType::F32;
          e.workspace = s.k == 8192;
          check_host_operands(name, a.view(), b.view(), e, rng);
        }
      }
    }
  }
  // K = 96 and 32 * 67: the last chunk's second block lies past K (swizzled scales; compact rows of
  // an odd number of scales are the expanded path's); a 16-byte row pad; C, bias, strided f16 D.
  for (int64_t k : {96, 32 * 67}) {
    const ManualMx a = manual_mx(Scheme::MXFP8_E4M3, false, 9, k, 2, normal_scales, rng, 16, true);
    const ManualMx b = manual_mx(Scheme::MXFP8_E4M3, false, 150, k, 2, normal_scales, rng, 0, true);
    Epilogue e;
    e.out = DType::F16;
    e.alpha = 0x1p-12f;  // sums of up to 2^21 brought into f16's range
    e.beta = -1.0f;
    e.with_c = true;
    e.with_bias = true;
    e.d_row_pad = 3;
    check_host_operands("MX skinny K = " + std::to_string(k) + ", C bias strided f16", a.view(), b.view(), e,
                        rng);
  }
  // From quantize(): x with a row of zeros (its blocks' scales 2^-127: the exact form) against W.
  {
    const int64_t tokens = 3, in = 512, out = 384;
    auto x = gaussian(tokens * in, rng, 1.0f);
    std::fill(x.begin() + in, x.begin() + 2 * in, 0.0f);
    const auto w = gaussian(out * in, rng, 0.02f);
    for (bool swizzle : {false, true}) {
      QuantizeOptions o;
      o.scheme = Scheme::MXFP8_E4M3;
      o.rowwise = true;
      o.scale_layout = swizzle ? ScaleLayout::Swizzled : ScaleLayout::Compact;
      const QuantizedTensor qx =
          quantize(TensorView::from_buffer(x.data(), x.size() * 4, DType::F32, {tokens, in}), o);
      const QuantizedTensor qw = quantize(
          TensorView::from_buffer(const_cast<float*>(w.data()), w.size() * 4, DType::F32, {out, in}), o);
      Epilogue e;
      e.out = DType::BF16;
      const auto [xa, wb] = te_gemm_operands(qw, qx, "TN");  // A = x (3 rows), B = W
      check_host_operands(
          std::string("MX skinny from quantize, a zero row ") + (swizzle ? "swizzled" : "compact"), xa, wb, e,
          rng);
    }
  }
  // The exact form: A's scales outside [2^-94, 2^90]: tiny (2^-127 ..), huge against tiny B's
  // (products near 1), huge against normal (large but finite); tiny B's (exact subnormal scales).
  // (A's values stay below fp32's max, where the oracle, like the CPU GEMM, reads them.)
  {
    struct Extreme {
      const char* name;
      std::vector<uint8_t> a_scales, b_scales;
      Scheme scheme;
      double slack;
    };
    const Extreme cases[] = {
        {"tiny A E4M3", {0, 1, 2}, normal_scales, Scheme::MXFP8_E4M3, 256 * 0x1p-149},
        {"tiny A E5M2", {0, 3, 6, 9}, normal_scales, Scheme::MXFP8_E5M2, 256 * 0x1p-149},
        {"huge A, tiny B", {200, 215, 230}, {0, 5, 10}, Scheme::MXFP8_E4M3, 1e-30},
        {"huge A, normal B", {220, 225}, normal_scales, Scheme::MXFP8_E4M3, 1e-30},
        {"tiny B E4M3", normal_scales, {0, 1, 2}, Scheme::MXFP8_E4M3, 256 * 0x1p-149},
        {"mixed A, one chunk slow", {0, 100, 127, 130}, normal_scales, Scheme::MXFP8_E4M3, 256 * 0x1p-149}};
    for (const Extreme& c : cases) {
      const ManualMx a = manual_mx(c.scheme, false, 12, 256, 1, c.a_scales, rng);
      const ManualMx b = manual_mx(c.scheme, false, 90, 256, 1, c.b_scales, rng, 0, true);
      check_host_operands(std::string("MX skinny scales: ") + c.name, a.view(), b.view(), Epilogue{}, rng,
                          c.slack);
    }
  }
  // NaN scales (0xFF) in A and in B: NaN rows and columns, also with alpha = 0.
  {
    ManualMx a = manual_mx(Scheme::MXFP8_E4M3, false, 6, 128, 1, normal_scales, rng);
    a.scales[1 * 4 + 2] = 0xFF;  // row 1, block 2
    ManualMx b = manual_mx(Scheme::MXFP8_E4M3, false, 40, 128, 1, normal_scales, rng);
    b.scales[17 * 4 + 0] = 0xFF;  // row 17, block 0
    Epilogue e;
    check_host_operands("MX skinny NaN scales", a.view(), b.view(), e, rng);
    e.alpha = 0.0f;
    check_host_operands("MX skinny NaN scales, alpha 0", a.view(), b.view(), e, rng);
  }
  // What the MX skinny kernel leaves to the expanded path: MXFP6 and MXFP4, a transposed operand,
  // compact rows of an odd number of scales. Forced onto it, each is an error; under Auto, right.
  {
    const ManualMx e4m3 = manual_mx(Scheme::MXFP8_E4M3, false, 8, 64, 1, normal_scales, rng);
    const ManualMx fp6 = manual_mx(Scheme::MXFP6_E2M3, false, 8, 64, 1, normal_scales, rng);
    const ManualMx transposed = manual_mx(Scheme::MXFP8_E4M3, true, 8, 64, 1, normal_scales, rng);
    const ManualMx odd_a = manual_mx(Scheme::MXFP8_E4M3, false, 8, 96, 1, normal_scales, rng);
    const ManualMx odd_b = manual_mx(Scheme::MXFP8_E4M3, false, 24, 96, 1, normal_scales, rng);
    const std::pair<const ManualMx*, const ManualMx*> pairs[] = {
        {&fp6, &fp6}, {&e4m3, &transposed}, {&transposed, &e4m3}, {&odd_a, &odd_b}};
    const char* names[] = {"MXFP6", "B transposed", "A transposed", "compact rows of 3 scales"};
    for (int i = 0; i < 4; ++i) {
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      const GemmOperand ga = on_device(pairs[i].first->view(), keep),
                        gb = on_device(pairs[i].second->view(), keep);
      const int64_t m = pairs[i].first->rows, n = pairs[i].second->rows;
      DeviceBuffer dd(static_cast<size_t>(m * n * 4));
      const TensorView d{dd.p, DType::F32, {m, n}, {}, Device::CUDA};
      expect_error(std::string("MX skinny refuses ") + names[i],
                   [&] { cuda::gemm(ga, gb, {}, d, nullptr, nullptr, nullptr, nullptr, 0, g_path); });
      if (g_kernels_only) continue;
      g_path = cuda::GemmPath::Auto;
      check_host_operands(std::string("MX under Auto: ") + names[i], pairs[i].first->view(),
                          pairs[i].second->view(), Epilogue{}, rng);
      g_path = cuda::GemmPath::Skinny;
    }
  }
}

void run_checks(bool quick) {
  std::mt19937_64 rng(20261127);
  const auto gpumode_scales = e4m3_codes_of({0.0f, 1.0f, 2.0f, 3.0f});
  std::vector<uint8_t> subnormal_scales = {1, 2, 3, 4, 5, 6, 7};  // E4M3 2^-9 .. 7 * 2^-9
  std::vector<uint8_t> finite_scales;
  for (int c = 0; c < 0x7F; ++c) finite_scales.push_back(static_cast<uint8_t>(c));

  struct Shape {
    int64_t m, n, k, l;
  };
  // The skinny kernel's three row tilings (A's rows by 8, 16 and 32) come from M = 1, 7, 16, 31
  // and 257; its split K from the long K at few output blocks (16 x 136 x 8192: 3 blocks).
  std::vector<Shape> shapes = {{128, 128, 64, 1},  {1, 1, 64, 1},       {7, 200, 128, 1},
                               {257, 130, 256, 2}, {300, 384, 1024, 1}, {128, 256, 8192, 1},
                               {16, 136, 8192, 1}, {31, 70, 4096, 3}};
  if (quick) shapes.resize(4);
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};

  // Exact sums: GPU MODE's scales {0, 1, 2, 3}, every layout and output dtype.
  for (const Shape& s : shapes) {
    const HostOperand a = random_operand(s.m, s.k, s.l, gpumode_scales, rng);
    const HostOperand b = random_operand(s.n, s.k, s.l, gpumode_scales, rng);
    for (bool swizzle : {false, true}) {
      for (DType out : dtypes) {
        Epilogue e;
        e.out = out;
        char name[160];
        std::snprintf(name, sizeof name, "exact %lldx%lldx%lld L%lld %s %s", static_cast<long long>(s.m),
                      static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(s.l),
                      swizzle ? "swizzled" : "compact", std::string(dtype_name(out)).c_str());
        check_gemm(name, a, b, swizzle, e, true, rng);
      }
    }
  }
  // Exact sums of subnormal-scale blocks (the fp16 subnormal path through the tensor cores).
  {
    const HostOperand a = random_operand(200, 1024, 1, subnormal_scales, rng);
    const HostOperand b = random_operand(136, 1024, 1, subnormal_scales, rng);
    check_gemm("exact subnormal scales", a, b, false, Epilogue{}, true, rng);
  }
  // The epilogue: alpha, beta * C (each dtype), bias (each dtype), strided and in-place D.
  {
    const HostOperand a = random_operand(190, 512, 1, gpumode_scales, rng);
    const HostOperand b = random_operand(260, 512, 1, gpumode_scales, rng);
    for (DType out : dtypes) {
      Epilogue e;
      e.out = out;
      e.alpha = 0.375f;
      e.beta = -1.5f;
      e.with_c = true;
      e.with_bias = true;
      e.c_dtype = out == DType::F32 ? DType::BF16 : DType::F32;
      e.bias_dtype = out == DType::F16 ? DType::BF16 : DType::F16;
      e.d_row_pad = 3;
      check_gemm("epilogue alpha beta C bias strided " + std::string(dtype_name(out)), a, b, true, e, true,
                 rng);
      e.in_place = true;
      e.d_row_pad = 0;
      check_gemm("epilogue in place " + std::string(dtype_name(out)), a, b, false, e, true, rng);
    }
    // The bias alone into a contiguous D (a Linear's fprop): the epilogue kernel's four-column
    // form where N % 4 == 0 (260), the general one where not (262), each dtype.
    for (DType out : dtypes) {
      for (int64_t n : {260, 262}) {
        const HostOperand bn = random_operand(n, 512, 1, gpumode_scales, rng);
        Epilogue e;
        e.out = out;
        e.alpha = 0.375f;
        e.with_bias = true;
        e.bias_dtype = out == DType::F32 ? DType::BF16 : out;
        check_gemm("epilogue bias alone N=" + std::to_string(n) + " " + std::string(dtype_name(out)), a, bn,
                   true, e, true, rng);
      }
      // Padded rows without C: a row stride of N + 4 keeps the four-column form, N + 2 does not.
      const HostOperand b260 = random_operand(260, 512, 1, gpumode_scales, rng);
      for (int64_t pad : {4, 2}) {
        Epilogue e;
        e.out = out;
        e.with_bias = true;
        e.d_row_pad = pad;
        check_gemm("epilogue bias alone, D rows padded by " + std::to_string(pad) + " " +
                       std::string(dtype_name(out)),
                   a, b260, false, e, true, rng);
      }
    }
    const HostOperand a3 = random_operand(64, 128, 3, gpumode_scales, rng);
    const HostOperand b3 = random_operand(72, 128, 3, gpumode_scales, rng);
    {
      Epilogue e;
      e.with_bias = true;
      e.out = DType::BF16;
      check_gemm("epilogue batched bias alone bf16", a3, b3, false, e, true, rng);
    }
    Epilogue e;
    e.with_c = true;
    e.beta = 2.0f;
    e.with_bias = true;
    e.d_row_pad = 5;
    check_gemm("epilogue batched C bias strided", a3, b3, true, e, true, rng);
    // Few output tiles and a long K: the split-K path (gemm_split.hpp), batched, with C and bias.
    const HostOperand a4 = random_operand(128, 2048, 2, gpumode_scales, rng);
    const HostOperand b4 = random_operand(200, 2048, 2, gpumode_scales, rng);
    e.workspace = true;
    check_gemm("split K, batched, C bias strided, caller's workspace", a4, b4, false, e, true, rng);
    {
      Epilogue bias_alone;
      bias_alone.with_bias = true;
      bias_alone.out = DType::BF16;
      check_gemm("split K, batched, bias alone bf16", a4, b4, true, bias_alone, true, rng);
    }
    e.workspace = false;
    e.in_place = true;
    e.d_row_pad = 0;
    e.out = DType::BF16;
    check_gemm("split K, batched, in place bf16", a4, b4, true, e, true, rng);
    // Splits of unequal length (K = 50 tiles of 64: runs of 17, 17 and 16 on 132 SMs), and the
    // two mixed scale layouts.
    const HostOperand a5 = random_operand(128, 64 * 50, 1, gpumode_scales, rng);
    const HostOperand b5 = random_operand(128, 64 * 50, 1, gpumode_scales, rng);
    check_gemm("uneven split K, compact A, swizzled B", a5, b5, Layouts{false, true}, Epilogue{}, true, rng);
    check_gemm("uneven split K, swizzled A, compact B", a5, b5, Layouts{true, false}, Epilogue{}, true, rng);
    const HostOperand a6 = random_operand(200, 256, 1, gpumode_scales, rng);
    const HostOperand b6 = random_operand(300, 256, 1, gpumode_scales, rng);
    check_gemm("no split, swizzled A, compact B", a6, b6, Layouts{true, false}, Epilogue{}, true, rng);
    check_gemm("no split, compact A, swizzled B", a6, b6, Layouts{false, true}, Epilogue{}, true, rng);
  }
  // Any finite scales, global amaxes on the host and on the device: within the fp32 bound.
  for (bool device_amax : {false, true}) {
    HostOperand a = random_operand(333, 2048, 1, finite_scales, rng);
    HostOperand b = random_operand(129, 2048, 1, finite_scales, rng);
    a.amax = 3.5f;
    b.amax = 1234.5f;
    Epilogue e;
    e.amax_on_device = device_amax;
    e.alpha = 0.5f;
    check_gemm(std::string("finite scales, both amaxes, ") + (device_amax ? "device" : "host"), a, b, false,
               e, false, rng);
    b.amax.reset();
    check_gemm(std::string("finite scales, A's amax, ") + (device_amax ? "device" : "host"), a, b, true, e,
               false, rng);
  }
  // Operands from quantize(): fprop "TN" (x rowwise, W rowwise) and wgrad "NT" (dy^T, x^T: the
  // columnwise outputs, with the RHT as TE's wgrad uses it).
  {
    const int64_t tokens = 256, in = 512, out = 384;
    const auto x = gaussian(tokens * in, rng, 1.0f), w = gaussian(out * in, rng, 0.02f),
               dy = gaussian(tokens * out, rng, 0.1f);
    QuantizeOptions o;
    o.scheme = Scheme::NVFP4;
    o.rowwise = true;
    o.columnwise = true;
    o.rht = true;
    o.scale_layout = ScaleLayout::Swizzled;
    // bf16 inputs (the RHT takes bf16 only, as in TransformerEngine).
    std::vector<std::vector<uint16_t>> keep;
    const auto view = [&keep](const std::vector<float>& v, int64_t r, int64_t c) {
      std::vector<uint16_t> bf(v.size());
      for (size_t i = 0; i < v.size(); ++i) bf[i] = float_to_bf16(v[i]);
      keep.push_back(std::move(bf));
      return TensorView::from_buffer(keep.back().data(), v.size() * 2, DType::BF16, {r, c});
    };
    const QuantizedTensor qx = quantize(view(x, tokens, in), o), qdy = quantize(view(dy, tokens, out), o);
    QuantizeOptions ow = o;
    ow.rht = false;
    ow.tile = Tile::k16x16;
    const QuantizedTensor qw = quantize(view(w, out, in), ow);
    for (bool device_amax : {false, true}) {
      Epilogue e;
      e.amax_on_device = device_amax;
      e.out = DType::BF16;
      check_gemm(std::string("fprop TN from quantize ") + (device_amax ? "device amax" : "host amax"),
                 from_quantized(qx, Usage::Rowwise), from_quantized(qw, Usage::Rowwise), true, e, false, rng);
      check_gemm(std::string("wgrad NT (RHT) from quantize ") + (device_amax ? "device amax" : "host amax"),
                 from_quantized(qdy, Usage::Columnwise), from_quantized(qx, Usage::Columnwise), true, e,
                 false, rng);
    }
  }
  if (g_path == cuda::GemmPath::Skinny) run_mx_skinny_checks(rng);
  if (g_path == cuda::GemmPath::Expanded) {
    run_mx_checks(rng);
    // NVFP4 whose K is not a multiple of 32 (the skinny kernel's): the expanded path only.
    const HostOperand a = random_operand(96, 80, 1, gpumode_scales, rng);
    const HostOperand b = random_operand(136, 80, 1, gpumode_scales, rng);
    check_gemm("NVFP4 K = 80", a, b, false, Epilogue{}, true, rng);
    check_gemm("NVFP4 K = 80 swizzled", a, b, true, Epilogue{}, true, rng);
  }
  if (g_path != cuda::GemmPath::Fused) {
    // K a multiple of 32 but not of 64 or 128: the skinny kernel's last chunk of 128 codes is
    // partly past K (the threads past it read zeros), with a split K, batches and both layouts.
    for (int64_t k : {96, 32 * 131}) {
      const HostOperand a = random_operand(12, k, 2, gpumode_scales, rng);
      const HostOperand b = random_operand(150, k, 2, gpumode_scales, rng);
      for (bool swizzle : {false, true}) {
        Epilogue e;
        e.out = DType::BF16;
        e.with_bias = true;
        check_gemm("NVFP4 K = " + std::to_string(k) + (swizzle ? " swizzled" : " compact"), a, b, swizzle, e,
                   true, rng);
      }
    }
  }
  // Bad arguments.
  {
    const HostOperand a = random_operand(32, 128, 1, gpumode_scales, rng);
    DeviceBuffer da(a.codes.data(), a.codes.size()), das(a.compact.data(), a.compact.size());
    DeviceBuffer dd(32 * 32 * 4);
    const GemmOperand ok = a.view(da.p, das.p, false, Device::CUDA);
    const TensorView d{dd.p, DType::F32, {32, 32}, {}, Device::CUDA};
    auto run = [&](GemmOperand x, GemmOperand y, GemmProblem p, TensorView out) {
      cuda::gemm(x, y, p, out, nullptr, nullptr, nullptr, nullptr, 0, g_path);
    };
    run(ok, ok, {}, d);  // the control: no error
    CK(cudaDeviceSynchronize());
    GemmOperand k80 = ok;
    k80.data.shape = {32, 40};
    k80.data.strides = {40, 1};
    k80.scales.shape = {32, 5};
    k80.scales.strides = {5, 1};
    GemmOperand mx = ok;  // MXFP8 [32, 64]: 2 scales per row
    mx.scheme = Scheme::MXFP8_E4M3;
    mx.data.shape = {32, 64};
    mx.scales.shape = {32, 2};
    mx.scales.strides = {2, 1};
    GemmOperand unaligned = ok;
    unaligned.data.data = static_cast<uint8_t*>(da.p) + 4;
    unaligned.data.shape = {31, 64};
    unaligned.scales.shape = {31, 8};
    const TensorView d31{dd.p, DType::F32, {31, 31}, {}, Device::CUDA};
    if (g_path == cuda::GemmPath::Fused || g_path == cuda::GemmPath::Skinny) {
      const std::string kernel = path_name(g_path);
      expect_error("K not a multiple of 64 or 32 (" + kernel + ")", [&] { run(k80, k80, {}, d); });
      if (g_path == cuda::GemmPath::Fused) {
        expect_error("MX operands (fused)", [&] { run(mx, mx, {}, d); });
      } else {  // MXFP8 runs on the skinny path (checked in run_mx_skinny_checks)
        run(mx, mx, {}, d);
        CK(cudaDeviceSynchronize());
      }
      expect_error("unaligned codes (" + kernel + ")", [&] { run(unaligned, unaligned, {}, d31); });
    } else {  // the expanded path takes these: K = 80 and MX are checked elsewhere
      run(k80, k80, {}, d);
      run(mx, mx, {}, d);
      CK(cudaDeviceSynchronize());
      // Unaligned NVFP4 codes (byte loads), on the expanded path and under Auto (which must not
      // pick the fused kernel for them), against the oracle.
      GemmOperand host_unaligned = a.view(a.codes.data(), a.compact.data(), false, Device::CPU);
      host_unaligned.data.data = const_cast<uint8_t*>(a.codes.data()) + 4;
      host_unaligned.data.shape = {31, 64};
      host_unaligned.scales.shape = {31, 8};
      check_operands("unaligned NVFP4 codes", host_unaligned, host_unaligned, unaligned, unaligned,
                     Epilogue{}, false, rng);
      g_path = cuda::GemmPath::Auto;
      check_operands("unaligned NVFP4 codes, Auto", host_unaligned, host_unaligned, unaligned, unaligned,
                     Epilogue{}, false, rng);
      g_path = cuda::GemmPath::Expanded;
    }
    expect_error("NVFP4 x MX", [&] { run(ok, mx, {}, d); });
    GemmOperand mx_amax = mx;
    mx_amax.amax = 1.0f;
    expect_error("MX operand with an amax", [&] { run(mx_amax, mx, {}, d); });
    GemmOperand nvfp4_transposed = ok;
    nvfp4_transposed.stored_transposed = true;
    expect_error("NVFP4 stored transposed", [&] { run(nvfp4_transposed, ok, {}, d); });
    GemmOperand mx_k40 = mx;  // K = 40: not a multiple of MX's block
    mx_k40.data.shape = {32, 40};
    mx_k40.data.strides = {40, 1};
    expect_error("MX K not a multiple of 32", [&] { run(mx_k40, mx_k40, {}, d); });
    expect_error("dense operand", [&] { run(GemmOperand::from_dense(d), ok, {}, d); });
    GemmOperand host = a.view(a.codes.data(), a.compact.data(), false, Device::CPU);
    expect_error("host operand", [&] { run(host, ok, {}, d); });
    GemmOperand bad_scales = ok;
    bad_scales.scales.shape = {32, 4};
    expect_error("compact scales of the wrong shape", [&] { run(bad_scales, ok, {}, d); });
    GemmOperand short_swizzle = ok;
    short_swizzle.scale_layout = ScaleLayout::Swizzled;
    expect_error("swizzled scales too short", [&] { run(short_swizzle, ok, {}, d); });
    expect_error("D of the wrong shape", [&] {
      run(ok, ok, {}, TensorView{dd.p, DType::F32, {32, 31}, {}, Device::CUDA});
    });
    expect_error("D overlapping", [&] {
      run(ok, ok, {}, TensorView{dd.p, DType::F32, {32, 32}, {1, 1}, Device::CUDA});
    });
    expect_error("D u8", [&] { run(ok, ok, {}, TensorView{dd.p, DType::U8, {32, 32}, {}, Device::CUDA}); });
    GemmProblem bad_c;
    bad_c.c = TensorView{dd.p, DType::F32, {32, 16}, {}, Device::CUDA};
    expect_error("C of the wrong shape", [&] { run(ok, ok, bad_c, d); });
    GemmProblem bad_bias;
    bad_bias.bias = TensorView{dd.p, DType::F32, {31}, {}, Device::CUDA};
    expect_error("bias of the wrong length", [&] { run(ok, ok, bad_bias, d); });
    GemmProblem misaligned_bias;
    misaligned_bias.bias = TensorView{static_cast<uint8_t*>(dd.p) + 2, DType::F32, {32}, {}, Device::CUDA};
    expect_error("misaligned bias", [&] { run(ok, ok, misaligned_bias, d); });
    DeviceBuffer big(64 * 64 * 4);
    const TensorView d_in_big{big.p, DType::F32, {32, 32}, {64, 1}, Device::CUDA};
    GemmProblem shifted_c;  // C = D moved by one element: read and written by different threads
    shifted_c.c = TensorView{static_cast<float*>(big.p) + 1, DType::F32, {32, 32}, {64, 1}, Device::CUDA};
    expect_error("C overlapping D", [&] { run(ok, ok, shifted_c, d_in_big); });
    GemmProblem same_c;  // the control: C is D itself
    same_c.c = d_in_big;
    run(ok, ok, same_c, d_in_big);
    CK(cudaDeviceSynchronize());
    GemmProblem beside_c;  // the control: C in the other half of the rows' padding, apart from D
    beside_c.c =
        TensorView{static_cast<float*>(big.p) + 32 * 64, DType::F32, {32, 32}, {64, 1}, Device::CUDA};
    run(ok, ok, beside_c, d_in_big);
    CK(cudaDeviceSynchronize());
    expect_error("D strides out of range", [&] {
      run(ok, ok, {}, TensorView{dd.p, DType::F32, {32, 32}, {int64_t{1} << 62, 1}, Device::CUDA});
    });
    GemmOperand both = ok;
    both.amax = 1.0f;
    float* amax_device = static_cast<float*>(dd.p);
    expect_error("host and device amax",
                 [&] { cuda::gemm(both, ok, {}, d, nullptr, amax_device, nullptr, nullptr, 0, g_path); });
  }
}

int main(int argc, char** argv) {
  if (argc >= 5 && argc <= 7 && std::string(argv[1]) == "--time") {
    const std::string path = argc >= 6 ? argv[5] : "fused";
    const Scheme scheme = argc == 7 && std::string(argv[6]) == "mxfp8" ? Scheme::MXFP8_E4M3 : Scheme::NVFP4;
    const cuda::GemmPath paths[] = {cuda::GemmPath::Fused, cuda::GemmPath::Skinny, cuda::GemmPath::Expanded,
                                    cuda::GemmPath::Auto};
    for (cuda::GemmPath p : paths) {
      if (path == path_name(p))
        return time_one_shape(std::stoll(argv[2]), std::stoll(argv[3]), std::stoll(argv[4]), p, scheme);
    }
    std::fprintf(stderr, "unknown path '%s' (fused, skinny, expanded, auto)\n", path.c_str());
    return 2;
  }
  bool quick = false;
  std::vector<cuda::GemmPath> paths = {cuda::GemmPath::Fused, cuda::GemmPath::Skinny,
                                       cuda::GemmPath::Expanded};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") quick = true;
    if (arg == "--kernels-only") {
      paths = {cuda::GemmPath::Fused, cuda::GemmPath::Skinny};  // no cuBLAS
      g_kernels_only = true;
    }
  }
  for (cuda::GemmPath path : paths) {
    g_path = path;
    run_checks(quick);
  }
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures > 100 ? 100 : g_failures;
}
