// MX 32x32 tiles (Tile::k32x32, TransformerEngine's MXFP8 2D quantization for weights): the
// reference against TE's own reference formula, the fast path against the reference on every
// kernel set, the properties a tile gives (one code per element in both directions, one scale per
// tile), ragged edges, special values and the options it does not take.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_sets.hpp"
#include "microscale/error.hpp"
#include "microscale/format.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"
#include "microscale/quantize.hpp"
#include "microscale/recipe.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;
using testing_data::same_bytes;

constexpr Scheme kMxSchemes[] = {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3,
                                 Scheme::MXFP6_E3M2, Scheme::MXFP4};
constexpr ScaleMode kModes[] = {ScaleMode::Floor, ScaleMode::Ceil, ScaleMode::Even, ScaleMode::RCeil};

QuantizeOptions tile_options(Scheme scheme, bool rowwise, bool columnwise) {
  QuantizeOptions o;
  o.scheme = scheme;
  o.tile = Tile::k32x32;
  o.rowwise = rowwise;
  o.columnwise = columnwise;
  return o;
}

// Every output of two quantizations byte for byte.
void expect_same_outputs(const QuantizedTensor& fast, const QuantizedTensor& ref, const std::string& what) {
  EXPECT_TRUE(same_bytes(fast.rowwise_data, ref.rowwise_data)) << what;
  EXPECT_TRUE(same_bytes(fast.rowwise_scale, ref.rowwise_scale)) << what;
  EXPECT_TRUE(same_bytes(fast.columnwise_data, ref.columnwise_data)) << what;
  EXPECT_TRUE(same_bytes(fast.columnwise_scale, ref.columnwise_scale)) << what;
}

float value_at(const Tensor& x, int64_t i) {
  switch (x.dtype()) {
    case DType::F32: return x.data_as<float>()[i];
    case DType::BF16: return bf16_to_float(x.data_as<uint16_t>()[i]);
    default: return half_to_float(x.data_as<uint16_t>()[i]);
  }
}

// TransformerEngine's float_to_e8m0 of its C++ tests (finite, non-negative v): the exponent of v
// rounded up to a power of two, 0 for 0.
uint8_t te_float_to_e8m0(float v) {
  if (v == 0.0f) return 0;
  uint32_t bits = 0;
  std::memcpy(&bits, &v, 4);
  uint32_t exponent = bits >> 23;
  const uint32_t mantissa = bits & 0x7FFFFF;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

// TE's compute_ref_2d_quantize (tests/cpp/operator/test_cast_mxfp8.cu), written again: per 32x32
// tile the largest |x|, its scale byte float_to_e8m0(amax * (1 / max)), and every element cast to
// the FP8 format after the product with 2^(127 - e). Data [M, K] (both directions), one scale per tile.
struct TeTiles {
  std::vector<uint8_t> codes;   // [M, K]
  std::vector<uint8_t> scales;  // [M/32, K/32]
};

TeTiles te_reference(const Tensor& x, Format format, float max_normal) {
  const int64_t m = x.shape()[0], k = x.shape()[1];
  TeTiles te{std::vector<uint8_t>(static_cast<size_t>(m * k)),
             std::vector<uint8_t>(static_cast<size_t>(m * k / 1024))};
  for (int64_t ti = 0; ti < m / 32; ++ti) {
    for (int64_t tj = 0; tj < k / 32; ++tj) {
      float amax = 0.0f;
      for (int64_t r = 32 * ti; r < 32 * ti + 32; ++r) {
        for (int64_t c = 32 * tj; c < 32 * tj + 32; ++c)
          amax = std::max(amax, std::fabs(value_at(x, r * k + c)));
      }
      const uint8_t e = te_float_to_e8m0(amax * (1.0f / max_normal));
      te.scales[static_cast<size_t>(ti * (k / 32) + tj)] = e;
      const float inverse = std::ldexp(1.0f, 127 - static_cast<int>(e));
      for (int64_t r = 32 * ti; r < 32 * ti + 32; ++r) {
        for (int64_t c = 32 * tj; c < 32 * tj + 32; ++c)
          te.codes[static_cast<size_t>(r * k + c)] = encode_rn(format, value_at(x, r * k + c) * inverse);
      }
    }
  }
  return te;
}

TEST(MxTiles, ReferenceIsTransformerEnginesFormula) {
  // TE runs 2D tiles for MXFP8 with its RCEIL scales; finite inputs of every range.
  int checked = 0;
  for (Scheme scheme : {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2}) {
    const Format format = element_format(scheme);
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Sparse, Fill::Tiny, Fill::Extreme}) {
        if (dtype != DType::F32 && fill == Fill::Extreme) continue;  // out of 16-bit range
        const Tensor x = random_tensor(dtype, {96, 128}, fill, 11);
        QuantizeOptions o = tile_options(scheme, true, true);
        o.scale_mode = ScaleMode::RCeil;
        const QuantizedTensor q = quantize_ref(x.view(), o);
        const TeTiles te = te_reference(x, format, format_info(format).max_normal);
        ASSERT_EQ(std::memcmp(q.rowwise_data.data(), te.codes.data(), te.codes.size()), 0)
            << scheme_name(scheme) << " dtype " << static_cast<int>(dtype) << " fill "
            << static_cast<int>(fill);
        ASSERT_EQ(std::memcmp(q.columnwise_data.data(), te.codes.data(), te.codes.size()), 0);
        for (int64_t r = 0; r < 96; ++r) {
          for (int64_t c = 0; c < 128; ++c) {
            const uint8_t tile_scale = te.scales[static_cast<size_t>((r / 32) * 4 + c / 32)];
            ASSERT_EQ(q.rowwise_scale.data_as<uint8_t>()[r * 4 + c / 32], tile_scale);
            ASSERT_EQ(q.columnwise_scale.data_as<uint8_t>()[(r / 32) * 128 + c], tile_scale);
          }
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 26);
}

// Every scheme, scale mode and input dtype: the fast path (each kernel set) equals the reference,
// both directions hold the same codes, and every row (column) of a tile repeats its scale.
TEST(MxTiles, FastPathEqualsReferenceAndTilesShareOneScale) {
  for (const char* kernels : testing_data::kKernelSets) {
    if (!testing_data::select_kernel_set(kernels)) continue;
    for (Scheme scheme : kMxSchemes) {
      for (ScaleMode mode : kModes) {
        for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
          const Fill fill = dtype == DType::F32 ? Fill::Heavy : Fill::Specials;
          const Tensor x = random_tensor(dtype, {64, 96}, fill, 5 + static_cast<uint32_t>(mode));
          QuantizeOptions o = tile_options(scheme, true, true);
          o.scale_mode = mode;
          o.num_threads = 2;
          const QuantizedTensor fast = quantize(x.view(), o);
          const QuantizedTensor ref = quantize_ref(x.view(), o);
          const std::string what = std::string(kernels) + " " + std::string(scheme_name(scheme)) + " " +
                                   std::string(scale_mode_name(mode)) + " dtype " +
                                   std::to_string(static_cast<int>(dtype));
          ASSERT_TRUE(same_bytes(fast.rowwise_data, ref.rowwise_data)) << what;
          ASSERT_TRUE(same_bytes(fast.rowwise_scale, ref.rowwise_scale)) << what;
          ASSERT_TRUE(same_bytes(fast.columnwise_data, ref.columnwise_data)) << what;
          ASSERT_TRUE(same_bytes(fast.columnwise_scale, ref.columnwise_scale)) << what;
          ASSERT_EQ(fast.tile, Tile::k32x32);
          ASSERT_TRUE(same_bytes(ref.rowwise_data, ref.columnwise_data)) << what;
          const auto* rs = ref.rowwise_scale.data_as<uint8_t>();     // [64, 3]
          const auto* cs = ref.columnwise_scale.data_as<uint8_t>();  // [2, 96]
          for (int64_t r = 0; r < 64; ++r) {
            for (int64_t c = 0; c < 96; ++c) {
              const uint8_t tile_scale = rs[(r / 32) * 32 * 3 + c / 32];
              ASSERT_EQ(rs[r * 3 + c / 32], tile_scale) << what;
              ASSERT_EQ(cs[(r / 32) * 96 + c], tile_scale) << what;
            }
          }
        }
      }
    }
  }
  unsetenv("MICROSCALE_CPU_KERNELS");
}

// The tile's largest element in each of its 1024 places (second tile of a [32, 64] matrix): the
// fast path's scale is always that element's, as the reference's.
TEST(MxTiles, TileAmaxFromEveryPlace) {
  for (const char* kernels : testing_data::kKernelSets) {
    if (!testing_data::select_kernel_set(kernels)) continue;
    const QuantizeOptions o = tile_options(Scheme::MXFP8_E4M3, true, true);
    for (int64_t place = 0; place < 1024; ++place) {
      Tensor x = random_tensor(DType::BF16, {32, 64}, Fill::Normal, 2);  // a fresh copy per place
      x.data_as<uint16_t>()[(place / 32) * 64 + 32 + place % 32] = float_to_bf16(-3000.0f);
      const QuantizedTensor fast = quantize(x.view(), o), ref = quantize_ref(x.view(), o);
      ASSERT_TRUE(same_bytes(fast.rowwise_scale, ref.rowwise_scale)) << kernels << " place " << place;
      ASSERT_TRUE(same_bytes(fast.columnwise_scale, ref.columnwise_scale)) << kernels << " place " << place;
      ASSERT_TRUE(same_bytes(fast.rowwise_data, ref.rowwise_data)) << kernels << " place " << place;
      ASSERT_EQ(ref.rowwise_scale.data_as<uint8_t>()[1], 127 + 3) << place;  // 3000 / 448 -> 2^3
    }
  }
  unsetenv("MICROSCALE_CPU_KERNELS");
}

// Rows wider than the 16-bit kernel's 256-column chunks (544: two whole chunks and one of 32), so
// that a band's tiles come from several chunks.
TEST(MxTiles, BandsOfSeveralChunks) {
  for (const char* kernels : testing_data::kKernelSets) {
    if (!testing_data::select_kernel_set(kernels)) continue;
    Tensor x = random_tensor(DType::BF16, {64, 544}, Fill::Heavy, 12);
    x.data_as<uint16_t>()[40 * 544 + 300] = float_to_bf16(5.0e4f);  // tile (1, 9), in the second chunk
    for (Scheme scheme : kMxSchemes) {
      for (ScaleMode mode : {ScaleMode::RCeil, ScaleMode::Floor}) {
        QuantizeOptions o = tile_options(scheme, true, true);
        o.scale_mode = mode;
        const QuantizedTensor fast = quantize(x.view(), o), ref = quantize_ref(x.view(), o);
        const std::string what = std::string(kernels) + " " + std::string(scheme_name(scheme));
        expect_same_outputs(fast, ref, what);
      }
    }
  }
  unsetenv("MICROSCALE_CPU_KERNELS");
}

// A tile's scale is the 1-D blocks' scale of its largest element: quantizing a tile equals
// quantizing rows whose block amax is the tile's. Checked through the rule itself: where a tile's
// amax sits in row 0, the 1-D rowwise scale of row 0's block equals the tile's scale.
TEST(MxTiles, ScaleIsTheOneDimensionalRuleOfTheTileAmax) {
  Tensor x = random_tensor(DType::F32, {32, 64}, Fill::Normal, 3);
  for (int64_t c = 0; c < 64; c += 32) x.data_as<float>()[c + 5] = 100.0f + static_cast<float>(c);  // row 0
  for (ScaleMode mode : kModes) {
    QuantizeOptions tiles = tile_options(Scheme::MXFP8_E4M3, true, false);
    tiles.scale_mode = mode;
    QuantizeOptions blocks = tiles;
    blocks.tile = Tile::k1x16;
    const QuantizedTensor t = quantize(x.view(), tiles), b = quantize(x.view(), blocks);
    for (int64_t j = 0; j < 2; ++j) {
      EXPECT_EQ(t.rowwise_scale.data_as<uint8_t>()[j], b.rowwise_scale.data_as<uint8_t>()[j]);
      EXPECT_EQ(t.rowwise_scale.data_as<uint8_t>()[31 * 2 + j], b.rowwise_scale.data_as<uint8_t>()[j]);
    }
    // Row 0's codes are the 1-D ones (same scale); another row's differ where its own amax is smaller.
    EXPECT_EQ(std::memcmp(t.rowwise_data.data(), b.rowwise_data.data(), 64), 0);
  }
}

// Dims that are not quantized along need not be multiples of 32: the last tile takes what is
// there. Rowwise only: M = 40 (a tile of 8 rows); columnwise only: K = 40 (8 columns; even for FP4).
TEST(MxTiles, RaggedEdgeTiles) {
  for (const char* kernels : testing_data::kKernelSets) {
    if (!testing_data::select_kernel_set(kernels)) continue;
    for (Scheme scheme : kMxSchemes) {
      for (bool rowwise : {true, false}) {
        const std::vector<int64_t> shape =
            rowwise ? std::vector<int64_t>{40, 64} : std::vector<int64_t>{64, 40};
        const Tensor x = random_tensor(DType::BF16, shape, Fill::Heavy, 9);
        QuantizeOptions o = tile_options(scheme, rowwise, !rowwise);
        const QuantizedTensor fast = quantize(x.view(), o), ref = quantize_ref(x.view(), o);
        const std::string what = std::string(kernels) + " " + std::string(scheme_name(scheme));
        expect_same_outputs(fast, ref, what);
        // The short tile's scale is its own amax's: put a large value there and see its scale move.
        Tensor y = random_tensor(DType::BF16, shape, Fill::Heavy, 9);  // x again, to change
        y.data_as<uint16_t>()[(rowwise ? 36 * 64 + 3 : 3 * 40 + 36)] = float_to_bf16(1.0e6f);
        const QuantizedTensor big = quantize(y.view(), o);
        const uint8_t before = rowwise ? ref.rowwise_scale.data_as<uint8_t>()[36 * 2]
                                       : ref.columnwise_scale.data_as<uint8_t>()[36];
        const uint8_t after = rowwise ? big.rowwise_scale.data_as<uint8_t>()[32 * 2]
                                      : big.columnwise_scale.data_as<uint8_t>()[32];
        EXPECT_GT(after, before) << what;
      }
    }
  }
  unsetenv("MICROSCALE_CPU_KERNELS");
}

// A NaN anywhere in a tile makes the tile's scale NaN (0xFF), as it does a 1-D block's (torch.amax
// propagates NaN); the other tiles keep theirs. Swizzled scales hold the same bytes, placed.
TEST(MxTiles, NanTileAndSwizzledScales) {
  Tensor x = random_tensor(DType::F32, {64, 64}, Fill::Normal, 4);
  x.data_as<float>()[40 * 64 + 50] = NAN;  // tile (1, 1)
  for (ScaleMode mode : kModes) {
    QuantizeOptions o = tile_options(Scheme::MXFP8_E4M3, true, true);
    o.scale_mode = mode;
    const QuantizedTensor q = quantize(x.view(), o);
    const auto* rs = q.rowwise_scale.data_as<uint8_t>();
    for (int64_t r = 32; r < 64; ++r) EXPECT_EQ(rs[r * 2 + 1], 0xFF);
    for (int64_t r = 0; r < 64; ++r) EXPECT_NE(rs[r * 2 + (r < 32 ? 1 : 0)], 0xFF);
    for (int64_t c = 32; c < 64; ++c) EXPECT_EQ(q.columnwise_scale.data_as<uint8_t>()[64 + c], 0xFF);
    o.scale_layout = ScaleLayout::Swizzled;
    const QuantizedTensor s = quantize(x.view(), o);
    EXPECT_TRUE(same_bytes(unswizzle_scales(s.rowwise_scale.view(), 64, 2), q.rowwise_scale));
    EXPECT_TRUE(same_bytes(s.rowwise_data, q.rowwise_data));
  }
}

// Both directions dequantize to the same values (the same codes and scales, one transposed view).
TEST(MxTiles, DirectionsDequantizeAlike) {
  const Tensor x = random_tensor(DType::BF16, {64, 128}, Fill::Heavy, 8);
  for (Scheme scheme : kMxSchemes) {
    const QuantizedTensor q = quantize(x.view(), tile_options(scheme, true, true));
    const Tensor row = dequantize(q, Usage::Rowwise), col = dequantize(q, Usage::Columnwise);
    EXPECT_TRUE(same_bytes(row, col)) << scheme_name(scheme);
  }
}

TEST(MxTiles, OptionsItDoesNotTake) {
  const Tensor x = random_tensor(DType::F32, {64, 64}, Fill::Normal, 1);
  QuantizeOptions o = tile_options(Scheme::NVFP4, true, true);
  EXPECT_THROW(quantize(x.view(), o), Error);  // 32x32 tiles are MX's
  o.scheme = Scheme::MXFP8_E4M3;
  o.tile = Tile::k16x16;
  EXPECT_THROW(quantize(x.view(), o), Error);  // 16x16 tiles are NVFP4's
  EXPECT_EQ(parse_tile("32X32", Scheme::MXFP8_E4M3), Tile::k32x32);
  EXPECT_EQ(parse_tile("1x32", Scheme::MXFP4), Tile::k1x16);
  EXPECT_THROW(parse_tile("1x32", Scheme::NVFP4), Error);  // 1x32 blocks are MX's
  EXPECT_EQ(tile_name(Tile::k32x32), "32x32");
  // The scheme's own name reads back to the same tile: MX's 1-D blocks are "1x32", NVFP4's "1x16".
  EXPECT_EQ(tile_name(Tile::k1x16, Scheme::MXFP6_E2M3), "1x32");
  EXPECT_EQ(tile_name(Tile::k1x16, Scheme::NVFP4), "1x16");
  EXPECT_EQ(tile_name(Tile::k16x16, Scheme::NVFP4), "16x16");
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3, Scheme::MXFP4}) {
    const std::vector<Tile> tiles = is_mx(scheme) ? std::vector<Tile>{Tile::k1x16, Tile::k32x32}
                                                  : std::vector<Tile>{Tile::k1x16, Tile::k16x16};
    for (Tile tile : tiles) EXPECT_EQ(parse_tile(tile_name(tile, scheme), scheme), tile);
  }
  EXPECT_THROW(parse_tile("32x16", Scheme::MXFP8_E4M3), Error);
  // The shape rules are the 1-D ones: columnwise output needs M % 32 == 0.
  const Tensor ragged = random_tensor(DType::F32, {40, 64}, Fill::Normal, 1);
  EXPECT_THROW(quantize(ragged.view(), tile_options(Scheme::MXFP8_E4M3, true, true)), Error);
}

}  // namespace
}  // namespace microscale
