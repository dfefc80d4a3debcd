// Vectorised decode of block-scaled codes into fp32 (see decode_codes.hpp). Each entry point is
// compiled per x86-64 level (cpu_dispatch.hpp) with one loop per scheme inlined into it, so the
// codec's integer/select steps become vector instructions of the CPU at hand.
#include "cpu/decode_codes.hpp"

#include <cstring>

#include "core/element_codec.hpp"
#include "cpu/cpu_dispatch.hpp"

namespace microscale::cpu {
namespace {

// The bits a byte of the format's codes never sets: a 6-bit code has its two high bits clear.
template <class Codec>
constexpr unsigned kInvalidBits = Codec::kWidth == 6 ? 0xC0u : 0u;

// codes[j] = FP4 code j of `bytes` (two a byte, the low nibble first), j < kCount. A nibble to a
// byte each, so that a decode loop reads consecutive codes: decoding the pairs in place
// interleaved the stores, and GCC left that loop scalar.
template <int kCount>
MICROSCALE_CPU_INLINE void spread_nibbles(const uint8_t* bytes, uint8_t* codes) {
  alignas(64) uint16_t pairs[kCount / 2];  // low byte: the low nibble (little-endian)
#pragma omp simd
  for (int j = 0; j < kCount / 2; ++j)
    pairs[j] = static_cast<uint16_t>((bytes[j] & 0x0Fu) | ((bytes[j] & 0xF0u) << 4));
  std::memcpy(codes, pairs, kCount);
}

#if defined(__GNUC__) && !defined(__clang__)
// Eight lanes of GCC's vector extensions: lowered per clone (AVX2: one ymm register each; the
// variable shift and the permute below become vpsrlvd and vpermps).
typedef float Floats8 __attribute__((vector_size(32)));
typedef int32_t Ints8 __attribute__((vector_size(32)));
typedef uint32_t Uints8 __attribute__((vector_size(32)));

// out[j] = value(FP4 code j of `bytes`) * scale for j < kBlock. FP4 has 8 magnitudes: the block's
// 8 products with each sign are two registers, and each code picks its lane by a permute (its low
// three bits) and its sign by a blend (bit 3). (-v) * scale is what Codec::decode(code) * scale
// computes for a negative code, so every byte, NaN scales included, is the same.
template <int kBlock>
MICROSCALE_CPU_INLINE void fp4_block_values(const uint8_t* bytes, float scale, float* out) {
  const Floats8 magnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  Floats8 negated = {-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  // Opaque to the optimiser: GCC would otherwise form negated * scale as -(magnitudes * scale),
  // which differs where the product is NaN (a NaN scale's sign, or 0 x Inf's default NaN).
  __asm__("" : "+m"(negated));
  const Floats8 positive = magnitudes * scale;
  const Floats8 negative = negated * scale;
  const Uints8 nibble_shifts = {0, 4, 8, 12, 16, 20, 24, 28};
  for (int g = 0; g < kBlock / 8; ++g) {
    uint32_t four_bytes;  // 8 codes, the first in the low nibble
    std::memcpy(&four_bytes, bytes + 4 * g, sizeof four_bytes);
    const Uints8 codes = (Uints8{} + four_bytes) >> nibble_shifts;  // lane k: code k in bits 0-3
    const Ints8 lanes = reinterpret_cast<const Ints8&>(codes) & 7;
    const Ints8 is_negative = (codes & 8) != 0;
    const Floats8 values =
        is_negative ? __builtin_shuffle(negative, lanes) : __builtin_shuffle(positive, lanes);
    std::memcpy(out + 8 * g, &values, sizeof values);
  }
}
#endif

template <class Codec, int kBlock>
MICROSCALE_CPU_INLINE unsigned row_values(const uint8_t* row, int64_t first, int64_t count,
                                          const float* block_scales, float* out) {
  unsigned invalid = 0;
  for (int64_t b = 0; b < count / kBlock; ++b) {
    const float scale = block_scales[b];
    float* block = out + b * kBlock;  // [kBlock]
    if constexpr (Codec::kWidth == 4) {
#if defined(__GNUC__) && !defined(__clang__)
      fp4_block_values<kBlock>(row + (first + b * kBlock) / 2, scale, block);
#else  // (no __builtin_shuffle): the generic codec
      alignas(64) uint8_t codes[kBlock];
      spread_nibbles<kBlock>(row + (first + b * kBlock) / 2, codes);
      for (int j = 0; j < kBlock; ++j) block[j] = Codec::decode(codes[j]) * scale;
#endif
    } else {
      const uint8_t* bytes = row + first + b * kBlock;  // [kBlock]
      // The codes widened to 32-bit lanes first: with bytes in the decode loop, GCC sizes its
      // vectors by the bytes (16 of them in 128 bits) and runs the codec's 32-bit steps 4 lanes
      // wide; from 32-bit codes they run 8 (AVX2) or 16 (AVX-512) wide.
      alignas(64) uint32_t codes[kBlock];
      for (int j = 0; j < kBlock; ++j) codes[j] = bytes[j];
#pragma omp simd reduction(| : invalid)
      for (int j = 0; j < kBlock; ++j) {
        invalid |= codes[j] & kInvalidBits<Codec>;
        block[j] = Codec::decode(codes[j]) * scale;
      }
    }
  }
  return invalid;
}

template <class Codec>
MICROSCALE_CPU_INLINE unsigned scaled_values(const uint8_t* bytes, int64_t count, const float* scales,
                                             float* out) {
  constexpr int kStep = 64;  // codes per step (FP4: spread from 32 bytes)
  unsigned invalid = 0;
  alignas(64) uint8_t spread[kStep];  // FP4: a code a byte
  alignas(64) uint32_t codes[kStep];  // 32-bit lanes for the decode (see row_values)
  for (int64_t j0 = 0; j0 < count; j0 += kStep) {
    const int n = static_cast<int>(count - j0 < kStep ? count - j0 : kStep);
    const uint8_t* step = spread;  // [n] one code a byte
    if constexpr (Codec::kWidth == 4) {
      if (n == kStep) {
        spread_nibbles<kStep>(bytes + j0 / 2, spread);
      } else {
        for (int j = 0; j < n; ++j)
          spread[j] = static_cast<uint8_t>((bytes[(j0 + j) / 2] >> (4 * (j % 2))) & 0x0F);
      }
    } else {
      step = bytes + j0;
    }
    for (int j = 0; j < n; ++j) codes[j] = step[j];
#pragma omp simd reduction(| : invalid)
    for (int j = 0; j < n; ++j) {
      invalid |= codes[j] & kInvalidBits<Codec>;
      out[j0 + j] = Codec::decode(codes[j]) * scales[j0 + j];
    }
  }
  return invalid;
}

template <class Codec, int kBlock>
MICROSCALE_CPU_INLINE unsigned column_values(const uint8_t* codes, int64_t stride, int rows, int64_t count,
                                             const float* block_scales, float* const* out) {
  constexpr int kGroup = kColumnGroup;
  static_assert(kBlock % kGroup == 0, "a step of kGroup K indices lies in one block");
  unsigned invalid = 0;
  alignas(64) uint8_t group[kGroup];       // one K index's codes of the group's rows
  alignas(64) float tile[kGroup][kGroup];  // [K index in the step][row]
  for (int64_t k0 = 0; k0 < count; k0 += kGroup) {
    const float* scales = block_scales + (k0 / kBlock) * kGroup;  // [kGroup], one per row
    for (int kk = 0; kk < kGroup; ++kk) {
      const uint8_t* bytes = codes + (k0 + kk) * stride;
      if constexpr (Codec::kWidth == 4) {
        std::memset(group, 0, sizeof group);
        for (int i = 0; i < rows; ++i)
          group[i] = static_cast<uint8_t>((bytes[i / 2] >> (4 * (i % 2))) & 0x0F);
      } else if (rows == kGroup) {
        std::memcpy(group, bytes, kGroup);
      } else {
        std::memset(group, 0, sizeof group);
        std::memcpy(group, bytes, static_cast<size_t>(rows));
      }
      alignas(64) uint32_t group_codes[kGroup];  // 32-bit lanes for the decode (see row_values)
      for (int i = 0; i < kGroup; ++i) group_codes[i] = group[i];
#pragma omp simd reduction(| : invalid)
      for (int i = 0; i < kGroup; ++i) {
        invalid |= group_codes[i] & kInvalidBits<Codec>;
        tile[kk][i] = Codec::decode(group_codes[i]) * scales[i];
      }
    }
    // The tile transposed into the rows' outputs.
    for (int i = 0; i < rows; ++i) {
      float* row = out[i] + k0;
      for (int kk = 0; kk < kGroup; ++kk) row[kk] = tile[kk][i];
    }
  }
  return invalid;
}

}  // namespace

MICROSCALE_CPU_DISPATCH unsigned decode_row(Scheme scheme, const uint8_t* row, int64_t first, int64_t count,
                                            const float* block_scales, float* out) {
  switch (scheme) {
    case Scheme::NVFP4: return row_values<E2M1Codec, 16>(row, first, count, block_scales, out);
    case Scheme::MXFP8_E4M3: return row_values<E4M3Codec, 32>(row, first, count, block_scales, out);
    case Scheme::MXFP8_E5M2: return row_values<E5M2Codec, 32>(row, first, count, block_scales, out);
    case Scheme::MXFP6_E2M3: return row_values<E2M3Codec, 32>(row, first, count, block_scales, out);
    case Scheme::MXFP6_E3M2: return row_values<E3M2Codec, 32>(row, first, count, block_scales, out);
    case Scheme::MXFP4: return row_values<E2M1Codec, 32>(row, first, count, block_scales, out);
  }
  return 0;
}

MICROSCALE_CPU_DISPATCH unsigned decode_columns(Scheme scheme, const uint8_t* codes, int64_t stride, int rows,
                                                int64_t count, const float* block_scales, float* const* out) {
  switch (scheme) {
    case Scheme::NVFP4: return column_values<E2M1Codec, 16>(codes, stride, rows, count, block_scales, out);
    case Scheme::MXFP8_E4M3:
      return column_values<E4M3Codec, 32>(codes, stride, rows, count, block_scales, out);
    case Scheme::MXFP8_E5M2:
      return column_values<E5M2Codec, 32>(codes, stride, rows, count, block_scales, out);
    case Scheme::MXFP6_E2M3:
      return column_values<E2M3Codec, 32>(codes, stride, rows, count, block_scales, out);
    case Scheme::MXFP6_E3M2:
      return column_values<E3M2Codec, 32>(codes, stride, rows, count, block_scales, out);
    case Scheme::MXFP4: return column_values<E2M1Codec, 32>(codes, stride, rows, count, block_scales, out);
  }
  return 0;
}

MICROSCALE_CPU_DISPATCH unsigned decode_scaled(Scheme scheme, const uint8_t* codes, int64_t count,
                                               const float* scales, float* out) {
  switch (scheme) {
    case Scheme::NVFP4:
    case Scheme::MXFP4: return scaled_values<E2M1Codec>(codes, count, scales, out);
    case Scheme::MXFP8_E4M3: return scaled_values<E4M3Codec>(codes, count, scales, out);
    case Scheme::MXFP8_E5M2: return scaled_values<E5M2Codec>(codes, count, scales, out);
    case Scheme::MXFP6_E2M3: return scaled_values<E2M3Codec>(codes, count, scales, out);
    case Scheme::MXFP6_E3M2: return scaled_values<E3M2Codec>(codes, count, scales, out);
  }
  return 0;
}

}  // namespace microscale::cpu
