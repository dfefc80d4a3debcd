// NVFP4 4over6 (FourOverSix, quantize.hpp): worked blocks whose picks follow from the definition,
// the fast path against the reference, dequantization and the GEMM with the bound of 256, and the
// options 4over6 does not take.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/scale_math.hpp"
#include "kernel_sets.hpp"
#include "microscale/error.hpp"
#include "microscale/gemm.hpp"
#include "microscale/quantize.hpp"
#include "microscale/recipe.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;
using testing_data::same_bytes;

// Rows of 16 fp32 values as a [rows, 16] tensor.
Tensor rows_of(const std::vector<std::vector<float>>& rows) {
  Tensor t(DType::F32, {static_cast<int64_t>(rows.size()), 16});
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < 16; ++i) t.data_as<float>()[r * 16 + i] = i < rows[r].size() ? rows[r][i] : 0.0f;
  }
  return t;
}

// 4over6 with the bound 256 and the amax 1536: S_enc = 1536 / 1536 = 1, so a block of amax 48
// has map to 6's scale 48 / 6 = 8 (E4M3 0x50) and map to 4's 12 (0x54), both exact, and the
// error terms are plain differences of values.
QuantizeOptions worked_options(FourOverSix mode) {
  QuantizeOptions o;
  o.scheme = Scheme::NVFP4;
  o.four_over_six = mode;
  o.nvfp4_e4m3_max = 256;
  o.amax_rowwise = 1536.0f;
  return o;
}

struct Expected {
  uint8_t scale;
  uint8_t byte0, byte1;  // codes of elements 0-1 and 2-3
};

void expect_rows(const QuantizedTensor& q, const std::vector<Expected>& rows, const std::string& what) {
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(q.rowwise_scale.data_as<uint8_t>()[r], rows[r].scale) << what << " row " << r;
    EXPECT_EQ(q.rowwise_data.data_as<uint8_t>()[r * 8], rows[r].byte0) << what << " row " << r;
    EXPECT_EQ(q.rowwise_data.data_as<uint8_t>()[r * 8 + 1], rows[r].byte1) << what << " row " << r;
  }
}

TEST(FourOverSix, WorkedBlocks) {
  // [48, 36]: map to 6 gives 6 and 4.5 -> 4 (32, off by 4); map to 4 gives 4 and 3, exact.
  // [48, 32]: map to 6 exact (6, 4); map to 4 gives 4 and 2.67 -> 3 (36, off by 4).
  // [48]: both exact, a tie, which keeps map to 6.
  // [48, 40, 32, 44]: map to 4 (4, 3, 3, 4) is off by 0, 4, 4, 4; map to 6 (6, 5 -> 4, 4, 5.5 -> 6)
  // by 0, 8, 0, 4. The absolute errors tie (12 and 12: map to 6), the squared ones do not (48 < 80).
  // E2M1 codes: 3 -> 5, 4 -> 6, 6 -> 7; even elements in the low nibble.
  const Tensor x = rows_of({{48, 36}, {48, 32}, {48}, {48, 40, 32, 44}});
  const Expected map4_48_36{0x54, 0x56, 0x00}, map6_48_32{0x50, 0x67, 0x00}, tie{0x50, 0x07, 0x00};
  const QuantizedTensor mae = quantize_ref(x.view(), worked_options(FourOverSix::MinMae));
  expect_rows(mae, {map4_48_36, map6_48_32, tie, {0x50, 0x67, 0x76}}, "MAE");
  const QuantizedTensor mse = quantize_ref(x.view(), worked_options(FourOverSix::MinMse));
  expect_rows(mse, {map4_48_36, map6_48_32, tie, {0x54, 0x56, 0x65}}, "MSE");
  EXPECT_EQ(mae.nvfp4_e4m3_max, 256);
  EXPECT_EQ(mae.rowwise_amax, 1536.0f);
  // The fast path, and the scaled-domain error, which here (S_enc = 1) measures the same.
  for (FourOverSix mode : {FourOverSix::MinMae, FourOverSix::MinMse}) {
    QuantizeOptions o = worked_options(mode);
    const QuantizedTensor ref = quantize_ref(x.view(), o);
    EXPECT_TRUE(same_bytes(quantize(x.view(), o).rowwise_data, ref.rowwise_data));
    o.four_over_six_scaled_error = true;
    EXPECT_TRUE(same_bytes(quantize_ref(x.view(), o).rowwise_data, ref.rowwise_data));
  }
  // Dequantized: map to 4's 4 and 3 times 12 give the input back.
  const Tensor back = dequantize(mae, Usage::Rowwise);
  EXPECT_EQ(back.data_as<float>()[0], 48.0f);
  EXPECT_EQ(back.data_as<float>()[1], 36.0f);
}

// The tile's error adds its rows in TE's tree, not in row order: 4 and fifteen times 2^-22 (half an
// ulp of 4) stay 4 in row order (each add a tie to even), and not in the tree, where the small
// terms meet each other first.
TEST(FourOverSix, TileErrorAddsAsATree) {
  float e[16];
  for (float& v : e) v = 0x1p-22f;
  e[0] = 4.0f;
  float in_order = 0.0f;
  for (float v : e) in_order += v;
  EXPECT_EQ(in_order, 4.0f);
  // (ulp(4) = 2^-21) e[0] + e[8] = 4 (a tie, to even), the seven other pairs 2^-21; 4 apart:
  // 4 + 2^-21 and three of 2^-20; 2 apart: 4 + 3 * 2^-21 and 2^-19; 1 apart: 4 + 7 * 2^-21, exact.
  EXPECT_EQ(four_over_six_tile_error(e, 1), 4.0f + 7 * 0x1p-21f);
  float strided[32] = {};
  for (int i = 0; i < 16; ++i) strided[2 * i] = e[i];
  EXPECT_EQ(four_over_six_tile_error(strided, 2), 4.0f + 7 * 0x1p-21f);
}

TEST(FourOverSix, TilePicksFromTheSumOfItsRows) {
  // A 16x16 tile of amax 48 whose rows favour map to 4 (rows [48, 36], off by 4 under map to 6)
  // and map to 6 (rows [48, 32], off by 4 under map to 4): the tile goes with the sum.
  std::vector<std::vector<float>> favour4(16, {48, 36}), even(16, {48, 36});
  for (int r = 0; r < 6; ++r) favour4[r] = {48, 32};  // 10 rows for map to 4, 6 for map to 6
  for (int r = 0; r < 8; ++r) even[r] = {48, 32};     // 8 and 8: a tie, map to 6
  for (const auto& [rows, scale] : {std::pair{favour4, uint8_t{0x54}}, std::pair{even, uint8_t{0x50}}}) {
    QuantizeOptions o = worked_options(FourOverSix::MinMae);
    o.tile = Tile::k16x16;
    o.columnwise = true;
    o.amax_columnwise = 1536.0f;
    const Tensor x = rows_of(rows);
    const QuantizedTensor q = quantize_ref(x.view(), o);
    for (int r = 0; r < 16; ++r) EXPECT_EQ(q.rowwise_scale.data_as<uint8_t>()[r], scale) << "row " << r;
    const QuantizedTensor fast = quantize(x.view(), o);
    EXPECT_TRUE(same_bytes(fast.rowwise_data, q.rowwise_data));
    EXPECT_TRUE(same_bytes(fast.rowwise_scale, q.rowwise_scale));
    EXPECT_TRUE(same_bytes(fast.columnwise_data, q.columnwise_data));
    EXPECT_TRUE(same_bytes(fast.columnwise_scale, q.columnwise_scale));
  }
}

// The fast path equals the reference on every kernel set, for both error modes and domains, both
// bounds, both tiles, one or both directions, amaxes found or given, and every input dtype.
TEST(FourOverSix, FastEqualsReference) {
  uint32_t seed = 40;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Specials, Fill::Sparse, Fill::Tiny}) {
      for (auto shape : {std::vector<int64_t>{32, 64}, {2, 48, 160}, {64, 16}}) {
        for (int variant = 0; variant < 16; ++variant) {
          const Tensor x = random_tensor(dtype, shape, fill, seed++);
          QuantizeOptions o;
          o.scheme = Scheme::NVFP4;
          o.four_over_six = variant % 2 == 0 ? FourOverSix::MinMae : FourOverSix::MinMse;
          o.four_over_six_scaled_error = variant % 4 >= 2;
          o.nvfp4_e4m3_max = variant % 8 < 4 ? 256 : 448;
          o.tile = variant < 8 ? Tile::k16x16 : Tile::k1x16;  // every mode, domain and bound in both
          o.columnwise = true;
          o.rowwise = seed % 5 != 0;
          if (seed % 7 == 0) o.amax_rowwise = o.amax_columnwise = 3.0f;
          o.num_threads = 2;
          const std::string what = std::string(dtype_name(dtype)) + " " + shape_string(shape) + " variant " +
                                   std::to_string(variant) + " tile " + std::string(tile_name(o.tile));
          const QuantizedTensor ref = quantize_ref(x.view(), o);
          for (const char* kernels : testing_data::kKernelSets) {
            if (!testing_data::select_kernel_set(kernels)) continue;
            const QuantizedTensor fast = quantize(x.view(), o);
            EXPECT_TRUE(same_bytes(fast.rowwise_data, ref.rowwise_data)) << what;
            EXPECT_TRUE(same_bytes(fast.rowwise_scale, ref.rowwise_scale)) << what;
            EXPECT_TRUE(same_bytes(fast.columnwise_data, ref.columnwise_data)) << what;
            EXPECT_TRUE(same_bytes(fast.columnwise_scale, ref.columnwise_scale)) << what;
            EXPECT_EQ(float_bits(fast.rowwise_amax), float_bits(ref.rowwise_amax)) << what;
            EXPECT_EQ(float_bits(fast.columnwise_amax), float_bits(ref.columnwise_amax)) << what;
            EXPECT_EQ(fast.nvfp4_e4m3_max, o.nvfp4_e4m3_max) << what;
          }
          unsetenv("MICROSCALE_CPU_KERNELS");
        }
      }
    }
  }
}

// A short last band (rowwise 1x16 only: rows not a multiple of 16).
TEST(FourOverSix, FastEqualsReferenceShortBand) {
  const Tensor x = random_tensor(DType::BF16, {21, 48}, Fill::Normal, 7);
  QuantizeOptions o;
  o.scheme = Scheme::NVFP4;
  o.four_over_six = FourOverSix::MinMse;
  const QuantizedTensor ref = quantize_ref(x.view(), o), fast = quantize(x.view(), o);
  EXPECT_TRUE(same_bytes(fast.rowwise_data, ref.rowwise_data));
  EXPECT_TRUE(same_bytes(fast.rowwise_scale, ref.rowwise_scale));
}

// 4over6 picks per block the encoding with the smaller error, so its total error is at most the
// plain encoding's with the same bound: checked against map to 6 alone, the plain NVFP4 path
// (which differs only in folding 1/6 into S_enc, an ulp on some scales, so compared in sum).
TEST(FourOverSix, NoWorseThanPlainNvfp4) {
  const Tensor x = random_tensor(DType::F32, {256, 256}, Fill::Normal, 3);
  QuantizeOptions plain;
  plain.scheme = Scheme::NVFP4;
  QuantizeOptions fos = plain;
  fos.four_over_six = FourOverSix::MinMse;
  auto squared_error = [&](const QuantizeOptions& o) {
    const Tensor back = dequantize(quantize(x.view(), o), Usage::Rowwise);
    double sum = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double d = static_cast<double>(back.data_as<float>()[i]) - x.data_as<float>()[i];
      sum += d * d;
    }
    return sum;
  };
  const double plain_error = squared_error(plain), fos_error = squared_error(fos);
  EXPECT_LT(fos_error, plain_error * 0.9) << "plain " << plain_error << ", 4over6 " << fos_error;
  fos.nvfp4_e4m3_max = 256;
  EXPECT_LT(squared_error(fos), plain_error * 0.9);
}

// Dequantization and the GEMM use S_enc = 1536 / amax for a tensor quantized with the bound 256.
TEST(FourOverSix, DequantizeAndGemmWithBound256) {
  const Tensor a = random_tensor(DType::F32, {32, 64}, Fill::Normal, 11);
  const Tensor b = random_tensor(DType::F32, {16, 64}, Fill::Normal, 12);
  QuantizeOptions o;
  o.scheme = Scheme::NVFP4;
  o.four_over_six = FourOverSix::MinMae;
  o.nvfp4_e4m3_max = 256;
  const QuantizedTensor qa = quantize(a.view(), o), qb = quantize(b.view(), o);
  const Tensor da = dequantize(qa, Usage::Rowwise), db = dequantize(qb, Usage::Rowwise);
  // Element (0, j) of a dequantized is code * RN(scale * RN(amax / 1536)) (S_dec = 1 / S_enc).
  const float s_dec = 1.0f / (1536.0f / qa.rowwise_amax);
  for (int j = 0; j < 16; ++j) {
    const uint8_t byte = qa.rowwise_data.data_as<uint8_t>()[j / 2];
    const uint8_t code = j % 2 == 0 ? (byte & 0xF) : (byte >> 4);
    const float scale = decode(Format::E4M3, qa.rowwise_scale.data_as<uint8_t>()[0]);
    EXPECT_EQ(da.data_as<float>()[j], decode(Format::E2M1, code) * (scale * s_dec)) << j;
  }
  // The GEMM: sums of code * scale products times amax_a * amax_b * RN(1 / (36 * 256^2)), against
  // the dequantized operands' products (448 in place of 256 would be off by (448/256)^2).
  const Tensor d = gemm(GemmOperand::from(qa, Usage::Rowwise), GemmOperand::from(qb, Usage::Rowwise));
  for (int64_t i = 0; i < 32; ++i) {
    for (int64_t n = 0; n < 16; ++n) {
      double sum = 0;  // the dequantized values carry RN(amax / 1536): compare to within a few ulps
      for (int64_t k = 0; k < 64; ++k)
        sum += static_cast<double>(da.data_as<float>()[i * 64 + k]) * db.data_as<float>()[n * 64 + k];
      EXPECT_NEAR(d.data_as<float>()[i * 16 + n], sum, 1e-5 * (1 + std::abs(sum))) << i << ", " << n;
    }
  }
  EXPECT_EQ(GemmOperand::from(qa, Usage::Rowwise).nvfp4_e4m3_max, 256);
}

void expect_rejected(const QuantizeOptions& o, const std::string& reason) {
  const Tensor x = random_tensor(DType::BF16, {32, 32}, Fill::Normal, 1);
  for (auto fn : {quantize, quantize_ref}) {
    try {
      fn(x.view(), o);
      ADD_FAILURE() << "accepted; expected an error about '" << reason << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

TEST(FourOverSix, OptionsItDoesNotTake) {
  QuantizeOptions o;
  o.scheme = Scheme::NVFP4;
  o.four_over_six = FourOverSix::MinMae;
  o.columnwise = true;
  o.rht = true;
  expect_rejected(o, "4over6 does not take the RHT");
  o.rht = false;
  o.stochastic_rounding = StochasticRounding{1, 0};
  expect_rejected(o, "does not take stochastic rounding");
  o.stochastic_rounding.reset();
  o.nvfp4_e4m3_max = 300;
  expect_rejected(o, "nvfp4_e4m3_max must be 448, or 256 with 4over6");
  o.four_over_six = FourOverSix::Off;
  o.nvfp4_e4m3_max = 256;
  expect_rejected(o, "nvfp4_e4m3_max must be 448, or 256 with 4over6");
  o.nvfp4_e4m3_max = 448;
  o.four_over_six_scaled_error = true;
  expect_rejected(o, "applies to 4over6 only");
  o.four_over_six_scaled_error = false;
  o.four_over_six = static_cast<FourOverSix>(7);
  expect_rejected(o, "unknown 4over6 error mode");
  QuantizeOptions mx;
  mx.scheme = Scheme::MXFP8_E4M3;
  mx.four_over_six = FourOverSix::MinMae;
  expect_rejected(mx, "4over6 applies to nvfp4 only");
  EXPECT_EQ(parse_four_over_six("MSE"), FourOverSix::MinMse);
  EXPECT_EQ(four_over_six_name(FourOverSix::MinMae), "mae");
  EXPECT_THROW(parse_four_over_six("l1"), Error);
}

// The recipe's scopes: 4over6 on the tensors named (gradients never), the bound 256 on those of them
// in the second scope; an input under 4over6 needs the RHT off.
TEST(FourOverSix, RecipeScopes) {
  NVFP4BlockScaling::Options o;
  o.disable_rht = true;
  o.four_over_six = Nvfp4Scope::All;
  o.four_over_six_e4m3_use_256 = Nvfp4Scope::Weights;
  o.four_over_six_err_mode = FourOverSix::MinMse;
  const Recipe recipe = NVFP4BlockScaling(o);
  const QuantizeOptions x = *quantize_options(recipe, TensorRole::Input);
  const QuantizeOptions w = *quantize_options(recipe, TensorRole::Weight);
  const QuantizeOptions dy = *quantize_options(recipe, TensorRole::GradOutput);
  EXPECT_EQ(x.four_over_six, FourOverSix::MinMse);
  EXPECT_EQ(x.nvfp4_e4m3_max, 448);
  EXPECT_EQ(w.four_over_six, FourOverSix::MinMse);
  EXPECT_EQ(w.nvfp4_e4m3_max, 256);
  EXPECT_EQ(w.tile, Tile::k16x16);
  EXPECT_EQ(dy.four_over_six, FourOverSix::Off);
  EXPECT_EQ(dy.nvfp4_e4m3_max, 448);
  EXPECT_TRUE(dy.stochastic_rounding.has_value());
  o.disable_rht = false;
  EXPECT_THROW(NVFP4BlockScaling{o}, Error);
  o.four_over_six = Nvfp4Scope::Weights;  // the weight has no RHT: fine
  EXPECT_EQ(quantize_options(NVFP4BlockScaling(o), TensorRole::Input)->four_over_six, FourOverSix::Off);
  // The scaled error (TE's NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH) goes to the tensors in scope only.
  o.four_over_six_scaled_error = true;
  EXPECT_TRUE(quantize_options(NVFP4BlockScaling(o), TensorRole::Weight)->four_over_six_scaled_error);
  EXPECT_FALSE(quantize_options(NVFP4BlockScaling(o), TensorRole::Input)->four_over_six_scaled_error);
  o.four_over_six_scaled_error = false;
  o.four_over_six_err_mode = FourOverSix::Off;
  EXPECT_THROW(NVFP4BlockScaling{o}, Error);
  EXPECT_EQ(parse_nvfp4_scope("Activations"), Nvfp4Scope::Activations);
  EXPECT_THROW(parse_nvfp4_scope("grads"), Error);
}

}  // namespace
}  // namespace microscale
