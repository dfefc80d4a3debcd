// dequantize (threads + vectorised decode) against dequantize_ref (a table lookup per element),
// bit for bit: every scheme, both usages, compact and swizzled scales, f32 / bf16 / f16 output,
// row-scaled NVFP4 and the 4over6 bound, over random bytes (every code, every scale byte,
// NaN scales included); and bytes that are no code of a 6-bit format are an error on both paths.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "microscale/error.hpp"
#include "microscale/quantize.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;

void randomize(Tensor& t, uint8_t mask, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<uint8_t>()[i] = static_cast<uint8_t>(rng() & mask);
}

void expect_same_bytes(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const auto* g = static_cast<const uint8_t*>(got.data());
  const auto* w = static_cast<const uint8_t*>(want.data());
  size_t first_difference = got.nbytes();
  for (size_t i = 0; i < got.nbytes(); ++i) {
    if (g[i] != w[i]) {
      first_difference = i;
      break;
    }
  }
  EXPECT_EQ(first_difference, got.nbytes()) << what << ": first differing byte";
}

struct Variant {
  Scheme scheme;
  bool row_scaled = false;
  int nvfp4_e4m3_max = 448;
};

TEST(Dequantize, EqualsReferenceOnEveryCodeAndScaleByte) {
  // 96 x 160: three MX blocks down the columns, 2.5 of the fast path's 64-code steps along a row.
  const Tensor x = random_tensor(DType::F32, {96, 160}, Fill::Normal, 3);
  uint32_t seed = 100;
  for (const Variant& v :
       {Variant{Scheme::NVFP4}, Variant{Scheme::NVFP4, true}, Variant{Scheme::NVFP4, false, 256},
        Variant{Scheme::MXFP8_E4M3}, Variant{Scheme::MXFP8_E5M2}, Variant{Scheme::MXFP6_E2M3},
        Variant{Scheme::MXFP6_E3M2}, Variant{Scheme::MXFP4}}) {
    const uint8_t code_mask = format_info(element_format(v.scheme)).bits == 6 ? 0x3F : 0xFF;
    for (ScaleLayout layout : {ScaleLayout::Compact, ScaleLayout::Swizzled}) {
      QuantizeOptions o;
      o.scheme = v.scheme;
      o.rowwise = o.columnwise = true;
      o.scale_layout = layout;
      o.row_scaled = v.row_scaled;
      o.nvfp4_e4m3_max = v.nvfp4_e4m3_max;
      if (v.nvfp4_e4m3_max == 256) o.four_over_six = FourOverSix::MinMae;
      QuantizedTensor q = quantize(x.view(), o);
      for (Tensor* t : {&q.rowwise_data, &q.columnwise_data}) randomize(*t, code_mask, seed++);
      for (Tensor* t : {&q.rowwise_scale, &q.columnwise_scale}) randomize(*t, 0xFF, seed++);
      for (Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
        for (DType out : {DType::F32, DType::BF16, DType::F16}) {
          const std::string what = std::string(scheme_name(v.scheme)) + (v.row_scaled ? " row-scaled" : "") +
                                   " bound " + std::to_string(v.nvfp4_e4m3_max) +
                                   (layout == ScaleLayout::Swizzled ? " swizzled " : " compact ") +
                                   (usage == Usage::Rowwise ? "rowwise " : "columnwise ") +
                                   std::string(dtype_name(out));
          expect_same_bytes(dequantize(q, usage, out), dequantize_ref(q, usage, out), what);
        }
      }
    }
  }
}

TEST(Dequantize, SixBitBytesThatAreNoCodesAreAnError) {
  const Tensor x = random_tensor(DType::F32, {64, 64}, Fill::Normal, 4);
  for (Scheme scheme : {Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2}) {
    QuantizeOptions o;
    o.scheme = scheme;
    o.rowwise = o.columnwise = true;
    QuantizedTensor q = quantize(x.view(), o);
    q.rowwise_data.data_as<uint8_t>()[70] = 0xC5;
    q.columnwise_data.data_as<uint8_t>()[4000] = 0x41;
    const std::string name(format_info(element_format(scheme)).name);
    for (Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
      for (auto* path : {&dequantize, &dequantize_ref}) {
        try {
          (*path)(q, usage, DType::F32);
          ADD_FAILURE() << scheme_name(scheme) << ": no error";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("not " + name + " codes"), std::string::npos) << e.what();
        }
      }
    }
  }
}

}  // namespace
}  // namespace microscale
