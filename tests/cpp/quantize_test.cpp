// quantize() (fast path) equals quantize_ref() bit for bit on random shapes, dtypes, strides,
// ranks, fills and options; dequantize() inverts to within the format's error; layouts agree.
#include "microscale/quantize.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/scale_math.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "kernel_sets.hpp"
#include "microscale/error.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

using testing_data::Fill;
using testing_data::random_tensor;
using testing_data::same_bytes;

void expect_same(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& what) {
  EXPECT_TRUE(same_bytes(a.rowwise_data, b.rowwise_data)) << what << ": rowwise_data";
  EXPECT_TRUE(same_bytes(a.rowwise_scale, b.rowwise_scale)) << what << ": rowwise_scale";
  EXPECT_TRUE(same_bytes(a.columnwise_data, b.columnwise_data)) << what << ": columnwise_data";
  EXPECT_TRUE(same_bytes(a.columnwise_scale, b.columnwise_scale)) << what << ": columnwise_scale";
  if (!is_mx(a.scheme)) {
    EXPECT_EQ(float_bits(a.rowwise_amax), float_bits(b.rowwise_amax)) << what;
    EXPECT_EQ(float_bits(a.columnwise_amax), float_bits(b.columnwise_amax)) << what;
  }
}

// quantize() on each CPU kernel set the CPU has (src/cpu/kernel_set.hpp: AVX-512, AVX2, portable)
// equals quantize_ref().
void expect_fast_equals_ref(const TensorView& x, const QuantizeOptions& o, const std::string& what) {
  const QuantizedTensor ref = quantize_ref(x, o);
  for (const char* kernels : testing_data::kKernelSets) {
    if (!testing_data::select_kernel_set(kernels)) continue;  // the same set as one before it
    expect_same(quantize(x, o), ref, what + " [" + kernels + " kernels]");
  }
  unsetenv("MICROSCALE_CPU_KERNELS");
}

const Scheme kAllSchemes[] = {Scheme::NVFP4,      Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2,
                              Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2, Scheme::MXFP4};

// NaN patterns of both signs and kinds between Gaussian values: every one of bf16 and f16, the
// edges of fp32's (the least and largest signalling and quiet payloads); with +-0 and +-max
// finite, and once with +-Inf (the NVFP4 amaxes then Inf), once without. The 16-bit kernels tell
// NaN, Inf and the sign apart by pattern ranges, whose edges the fills' canonical NaNs do not
// reach; and a signalling NaN is where std::fmax stops skipping NaN (max_abs_skipping_nan,
// scale_math.hpp).
TEST(Quantize, FastEqualsReferenceNanPatterns) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (bool with_inf : {true, false}) {
      const uint32_t inf = dtype == DType::F32 ? 0x7F800000u : dtype == DType::BF16 ? 0x7F80u : 0x7C00u;
      const uint32_t sign_bit = dtype == DType::F32 ? 0x80000000u : 0x8000u;
      std::vector<uint32_t> magnitudes = {0u, inf - 1};  // 0, max finite
      if (with_inf) magnitudes.push_back(inf);
      if (dtype == DType::F32) {
        for (uint32_t a : {0x7F800001u, 0x7F800002u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FC00001u, 0x7FFFFFFFu})
          magnitudes.push_back(a);
      } else {
        for (uint32_t a = inf + 1; a <= 0x7FFFu; ++a) magnitudes.push_back(a);
      }
      std::vector<uint32_t> specials;
      for (uint32_t sign : {0u, sign_bit}) {
        for (uint32_t a : magnitudes) specials.push_back(sign | a);
      }
      const int64_t cols = 128;
      const auto rows = (static_cast<int64_t>(2 * specials.size()) / cols / 32 + 1) * 32;
      Tensor x = random_tensor(dtype, {rows, cols}, Fill::Normal, 31);
      for (size_t i = 0; i < specials.size(); ++i) {  // every other element
        if (dtype == DType::F32) {
          x.data_as<uint32_t>()[2 * i + 1] = specials[i];
        } else {
          x.data_as<uint16_t>()[2 * i + 1] = static_cast<uint16_t>(specials[i]);
        }
      }
      for (Scheme scheme : kAllSchemes) {
        for (int variant = 0; variant < (scheme == Scheme::NVFP4 ? 3 : 1); ++variant) {
          QuantizeOptions o;
          o.scheme = scheme;
          o.rowwise = o.columnwise = true;
          o.tile = variant == 1 ? Tile::k16x16 : Tile::k1x16;
          o.rht = variant == 2;
          if (o.rht && dtype != DType::BF16) continue;
          expect_fast_equals_ref(x.view(), o,
                                 std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) +
                                     (o.rht ? " rht" : "") + (variant == 1 ? " 16x16" : "") +
                                     (with_inf ? " NaN and Inf patterns" : " NaN patterns"));
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceMx) {
  uint32_t seed = 1;
  for (Scheme scheme : kAllSchemes) {
    if (!is_mx(scheme)) continue;
    for (ScaleMode mode : {ScaleMode::Floor, ScaleMode::Ceil, ScaleMode::Even, ScaleMode::RCeil}) {
      for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
        for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Specials, Fill::SpecialsNoNan, Fill::Extreme,
                          Fill::Sparse, Fill::Tiny}) {
          // Last dims of 1, 2, 3, 5 and 13 blocks: the 16-bit kernels' chunks are 64 (AVX-512) or 256
          // columns, with narrower ones at the end of a band.
          for (auto shape :
               {std::vector<int64_t>{32, 64}, {96, 160}, {2, 3, 32, 32}, {64, 32}, {64, 416}, {64, 96}}) {
            const Tensor x = random_tensor(dtype, shape, fill, seed++);
            QuantizeOptions o;
            o.scheme = scheme;
            o.scale_mode = mode;
            o.rowwise = o.columnwise = true;
            o.num_threads = 2;
            const std::string what = std::string(scheme_name(scheme)) + " " +
                                     std::string(scale_mode_name(mode)) + " " +
                                     std::string(dtype_name(dtype)) + " " + shape_string(shape);
            expect_fast_equals_ref(x.view(), o, what);
          }
        }
      }
    }
  }
}

// FP6 and FP4 in blocks whose amax is 2^e: every 16-bit pattern below it, of both signs, in the
// other lanes. Each 32 x 32 tile has the amax on its diagonal, so every rowwise and columnwise
// block holds it. The exponents put the least scale byte of the AVX2 chunk's form (FP6: the
// subnormal form's Mx16Subnormals::kMinScale, where input subnormals get codes above 0; FP4: the
// two-step form's Mx16Fp4TwoStep::kMinScale, where its lowest step is the least normal input),
// the byte below it (the chunk then takes fix_outside, or thresholds), and typical ones. The four
// scale rules agree on an amax that is a power of two, so each byte is met under every rule.
TEST(Quantize, FastEqualsReferenceMxFp6Fp4EveryPatternBelowAmax) {
  for (Scheme scheme : {Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2, Scheme::MXFP4}) {
    const int emax = scheme == Scheme::MXFP6_E3M2 ? 4 : 2;
    for (DType dtype : {DType::BF16, DType::F16}) {
      const bool bf16 = dtype == DType::BF16;
      int least_scale = bf16 ? 3 : 115;  // FP4: 2^(S - 129), the lowest step, a normal input
      if (scheme != Scheme::MXFP4) {     // FP6: d >= 1, and 2^(127 - S + m - emin) finite
        const int grid_shift = scheme == Scheme::MXFP6_E2M3 ? 3 : 4;
        const int bias = scheme == Scheme::MXFP6_E3M2 ? 3 : 1;
        least_scale = std::max(bf16 ? bias + 1 : bias + 113, grid_shift);
      }
      for (int e : {least_scale - 127 + emax, least_scale - 128 + emax, -3, 0, bf16 ? 100 : 15}) {
        const float amax = std::ldexp(1.0f, e);
        const uint16_t amax_bits = bf16 ? float_to_bf16(amax) : float_to_half(amax);
        const int64_t cols = 256;
        const int64_t per_row = cols - cols / 32;  // lanes off the diagonal
        const int64_t rows = (2 * amax_bits / per_row / 32 + 1) * 32;
        Tensor x(dtype, {rows, cols});
        auto* bits = x.data_as<uint16_t>();
        uint32_t next = 0;
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            const bool diagonal = i % 32 == j % 32;
            bits[i * cols + j] =
                diagonal ? static_cast<uint16_t>(amax_bits | (i % 2 != 0 ? 0x8000 : 0))
                         : static_cast<uint16_t>((next % amax_bits) | (next / amax_bits % 2) << 15);
            next += diagonal ? 0 : 1;
          }
        }
        for (ScaleMode mode : {ScaleMode::Floor, ScaleMode::Ceil, ScaleMode::Even, ScaleMode::RCeil}) {
          QuantizeOptions o;
          o.scheme = scheme;
          o.scale_mode = mode;
          o.rowwise = o.columnwise = true;
          const std::string what = std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) +
                                   " amax 2^" + std::to_string(e) + " " + std::string(scale_mode_name(mode));
          expect_fast_equals_ref(x.view(), o, what);
        }
      }
      // Blocks below the form's least scale byte among Gaussian ones (the chunk then takes
      // fix_outside, or thresholds): (0) one rowwise block per row, a different one in each row, never the
      // first alone; (1) in the first band, column 32g + 7 of every 32, so that only columnwise
      // blocks are; and (2) blocks of +-0 (amax 0, whose low byte the form takes): those of (0)
      // in every fourth row, and those of (1).
      for (int variant = 0; variant < 3; ++variant) {
        Tensor x = random_tensor(dtype, {64, 512}, Fill::Normal, 901 + variant);
        auto* bits = x.data_as<uint16_t>();
        for (int64_t i = 0; i < 64; ++i) {
          for (int64_t j = 0; j < 512; ++j) {
            const bool row_block = j / 32 == 1 + i % 15 && (variant == 0 || (variant == 2 && i % 4 == 0));
            const bool column_block = variant > 0 && i < 32 && j % 32 == 7;
            if (!row_block && !column_block) continue;
            uint16_t& b = bits[i * 512 + j];
            if (variant == 2) {
              b = static_cast<uint16_t>(b & 0x8000);  // +-0
            } else {
              const float v =
                  (bf16 ? bf16_to_float(b) : half_to_float(b)) * std::ldexp(1.0f, bf16 ? -126 : -13);
              b = bf16 ? float_to_bf16(v) : float_to_half(v);
            }
          }
        }
        for (int directions = 0; directions < 3; ++directions) {  // both, rowwise, columnwise
          QuantizeOptions o;
          o.scheme = scheme;
          o.rowwise = directions != 2;
          o.columnwise = directions != 1;
          const char* kVariants[] = {" a tiny rowwise block per row", " tiny columnwise blocks",
                                     " zero blocks"};
          const char* kDirections[] = {" row+col", " rowwise", " columnwise"};
          expect_fast_equals_ref(x.view(), o,
                                 std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) +
                                     kVariants[variant] + kDirections[directions]);
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceMxStreamedOutputs) {
  // Outputs of kStreamBytes (8 MiB) and more are written by streaming stores (the AVX2 chunks),
  // after a row's codes are mended in cache: 8 MiB of codes per direction.
  for (Scheme scheme : {Scheme::MXFP8_E4M3, Scheme::MXFP6_E2M3, Scheme::MXFP4}) {
    const std::vector<int64_t> shape{2048, scheme == Scheme::MXFP4 ? 8192 : 4096};
    const Tensor x = random_tensor(DType::BF16, shape, Fill::Heavy, 77);
    QuantizeOptions o;
    o.scheme = scheme;
    o.rowwise = o.columnwise = true;
    o.num_threads = 2;
    expect_fast_equals_ref(x.view(), o, std::string(scheme_name(scheme)) + " " + shape_string(shape));
  }
}

// One direction at a time: the 16-bit MX kernels encode both directions from one pass over a chunk.
TEST(Quantize, FastEqualsReferenceMxOneDirection) {
  uint32_t seed = 700;
  for (Scheme scheme :
       {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2, Scheme::MXFP4}) {
    for (DType dtype : {DType::BF16, DType::F16}) {
      for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Extreme, Fill::Sparse, Fill::Tiny}) {
        for (bool rowwise : {false, true}) {
          for (auto shape : {std::vector<int64_t>{64, 96}, {96, 416}}) {
            const Tensor x = random_tensor(dtype, shape, fill, seed++);
            QuantizeOptions o;
            o.scheme = scheme;
            o.rowwise = rowwise;
            o.columnwise = !rowwise;
            const std::string what = std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) +
                                     (rowwise ? " rowwise " : " columnwise ") + shape_string(shape);
            expect_fast_equals_ref(x.view(), o, what);
          }
        }
        // Rowwise only, the last band short of 32 rows (the AVX2 FP8 chunk takes whole bands).
        const Tensor x = random_tensor(dtype, {40, 96}, fill, seed++);
        QuantizeOptions o;
        o.scheme = scheme;
        expect_fast_equals_ref(
            x.view(), o,
            std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) + " rowwise 40x96");
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceColumnwiseOnlyAnyLastDim) {
  // Columnwise blocks run along the rows, so a columnwise-only call takes any last dim: here
  // below, between and above the kernels' chunk widths.
  uint32_t seed = 900;
  for (Scheme scheme : kAllSchemes) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      for (Fill fill : {Fill::Normal, Fill::Specials, Fill::Tiny}) {
        for (int64_t k : {8, 40, 300}) {
          const Tensor x = random_tensor(dtype, {64, k}, fill, seed++);
          QuantizeOptions o;
          o.scheme = scheme;
          o.rowwise = false;
          o.columnwise = true;
          o.num_threads = 2;
          expect_fast_equals_ref(x.view(), o,
                                 std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) +
                                     " columnwise K=" + std::to_string(k));
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferencePaddedRows) {
  // Rows further apart than their length (a view of the first 96 columns of 128).
  uint32_t seed = 950;
  for (Scheme scheme : kAllSchemes) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      const Tensor base = random_tensor(dtype, {64, 128}, Fill::Normal, seed++);
      TensorView padded = base.view();
      padded.shape = {64, 96};
      padded.strides = {128, 1};
      QuantizeOptions o;
      o.scheme = scheme;
      o.rowwise = o.columnwise = true;
      for (bool rht : {false, true}) {
        if (rht && (scheme != Scheme::NVFP4 || dtype != DType::BF16)) continue;
        o.rht = rht;
        expect_fast_equals_ref(
            padded, o,
            std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) + (rht ? " rht" : ""));
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4) {
  uint32_t seed = 100;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Specials, Fill::SpecialsNoNan, Fill::Extreme,
                      Fill::Tiny, Fill::LowNormal}) {
      for (auto shape : {std::vector<int64_t>{16, 16}, {48, 80}, {144, 32}, {2, 8, 64}, {272, 400}}) {
        for (Tile tile : {Tile::k1x16, Tile::k16x16}) {
          for (bool rht : {false, true}) {
            if (rht && (dtype != DType::BF16 || tile == Tile::k16x16)) continue;
            for (bool sr : {false, true}) {
              const Tensor x = random_tensor(dtype, shape, fill, seed++);
              QuantizeOptions o;
              o.scheme = Scheme::NVFP4;
              o.rowwise = o.columnwise = true;
              o.tile = tile;
              o.rht = rht;
              if (sr) o.stochastic_rounding = StochasticRounding{seed, 3};
              o.num_threads = 3;
              const std::string what = std::string(dtype_name(dtype)) + " " + shape_string(shape) +
                                       (tile == Tile::k16x16 ? " 16x16" : " 1x16") + (rht ? " rht" : "") +
                                       (sr ? " sr" : "");
              expect_fast_equals_ref(x.view(), o, what);
            }
          }
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4RhtAmaxGiven) {
  // With the columnwise amax given there is no pass 1: every transform is pass 2's, and an amax
  // below the data's saturates block scales.
  uint32_t seed = 700;
  for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Specials, Fill::SpecialsNoNan, Fill::Extreme, Fill::Tiny,
                    Fill::LowNormal}) {
    const Tensor x = random_tensor(DType::BF16, {272, 400}, fill, seed++);
    QuantizeOptions o;
    o.rowwise = o.columnwise = true;
    o.rht = true;
    o.num_threads = 2;
    const float found = quantize_ref(x.view(), o).columnwise_amax;
    for (float amax : {found, 1.5f}) {
      if (!std::isfinite(amax) || amax <= 0.0f) continue;  // all-NaN or all-zero fills
      o.amax_columnwise = amax;
      expect_fast_equals_ref(x.view(), o, std::string("rht amax given ") + std::to_string(amax));
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4RhtSumNotExactInFp32) {
  // A column whose RHT outputs cannot be summed exactly in fp32, yet within 16 binades (so the fast
  // path tries fp32 and must reject it after): rows 0-7 hold +-a, signed so that outputs 0 and 8
  // sum to 2a; row 8 adds half a bf16 ulp of 2a; rows 9 and 10 (15 binades below a) add 0.75 of
  // an fp32 ulp. Output 0 is then a bf16 tie plus less than an fp32 ulp: the reference truncates
  // to the tie, which rounds to even (2a); an fp32 sum rounds up to the next ulp, then to the next
  // bf16 value. Output 0 is the columnwise amax, so taking the fp32 sums would show in it.
  // Pass 2 checks its own sums (with the amax given there is no pass 1). For 2a = 2.5 and the
  // amax 2688 * 2^7 (S_enc = 2^-7) the block scale is the E4M3 subnormal 2^-8 either way
  // (2.5 * 2^-7 / 6 = (5/3) 2^-9), the encode scale 1 / (2^-8 * 2^7) = 2, and output 0 encodes
  // as 2.5 * 2 = 5 exactly: a tie, code 6 (4). The fp32 sum's next bf16 value gives
  // 5 (1 + 2^-7), code 7 (6).
  // A width of 64 puts the column in a band's second unit, whose maxes the first unit's element
  // loop computes (UnitMaxes).
  const float row_sign[8] = {1, 1, 1, -1, 1, -1, -1, -1};  // the sign mask 0xD7E8's rows 0-7
  for (float a : {1.0f, 1.015625f, 1.25f, 1.5f}) {         // 2a has an even bf16 significand
    for (int b : {0, 5}) {
      for (int64_t width : {32, 64}) {
        for (int64_t lane : {0, 1, 6}) {  // even and odd lanes of a unit
          const int64_t column = width - 32 + lane;
          Tensor x(DType::BF16, {16, width});
          float values[11];
          for (int i = 0; i < 8; ++i) values[i] = row_sign[i] * a;
          values[8] = -0x1p-5f;
          values[9] = -0x1p-15f * (1.0f + (b + 3) / 128.0f);
          values[10] = 0x1p-15f * (1.0f + b / 128.0f);
          for (int i = 0; i < 11; ++i) x.data_as<uint16_t>()[i * width + column] = float_to_bf16(values[i]);
          QuantizeOptions o;
          o.rowwise = o.columnwise = true;
          o.rht = true;
          EXPECT_EQ(quantize_ref(x.view(), o).columnwise_amax, 2.0f * a);
          const std::string what =
              "a " + std::to_string(a) + " b " + std::to_string(b) + " column " + std::to_string(column);
          expect_fast_equals_ref(x.view(), o, what);
          if (a == 1.25f) {
            o.amax_columnwise = 2688.0f * 128.0f;
            const QuantizedTensor ref = quantize_ref(x.view(), o);
            const uint8_t code0 = ref.columnwise_data.data_as<uint8_t>()[column * 8] & 0xF;  // output 0
            EXPECT_EQ(code0, 6) << what;  // the tie at 5 went to 4: the case this test is for
            expect_fast_equals_ref(x.view(), o, what + " amax given");
            // The lane's other column (column ^ 1, the other half of the unit) at 2^-4: its outputs
            // (at most 2^-2) pass this column's bound on exact outputs (below 1), and its own bound
            // (near 2^11) would pass this column's inexact 2.5; neither may stand in for the other.
            for (int i = 0; i < 16; ++i)
              x.data_as<uint16_t>()[i * width + (column ^ 1)] = float_to_bf16(0x1p-4f);
            expect_fast_equals_ref(x.view(), o, what + " amax given, beside 2^-4");
          }
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4ManyGroupsPerThread) {
  // Several 256-row groups per thread: each group's columnwise stage is flushed and reused by the
  // next, and the columnwise scales of 4 groups share a line. A last group of one band. With 2 and
  // 5 threads, threads share lines of columnwise scales (gathered after a barrier instead).
  uint32_t seed = 900;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (auto shape : {std::vector<int64_t>{1040, 96}, {1536, 1056}}) {
      for (bool rht : {false, true}) {
        if (rht && dtype != DType::BF16) continue;
        for (int threads : {1, 2, 5}) {
          const Tensor x = random_tensor(dtype, shape, Fill::Normal, seed++);
          QuantizeOptions o;
          o.rowwise = o.columnwise = true;
          o.rht = rht;
          o.num_threads = threads;
          expect_fast_equals_ref(x.view(), o,
                                 std::string(dtype_name(dtype)) + " " + shape_string(shape) +
                                     (rht ? " rht" : "") + " threads " + std::to_string(threads));
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4OneDirection) {
  // Each direction alone (columnwise with and without the RHT): the AVX-512 kernels have a form
  // for each, the portable bf16/f16 kernel a template instance.
  uint32_t seed = 500;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (Fill fill : {Fill::Normal, Fill::Specials, Fill::SpecialsNoNan, Fill::Extreme}) {
      for (Tile tile : {Tile::k1x16, Tile::k16x16}) {
        for (int form = 0; form < 3; ++form) {  // rowwise, columnwise, columnwise + RHT
          const bool rowwise = form == 0, rht = form == 2;
          if (rht && (dtype != DType::BF16 || tile == Tile::k16x16)) continue;
          const Tensor x = random_tensor(dtype, {160, 96}, fill, seed++);
          QuantizeOptions o;
          o.tile = tile;
          o.rowwise = rowwise;
          o.columnwise = !rowwise;
          o.rht = rht;
          o.num_threads = 2;
          expect_fast_equals_ref(x.view(), o,
                                 std::string(dtype_name(dtype)) + (rowwise ? " rowwise" : " columnwise") +
                                     (rht ? " rht" : "") + (tile == Tile::k16x16 ? " 16x16" : " 1x16"));
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4F16AmaxGiven) {
  // f16 units with both amaxes given (no pass 1): the amax found, one below the data's (saturated
  // block scales, products that may reach 7) and one far above it.
  uint32_t seed = 1100;
  for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Extreme, Fill::SpecialsNoNan}) {
    const Tensor x = random_tensor(DType::F16, {160, 96}, fill, seed++);
    for (Tile tile : {Tile::k1x16, Tile::k16x16}) {
      QuantizeOptions o;
      o.rowwise = o.columnwise = true;
      o.tile = tile;
      o.num_threads = 2;
      const float found = quantize_ref(x.view(), o).rowwise_amax;
      for (float amax : {found, 1.5f, 1e4f}) {
        if (!std::isfinite(amax) || amax <= 0.0f) continue;
        o.amax_rowwise = o.amax_columnwise = amax;
        expect_fast_equals_ref(
            x.view(), o,
            std::string(tile == Tile::k16x16 ? "16x16" : "1x16") + " f16 amax given " + std::to_string(amax));
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4TilesAmaxGiven) {
  // 16x16 tiles of 16-bit inputs with the amaxes given: pass 1 does not run, so no tile maxes are
  // kept for pass 2, and each unit's element loop computes the next unit's column maxes instead.
  // Five units per band (K = 160), so that the maxes are carried along a chain, or five and a
  // last 16-column tile (K = 176); specials with NaN break the chain (a NaN unit goes by tiles and
  // the unit after it computes its own maxes).
  uint32_t seed = 1200;
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (Fill fill : {Fill::Normal, Fill::Heavy, Fill::Specials, Fill::Tiny}) {
      const Tensor x = random_tensor(dtype, {64, fill == Fill::Heavy ? 176 : 160}, fill, seed++);
      QuantizeOptions both;
      both.rowwise = both.columnwise = true;
      both.tile = Tile::k16x16;
      const float found = quantize_ref(x.view(), both).rowwise_amax;
      for (int directions = 0; directions < 3; ++directions) {  // both, rowwise, columnwise
        QuantizeOptions o = both;
        o.rowwise = directions != 2;
        o.columnwise = directions != 1;
        o.num_threads = 2;
        for (float amax : {found, found / 64.0f, 1e4f}) {
          if (!std::isfinite(amax) || amax <= 0.0f) continue;
          o.amax_rowwise = o.amax_columnwise = amax;
          expect_fast_equals_ref(
              x.view(), o,
              std::string(dtype_name(dtype)) + " 16x16 directions " + std::to_string(directions) + " fill " +
                  std::to_string(static_cast<int>(fill)) + " amax given " + std::to_string(amax));
        }
      }
    }
  }
}

TEST(Quantize, FastEqualsReferenceNvfp4DifferentAmaxPerDirection) {
  // Each direction its own global scale: the portable bf16/f16 kernel shares one threshold table,
  // and with 16x16 tiles one set of codes, only between directions whose scales are equal.
  uint32_t seed = 1300;
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (Tile tile : {Tile::k1x16, Tile::k16x16}) {
      const Tensor x = random_tensor(dtype, {160, 96}, Fill::Normal, seed++);
      QuantizeOptions o;
      o.rowwise = o.columnwise = true;
      o.tile = tile;
      o.num_threads = 2;
      const float found = quantize_ref(x.view(), o).rowwise_amax;
      o.amax_rowwise = found;
      o.amax_columnwise = 3.0f * found;  // not a power of two: the encode scales differ too
      expect_fast_equals_ref(x.view(), o,
                             std::string(dtype_name(dtype)) + (tile == Tile::k16x16 ? " 16x16" : " 1x16"));
    }
  }
}

TEST(Quantize, FastEqualsReferenceLargeStreamedOutputs) {
  // Outputs of 8 MiB and more are written with streaming stores (the AVX-512 kernels, the
  // portable NVFP4 bf16/f16 kernel): 4096 x 4096 is the smallest square shape that takes them.
  const Tensor x = random_tensor(DType::BF16, {4096, 4096}, Fill::Normal, 1400);
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3, Scheme::MXFP4}) {
    QuantizeOptions o;
    o.scheme = scheme;
    o.rowwise = o.columnwise = true;
    o.num_threads = 2;
    expect_fast_equals_ref(x.view(), o, std::string(scheme_name(scheme)) + " 4096x4096");
  }
}

TEST(Quantize, RowwiseOnlyRaggedRowsAndAmaxOverride) {
  // Rowwise needs only the last dim blocked: 37 rows are fine.
  const Tensor x = random_tensor(DType::BF16, {37, 64}, Fill::Normal, 7);
  for (Scheme scheme : kAllSchemes) {
    QuantizeOptions o;
    o.scheme = scheme;
    expect_fast_equals_ref(x.view(), o, std::string(scheme_name(scheme)));
  }
  // More than one group of 128 rows, and rows whose last 64-byte line is partial.
  const Tensor wide = random_tensor(DType::F32, {149, 272}, Fill::Specials, 8);
  expect_fast_equals_ref(wide.view(), QuantizeOptions{}, "nvfp4 rowwise ragged wide");
  QuantizeOptions tiles;
  tiles.tile = Tile::k16x16;
  const Tensor wide16 = random_tensor(DType::F32, {160, 272}, Fill::Specials, 9);
  expect_fast_equals_ref(wide16.view(), tiles, "nvfp4 16x16 rowwise wide");
  QuantizeOptions o;
  o.amax_rowwise = 100.0f;  // e.g. the max over a tensor-parallel group
  const QuantizedTensor q = quantize(x.view(), o);
  EXPECT_EQ(q.rowwise_amax, 100.0f);
  expect_same(q, quantize_ref(x.view(), o), "override");
}

TEST(Quantize, IntoReusesMatchingBuffers) {
  const Tensor a = random_tensor(DType::BF16, {64, 96}, Fill::Normal, 31);
  const Tensor b = random_tensor(DType::BF16, {64, 96}, Fill::Heavy, 32);
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3}) {
    QuantizeOptions o;
    o.scheme = scheme;
    o.rowwise = o.columnwise = true;
    QuantizedTensor q;
    quantize_into(a.view(), o, q);  // allocates
    expect_same(q, quantize(a.view(), o), "into, fresh");
    const void* data = q.columnwise_data.data();
    quantize_into(b.view(), o, q);  // same shapes: the same buffers, new bytes
    EXPECT_EQ(q.columnwise_data.data(), data);
    expect_same(q, quantize(b.view(), o), "into, reused");
    const Tensor c = random_tensor(DType::BF16, {32, 96}, Fill::Normal, 33);
    quantize_into(c.view(), o, q);  // other shapes: new buffers
    EXPECT_NE(q.columnwise_data.data(), data);
    expect_same(q, quantize(c.view(), o), "into, reshaped");
  }
}

TEST(Quantize, NonContiguousInputEqualsContiguousCopy) {
  // A transposed view (TE's non-contiguous test): strides (1, 32) over a [128, 32] buffer.
  const Tensor base = random_tensor(DType::F32, {128, 32}, Fill::Normal, 11);
  TensorView transposed = base.view();
  transposed.shape = {32, 128};
  transposed.strides = {1, 32};
  Tensor copy(DType::F32, {32, 128});
  for (int64_t r = 0; r < 32; ++r) {
    for (int64_t c = 0; c < 128; ++c) copy.data_as<float>()[r * 128 + c] = base.data_as<float>()[c * 32 + r];
  }
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3, Scheme::MXFP4}) {
    QuantizeOptions o;
    o.scheme = scheme;
    o.rowwise = o.columnwise = true;
    const QuantizedTensor a = quantize(transposed, o);
    expect_same(a, quantize(copy.view(), o), "strided vs copy");
    expect_same(a, quantize_ref(transposed, o), "strided fast vs ref");
    expect_fast_equals_ref(copy.view(), o, "contiguous copy");
  }
}

TEST(Quantize, ThreadCountDoesNotChangeBytes) {
  const Tensor x = random_tensor(DType::BF16, {256, 128}, Fill::Heavy, 21);
  QuantizeOptions o;
  o.rowwise = o.columnwise = true;
  o.rht = true;
  o.stochastic_rounding = StochasticRounding{42, 0};
  o.num_threads = 1;
  const QuantizedTensor one = quantize(x.view(), o);
  for (int threads : {2, 3, 7, 0}) {
    o.num_threads = threads;
    expect_same(quantize(x.view(), o), one, "threads " + std::to_string(threads));
  }
}

TEST(Quantize, SwizzledScalesEqualSwizzledCompact) {
  const Tensor x = random_tensor(DType::BF16, {160, 96}, Fill::Normal, 5);
  for (Scheme scheme : {Scheme::NVFP4, Scheme::MXFP8_E4M3}) {
    QuantizeOptions o;
    o.scheme = scheme;
    o.rowwise = o.columnwise = true;
    const QuantizedTensor compact = quantize(x.view(), o);
    o.scale_layout = ScaleLayout::Swizzled;
    const QuantizedTensor swizzled = quantize(x.view(), o);
    EXPECT_TRUE(same_bytes(swizzled.rowwise_scale, swizzle_scales(compact.rowwise_scale.view())));
    EXPECT_TRUE(same_bytes(swizzled.rowwise_data, compact.rowwise_data));
    // Dequantization reads either layout to the same values.
    for (Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
      EXPECT_TRUE(same_bytes(dequantize(compact, usage), dequantize(swizzled, usage))) << scheme_name(scheme);
    }
  }
}

// SQNR of dequantize(quantize(x)) against x (rowwise), by scheme, for normal data. Floors from
// torchao's test_mx_tensor (e4m3 >= 18 dB, others >= 13) and test_nvfp4_reconstruction (>= 8).
TEST(Quantize, DequantizeReconstructs) {
  const Tensor x = random_tensor(DType::F32, {128, 256}, Fill::Normal, 9);
  const float* ref = x.data_as<float>();
  for (Scheme scheme : kAllSchemes) {
    QuantizeOptions o;
    o.scheme = scheme;
    o.rowwise = o.columnwise = true;
    const QuantizedTensor q = quantize(x.view(), o);
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      const Tensor d = dequantize(q, Usage::Rowwise, out);
      ASSERT_EQ(d.shape(), x.shape());
      double signal = 0, noise = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const float v = out == DType::F32    ? d.data_as<float>()[i]
                        : out == DType::BF16 ? bf16_to_float(d.data_as<uint16_t>()[i])
                                             : half_to_float(d.data_as<uint16_t>()[i]);
        signal += double(ref[i]) * ref[i];
        noise += (double(ref[i]) - v) * (double(ref[i]) - v);
      }
      const double sqnr = 10 * std::log10(signal / noise);
      const double floor = scheme == Scheme::MXFP8_E4M3 ? 18.0 : scheme == Scheme::NVFP4 ? 8.0 : 13.0;
      EXPECT_GT(sqnr, floor) << scheme_name(scheme) << " " << dtype_name(out);
    }
    // Columnwise: NVFP4 gives X^T, MX gives X.
    const Tensor c = dequantize(q, Usage::Columnwise);
    EXPECT_EQ(c.shape(), is_mx(scheme) ? x.shape() : (std::vector<int64_t>{256, 128}));
  }
}

// A block whose scale byte is 0xFF dequantizes to the canonical NaN in every element, whatever its
// codes (a NaN code keeps no sign or payload of its own, a zero or finite code gives no Inf).
TEST(Quantize, DequantizeMxNanScaleBlock) {
  Tensor x(DType::F32, {2, 64});
  float* v = x.data_as<float>();
  for (int i = 0; i < 128; ++i) v[i] = (i % 3 == 0) ? 0.0f : (i % 2 ? -1.5f : 2.0f);
  v[5] = -NAN;       // block 0 of row 0: scale 0xFF
  v[64] = INFINITY;  // block 0 of row 1: scale 0xFF
  for (Scheme scheme : {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3, Scheme::MXFP4}) {
    QuantizeOptions o;
    o.scheme = scheme;
    const QuantizedTensor q = quantize(x.view(), o);
    ASSERT_EQ(q.rowwise_scale.data_as<uint8_t>()[0], 0xFF) << scheme_name(scheme);
    ASSERT_EQ(q.rowwise_scale.data_as<uint8_t>()[2], 0xFF) << scheme_name(scheme);
    const Tensor d = dequantize(q, Usage::Rowwise, DType::F32);
    for (int row = 0; row < 2; ++row) {
      for (int i = 0; i < 32; ++i) {
        uint32_t bits;
        std::memcpy(&bits, d.data_as<float>() + row * 64 + i, 4);
        EXPECT_EQ(bits, 0x7FC00000u) << scheme_name(scheme) << " row " << row << " element " << i;
      }
      for (int i = 32; i < 64; ++i) EXPECT_EQ(d.data_as<float>()[row * 64 + i], v[row * 64 + i]);
    }
  }
}

TEST(Quantize, MxSpecialValueSemantics) {
  // numerics-mx.md §3.6: [1000, .5, -17, 3] style checks on a 32-block: an Inf or NaN makes the
  // scale 0xFF and FP8 elements NaN; zeros give scale 0; 2^-126 blocks give scale 0 and 2.0.
  Tensor x(DType::F32, {4, 32});
  float* v = x.data_as<float>();
  for (int i = 0; i < 32; ++i) {
    v[i] = 1.0f;
    v[32 + i] = 1.0f;
    v[64 + i] = 0.0f;
    v[96 + i] = std::ldexp(1.0f, -126);
  }
  v[0] = INFINITY;
  v[32] = NAN;
  QuantizeOptions o;
  o.scheme = Scheme::MXFP8_E4M3;
  for (ScaleMode mode : {ScaleMode::Floor, ScaleMode::RCeil}) {
    o.scale_mode = mode;
    const QuantizedTensor q = quantize(x.view(), o);
    const uint8_t* s = q.rowwise_scale.data_as<uint8_t>();
    const uint8_t* d = q.rowwise_data.data_as<uint8_t>();
    EXPECT_EQ(s[0], 0xFF);
    EXPECT_EQ(s[1], 0xFF);
    EXPECT_EQ(s[2], 0x00);
    EXPECT_EQ(s[3], 0x00);
    EXPECT_TRUE(std::isnan(decode(Format::E4M3, d[1])));
    EXPECT_TRUE(std::isnan(decode(Format::E4M3, d[33])));
    EXPECT_EQ(d[64], 0x00);
    EXPECT_EQ(d[96], 0x40);  // 2^-126 * 2^127 = 2.0
    const Tensor deq = dequantize(q, Usage::Rowwise);
    EXPECT_TRUE(std::isnan(deq.data_as<float>()[5]));  // whole NaN-scale block is NaN
    EXPECT_EQ(deq.data_as<float>()[96], std::ldexp(1.0f, -126));
  }
}

// The AVX2 NVFP4 chunk compares with the doubling form of the thresholds where it holds from the
// call's first scale code on (build_e2m1_doubling_form), and with the thresholds in chunks with a
// block scale code below it. Here 32 x 768 tensors (3 chunks per band) with both amaxes given:
// Gaussian values within +-amax (f16's range capping them), and in the middle chunks a block of
// zeros (scale code 0 both ways), a block 2^-14 below the rest (low codes both ways; below the
// f16 form's first), and in the last chunks one row of a block far below the rest (a low rowwise
// code only) and one column of a band (a low columnwise code only). The amaxes make the form
// hold from code 1 (bf16 1 and 3e6, f16 2688), from a later code (f16 1) and for none (f16 3e6):
// every path, in each direction and both.
TEST(Quantize, FastEqualsReferenceNvfp4DoublingForm) {
  const auto first_code = [](DType input, float amax) {  // as the call builds it from its amax
    cpu::E2m1Thresholds t, d;
    cpu::build_e2m1_thresholds(input, 1.0f / nvfp4_global_encode_scale(amax), t);
    return cpu::build_e2m1_doubling_form(input, t, d);
  };
  uint32_t seed = 1700;
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (float amax : {1.0f, 2688.0f, 3.0e6f}) {
      const int first = first_code(dtype, amax);
      if (dtype == DType::BF16 || amax == 2688.0f) {
        EXPECT_EQ(first, 1) << amax;
      } else if (amax == 1.0f) {
        EXPECT_TRUE(first > 1 && first < 127) << first;
      } else {
        EXPECT_EQ(first, 127);
      }
      Tensor x = random_tensor(dtype, {32, 768}, Fill::Normal, seed++);
      auto* bits = x.data_as<uint16_t>();
      const auto set = [&](int64_t r, int64_t c, float v) {
        bits[r * 768 + c] = dtype == DType::BF16 ? float_to_bf16(v) : float_to_half(v);
      };
      const auto value = [&](int64_t r, int64_t c) {
        return dtype == DType::BF16 ? bf16_to_float(bits[r * 768 + c]) : half_to_float(bits[r * 768 + c]);
      };
      const float peak = std::min(amax, 60000.0f);
      for (int64_t r = 0; r < 32; ++r) {
        for (int64_t c = 0; c < 768; ++c) set(r, c, std::clamp(value(r, c) * (peak / 4.0f), -peak, peak));
      }
      for (int r = 0; r < 16; ++r) {
        for (int c = 0; c < 16; ++c) {
          set(r, 256 + c, 0.0f);                                    // a block of zeros
          set(16 + r, 320 + c, value(16 + r, 320 + c) * 0x1p-14f);  // a tiny block
        }
        // Nonzero: zeros get code 0 from any form. So low that their block's scale code is 0
        // (bf16) or below the f16 form's first.
        const float low = dtype == DType::BF16 ? 0x1p-20f : 0x1p-16f;
        set(16 + r, 600, value(16 + r, 600) * low);  // a column of a band
        set(3, 512 + r, value(3, 512 + r) * low);    // a row of a block
      }
      for (bool rht : {false, true}) {
        if (rht && dtype != DType::BF16) continue;
        for (Tile tile : {Tile::k1x16, Tile::k16x16}) {
          if (rht && tile == Tile::k16x16) continue;
          for (int directions = 1; directions <= 3; ++directions) {
            QuantizeOptions o;
            o.rowwise = (directions & 1) != 0;
            o.columnwise = (directions & 2) != 0;
            o.tile = tile;
            o.rht = rht && o.columnwise;
            o.amax_rowwise = o.amax_columnwise = amax;
            o.num_threads = 2;
            expect_fast_equals_ref(x.view(), o,
                                   std::string(dtype_name(dtype)) + " amax " + std::to_string(amax) +
                                       (tile == Tile::k16x16 ? " 16x16" : " 1x16") + (o.rht ? " rht" : "") +
                                       " directions " + std::to_string(directions));
          }
        }
      }
    }
  }
}

// Pass 1 of the 16-bit NVFP4 kernel reads rows [0, h) beside [h, rows), h = ceil(rows / 2), and
// for an odd count row h - 1 beside itself: the amax wherever it lies, first row, either half,
// last row.
TEST(Quantize, Nvfp4AmaxInAnyRow) {
  uint32_t seed = 1800;
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (int64_t rows : {1, 2, 17, 32, 33}) {
      for (int64_t at : {int64_t{0}, rows / 2 - 1, rows / 2, (rows + 1) / 2, rows - 1}) {
        if (at < 0 || at >= rows) continue;
        Tensor x = random_tensor(dtype, {rows, 48}, Fill::Normal, seed++);
        x.data_as<uint16_t>()[at * 48 + 17] =
            dtype == DType::BF16 ? float_to_bf16(-100.0f) : float_to_half(-100.0f);
        for (bool columnwise : {false, true}) {
          if (columnwise && rows % 16 != 0) continue;
          QuantizeOptions o;
          o.rowwise = true;
          o.columnwise = columnwise;
          o.num_threads = 2;
          const std::string what = std::string(dtype_name(dtype)) + " rows " + std::to_string(rows) +
                                   " amax in row " + std::to_string(at) +
                                   (columnwise ? " both directions" : "");
          EXPECT_EQ(quantize(x.view(), o).rowwise_amax, 100.0f) << what;
          expect_fast_equals_ref(x.view(), o, what);
        }
      }
    }
  }
}

TEST(Quantize, Nvfp4WorkedExample) {
  // numerics-te.md §1.5: amax 10, a block with amax 3 -> scale 128 (0x70), codes as listed.
  const float block[16] = {-1.5f, 0.7f, 2.2f,  -0.01f, 1.0f, 2.9f, 0.33f, -0.26f,
                           1.76f, 0.5f, -2.5f, 1.26f,  0.1f, 3.0f, 0.0f,  0.0f};
  Tensor x(DType::F32, {1, 32});
  for (int i = 0; i < 16; ++i) x.data_as<float>()[i] = block[i];
  for (int i = 16; i < 32; ++i) x.data_as<float>()[i] = i == 16 ? 10.0f : 0.0f;
  const QuantizedTensor q = quantize(x.view(), QuantizeOptions{});
  EXPECT_EQ(q.rowwise_amax, 10.0f);
  EXPECT_EQ(q.rowwise_scale.data_as<uint8_t>()[0], 0x70);
  const float want[16] = {-3, 1.5, 4, -0.0f, 2, 6, 0.5, -0.5, 4, 1, -6, 3, 0, 6, 0, 0};
  for (int i = 0; i < 16; ++i) {
    const uint8_t byte = q.rowwise_data.data_as<uint8_t>()[i / 2];
    const uint8_t code = i % 2 == 0 ? byte & 0xF : byte >> 4;
    EXPECT_EQ(decode(Format::E2M1, code), want[i]) << i;
  }
}

}  // namespace
}  // namespace microscale
