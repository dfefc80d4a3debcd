// Block-scaled GEMM: exact-by-construction cases, the golden gemm_* products, random cases
// against float64 on the same dequantized operands, all layouts/schemes/batches, the GPU MODE
// NVFP4 interface, and clear errors for mismatched inputs.
#include "microscale/gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/operand_access.hpp"
#include "golden.hpp"
#include "microscale/error.hpp"
#include "microscale/layout.hpp"
#include "microscale/safetensors.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;

// float64 reference on the same dequantized operands: D = alpha * A B^T, alpha as gemm() forms it.
std::vector<double> reference(const GemmOperand& a, const GemmOperand& b, double alpha,
                              std::vector<double>* magnitude) {
  const OperandReader ra(a), rb(b);
  const int64_t m = ra.rows(), n = rb.rows(), k = ra.k(), l_count = ra.batches();
  std::vector<double> d(static_cast<size_t>(l_count * m * n));
  if (magnitude) magnitude->assign(d.size(), 0.0);
  for (int64_t l = 0; l < l_count; ++l) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double t = static_cast<double>(ra.at(l, i, p)) * rb.at(l, j, p);
          s += t;
          mag += std::fabs(t);
        }
        d[(l * m + i) * n + j] = alpha * s;
        if (magnitude) (*magnitude)[(l * m + i) * n + j] = std::fabs(alpha) * mag;
      }
    }
  }
  return d;
}

double alpha_of(const GemmOperand& a, const GemmOperand& b, float alpha = 1.0f) {
  if (a.amax && b.amax) return ((alpha * *a.amax) * *b.amax) * (1.0f / 7225344.0f);
  return alpha;
}

// FP32 accumulation bound: |D - ref| <= K * 2^-23 * sum|a b| (a loose, standard bound; the
// products themselves are exact).
void expect_close(const Tensor& d, const std::vector<double>& ref, const std::vector<double>& magnitude,
                  int64_t k, const std::string& what) {
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double got = d.data_as<float>()[i];
    const double bound = static_cast<double>(k) * std::ldexp(1.0, -23) * magnitude[i] + 1e-30;
    if (!(std::fabs(got - ref[i]) <= bound) && ++bad <= 3) {
      ADD_FAILURE() << what << " at " << i << ": " << got << " vs " << ref[i] << " (bound " << bound << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(Gemm, ExactByConstruction) {
  // Operands on the grids with power-of-two scales: every product and partial sum is exact in
  // fp32, so D equals the float64 result exactly.
  std::mt19937 rng(1);
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3,
                        Scheme::MXFP6_E3M2, Scheme::MXFP4}) {
    const int64_t m = 48, n = 40, k = 128;
    const Format f = element_format(scheme);
    const int block = block_size(scheme);
    const bool packed = f == Format::E2M1;
    auto make = [&](int64_t rows, Tensor& data, Tensor& scales) {
      data = Tensor(DType::U8, {rows, packed ? k / 2 : k});
      scales = Tensor(DType::U8, {rows, k / block});
      for (int64_t i = 0; i < data.numel(); ++i) {
        // Codes whose values are multiples of 1/4 within [-8, 8]: with scales in [1/2, 2] every
        // product is a multiple of 2^-6 below 2^8, and sums of 128 stay below 2^21 quanta.
        auto ok = [&](uint8_t c) {
          const float v = decode(f, c);
          return std::isfinite(v) && std::fabs(v) <= 8.0f && std::floor(v * 4) == v * 4;
        };
        uint8_t code;
        do {
          code = static_cast<uint8_t>(rng() & (packed ? 0xFF : (1u << format_info(f).bits) - 1));
        } while (packed ? !(ok(code & 0xF) && ok(code >> 4)) : !ok(code));
        data.data_as<uint8_t>()[i] = code;
      }
      for (int64_t i = 0; i < scales.numel(); ++i) {
        // powers of two 0.5, 1, 2: E4M3 0x30, 0x38, 0x40; E8M0 126, 127, 128
        scales.data_as<uint8_t>()[i] = scheme == Scheme::NVFP4 ? static_cast<uint8_t>(0x30 + 8 * (rng() % 3))
                                                               : static_cast<uint8_t>(126 + rng() % 3);
      }
    };
    Tensor ad, as, bd, bs;
    make(m, ad, as);
    make(n, bd, bs);
    GemmOperand a, b;
    a.quantized = b.quantized = true;
    a.scheme = b.scheme = scheme;
    a.data = ad.view();
    a.scales = as.view();
    b.data = bd.view();
    b.scales = bs.view();
    const Tensor d = gemm(a, b);
    const std::vector<double> ref = reference(a, b, 1.0, nullptr);
    int64_t diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) diff += d.data_as<float>()[i] != ref[i];
    EXPECT_EQ(diff, 0) << scheme_name(scheme);
  }
}

TEST(Gemm, GoldenProducts) {
  for (const char* name : {"gemm_nvfp4_128x96x256", "gemm_nvfp4_256x384x512", "gemm_mxfp8_128x96x256",
                           "gemm_mxfp8_256x384x512"}) {
    const SafetensorsFile f = SafetensorsFile::open(golden_dir() + "/" + name + ".safetensors");
    const bool nvfp4 = std::string(name).find("nvfp4") != std::string::npos;
    GemmOperand a, b;
    a.quantized = b.quantized = true;
    a.scheme = b.scheme = nvfp4 ? Scheme::NVFP4 : Scheme::MXFP8_E4M3;
    a.data = f.view("a_data");
    a.scales = f.view("a_scale");
    b.data = f.view("b_data");
    b.scales = f.view("b_scale");
    if (nvfp4) {
      a.amax = *static_cast<const float*>(f.view("a_amax").data);
      b.amax = *static_cast<const float*>(f.view("b_amax").data);
    }
    const Tensor d = gemm(a, b);
    const auto* want = static_cast<const float*>(f.view("out").data);
    std::vector<double> magnitude;
    reference(a, b, alpha_of(a, b), &magnitude);
    int64_t bad = 0;
    for (int64_t i = 0; i < d.numel(); ++i) {
      // golden = float64 product with a true division for alpha; ours rounds alpha to fp32
      // (TE's formula) and accumulates in fp32: K 2^-23 relative to sum |a b| plus alpha's ulps.
      const double bound = (512 * std::ldexp(1.0, -23) + 4 * std::ldexp(1.0, -24)) * magnitude[i] + 1e-30;
      bad += !(std::fabs(d.data_as<float>()[i] - want[i]) <=
               bound + 4 * std::ldexp(1.0, -24) * std::fabs(want[i]));
    }
    EXPECT_EQ(bad, 0) << name;
  }
}

TEST(Gemm, RandomAgainstFloat64AllSchemesLayoutsAndBatches) {
  uint32_t seed = 10;
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3,
                        Scheme::MXFP6_E3M2, Scheme::MXFP4}) {
    for (ScaleLayout layout : {ScaleLayout::Compact, ScaleLayout::Swizzled}) {
      const Tensor x = random_tensor(DType::BF16, {64, 96}, Fill::Heavy, seed++);
      const Tensor w = random_tensor(DType::BF16, {32, 96}, Fill::Normal, seed++);
      QuantizeOptions o;
      o.scheme = scheme;
      o.rowwise = o.columnwise = true;
      o.scale_layout = layout;
      const QuantizedTensor xq = quantize(x.view(), o), wq = quantize(w.view(), o);
      for (const char* te_layout : {"TN"}) {
        const auto [a, b] = te_gemm_operands(wq, xq, te_layout);
        std::vector<double> mag;
        const std::vector<double> ref = reference(a, b, alpha_of(a, b), &mag);
        expect_close(gemm(a, b), ref, mag, 96, std::string(scheme_name(scheme)) + " TN");
      }
      // NT: dW-style, contraction over the rows (64) of both, from columnwise data.
      const Tensor dy = random_tensor(DType::BF16, {64, 32}, Fill::Normal, seed++);
      const QuantizedTensor dyq = quantize(dy.view(), o);
      const auto [a, b] = te_gemm_operands(xq, dyq, "NT");  // [32, 96] = dy^T x
      std::vector<double> mag;
      const std::vector<double> ref = reference(a, b, alpha_of(a, b), &mag);
      const Tensor d = gemm(a, b);
      EXPECT_EQ(d.shape(), (std::vector<int64_t>{32, 96}));
      expect_close(d, ref, mag, 64, std::string(scheme_name(scheme)) + " NT");
      // NN: dX-style, contraction over W's rows (32).
      const auto [a2, b2] = te_gemm_operands(wq, dyq, "NN");  // [64, 96] = dy W
      const Tensor d2 = gemm(a2, b2);
      EXPECT_EQ(d2.shape(), (std::vector<int64_t>{64, 96}));
      std::vector<double> mag2;
      expect_close(d2, reference(a2, b2, alpha_of(a2, b2), &mag2), mag2, 32,
                   std::string(scheme_name(scheme)) + " NN");
    }
  }
}

TEST(Gemm, MixedDenseTimesQuantizedAndEpilogue) {
  const Tensor x = random_tensor(DType::BF16, {16, 64}, Fill::Normal, 3);
  const Tensor w = random_tensor(DType::F32, {24, 64}, Fill::Normal, 4);
  const QuantizedTensor wq = quantize(w.view(), QuantizeOptions{});
  const GemmOperand a = GemmOperand::from_dense(x.view()), b = GemmOperand::from(wq, Usage::Rowwise);
  Tensor c = random_tensor(DType::F32, {16, 24}, Fill::Normal, 5),
         bias = random_tensor(DType::F32, {24}, Fill::Normal, 6);
  GemmProblem p;
  p.alpha = 0.5f;
  p.beta = 2.0f;
  p.c = c.view();
  p.bias = bias.view();
  const Tensor d = gemm(a, b, p);
  // Mixed: the NVFP4 operand's global scale is amax * RN(1/2688).
  const double alpha = (0.5f * wq.rowwise_amax) * (1.0f / 2688.0f);
  std::vector<double> mag;
  const std::vector<double> ref = reference(a, b, alpha, &mag);
  for (int64_t i = 0; i < 16 * 24; ++i) {
    const double want = ref[i] + 2.0 * c.data_as<float>()[i] + bias.data_as<float>()[i % 24];
    EXPECT_NEAR(d.data_as<float>()[i], want, 64 * std::ldexp(1.0, -22) * (mag[i] + std::fabs(want)) + 1e-6)
        << i;
  }
  // bf16 / f16 outputs are the f32 result rounded once.
  for (DType out : {DType::BF16, DType::F16}) {
    GemmProblem q = p;
    q.out_dtype = out;
    const Tensor h = gemm(a, b, q);
    for (int64_t i = 0; i < h.numel(); ++i) {
      const float v = d.data_as<float>()[i];
      EXPECT_EQ(h.data_as<uint16_t>()[i], out == DType::BF16 ? float_to_bf16(v) : float_to_half(v));
    }
  }
}

// The bf16 route (oneDNN, where built and the CPU multiplies bf16) flushes subnormal inputs and
// results: panels with a value that could make a subnormal product or partial sum go through
// sgemm. Each case's exact result is a tiny nonzero fp32 value. Only the first and the last would
// differ on the bf16 route (subnormal products flushed to 0; a value that is no bf16 value); the
// others pin the rule's edges.
TEST(Gemm, ValuesThatCouldMakeSubnormalsStayExact) {
  struct Case {
    float a, b;  // every element of A and of B (K = 32)
  };
  for (const Case c : {Case{0x1p-70f, 0x1p-70f},             // products 2^-140: subnormal
                       Case{0x1p-60f, 0x1p-63f},             // both below the route's 2^-56
                       Case{0x1.02p-50f, 0x1p-76f},          // a product's last bit at 2^-133
                       Case{1.0f + 0x1p-10f, 0x1p-126f}}) {  // A no bf16 value, B the least normal
    Tensor a(DType::F32, {4, 32}), b(DType::F32, {8, 32});
    std::fill_n(a.data_as<float>(), a.numel(), c.a);
    std::fill_n(b.data_as<float>(), b.numel(), c.b);
    const Tensor d = gemm(GemmOperand::from_dense(a.view()), GemmOperand::from_dense(b.view()));
    const float want = static_cast<float>(32.0 * static_cast<double>(c.a) * c.b);
    ASSERT_NE(want, 0.0f);
    for (int64_t i = 0; i < d.numel(); ++i) EXPECT_EQ(d.data_as<float>()[i], want) << c.a << " x " << c.b;
  }
}

// Products that are normal but whose sum is subnormal: (1 + 2^-7) 2^-126 - 2^-126 = 2^-133. A guard
// on the products alone would let the bf16 route flush the sum; values below 2^-56 keep it off.
TEST(Gemm, SubnormalSumOfNormalProductsStaysExact) {
  Tensor a(DType::F32, {1, 32}), b(DType::F32, {1, 32});
  std::fill_n(a.data_as<float>(), 32, 0.0f);
  std::fill_n(b.data_as<float>(), 32, 0.0f);
  a.data_as<float>()[0] = 0x1.02p-63f;  // (1 + 2^-7) 2^-63
  a.data_as<float>()[1] = -0x1p-63f;
  b.data_as<float>()[0] = b.data_as<float>()[1] = 0x1p-63f;
  const Tensor d = gemm(GemmOperand::from_dense(a.view()), GemmOperand::from_dense(b.view()));
  EXPECT_EQ(d.data_as<float>()[0], 0x1p-133f);
}

// Two K-panels (4096 wide): the first, of values below 2^-56, goes through sgemm and leaves
// subnormal sums; the second (zeros times ones) fits bf16, but stays on sgemm, so that those sums
// are not added onto by the bf16 route, whose instructions may flush them. (oneDNN 2.6 on Zen 4
// adds the earlier sums with IEEE arithmetic and keeps them even without that rule: there this
// test cannot fail; the rule is for kernels that accumulate inside the bf16 instruction.)
TEST(Gemm, SubnormalSumsOfAnEarlierPanelSurvive) {
  Tensor a(DType::F32, {4, 8192}), b(DType::F32, {8, 8192});
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t p = 0; p < 8192; ++p) a.data_as<float>()[r * 8192 + p] = p < 4096 ? 0x1p-70f : 0.0f;
  }
  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t p = 0; p < 8192; ++p) b.data_as<float>()[r * 8192 + p] = p < 4096 ? 0x1p-70f : 1.0f;
  }
  const Tensor d = gemm(GemmOperand::from_dense(a.view()), GemmOperand::from_dense(b.view()));
  for (int64_t i = 0; i < d.numel(); ++i) EXPECT_EQ(d.data_as<float>()[i], 0x1p-128f) << i;  // 4096 * 2^-140
}

// Exact-by-construction bf16 values (small integers times powers of two within 2^-56..): both
// routes give the exact sums, so the result is the same whichever ran.
TEST(Gemm, Bf16ValuesGiveExactSums) {
  Tensor a(DType::BF16, {33, 64}), b(DType::BF16, {17, 64});
  std::vector<double> av(a.numel()), bv(b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) {
    av[i] = std::ldexp(static_cast<double>(static_cast<int>(i % 7) - 3), static_cast<int>(i % 5) - 2);
    a.data_as<uint16_t>()[i] = float_to_bf16(static_cast<float>(av[i]));
  }
  for (int64_t i = 0; i < b.numel(); ++i) {
    bv[i] = std::ldexp(static_cast<double>(static_cast<int>(i % 11) - 5), -static_cast<int>(i % 3));
    b.data_as<uint16_t>()[i] = float_to_bf16(static_cast<float>(bv[i]));
  }
  const Tensor d = gemm(GemmOperand::from_dense(a.view()), GemmOperand::from_dense(b.view()));
  for (int64_t i = 0; i < 33; ++i) {
    for (int64_t j = 0; j < 17; ++j) {
      double want = 0;
      for (int64_t p = 0; p < 64; ++p) want += av[i * 64 + p] * bv[j * 64 + p];
      EXPECT_EQ(d.data_as<float>()[i * 17 + j], static_cast<float>(want)) << i << ", " << j;
    }
  }
}

// The GPU MODE nvfp4_gemm inputs, as they are laid out: a [M, K/2, L] and b [N, K/2, L] K-major
// e2m1 bytes, scales already in the 128x4 swizzled ("permuted") layout, c fp16 [M, N, L].
TEST(Gemm, GpuModeNvfp4Interface) {
  const int64_t m = 128, n = 256, k = 256, l = 2;
  std::mt19937 rng(7);
  // Made as [L, M, K/2] contiguous, viewed as [M, K/2, L] with strides (K/2, 1, M*K/2).
  std::vector<uint8_t> a_bytes(l * m * k / 2), b_bytes(l * n * k / 2);
  for (auto& v : a_bytes) v = static_cast<uint8_t>(rng());
  for (auto& v : b_bytes) v = static_cast<uint8_t>(rng());
  // Scales in {0, 1, 2, 3} (e4m3 codes 0x00, 0x38, 0x40, 0x44), compact then swizzled per batch.
  const uint8_t scale_codes[4] = {0x00, 0x38, 0x40, 0x44};
  auto scales = [&](int64_t rows, std::vector<uint8_t>& compact, std::vector<uint8_t>& swizzled) {
    compact.resize(l * rows * k / 16);
    for (auto& v : compact) v = scale_codes[rng() % 4];
    swizzled.assign(l * rows * k / 16, 0);
    for (int64_t b = 0; b < l; ++b) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < k / 16; ++c) {
          swizzled[b * rows * k / 16 + swizzled_offset(r, c, k / 16)] =
              compact[(b * rows + r) * (k / 16) + c];
        }
      }
    }
  };
  std::vector<uint8_t> sfa, sfa_perm, sfb, sfb_perm;
  scales(m, sfa, sfa_perm);
  scales(n, sfb, sfb_perm);
  GemmOperand a, b;
  a.quantized = b.quantized = true;
  a.data = TensorView::from_buffer(a_bytes.data(), a_bytes.size(), DType::U8, {m, k / 2, l});
  a.data.strides = {k / 2, 1, m * k / 2};
  b.data = TensorView::from_buffer(b_bytes.data(), b_bytes.size(), DType::U8, {n, k / 2, l});
  b.data.strides = {k / 2, 1, n * k / 2};
  a.scales = TensorView::from_buffer(sfa_perm.data(), sfa_perm.size(), DType::U8,
                                     {static_cast<int64_t>(sfa_perm.size())});
  b.scales = TensorView::from_buffer(sfb_perm.data(), sfb_perm.size(), DType::U8,
                                     {static_cast<int64_t>(sfb_perm.size())});
  a.scale_layout = b.scale_layout = ScaleLayout::Swizzled;
  std::vector<uint16_t> c_buf(l * m * n, 0x7E00);  // garbage the kernel must overwrite
  TensorView c = TensorView::from_buffer(c_buf.data(), c_buf.size() * 2, DType::F16, {m, n, l});
  c.strides = {n, 1, m * n};
  gemm_into(a, b, GemmProblem{}, c);
  // For this data every sum is exact in fp32, so c is the correctly rounded fp16 of the exact sum.
  const std::vector<double> ref = reference(a, b, 1.0, nullptr);
  int64_t bad = 0;
  for (int64_t bi = 0; bi < l; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        bad += c_buf[bi * m * n + i * n + j] != float_to_half(static_cast<float>(ref[(bi * m + i) * n + j]));
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Gemm, ClearErrors) {
  const Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Normal, 1);
  const Tensor w = random_tensor(DType::F32, {32, 96}, Fill::Normal, 2);
  const QuantizedTensor xq = quantize(x.view(), QuantizeOptions{}),
                        wq = quantize(w.view(), QuantizeOptions{});
  auto expect_error = [](auto fn, const std::string& text) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([&] { gemm(GemmOperand::from(xq, Usage::Rowwise), GemmOperand::from(wq, Usage::Rowwise)); },
               "K differ");
  expect_error([&] { GemmOperand::from(xq, Usage::Columnwise); }, "no columnwise");
  expect_error([&] { te_gemm_operands(xq, wq, "XY"); }, "layout must be");
  QuantizeOptions mx;
  mx.scheme = Scheme::MXFP8_E4M3;
  const QuantizedTensor xm = quantize(x.view(), mx);
  expect_error([&] { gemm(GemmOperand::from(xq, Usage::Rowwise), GemmOperand::from(xm, Usage::Rowwise)); },
               "different block sizes");
  {  // an output view whose strides put two elements at one address
    Tensor d(DType::F32, {32, 32});
    TensorView overlapping = d.view();
    overlapping.shape = {8, 8};
    overlapping.strides = {1, 1};
    const QuantizedTensor a8 =
        quantize(random_tensor(DType::F32, {8, 64}, Fill::Normal, 5).view(), QuantizeOptions{});
    expect_error(
        [&] {
          gemm_into(GemmOperand::from(a8, Usage::Rowwise), GemmOperand::from(a8, Usage::Rowwise), {},
                    overlapping);
        },
        "overlap");
  }
  GemmOperand bad = GemmOperand::from(xq, Usage::Rowwise);
  bad.scales.shape = {32, 3};
  expect_error([&] { gemm(bad, GemmOperand::from(xq, Usage::Rowwise)); }, "compact scales");
  bad = GemmOperand::from(xq, Usage::Rowwise);
  bad.data.dtype = DType::F32;
  expect_error([&] { gemm(bad, GemmOperand::from(xq, Usage::Rowwise)); }, "u8 codes");
  GemmProblem p;
  p.out_dtype = DType::U8;
  expect_error([&] { gemm(GemmOperand::from(xq, Usage::Rowwise), GemmOperand::from(xq, Usage::Rowwise), p); },
               "out_dtype");
  const Tensor bias = random_tensor(DType::F32, {5}, Fill::Normal, 3);
  GemmProblem pb;
  pb.bias = bias.view();
  expect_error(
      [&] { gemm(GemmOperand::from(xq, Usage::Rowwise), GemmOperand::from(xq, Usage::Rowwise), pb); },
      "bias must be");
  const Tensor u8(DType::U8, {4, 4});
  expect_error([&] { gemm(GemmOperand::from_dense(u8.view()), GemmOperand::from_dense(u8.view())); },
               "f32, bf16 or f16");
  bad = GemmOperand::from(xq, Usage::Rowwise);
  bad.scale_layout = static_cast<ScaleLayout>(7);
  expect_error([&] { gemm(bad, GemmOperand::from(xq, Usage::Rowwise)); }, "unknown scale layout id 7");
}

// A 6-bit operand's bytes with the two high bits set are no code of the format: an error, from
// either panel path (K-major rowwise data, and MX columnwise data stored untransposed).
TEST(Gemm, SixBitOperandWithInvalidBytesIsAnError) {
  const Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Normal, 1);
  for (Scheme scheme : {Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2}) {
    QuantizeOptions o;
    o.scheme = scheme;
    o.columnwise = true;
    QuantizedTensor q = quantize(x.view(), o);
    const Tensor fine = gemm(GemmOperand::from(q, Usage::Rowwise), GemmOperand::from(q, Usage::Rowwise));
    EXPECT_EQ(fine.shape(), (std::vector<int64_t>{32, 32}));
    for (Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
      QuantizedTensor broken = q;
      Tensor& data = usage == Usage::Rowwise ? broken.rowwise_data : broken.columnwise_data;
      data = Tensor(DType::U8, data.shape());  // a copy: q's bytes stay valid
      const Tensor& original = usage == Usage::Rowwise ? q.rowwise_data : q.columnwise_data;
      std::copy_n(original.data_as<uint8_t>(), original.numel(), data.data_as<uint8_t>());
      data.data_as<uint8_t>()[37] = 0xC5;
      const GemmOperand op = GemmOperand::from(broken, usage);
      try {
        gemm(op, op);
        ADD_FAILURE() << scheme_name(scheme) << ": no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not " + std::string(format_info(element_format(scheme)).name) +
                                             " codes"),
                  std::string::npos)
            << e.what();
      }
      const OperandReader reader(op);  // stored byte 37 is (row 0, column 37) of [32, 64]
      EXPECT_THROW(usage == Usage::Rowwise ? reader.at(0, 0, 37) : reader.at(0, 37, 0), Error);
    }
  }
}

}  // namespace
}  // namespace microscale
