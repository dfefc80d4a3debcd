// The CPU GEMM's panel decode (cpu/decode_codes.hpp through OperandReader::dequantize_panel)
// against OperandReader::at, the table-lookup reference, bit for bit: every scheme, K-major and
// transposed (MX columnwise) codes, compact and swizzled scales, a batch dim, panels that start
// past K index 0, row counts that leave a partial group (odd for byte codes), every code and every
// scale byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/operand_access.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;

std::vector<uint8_t> random_bytes(size_t count, uint8_t mask, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(count);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() & mask);
  return bytes;
}

// dequantize_panel(l, k0, width) equals at(l, r, k0 + j) for every element, bit for bit; a NaN
// equals any NaN (which of a NaN code and a NaN scale a product passes on is the multiply's
// operand order, which the vectorised loop may swap).
void expect_panels_equal_at(const OperandReader& reader, int64_t k0, int64_t width, const std::string& what) {
  std::vector<float> panel(static_cast<size_t>(reader.rows() * width));
  int64_t bad = 0;
  for (int64_t l = 0; l < reader.batches(); ++l) {
    reader.dequantize_panel(l, k0, width, panel.data());
    for (int64_t r = 0; r < reader.rows(); ++r) {
      for (int64_t j = 0; j < width; ++j) {
        const float want = reader.at(l, r, k0 + j), got = panel[r * width + j];
        const bool same = float_bits(want) == float_bits(got) || (std::isnan(want) && std::isnan(got));
        if (!same && ++bad <= 3) {
          ADD_FAILURE() << what << ": batch " << l << " row " << r << " k " << k0 + j << ": " << got << " vs "
                        << want;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(PanelDecode, EqualsElementAccessForEverySchemeLayoutAndWalk) {
  constexpr int64_t kK = 128;
  uint32_t seed = 1;
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3,
                        Scheme::MXFP6_E3M2, Scheme::MXFP4}) {
    const int block = block_size(scheme);
    const bool fp4 = element_format(scheme) == Format::E2M1;
    const uint8_t code_mask = format_info(element_format(scheme)).bits == 6 ? 0x3F : 0xFF;
    // Two full groups of 16 rows and a partial one: of 8 rows for FP4 (whose rows pair up in a
    // transposed operand's bytes), of 5 otherwise.
    const int64_t kRows = fp4 ? 40 : 37;
    for (bool transposed : {false, true}) {
      for (ScaleLayout layout : {ScaleLayout::Compact, ScaleLayout::Swizzled}) {
        for (int64_t batches : {1, 2}) {
          // Stored codes: [kRows, K] or, transposed, [K, kRows] (FP4: the last dim halved), batch
          // outermost in memory.
          const int64_t stored_rows = transposed ? kK : kRows, stored_cols = transposed ? kRows : kK;
          const int64_t stored_bytes = fp4 ? stored_cols / 2 : stored_cols;
          std::vector<uint8_t> data =
              random_bytes(static_cast<size_t>(batches * stored_rows * stored_bytes), code_mask, seed++);
          const int64_t blocks = kK / block;
          const int64_t scale_image =
              layout == ScaleLayout::Swizzled ? swizzled_rows(kRows) * swizzled_cols(blocks) : kRows * blocks;
          std::vector<uint8_t> scales =
              random_bytes(static_cast<size_t>(batches * scale_image), 0xFF, seed++);
          GemmOperand op;
          op.quantized = true;
          op.scheme = scheme;
          op.stored_transposed = transposed;
          op.scale_layout = layout;
          op.data = TensorView{data.data(), DType::U8, {stored_rows, stored_bytes}, {}};
          if (layout == ScaleLayout::Swizzled) {
            op.scales = TensorView{scales.data(), DType::U8, {scale_image * batches}, {}};
          } else {
            const int64_t srows = transposed ? blocks : kRows, scols = transposed ? kRows : blocks;
            op.scales = TensorView{scales.data(), DType::U8, {srows, scols}, {}};
            if (batches > 1) {
              op.scales.shape.push_back(batches);
              op.scales.strides = {scols, 1, srows * scols};
            }
          }
          if (batches > 1) {
            op.data.shape.push_back(batches);
            op.data.strides = {stored_bytes, 1, stored_rows * stored_bytes};
          }
          const OperandReader reader(op);
          ASSERT_EQ(reader.rows(), kRows);
          ASSERT_EQ(reader.k(), kK);
          const std::string what = std::string(scheme_name(scheme)) +
                                   (transposed ? " transposed" : " K-major") +
                                   (layout == ScaleLayout::Swizzled ? " swizzled" : " compact") +
                                   " batches " + std::to_string(batches);
          expect_panels_equal_at(reader, 0, kK, what);
          expect_panels_equal_at(reader, 2 * block, kK - 2 * block,
                                 what + " (panel from K index 2 blocks in)");
        }
      }
    }
  }
}

TEST(PanelDecode, DenseRowsEqualElementAccess) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor x = random_tensor(dtype, {37, 96}, Fill::Specials, 7);
    const GemmOperand op = GemmOperand::from_dense(x.view());
    const OperandReader reader(op);  // keeps a reference to op
    expect_panels_equal_at(reader, 0, 96, "dense " + std::string(dtype_name(dtype)));
    expect_panels_equal_at(reader, 32, 64, "dense " + std::string(dtype_name(dtype)) + " from K index 32");
  }
}

}  // namespace
}  // namespace microscale
