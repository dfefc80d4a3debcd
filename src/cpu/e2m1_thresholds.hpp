// E2M1 element codes of 16-bit inputs by comparisons: per block scale, the |x| patterns at which
// the code of the scaled element steps up. The bf16/f16 kernels of NVFP4 (quantize_nvfp4_16.cpp)
// and MXFP4 (quantize_mx16.cpp) run them, in plain C++ and in AVX2.
//
// Why: in the fp32 form each element costs a widening, a multiply and a ~20-operation encoder on
// 8 lanes (AVX2). The code is a monotone function of |x| for a given block scale: there are 7
// patterns where its magnitude steps from k - 1 to k, and one that decides the sign of a zero
// code. With them an element's code is 8 compares of its 16-bit |x| pattern (16 lanes on AVX2).
// - NVFP4: a direction has one global scale, so each of the 127 E4M3 block scale codes has one
//   encode scale, and one set of thresholds per call (build_e2m1_thresholds). Below the zero step
//   the product rounds to zero, and the code takes no sign (as the reference gives any zero).
// - MXFP4: the element is x * 2^(127 - S) for the block's E8M0 byte S, so the thresholds depend
//   on S and the input type only: one table per input type for the whole process
//   (mx_e2m1_thresholds). Every code of a finite block keeps its sign; a block whose scale is NaN
//   (S = 0xFF: it holds an Inf or a NaN) gives every element the code of +6.
//
// The thresholds come from the reference encoder itself (a bisection on its codes), so they are
// exact wherever the code is monotone in |x|, which holds for RN products with a multiplier > 0
// (tests/cpp/e2m1_thresholds_test.cpp checks every bf16 and f16 pattern against the encoder).
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>  // transpose_thresholds
#endif

#include "cpu/cpu_dispatch.hpp"
#include "microscale/tensor.hpp"  // DType

namespace microscale::cpu {

/// below[s][k] for block scale s is B - 1, where B is the smallest |x| pattern (0 .. the Inf
/// pattern) with: k = 0, a code that takes the element's sign; k = 1..7, an E2M1 magnitude code
/// >= k. (B >= 1 for k >= 1: |x| = 0 gives code 0.) A step never reached has B - 1 = 0x7FFF, above
/// every pattern; one reached by every pattern has -1.
template <int kScales>
struct E2m1ThresholdTable {
  alignas(64) int16_t below[kScales][8];
};

/// NVFP4: one row per E4M3 block scale code (0..126; 127, NaN, never occurs), for one direction's
/// global scale. Zero step: a nonzero RN(|x| * encode scale).
using E2m1Thresholds = E2m1ThresholdTable<128>;

/// MXFP4: one row per E8M0 scale byte. Zero step: every pattern (-1), none for the byte 0xFF.
using MxE2m1Thresholds = E2m1ThresholdTable<256>;

/// A 16-bit value twice in a 32-bit word: what a 32-bit broadcast from memory makes 16 lanes of.
constexpr int32_t repeated_pair(int v) {
  const auto half = static_cast<uint16_t>(v);
  return static_cast<int32_t>(half | (uint32_t{half} << 16));
}

/// A table's thresholds as 32-bit words holding the 16-bit threshold twice: pairs[s][k] for row s,
/// threshold k. A broadcast of a 32-bit word from memory is done by the load unit, where one of a
/// 16-bit word also takes a shuffle (the AVX2 kernels' rowwise thresholds).
template <int kScales>
struct E2m1ThresholdPairTable {
  alignas(64) int32_t pairs[kScales][8];

  explicit E2m1ThresholdPairTable(const E2m1ThresholdTable<kScales>& table) {
    for (int s = 0; s < kScales; ++s) {
      for (int k = 0; k < 8; ++k) pairs[s][k] = repeated_pair(table.below[s][k]);
    }
  }
};

/// How a table's thresholds are searched for; both give the same table.
enum class ThresholdSearch {
  Windowed,  // in a few patterns around a guess, checked; over all patterns where the check fails
  Full,      // over all patterns (what a failed check falls back to: the tests compare the two)
};

/// The thresholds of one NVFP4 direction of a call: the encode scale of code c is
/// nvfp4_block_encode_scale(e4m3_code_value(c), s_dec). `input` is BF16 or F16.
void build_e2m1_thresholds(DType input, float s_dec, E2m1Thresholds& out,
                           ThresholdSearch search = ThresholdSearch::Windowed);

/// The MXFP4 thresholds of `input` (BF16 or F16), built on first use (thread-safe) and kept.
const MxE2m1Thresholds& mx_e2m1_thresholds(DType input);

/// mx_e2m1_thresholds widened (E2m1ThresholdPairTable: the AVX2 MXFP4 chunk's), likewise kept.
const E2m1ThresholdPairTable<256>& mx_e2m1_threshold_pairs(DType input);

/// The code (sign in bit 3) of an element with |x| pattern `a` (NaN patterns included) and sign
/// bit `sign` (8 or 0) against one block's row of thresholds `t`. NOTE: `a` and `t` are int16 so
/// that the compares are single signed 16-bit compares (patterns <= 0x7FFF).
MICROSCALE_CPU_INLINE uint16_t e2m1_code_by_thresholds(int16_t a, uint16_t sign, const int16_t* t) {
  const int magnitude =
      (a > t[1]) + (a > t[2]) + (a > t[3]) + (a > t[4]) + (a > t[5]) + (a > t[6]) + (a > t[7]);
  return static_cast<uint16_t>(magnitude | (sign & (0u - static_cast<unsigned>(a > t[0]))));
}

/// The doubling form of an NVFP4 table (the AVX2 chunk's): 5 numbers per block scale instead of
/// 8 thresholds, and 13 operations per 16 elements instead of 16.
///
/// Why it holds: steps 3, 5 and 7 are reached at the products 1.25, 2.5 and 5, steps 4 and 6 at
/// 1.75 and 3.5, each twice the one before. Doubling a normal |x| adds one binade of patterns,
/// P = 2^m (m = 7 mantissa bits for bf16, 10 for f16), to its pattern and doubles its product
/// exactly (RN commutes with a power of two), so where the thresholds are normal patterns, step 5
/// is step 3 + P, step 7 is step 3 + 2P and step 6 is step 4 + P. The steps of such a family that
/// a pattern a reaches are then #{j >= 0 : a > first + jP} = max(a - (first - (P - 1)), 0) >> m,
/// a saturating subtract and a shift, where the family allows at most 3 (and 2). No cap is needed
/// per family: a count past it means a > step 7, where every step is reached, so the sum is
/// capped at 7 once.
///
/// doubling[s] = {below[0], below[1], below[2], below[3] - (P - 1), below[4] - (P - 1), 0, 0, 0}.
/// Returns the first block scale code from which the form holds for every code up to 126 (a step
/// never reached may be anywhere at or above 0x7FFF), 127 where it does not hold for 126. The
/// small codes have the large encode scales: their thresholds may lie among the subnormal
/// patterns, where doubling doubles the pattern (always so for code 0, a zero block scale; for
/// f16 inputs, whose normal range is narrow, often for the codes of blocks 2^-10 below the amax).
/// The kernel takes the doubling form for chunks whose scale codes are all from there on. Only
/// the rows of those codes are written.
int build_e2m1_doubling_form(DType input, const E2m1Thresholds& thresholds, E2m1Thresholds& doubling);

/// log2 of the input's patterns per binade: the shift of the doubling form.
constexpr int doubling_shift(DType input) { return input == DType::BF16 ? 7 : 10; }

/// e2m1_code_by_thresholds by the doubling form `d` of the block's thresholds (plain C++: what
/// the tests compare with the thresholds; the AVX2 form is e2m1_codes_doubling, avx2.hpp).
MICROSCALE_CPU_INLINE uint16_t e2m1_code_by_doubling(int16_t a, uint16_t sign, const int16_t* d, int shift) {
  const auto family = [a, shift](int16_t first) {  // unsigned: a saturating subtract
    const int v = static_cast<uint16_t>(a) - static_cast<int>(static_cast<uint16_t>(first));
    return v > 0 ? v >> shift : 0;
  };
  const int magnitude = std::min((a > d[1]) + (a > d[2]) + family(d[3]) + family(d[4]), 7);
  return static_cast<uint16_t>(magnitude | (sign & (0u - static_cast<unsigned>(a > d[0]))));
}

/// The thresholds of 8 blocks (table rows `rows[scales[q]]`, q = 0..7) to below[k][j0 + q]: their
/// rows, 16 bytes each, transposed as 8 x 8 16-bit lanes by unpacks of 16-, 32- and 64-bit lanes
/// (SSE2, which every x86-64 CPU has; a plain loop elsewhere). The kernels then compare a row of
/// elements against per-lane thresholds (columnwise blocks).
/// NOTE: lane by lane this was 16 scalar moves per column, ~15 % of the AVX2 NVFP4 kernel's time.
template <int kCols>
MICROSCALE_CPU_INLINE void transpose_thresholds(const int16_t (*rows)[8], const uint8_t* scales,
                                                int16_t (*below)[kCols], int j0) {
#if defined(__SSE2__)
  __m128i r[8], t[8], u[8];
  for (int q = 0; q < 8; ++q) r[q] = _mm_load_si128(reinterpret_cast<const __m128i*>(rows[scales[q]]));
  for (int p = 0; p < 4; ++p) {  // t[2p]: blocks 2p, 2p + 1 interleaved, thresholds 0-3; t[2p + 1]: 4-7
    t[2 * p] = _mm_unpacklo_epi16(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm_unpackhi_epi16(r[2 * p], r[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // blocks 4h..4h+3: thresholds (0, 1), (2, 3), (4, 5), (6, 7)
    const __m128i *a = t + 4 * h, *b = t + 4 * h + 2;
    u[4 * h] = _mm_unpacklo_epi32(a[0], b[0]);
    u[4 * h + 1] = _mm_unpackhi_epi32(a[0], b[0]);
    u[4 * h + 2] = _mm_unpacklo_epi32(a[1], b[1]);
    u[4 * h + 3] = _mm_unpackhi_epi32(a[1], b[1]);
  }
  for (int q = 0; q < 4; ++q) {  // threshold 2q from u[q] (blocks 0-3) and u[4 + q] (4-7), 2q + 1 after
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&below[2 * q][j0]), _mm_unpacklo_epi64(u[q], u[4 + q]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&below[2 * q + 1][j0]), _mm_unpackhi_epi64(u[q], u[4 + q]));
  }
#else
  for (int q = 0; q < 8; ++q) {
    for (int k = 0; k < 8; ++k) below[k][j0 + q] = rows[scales[q]][k];
  }
#endif
}

/// Codes (16-bit, < 16) two per byte: out[q] = codes[2q] | codes[2q + 1] << 4, q < bytes.
/// NOTE: each pair is read as one little-endian 32-bit word (the first code in its low half), so
/// that the loop vectorises (GCC 12 did not vectorise the two 16-bit reads).
MICROSCALE_CPU_INLINE void pack_codes(const uint16_t* codes, int bytes, uint8_t* __restrict out) {
  using CodePair = uint32_t __attribute__((may_alias));
  const auto* pairs = reinterpret_cast<const CodePair*>(codes);
  for (int q = 0; q < bytes; ++q) out[q] = static_cast<uint8_t>(pairs[q] | (pairs[q] >> 12));
}

}  // namespace microscale::cpu
