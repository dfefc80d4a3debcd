// MX quantizer written with AVX-512 intrinsics: every MX scheme (FP8 E4M3/E5M2, FP6 E2M3/E3M2,
// FP4 E2M1) and scale rule, rowwise and columnwise; equal bit for bit to quantize_mx_ref.cpp
// (tests/cpp/quantize_test.cpp runs it on random, special and boundary inputs, golden_test.cpp on
// the golden cases). Inputs with strided columns take the portable fast path.
//
// Three kernels. bf16 and f16 inputs stay in 16-bit lanes (32 lanes per register): with
// byte-sized codes (FP8, FP6) quantize_chunk16 below (codes by an integer subtract and shift since
// the block scales are powers of two; FP6's format subnormals by the subnormal form of
// mx16_form.hpp where every block allows it), which hands chunks with Inf/NaN (bf16: also tiny
// scales) to the general one; with FP4 codes quantize_chunk16_fp4 (codes by the two-step form of
// mx16_form.hpp where every block of the chunk allows it, else by thresholds).
// The general kernel (fp32 lanes) takes everything else and is described here.
//
// The unit of work is a chunk of one band of 32 input rows x 64 columns (four 16-lane tiles;
// FP4: 128 columns, eight tiles), so that every output row of the chunk is one 64-byte line. The
// last chunk of a band may be narrower (K is only a multiple of 32). Three steps:
//   1. load:    each row's tiles are widened to fp32 once (load16) into a local buffer, and the
//               |x| bit patterns feed both amaxes: per lane a vertical max over the 32 rows
//               (columnwise), per row the max of its two tiles of each block (rowwise).
//   2. scales:  columnwise, one register of 16 block amaxes per tile (scales: 16 contiguous
//               bytes); rowwise, transpose_max16 turns 16 rows' partial maxes into one register
//               of 16 row amaxes per block. The amaxes are unsigned maxes of |x| bits, so a NaN
//               anywhere in a block gives a NaN pattern and scale 0xFF, as the reference
//               (torch.amax propagates NaN).
//   3. encode:  row by row from the buffer: each tile times its inverse scale (the row's, a
//               broadcast; or the column's, a register), encoded, packed into the row's 64 bytes
//               and written with a single full-width store.
// Why: the outputs go to 64 rows (32 per direction) whose stride is usually a power of two.
// Stores of 8-16 byte pieces into many such rows leave partial lines and conflict in L1 (the
// NVFP4 kernel measured it); whole lines do not, and large outputs are streamed past the caches
// (see quantize_with). The fp32 buffer keeps the reloads off the input rows, which share L1 sets
// at such strides, and converts each input once; the input is prefetched in software.
#include <algorithm>
#include <cstring>

#include "core/fp_environment.hpp"
#include "cpu/avx512.hpp"
#include "cpu/avx512_codecs.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/kernel_set.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/row_loader.hpp"

namespace microscale::cpu {

#ifdef MICROSCALE_HAVE_AVX512_KERNELS
namespace {

using namespace avx512;

constexpr int kBlock = 32;  // MX block; also the rows of a band
constexpr int kLanes = 16;  // columns of a tile
// Tiles of a full chunk: one 64-byte line of output per row (64 codes, or 128 FP4 codes).
template <bool kPacked>
constexpr int kChunkTiles = kPacked ? 8 : 4;
constexpr int kMaxChunkCols = 128;

// One band of up to 32 input rows and everything it produces.
struct Band {
  const std::byte* src = nullptr;  // row 0 of the band
  int64_t row_bytes = 0;           // input row stride in bytes
  int rows = 0;                    // <= 32; short only for the last band of a rowwise-only input
  int64_t k = 0;
  // The element format's terms of mx_scale_bytes.
  int emax = 0;
  int mantissa_bits = 0;
  float max_normal = 0.0f;
  // Rowwise (row_data null: not requested): band row r at row_data + r * data_stride and
  // row_scale + r * row_scale_stride (K/32 bytes).
  uint8_t* row_data = nullptr;
  uint8_t* row_scale = nullptr;
  int64_t row_scale_stride = 0;
  // Columnwise (col_data null: not requested): band row r at col_data + r * data_stride; the
  // band's scales are one row of K bytes at col_scale.
  uint8_t* col_data = nullptr;
  uint8_t* col_scale = nullptr;
  int64_t data_stride = 0;  // K, or K/2 for FP4 (both directions)
  bool stream = false;      // full chunks' 64-byte lines bypass the caches (see quantize_with)
  // MXFP4 of bf16/f16 (quantize_chunk16_fp4): the thresholds of the input type, and the same
  // widened to 32-bit words (wide_fp4_thresholds).
  const int16_t (*fp4_thresholds)[8] = nullptr;
  const uint32_t (*fp4_wide_thresholds)[8] = nullptr;
};

// The low bytes of the int32 lanes of c[0..n-1] (values 0..255; n = 2 or 4), in order: byte
// 16t + j = c[t] lane j; with n = 2 the high 32 bytes are zero.
template <int n>
MICROSCALE_AVX512_INLINE __m512i pack_bytes(const __m512i* c) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i c2 = n == 4 ? c[2] : zero, c3 = n == 4 ? c[3] : zero;
  // The packs work within 128-bit lanes: dword 4l + t of `b` holds c[t]'s elements 4l..4l+3;
  // the permutation moves it to dword 4t + l. Saturation never applies (codes are 0..255).
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c2, c3));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(order, b);
}

// 64 FP4 codes, one per byte -> 32 bytes, element 2t in the low nibble of byte t.
MICROSCALE_AVX512_INLINE __m256i pack_nibbles(__m512i bytes) {
  // 16-bit lane = even | odd << 8 (codes < 16): its low byte becomes even | odd << 4.
  return _mm512_cvtepi16_epi8(_mm512_or_si512(bytes, _mm512_srli_epi16(bytes, 4)));
}

// Stores the codes c[0..kTiles-1] (lane j of c[t] = element 16t + j) of one output row: one
// byte each, or for FP4 two per byte; one store either way (a whole line for a full chunk).
template <bool kPacked, int kTiles>
MICROSCALE_AVX512_INLINE void store_codes(const __m512i c[kTiles], uint8_t* dst, bool stream) {
  if constexpr (kTiles == kChunkTiles<kPacked>) {
    __m512i line;
    if constexpr (kPacked) {
      line = _mm512_inserti64x4(_mm512_castsi256_si512(pack_nibbles(pack_bytes<4>(c))),
                                pack_nibbles(pack_bytes<4>(c + 4)), 1);
    } else {
      line = pack_bytes<4>(c);
    }
    store_line(dst, line, stream);
  } else if constexpr (kPacked && kTiles == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), pack_nibbles(pack_bytes<4>(c)));
  } else if constexpr (kPacked) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(pack_nibbles(pack_bytes<2>(c))));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_castsi512_si256(pack_bytes<2>(c)));
  }
}

// mx_scaled_element on 16 lanes: x * inverse, except that a NaN x stays a NaN of its own sign
// (here quieted, which no code depends on). kHasNan: some x of the chunk is NaN; else the product
// alone.
template <bool kHasNan>
MICROSCALE_AVX512_INLINE __m512 scaled(__m512 x, __m512 inverse) {
  const __m512 p = _mm512_mul_ps(x, inverse);
  if constexpr (!kHasNan) return p;
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(p), nan, _mm512_castps_si512(x),
                                                  _mm512_set1_epi32(0x00400000)));
}

// Step 3 of a chunk (below): the codes of every output row of the chunk, one row at a time, from
// the fp32 chunk in `buffer` and the inverse scales: row_inverse[r][i] of band row i's block r,
// col_inverse[t] of tile t's 16 column blocks.
template <typename Codec, bool kPacked, int kTiles, bool kHasNan>
MICROSCALE_AVX512_INLINE void encode_chunk(const Band& b, int64_t col, const float (*buffer)[kMaxChunkCols],
                                           const float (*row_inverse)[kBlock], const __m512* col_inverse) {
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  const int64_t data_col = kPacked ? col / 2 : col;
  const int rows = columnwise ? kBlock : b.rows;  // columnwise bands are always full
  for (int i = 0; i < rows; ++i) {
    __m512 v[kTiles];
    for (int t = 0; t < kTiles; ++t) v[t] = _mm512_load_ps(buffer[i] + t * kLanes);
    if (rowwise && i < b.rows) {
      __m512i c[kTiles];
      for (int r = 0; r < kTiles / 2; ++r) {
        const __m512 inverse = _mm512_set1_ps(row_inverse[r][i]);
        c[2 * r] = encode_rn<Codec>(scaled<kHasNan>(v[2 * r], inverse));
        c[2 * r + 1] = encode_rn<Codec>(scaled<kHasNan>(v[2 * r + 1], inverse));
      }
      store_codes<kPacked, kTiles>(c, b.row_data + i * b.data_stride + data_col, b.stream);
    }
    if (columnwise) {
      __m512i c[kTiles];
      for (int t = 0; t < kTiles; ++t) c[t] = encode_rn<Codec>(scaled<kHasNan>(v[t], col_inverse[t]));
      store_codes<kPacked, kTiles>(c, b.col_data + i * b.data_stride + data_col, b.stream);
    }
  }
}

// One chunk: band rows 0..b.rows-1, columns [col, col + 16 * kTiles). `buffer` is scratch.
template <typename Codec, bool kPacked, MxScaleRule kRule, DType kDType, int kTiles>
MICROSCALE_AVX512_INLINE void quantize_chunk(const Band& b, int64_t col, float (*buffer)[kMaxChunkCols]) {
  constexpr int kRowBlocks = kTiles / 2;  // rowwise blocks per row of the chunk
  constexpr int64_t kElementBytes = element_bytes<kDType>();
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;

  // 1. Load (rows past b.rows are zeros: they change no amax, and nothing of them is stored).
  // NOTE: the hardware prefetchers do not follow 32 input rows at once (nor the 64 output rows
  // beside them): without the software prefetch, half the time went to waiting on loads.
  __m512i col_max[kTiles];
  for (int t = 0; t < kTiles; ++t) col_max[t] = _mm512_setzero_si512();
  __m512i row_max[kRowBlocks][kBlock];  // per row, the max of its block's two tiles (16 lanes)
  const std::byte* src = b.src + col * kElementBytes;
  const int64_t ahead = std::min(kPrefetchCols, b.k - col - kTiles * kLanes) * kElementBytes;
  for (int i = 0; i < kBlock; ++i) {
    if (i < b.rows && ahead > 0) {
      for (int64_t l = 0; l < kTiles * kLanes * kElementBytes; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(src + i * b.row_bytes + ahead + l), _MM_HINT_T1);
    }
    __m512i a[kTiles];
    for (int t = 0; t < kTiles; ++t) {
      const __m512 v = i < b.rows ? load16<kDType>(src + i * b.row_bytes + t * kLanes * kElementBytes)
                                  : _mm512_setzero_ps();
      _mm512_store_ps(buffer[i] + t * kLanes, v);
      a[t] = abs_bits(v);
      col_max[t] = _mm512_max_epu32(col_max[t], a[t]);
    }
    for (int r = 0; r < kRowBlocks; ++r) row_max[r][i] = _mm512_max_epu32(a[2 * r], a[2 * r + 1]);
  }

  // Any NaN in the chunk (every element is under a column max): rare, costs one more step.
  const bool has_nan =
      _mm512_cmpgt_epu32_mask(vertical_max(col_max, kTiles), _mm512_set1_epi32(0x7F800000)) != 0;

  // 2. Scales. Columnwise: 16 * kTiles contiguous bytes of the band's scale row.
  __m512 col_inverse[kTiles];
  if (columnwise) {
    __m512i s[kTiles];
    for (int t = 0; t < kTiles; ++t) {
      s[t] = mx_scale_bytes<kRule>(col_max[t], b.emax, b.mantissa_bits, b.max_normal);
      col_inverse[t] = mx_inverse_scales(s[t]);
    }
    if constexpr (kTiles == 2) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.col_scale + col),
                          _mm512_castsi512_si256(pack_bytes<2>(s)));
    } else {
      for (int t = 0; t < kTiles; t += 4)
        _mm512_storeu_si512(b.col_scale + col + t * kLanes, pack_bytes<4>(s + t));
    }
  }
  // Rowwise: kRowBlocks bytes per row (K/32 apart: small stores, but 1/32 of the data bytes).
  alignas(64) float row_inverse[kRowBlocks][kBlock];
  if (rowwise) {
    for (int h = 0; h * kLanes < b.rows; ++h) {  // 16 rows at a time: lane L = row 16h + L
      __m512i s[kRowBlocks];
      for (int r = 0; r < kRowBlocks; ++r) {
        s[r] = mx_scale_bytes<kRule>(transpose_max16(row_max[r] + h * kLanes), b.emax, b.mantissa_bits,
                                     b.max_normal);
        _mm512_store_ps(row_inverse[r] + h * kLanes, mx_inverse_scales(s[r]));
      }
      const int n = std::min(kLanes, b.rows - h * kLanes);
      uint8_t* dst = b.row_scale + h * kLanes * b.row_scale_stride + col / kBlock;
      if constexpr (kRowBlocks == 1) {
        scatter_bytes(s[0], dst, b.row_scale_stride, n);
      } else {
        // Lane L: row L's kRowBlocks bytes in memory order.
        __m512i packed = s[0];
        for (int r = 1; r < kRowBlocks; ++r) packed = _mm512_or_si512(packed, _mm512_slli_epi32(s[r], 8 * r));
        alignas(64) uint32_t bytes[kLanes];
        _mm512_store_si512(bytes, packed);
        for (int i = 0; i < n; ++i) std::memcpy(dst + i * b.row_scale_stride, &bytes[i], kRowBlocks);
      }
    }
  }

  // 3. Encode.
  if (has_nan) {
    encode_chunk<Codec, kPacked, kTiles, true>(b, col, buffer, row_inverse, col_inverse);
  } else {
    encode_chunk<Codec, kPacked, kTiles, false>(b, col, buffer, row_inverse, col_inverse);
  }
}

// ---- bf16 and f16 inputs, byte-sized codes (FP8, FP6): 16-bit lanes throughout ----
//
// A chunk is one full band of 32 rows x 64 columns (two registers of 32 inputs per row; the last
// chunk of a band may be 32 columns, one register). The steps are those of quantize_chunk, but
// nothing is widened: the amaxes are unsigned maxes of the 16-bit |x| patterns (a vertical max
// per column, transpose_max16x2 per row block), and the codes come from mx16_codes_normal, a
// subtract and a shift per direction (avx512_codecs.hpp). Registers with a lane outside the normal
// form's range in either direction (format subnormals, input subnormals; zeros are fine) take
// mx_bf16_codes or mx_f16_codes; chunks with Inf or NaN take quantize_chunk, and so do bf16 chunks
// with a block scale below the format's bias (amax below ~2^-110) outside FP6's subnormal form
// (which takes blocks of zeros).
constexpr int k16Lanes = 32;
constexpr int k16ChunkCols = 64;

// Per 16 rows of row max patterns (the 16-bit max shifted up: bf16's fp32 bits) in row order:
// transpose_max16x2 on the rows' |x| (block b = columns 16b..16b+15 of the register), then the
// max of the two blocks.
MICROSCALE_AVX512_INLINE __m512i row_max16(const __m512i abs[16]) {
  __m512i out[2];
  transpose_max16x2(abs, out);
  // Lane d of out[h]: row 8h + 2(d % 4) + d / 8, block (d / 4) % 2; lanes d and d ^ 4 hold the two
  // blocks of one row (128-bit chunks 0 <-> 1, 2 <-> 3).
  for (__m512i& o : out) o = _mm512_max_epu32(o, _mm512_shuffle_i32x4(o, o, 0xB1));
  // Row r = 8h + q at lane 8(q % 2) + q / 2 of out[h].
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
  return _mm512_permutex2var_epi32(out[0], order, out[1]);
}

// Row block terms kept per band row: the scale byte and mx16_normal_terms, each as a 16-bit
// value repeated in both halves of a 32-bit word (a register is then one broadcast load).
struct RowTerms {
  alignas(64) uint32_t scale[kBlock];
  alignas(64) uint32_t lower[kBlock];
  alignas(64) uint32_t limit[kBlock];
  alignas(64) float multiplier[kBlock];  // FP6 in the subnormal form: subnormal_multipliers
};

// The output line of one row and direction: the 16-bit codes c[0..kRegs-1] as bytes.
template <int kRegs>
MICROSCALE_AVX512_INLINE void store_codes16(const __m512i* c, uint8_t* dst, bool stream) {
  if constexpr (kRegs == 2) {
    // packus interleaves the registers' 64-bit pieces per 128-bit lane; the permutation restores
    // the order. Codes are 0..255, so nothing saturates.
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    store_line(dst, _mm512_permutexvar_epi64(order, _mm512_packus_epi16(c[0], c[1])), stream);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi16_epi8(c[0]));
  }
}

// One register's codes for one direction (scale bytes per 16-bit lane) by the general form.
template <typename Codec, DType kIn>
MICROSCALE_AVX512_INLINE __m512i codes_outside_normal(__m512i x, __m512i scale_bytes) {
  if constexpr (kIn == DType::F16) {
    return mx_f16_codes<Codec>(x, scale_bytes);
  } else {
    const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
    return mx_bf16_codes<Codec>(abs, _mm512_srli_epi16(x, Mx16Format<Codec, kIn>::kSignShift), scale_bytes);
  }
}

// The codes of a register with a lane outside the normal form's range in a direction (rare): both
// requested directions by mx_bf16_codes or mx_f16_codes. `row_scale` is the row block's byte
// repeated in both halves of a 32-bit word; null pointers mark a direction not requested.
// NOTE: kept out of line: the hot loop stays small, and GCC 12 with -fsanitize=address,undefined
// and OpenMP miscompiled the inlined form (columnwise E3M2 codes took the normal form's values;
// adding a print made it disappear), while -O2 and either sanitizer alone did not.
template <typename Codec, DType kIn>
MICROSCALE_AVX512 __attribute__((noinline)) void encode_outside_normal(__m512i x, uint32_t row_scale,
                                                                       const __m512i* col_scale,
                                                                       __m512i* row_codes,
                                                                       __m512i* col_codes) {
  if (row_codes != nullptr)
    *row_codes = codes_outside_normal<Codec, kIn>(x, _mm512_set1_epi32(static_cast<int>(row_scale)));
  if (col_scale != nullptr) *col_codes = codes_outside_normal<Codec, kIn>(x, *col_scale);
}

// Step 1 of a 16-bit chunk, columns [col, col + 32 * kRegs) of a full band: its rows into
// `buffer`, the max |x| pattern per column (col_max[t], 16-bit lanes: columns 32t..32t+31) and per
// row and block (row_max[t][row]: the 16-bit max shifted up, i.e. bf16's fp32 bits); the columns
// that follow are prefetched.
template <int kRegs, int kWidth>
MICROSCALE_AVX512_INLINE void load_chunk16(const Band& b, int64_t col, uint16_t (*buffer)[kWidth],
                                           __m512i col_max[kRegs], uint32_t (*row_max)[kBlock]) {
  static_assert(kRegs * k16Lanes <= kWidth);
  const auto* src = reinterpret_cast<const uint16_t*>(b.src) + col;  // [32, row_bytes / 2]
  const int64_t stride = b.row_bytes / 2;
  const __m512i abs_mask = _mm512_set1_epi16(0x7FFF);
  const int64_t ahead = std::min(kPrefetchCols, b.k - col - kRegs * k16Lanes) * 2;
  for (int t = 0; t < kRegs; ++t) {
    col_max[t] = _mm512_setzero_si512();
    for (int h = 0; h < kBlock / 16; ++h) {
      __m512i abs[16];
      for (int i = 0; i < 16; ++i) {
        const int r = 16 * h + i;
        if (t == 0 && ahead > 0) {
          for (int64_t l = 0; l < kRegs * k16Lanes * 2; l += 64)
            _mm_prefetch(reinterpret_cast<const char*>(src + r * stride) + ahead + l, _MM_HINT_T1);
        }
        const __m512i v = _mm512_loadu_si512(src + r * stride + t * k16Lanes);
        _mm512_store_si512(buffer[r] + t * k16Lanes, v);
        abs[i] = _mm512_and_si512(v, abs_mask);
        col_max[t] = _mm512_max_epu16(col_max[t], abs[i]);
      }
      _mm512_store_si512(row_max[t] + 16 * h, row_max16(abs));
    }
  }
}

// The columnwise scale bytes of a 16-bit chunk from its column maxes (col_max[t]: columns
// 32t..32t+31): s[2t + h] holds those of columns 32t + 16h.. + 15, one per 32-bit lane.
template <MxScaleRule kRule, int kRegs, DType kIn>
MICROSCALE_AVX512_INLINE void column_scale_bytes(const Band& b, const __m512i* col_max, __m512i* s) {
  for (int t = 0; t < kRegs; ++t) {
    for (int h = 0; h < 2; ++h) {
      const __m256i half =
          h == 0 ? _mm512_castsi512_si256(col_max[t]) : _mm512_extracti64x4_epi64(col_max[t], 1);
      s[2 * t + h] = mx_scale_bytes<kRule>(_mm512_castps_si512(widen16<kIn>(half)), b.emax, b.mantissa_bits,
                                           b.max_normal);
    }
  }
}

// Whether every block of a 16-bit chunk has a scale byte from `least` to 0xFE or is a block of
// zeros (max pattern 0; every rule gives it byte 0, and a form that holds from `least` gets its
// codes right under the terms of `least`): where the FP6 subnormal form (least
// Mx16Subnormals::kMinScale) and the FP4 two-step form (least Mx16Fp4TwoStep::kMinScale) hold.
// Inf and NaN need no test of their own: every rule gives a block holding either the byte 0xFF
// (mx_scale_bytes). Column blocks: col_bytes and col_max, per register (16-bit lanes); row blocks:
// row_bytes and row_max (16-bit maxes shifted up), [register][row].
template <DType kIn, int kRegs>
MICROSCALE_AVX512_INLINE bool every_block_from(int least, bool rowwise, bool columnwise,
                                               const __m512i* col_bytes, const __m512i* col_max,
                                               const uint32_t (*row_bytes)[kBlock],
                                               const uint32_t (*row_max)[kBlock]) {
  // s - least (mod 2^16 or 2^32) is at least 0xFF - least exactly for s < least and s = 0xFF.
  __mmask32 outside = 0;
  if (columnwise) {
    for (int t = 0; t < kRegs; ++t) {
      const __m512i s = col_bytes[t];
      outside |=
          _mm512_mask_cmpge_epu16_mask(_mm512_test_epi16_mask(col_max[t], col_max[t]),
                                       _mm512_sub_epi16(s, _mm512_set1_epi16(static_cast<int16_t>(least))),
                                       _mm512_set1_epi16(static_cast<int16_t>(0xFF - least)));
    }
  }
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        const __m512i s = _mm512_load_si512(row_bytes[t] + 16 * h);
        const __m512i m = _mm512_load_si512(row_max[t] + 16 * h);
        outside |= _mm512_mask_cmpge_epu32_mask(_mm512_test_epi32_mask(m, m),
                                                _mm512_sub_epi32(s, _mm512_set1_epi32(least)),
                                                _mm512_set1_epi32(0xFF - least));
      }
    }
  }
  return outside == 0;
}

// The FP6 subnormal form (mx16_form.hpp: Mx16Subnormals) of the blocks of scale bytes S (32-bit
// lanes; S from kMinScale on, or a block of zeros): the multiplier 2^(127 - max(S, kMinScale) +
// kGridShift) as fp32 bits, a normal exponent for every such S.
template <typename Codec, DType kIn>
MICROSCALE_AVX512_INLINE __m512 subnormal_multipliers(__m512i bytes32) {
  using Subnormals = Mx16Subnormals<Codec, kIn>;
  const __m512i s = _mm512_max_epu32(bytes32, _mm512_set1_epi32(Subnormals::kMinScale));
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254 + Subnormals::kGridShift), s), 23));
}

// The subnormal form's code magnitudes of 32 lanes (the lanes outside the normal form; others are
// garbage): |x| as widen_half_lanes gives it (even and odd lanes) times the lanes' multipliers,
// rounded to integers in the current rounding mode (as encode_rn's add onto the grid rounds),
// back in 16-bit lanes.
MICROSCALE_AVX512_INLINE __m512i subnormal_magnitudes(__m512 even, __m512 odd, __m512 multiplier_even,
                                                      __m512 multiplier_odd) {
  const __m512i e = _mm512_cvtps_epi32(_mm512_mul_ps(even, multiplier_even));
  const __m512i o = _mm512_cvtps_epi32(_mm512_mul_ps(odd, multiplier_odd));
  return _mm512_mask_blend_epi16(0xAAAAAAAA, e, _mm512_slli_epi32(o, 16));  // low halves of e, o
}

// Step 3 of a 16-bit FP6 chunk in the subnormal form (every block from Mx16Subnormals::kMinScale):
// each lane's code from the normal form, or, where the lane is outside it (a nonzero format
// subnormal), from the subnormal form; branch-free, since FP6 blocks hold format subnormals in
// most registers (the general form per register took most of an FP6 chunk's time). Columnwise
// multipliers per register: [2t] even lanes, [2t + 1] odd lanes.
template <typename Codec, DType kIn, int kRegs>
MICROSCALE_AVX512_INLINE void encode_chunk16_fp6(const Band& b, int64_t col,
                                                 const uint16_t (*buffer)[k16ChunkCols], const RowTerms* row,
                                                 const __m512i* col_lower, const __m512i* col_limit,
                                                 const __m512* col_multiplier) {
  using F = Mx16Format<Codec, kIn>;
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  const __m512i one = _mm512_set1_epi16(1);
  for (int i = 0; i < kBlock; ++i) {
    __m512i row_codes[kRegs], col_codes[kRegs];
    for (int t = 0; t < kRegs; ++t) {
      const __m512i x = _mm512_load_si512(buffer[i] + t * k16Lanes);
      const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
      const __m512i x_shifted = _mm512_srli_epi16(x, F::kSignShift);
      const __m512i abs_plus_lsb =
          _mm512_add_epi16(abs, _mm512_and_si512(_mm512_srli_epi16(abs, F::kDrop), one));
      const __mmask32 nonzero = kIn == DType::F16 ? _mm512_test_epi16_mask(abs, abs) : 0;
      const __m512i abs_less_one = _mm512_sub_epi16(abs, one);
      const __m512 even = widen_half_lanes<kIn, false>(abs), odd = widen_half_lanes<kIn, true>(abs);
      if (rowwise) {
        const __m512 multiplier = _mm512_set1_ps(row[t].multiplier[i]);
        const __m512i normal = mx16_codes_normal<Codec, kIn>(
            abs_plus_lsb, x_shifted, _mm512_set1_epi32(static_cast<int>(row[t].lower[i])), nonzero);
        const __m512i subnormal =
            with_input_sign<Codec>(subnormal_magnitudes(even, odd, multiplier, multiplier), x_shifted);
        const __mmask32 outside =
            _mm512_cmple_epu16_mask(abs_less_one, _mm512_set1_epi32(static_cast<int>(row[t].limit[i])));
        row_codes[t] = _mm512_mask_blend_epi16(outside, normal, subnormal);
      }
      if (columnwise) {
        const __m512i normal = mx16_codes_normal<Codec, kIn>(abs_plus_lsb, x_shifted, col_lower[t], nonzero);
        const __m512i subnormal = with_input_sign<Codec>(
            subnormal_magnitudes(even, odd, col_multiplier[2 * t], col_multiplier[2 * t + 1]), x_shifted);
        col_codes[t] =
            _mm512_mask_blend_epi16(_mm512_cmple_epu16_mask(abs_less_one, col_limit[t]), normal, subnormal);
      }
    }
    if (rowwise) store_codes16<kRegs>(row_codes, b.row_data + i * b.data_stride + col, b.stream);
    if (columnwise) store_codes16<kRegs>(col_codes, b.col_data + i * b.data_stride + col, b.stream);
  }
}

// One chunk of a full band of kIn (bf16 or f16) inputs: columns [col, col + 32 * kRegs). False,
// with nothing written, when the chunk holds an Inf or NaN, or (bf16) a scale byte below the bias
// (see mx_bf16_codes) outside FP6's subnormal form. `buffer` is scratch: the chunk's rows,
// contiguous (see the file comment on L1 sets).
template <typename Codec, MxScaleRule kRule, int kRegs, DType kIn>
MICROSCALE_AVX512_INLINE bool quantize_chunk16(const Band& b, int64_t col, uint16_t (*buffer)[k16ChunkCols]) {
  using F = Mx16Format<Codec, kIn>;
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  const __m512i abs_mask = _mm512_set1_epi16(0x7FFF);

  // 1. Load into the buffer; |x| maxes per column and per row block.
  __m512i col_max[kRegs];
  alignas(64) uint32_t row_max[kRegs][kBlock];  // the 16-bit max shifted up
  load_chunk16<kRegs>(b, col, buffer, col_max, row_max);
  // Inf or NaN anywhere (every element is under a column max): the fp32 chunk handles them.
  for (int t = 0; t < kRegs; ++t) {
    if (_mm512_cmpge_epu16_mask(col_max[t], _mm512_set1_epi16(kInf16Bits<kIn>)) != 0) return false;
  }

  // 2. Scales and the encoders' terms; a direction not requested gets limit 0 (it sends only
  // |x| = 1, the smallest subnormal, to the general form, which is right for any lane). Columnwise:
  // kRegs * 32 contiguous bytes of the band's scale row, in 16-bit lanes per register.
  __m512i col_bytes = _mm512_setzero_si512();
  __m512i col_scale[kRegs];
  if (columnwise) {
    __m512i s[2 * kRegs];
    column_scale_bytes<kRule, kRegs, kIn>(b, col_max, s);
    col_bytes = pack_bytes<2 * kRegs>(s);  // byte j = column j's scale
    for (int t = 0; t < kRegs; ++t) {
      col_scale[t] = _mm512_cvtepu8_epi16(t == 0 ? _mm512_castsi512_si256(col_bytes)
                                                 : _mm512_extracti64x4_epi64(col_bytes, 1));
    }
  }
  // Rowwise: per row block its byte, each 16 rows' in one register.
  alignas(64) uint32_t bytes[kRegs][kBlock];  // rowwise: each row block's scale byte
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        // row_max holds each 16-bit max shifted up (bf16: its fp32 bits already).
        __m512i amax = _mm512_load_si512(row_max[t] + 16 * h);
        if constexpr (kIn == DType::F16) amax = _mm512_castps_si512(widen_half_lanes<kIn, true>(amax));
        _mm512_store_si512(bytes[t] + 16 * h,
                           mx_scale_bytes<kRule>(amax, b.emax, b.mantissa_bits, b.max_normal));
      }
    }
  }
  // FP6 in the subnormal form where every block of the chunk allows it (most chunks: under FLOOR,
  // block amaxes from 2^-122 (E2M3) or 2^-119 (E3M2) for bf16, 2^-11 or 2^-7 for f16, and blocks
  // of zeros).
  bool subnormal_form = false;
  if constexpr (Codec::kWidth == 6) {
    subnormal_form = every_block_from<kIn, kRegs>(Mx16Subnormals<Codec, kIn>::kMinScale, rowwise, columnwise,
                                                  col_scale, col_max, bytes, row_max);
  }
  // Other bf16 chunks with a scale byte below the bias go to the fp32 kernel (see mx_bf16_codes;
  // the subnormal form's least byte is above the bias); f16 takes any scale.
  if constexpr (kIn == DType::BF16) {
    if (!subnormal_form) {
      const __mmask64 valid = kRegs == 2 ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
      if (columnwise &&
          _mm512_mask_cmplt_epu8_mask(valid, col_bytes, _mm512_set1_epi8(static_cast<char>(F::kBias))) != 0)
        return false;
      for (int t = 0; t < kRegs && rowwise; ++t) {
        for (int h = 0; h < kBlock / 16; ++h) {
          if (_mm512_cmplt_epu32_mask(_mm512_load_si512(bytes[t] + 16 * h), _mm512_set1_epi32(F::kBias)) != 0)
            return false;
        }
      }
    }
  }
  __m512i col_lower[kRegs], col_limit[kRegs];
  for (int t = 0; t < kRegs; ++t) col_limit[t] = _mm512_setzero_si512();
  if (columnwise) {
    if constexpr (kRegs == 2) {
      _mm512_storeu_si512(b.col_scale + col, col_bytes);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.col_scale + col), _mm512_castsi512_si256(col_bytes));
    }
    for (int t = 0; t < kRegs; ++t) mx16_normal_terms<Codec, kIn>(col_scale[t], &col_lower[t], &col_limit[t]);
  }
  RowTerms row[kRegs];  // (K/32 bytes apart per row in the output)
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        const __m512i s = _mm512_load_si512(bytes[t] + 16 * h);
        const __m512i repeated = _mm512_or_si512(s, _mm512_slli_epi32(s, 16));
        __m512i lower, limit;
        mx16_normal_terms<Codec, kIn>(repeated, &lower, &limit);
        _mm512_store_si512(row[t].scale + 16 * h, repeated);
        _mm512_store_si512(row[t].lower + 16 * h, lower);
        _mm512_store_si512(row[t].limit + 16 * h, limit);
      }
    }
    uint8_t* dst = b.row_scale + col / kBlock;
    for (int i = 0; i < kBlock; ++i) {
      for (int t = 0; t < kRegs; ++t) dst[i * b.row_scale_stride + t] = static_cast<uint8_t>(bytes[t][i]);
    }
  } else {
    for (RowTerms& r : row) std::fill(std::begin(r.limit), std::end(r.limit), 0u);
  }

  // 3. Encode, row by row: FP6 in the subnormal form where it holds; FP8 seldom has a lane
  // outside the normal form, and takes the general form per register for it.
  if constexpr (Codec::kWidth == 6) {
    if (subnormal_form) {
      __m512 col_multiplier[2 * kRegs];
      for (int t = 0; t < kRegs && columnwise; ++t) {
        col_multiplier[2 * t] = subnormal_multipliers<Codec, kIn>(
            _mm512_and_si512(col_scale[t], _mm512_set1_epi32(0xFFFF)));  // even lanes' bytes
        col_multiplier[2 * t + 1] = subnormal_multipliers<Codec, kIn>(_mm512_srli_epi32(col_scale[t], 16));
      }
      if (rowwise) {
        for (int t = 0; t < kRegs; ++t) {
          for (int h = 0; h < kBlock / 16; ++h) {
            _mm512_store_ps(row[t].multiplier + 16 * h,
                            subnormal_multipliers<Codec, kIn>(_mm512_load_si512(bytes[t] + 16 * h)));
          }
        }
      }
      encode_chunk16_fp6<Codec, kIn, kRegs>(b, col, buffer, row, col_lower, col_limit, col_multiplier);
      return true;
    }
  }
  const __m512i one = _mm512_set1_epi16(1);
  for (int i = 0; i < kBlock; ++i) {
    __m512i row_codes[kRegs], col_codes[kRegs];
    for (int t = 0; t < kRegs; ++t) {
      const __m512i x = _mm512_load_si512(buffer[i] + t * k16Lanes);
      const __m512i abs = _mm512_and_si512(x, abs_mask);
      const __m512i x_shifted = _mm512_srli_epi16(x, F::kSignShift);
      const __m512i limit =
          _mm512_max_epu16(_mm512_set1_epi32(static_cast<int>(row[t].limit[i])), col_limit[t]);
      if (_mm512_cmple_epu16_mask(_mm512_sub_epi16(abs, one), limit) == 0) [[likely]] {
        const __m512i abs_plus_lsb =
            _mm512_add_epi16(abs, _mm512_and_si512(_mm512_srli_epi16(abs, F::kDrop), one));
        const __mmask32 nonzero = kIn == DType::F16 ? _mm512_test_epi16_mask(abs, abs) : 0;
        if (rowwise) {
          row_codes[t] = mx16_codes_normal<Codec, kIn>(
              abs_plus_lsb, x_shifted, _mm512_set1_epi32(static_cast<int>(row[t].lower[i])), nonzero);
        }
        if (columnwise)
          col_codes[t] = mx16_codes_normal<Codec, kIn>(abs_plus_lsb, x_shifted, col_lower[t], nonzero);
      } else {
        encode_outside_normal<Codec, kIn>(x, rowwise ? row[t].scale[i] : 0,
                                          columnwise ? &col_scale[t] : nullptr,
                                          rowwise ? &row_codes[t] : nullptr, &col_codes[t]);
      }
    }
    if (rowwise) store_codes16<kRegs>(row_codes, b.row_data + i * b.data_stride + col, b.stream);
    if (columnwise) store_codes16<kRegs>(col_codes, b.col_data + i * b.data_stride + col, b.stream);
  }
  return true;
}

// ---- MXFP4 of bf16 and f16 inputs: codes in 16-bit lanes ----
//
// E2M1 puts a large share of a block in the format's subnormals, outside the 16-bit form above.
// Two forms take them, chosen per chunk:
// - the two-step form (mx16_form.hpp: Mx16Fp4TwoStep, mx16_fp4_code): the normal form's code
//   with a saturating subtract, raised to the count of the block's two lowest steps; three terms
//   per block, each the scale byte shifted less a constant. It holds for scale bytes from
//   Mx16Fp4TwoStep::kMinScale to 0xFE and for blocks of zeros: every chunk of finite data whose
//   block amaxes are above ~2^-122 (bf16) or ~2^-10 (f16).
// - thresholds: compares of the |x| pattern with its block's thresholds (e2m1_thresholds.hpp:
//   mx_e2m1_thresholds), exact for every scale byte, 0xFF (Inf and NaN blocks) included; the
//   chunks the two-step form does not hold for.
// A chunk is a full band of 32 rows x 128 columns (four registers per row: each output row one
// 64-byte line); a band's last chunks may be 64 or 32 columns.
constexpr int kFp4ChunkCols = 128;

// The MXFP4 thresholds of kIn with each value repeated in both halves of a 32-bit word (one
// block's thresholds are then broadcast loads), and in word 0, instead of the zero step, the
// code's sign mask: 8, or 0 where the step is never reached (byte 0xFF: every code +6).
template <DType kIn>
const uint32_t (*wide_fp4_thresholds())[8] {
  struct Table {
    alignas(64) uint32_t below[256][8];
  };
  static const Table table = [] {
    const MxE2m1Thresholds& t = mx_e2m1_thresholds(kIn);
    Table w;
    for (int s = 0; s < 256; ++s) {
      for (int k = 0; k < 8; ++k) {
        // MX rows have the zero step at -1 (every pattern takes its sign) or 0x7FFF (none does).
        const auto v = static_cast<uint16_t>(k == 0 ? (t.below[s][0] < 0 ? 8 : 0) : t.below[s][k]);
        w.below[s][k] = v | uint32_t{v} << 16;
      }
    }
    return w;
  }();
  return table.below;
}

// The E2M1 codes of 32 lanes: |x| patterns `a`, input patterns shifted right by 12 (`sign_bits`:
// the sign in bit 3), against per-lane thresholds t[1..7] and sign masks t[0] (8 or 0).
MICROSCALE_AVX512_INLINE __m512i e2m1_codes16(__m512i a, __m512i sign_bits, const __m512i t[8]) {
  // The magnitude (0..7) bit by bit, a binary search over the monotone steps: bit 2 from step 4,
  // bit 1 from step 2 or 6, bit 0 from step 1, 3, 5 or 7.
  const __mmask32 b2 = _mm512_cmpgt_epi16_mask(a, t[4]);
  const __mmask32 b1 = _mm512_cmpgt_epi16_mask(a, _mm512_mask_blend_epi16(b2, t[2], t[6]));
  const __m512i odd = _mm512_mask_blend_epi16(b1, _mm512_mask_blend_epi16(b2, t[1], t[5]),
                                              _mm512_mask_blend_epi16(b2, t[3], t[7]));
  const __mmask32 b0 = _mm512_cmpgt_epi16_mask(a, odd);
  __m512i m = _mm512_maskz_mov_epi16(b2, _mm512_set1_epi16(4));
  m = _mm512_mask_add_epi16(m, b1, m, _mm512_set1_epi16(2));
  m = _mm512_mask_add_epi16(m, b0, m, _mm512_set1_epi16(1));
  return _mm512_ternarylogic_epi32(m, sign_bits, t[0], 0xF8);  // m | (sign_bits & t[0])
}

// The two-step form's terms (Mx16Fp4TwoStep::terms) of 32 lanes of scale bytes, one per 16-bit
// lane (a byte repeated in both halves of a 32-bit word gives its terms repeated likewise): each
// the byte clamped to the form's range, shifted to the input's exponent field, less an offset
// (mod 2^16, as the scalar form's casts).
struct Fp4TwoStepLanes {
  __m512i lower, step1, step2;
};

// A 16-bit lane holding `v` mod 2^16.
MICROSCALE_AVX512_INLINE __m512i set1_u16(int v) {
  return _mm512_set1_epi16(static_cast<int16_t>(static_cast<uint16_t>(v)));
}

template <DType kIn>
MICROSCALE_AVX512_INLINE Fp4TwoStepLanes fp4_two_step_terms(__m512i bytes16) {
  using T = Mx16Fp4TwoStep<kIn>;
  const __m512i clamped =
      _mm512_min_epu16(_mm512_max_epu16(bytes16, set1_u16(T::kMinScale)), set1_u16(T::kMaxScale));
  const __m512i base = _mm512_slli_epi16(clamped, T::kMantissaBits);
  return {_mm512_sub_epi16(base, set1_u16(T::kLowerOffset)),
          _mm512_sub_epi16(base, set1_u16(T::kStep1Offset)),
          _mm512_sub_epi16(base, set1_u16(T::kStep2Offset))};
}

// mx16_fp4_code on 32 lanes: |x| patterns `a`, |x| plus the rounding bit of the kept mantissa bit
// `a_plus_lsb`, input patterns shifted right by 12 (`sign_bits`: the sign in bit 3), and each
// lane's block terms.
template <DType kIn>
MICROSCALE_AVX512_INLINE __m512i two_step_codes16(__m512i a, __m512i a_plus_lsb, __m512i sign_bits,
                                                  const Fp4TwoStepLanes& t) {
  using F = Mx16Format<E2M1Codec, kIn>;
  const __m512i normal = _mm512_min_epu16(_mm512_srli_epi16(_mm512_subs_epu16(a_plus_lsb, t.lower), F::kDrop),
                                          _mm512_set1_epi16(static_cast<int16_t>(E2M1Codec::kMaxCode)));
  // The steps passed (|x| above step1, then step2) raise the code to at least 1, then 2.
  __m512i m =
      _mm512_mask_max_epu16(normal, _mm512_cmpgt_epi16_mask(a, t.step1), normal, _mm512_set1_epi16(1));
  m = _mm512_mask_max_epu16(m, _mm512_cmpgt_epi16_mask(a, t.step2), m, _mm512_set1_epi16(2));
  return _mm512_ternarylogic_epi32(m, sign_bits, _mm512_set1_epi16(8), 0xF8);  // m | (sign_bits & 8)
}

// The output row of one direction: the 16-bit codes c[0..kRegs-1] (lane j of c[t] = column
// 32t + j) two per byte, column 2q in the low nibble of byte q.
template <int kRegs>
MICROSCALE_AVX512_INLINE void store_fp4_codes16(const __m512i* c, uint8_t* dst, bool stream) {
  __m512i p[4];
  for (int t = 0; t < kRegs; ++t)  // 32-bit lane q: (codes 2q | 2q + 1 << 4) & 0xFF
    p[t] = _mm512_ternarylogic_epi32(c[t], _mm512_srli_epi32(c[t], 12), _mm512_set1_epi32(0xFF), 0xA8);
  if constexpr (kRegs == 4) {
    store_line(dst, pack_bytes<4>(p), stream);
  } else if constexpr (kRegs == 2) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_castsi512_si256(pack_bytes<2>(p)));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(p[0]));
  }
}

// Step 2's terms of an MXFP4 chunk for step 3, in the form chosen for the chunk. Thresholds:
// each row block's scale byte (its thresholds broadcast per row), each column lane's thresholds
// (col_below[k][j], from the 16-bit table by 8 x 8 transposes) and sign mask. Two-step form: each
// row block's terms as 32-bit words holding the 16-bit term twice (broadcast per row), each
// column lane's terms.
struct Fp4ChunkTerms {
  alignas(64) uint32_t row_bytes[4][kBlock];
  alignas(64) int16_t col_below[8][kFp4ChunkCols];
  __m512i col_sign[4];
  alignas(64) uint32_t row_lower[4][kBlock], row_step1[4][kBlock], row_step2[4][kBlock];
  Fp4TwoStepLanes col[4];
};

// Step 3 of quantize_chunk16_fp4 for the directions kRows, kCols: each row's codes, in the
// two-step form (kTwoStep) or by thresholds, from the chunk's terms.
// NOTE: the directions and the form are template arguments and the loops over registers and
// thresholds fully unrolled, so that the codes stay in registers (as runtime tests, GCC kept them
// on the stack).
template <DType kIn, int kRegs, bool kRows, bool kCols, bool kTwoStep>
MICROSCALE_AVX512_INLINE void encode_chunk16_fp4(const Band& b, int64_t col,
                                                 const uint16_t (*buffer)[kFp4ChunkCols],
                                                 const Fp4ChunkTerms& terms) {
  using F = Mx16Format<E2M1Codec, kIn>;
  const int64_t data_col = col / 2;
  for (int i = 0; i < kBlock; ++i) {
    __m512i row_codes[kRegs], col_codes[kRegs];
#pragma GCC unroll 4
    for (int t = 0; t < kRegs; ++t) {
      const __m512i x = _mm512_load_si512(buffer[i] + t * k16Lanes);
      const __m512i a = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
      const __m512i sign_bits = _mm512_srli_epi16(x, 12);
      if constexpr (kTwoStep) {
        const __m512i a_plus_lsb =
            _mm512_add_epi16(a, _mm512_and_si512(_mm512_srli_epi16(a, F::kDrop), _mm512_set1_epi16(1)));
        if constexpr (kRows) {
          const Fp4TwoStepLanes row = {_mm512_set1_epi32(static_cast<int>(terms.row_lower[t][i])),
                                       _mm512_set1_epi32(static_cast<int>(terms.row_step1[t][i])),
                                       _mm512_set1_epi32(static_cast<int>(terms.row_step2[t][i]))};
          row_codes[t] = two_step_codes16<kIn>(a, a_plus_lsb, sign_bits, row);
        }
        if constexpr (kCols) col_codes[t] = two_step_codes16<kIn>(a, a_plus_lsb, sign_bits, terms.col[t]);
      } else {
        if constexpr (kRows) {
          const uint32_t* w = b.fp4_wide_thresholds[terms.row_bytes[t][i]];
          __m512i th[8];
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) th[k] = _mm512_set1_epi32(static_cast<int>(w[k]));
          row_codes[t] = e2m1_codes16(a, sign_bits, th);
        }
        if constexpr (kCols) {
          __m512i th[8];
          th[0] = terms.col_sign[t];
#pragma GCC unroll 8
          for (int k = 1; k < 8; ++k) th[k] = _mm512_load_si512(terms.col_below[k] + t * k16Lanes);
          col_codes[t] = e2m1_codes16(a, sign_bits, th);
        }
      }
    }
    if constexpr (kRows)
      store_fp4_codes16<kRegs>(row_codes, b.row_data + i * b.data_stride + data_col, b.stream);
    if constexpr (kCols)
      store_fp4_codes16<kRegs>(col_codes, b.col_data + i * b.data_stride + data_col, b.stream);
  }
}

// Step 3 in the requested directions.
template <DType kIn, int kRegs, bool kTwoStep>
MICROSCALE_AVX512_INLINE void encode_chunk16_fp4_directions(const Band& b, int64_t col,
                                                            const uint16_t (*buffer)[kFp4ChunkCols],
                                                            const Fp4ChunkTerms& terms) {
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;
  if (rowwise && columnwise) {
    encode_chunk16_fp4<kIn, kRegs, true, true, kTwoStep>(b, col, buffer, terms);
  } else if (rowwise) {
    encode_chunk16_fp4<kIn, kRegs, true, false, kTwoStep>(b, col, buffer, terms);
  } else {
    encode_chunk16_fp4<kIn, kRegs, false, true, kTwoStep>(b, col, buffer, terms);
  }
}

// One MXFP4 chunk of a full band of kIn (bf16 or f16) inputs: columns [col, col + 32 * kRegs).
// `buffer` is scratch: the chunk's rows, contiguous.
template <MxScaleRule kRule, int kRegs, DType kIn>
MICROSCALE_AVX512_INLINE void quantize_chunk16_fp4(const Band& b, int64_t col,
                                                   uint16_t (*buffer)[kFp4ChunkCols]) {
  const bool rowwise = b.row_data != nullptr, columnwise = b.col_data != nullptr;

  // 1. Load into the buffer; |x| maxes per column and per row block.
  __m512i col_max[kRegs];
  alignas(64) uint32_t row_max[kRegs][kBlock];  // the 16-bit max shifted up
  load_chunk16<kRegs>(b, col, buffer, col_max, row_max);

  // 2. Scale bytes, then the terms of the form the chunk takes.
  Fp4ChunkTerms terms;
  alignas(64) uint8_t bytes[kFp4ChunkCols];  // byte j = column j's scale
  if (columnwise) {
    __m512i s[2 * kRegs];
    column_scale_bytes<kRule, kRegs, kIn>(b, col_max, s);
    if constexpr (kRegs == 1) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), _mm512_castsi512_si256(pack_bytes<2>(s)));
    } else {
      for (int q = 0; q < kRegs / 2; ++q) _mm512_store_si512(bytes + 64 * q, pack_bytes<4>(s + 4 * q));
    }
    std::memcpy(b.col_scale + col, bytes, kRegs * k16Lanes);
  }
  if (rowwise) {
    for (int t = 0; t < kRegs; ++t) {
      for (int h = 0; h < kBlock / 16; ++h) {
        __m512i amax = _mm512_load_si512(row_max[t] + 16 * h);
        if constexpr (kIn == DType::F16) amax = _mm512_castps_si512(widen_half_lanes<kIn, true>(amax));
        _mm512_store_si512(terms.row_bytes[t] + 16 * h,
                           mx_scale_bytes<kRule>(amax, b.emax, b.mantissa_bits, b.max_normal));
      }
    }
    uint8_t* dst = b.row_scale + col / kBlock;
    for (int i = 0; i < kBlock; ++i) {
      for (int t = 0; t < kRegs; ++t)
        dst[i * b.row_scale_stride + t] = static_cast<uint8_t>(terms.row_bytes[t][i]);
    }
  }

  __m512i col_bytes16[kRegs];  // columnwise: the scale bytes in 16-bit lanes
  for (int t = 0; t < kRegs && columnwise; ++t)
    col_bytes16[t] =
        _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + t * k16Lanes)));
  if (every_block_from<kIn, kRegs>(Mx16Fp4TwoStep<kIn>::kMinScale, rowwise, columnwise, col_bytes16, col_max,
                                   terms.row_bytes, row_max)) {
    for (int t = 0; t < kRegs && columnwise; ++t) terms.col[t] = fp4_two_step_terms<kIn>(col_bytes16[t]);
    if (rowwise) {
      for (int t = 0; t < kRegs; ++t) {
        for (int h = 0; h < kBlock / 16; ++h) {
          const __m512i s = _mm512_load_si512(terms.row_bytes[t] + 16 * h);
          const Fp4TwoStepLanes r = fp4_two_step_terms<kIn>(_mm512_or_si512(s, _mm512_slli_epi32(s, 16)));
          _mm512_store_si512(terms.row_lower[t] + 16 * h, r.lower);
          _mm512_store_si512(terms.row_step1[t] + 16 * h, r.step1);
          _mm512_store_si512(terms.row_step2[t] + 16 * h, r.step2);
        }
      }
    }
    return encode_chunk16_fp4_directions<kIn, kRegs, true>(b, col, buffer, terms);
  }
  if (columnwise) {
    for (int j = 0; j < kRegs * k16Lanes; j += 8)
      transpose_thresholds<kFp4ChunkCols>(b.fp4_thresholds, bytes + j, terms.col_below, j);
    for (int t = 0; t < kRegs; ++t) {  // the zero step's -1 (a sign) or 0x7FFF (none) -> 8 or 0
      terms.col_sign[t] =
          _mm512_maskz_mov_epi16(_mm512_cmplt_epi16_mask(_mm512_load_si512(terms.col_below[0] + t * k16Lanes),
                                                         _mm512_setzero_si512()),
                                 _mm512_set1_epi16(8));
    }
  }
  encode_chunk16_fp4_directions<kIn, kRegs, false>(b, col, buffer, terms);
}

template <typename Codec, bool kPacked, MxScaleRule kRule, DType kDType>
MICROSCALE_AVX512 void quantize_band(const Band& b) {
  constexpr int kTiles = kChunkTiles<kPacked>;
  alignas(64) float buffer[kBlock][kMaxChunkCols];  // the chunk as fp32 [32, 16 * kTiles]
  int64_t col = 0;
  if constexpr ((kDType == DType::BF16 || kDType == DType::F16) && kPacked) {
    if (b.rows == kBlock) {
      alignas(64) uint16_t buffer16[kBlock][kFp4ChunkCols];  // the chunk's inputs [32, 128]
      for (; col + kFp4ChunkCols <= b.k; col += kFp4ChunkCols)
        quantize_chunk16_fp4<kRule, 4, kDType>(b, col, buffer16);
      if (col + 2 * k16Lanes <= b.k) {
        quantize_chunk16_fp4<kRule, 2, kDType>(b, col, buffer16);
        col += 2 * k16Lanes;
      }
      if (col < b.k) quantize_chunk16_fp4<kRule, 1, kDType>(b, col, buffer16);
      if (b.stream) _mm_sfence();
      return;
    }
  }
  if constexpr ((kDType == DType::BF16 || kDType == DType::F16) && !kPacked) {
    if (b.rows == kBlock) {
      alignas(64) uint16_t buffer16[kBlock][k16ChunkCols];  // the chunk's inputs [32, 64]
      for (; col + k16ChunkCols <= b.k; col += k16ChunkCols) {
        if (!quantize_chunk16<Codec, kRule, 2, kDType>(b, col, buffer16))
          quantize_chunk<Codec, kPacked, kRule, kDType, kTiles>(b, col, buffer);
      }
      if (col < b.k && !quantize_chunk16<Codec, kRule, 1, kDType>(b, col, buffer16))
        quantize_chunk<Codec, kPacked, kRule, kDType, 2>(b, col, buffer);
      if (b.stream) _mm_sfence();
      return;
    }
  }
  for (; col + kTiles * kLanes <= b.k; col += kTiles * kLanes)
    quantize_chunk<Codec, kPacked, kRule, kDType, kTiles>(b, col, buffer);
  // The rest (K is a multiple of 32): FP4 one chunk of 64 columns, then one of 32.
  if constexpr (kPacked) {
    if (col + 4 * kLanes <= b.k) {
      quantize_chunk<Codec, kPacked, kRule, kDType, 4>(b, col, buffer);
      col += 4 * kLanes;
    }
  }
  if (col < b.k) quantize_chunk<Codec, kPacked, kRule, kDType, 2>(b, col, buffer);
  if (b.stream) _mm_sfence();  // streamed stores are weakly ordered: publish them before returning
}

template <typename Codec, bool kPacked, MxScaleRule kRule, DType kDType>
void quantize_with(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const FormatInfo& f = format_info(element_format(o.scheme));
  const int64_t m = x.rows, k = x.cols;
  const int64_t bands = (m + kBlock - 1) / kBlock;  // columnwise: M % 32 == 0 is checked
  const int64_t row_bytes = x.row_stride * element_bytes<kDType>();

  Band base;
  base.row_bytes = row_bytes;
  base.k = k;
  base.emax = f.emax;
  base.mantissa_bits = f.mantissa_bits;
  base.max_normal = f.max_normal;
  base.data_stride = kPacked ? k / 2 : k;
  base.row_scale_stride = k / kBlock;
  if constexpr (kPacked && (kDType == DType::BF16 || kDType == DType::F16)) {
    base.fp4_thresholds = mx_e2m1_thresholds(kDType).below;
    base.fp4_wide_thresholds = wide_fp4_thresholds<kDType>();
  }
  // Large outputs are written with streaming stores: they cannot stay in the caches anyway, and a
  // streamed whole line skips the read for ownership that a plain store costs (measured: 15.5 ->
  // 13.5 ms at 4096 x 4096 bf16, MXFP8 both directions). Needs every full chunk's lines aligned;
  // small outputs stay cached for whoever reads them next.
  const int64_t data_bytes = (int64_t{o.rowwise} + int64_t{o.columnwise}) * m * base.data_stride;
  base.stream = k % (kChunkTiles<kPacked> * kLanes) == 0 && data_bytes >= kStreamBytes &&
                (!o.rowwise || line_aligned(out.rowwise_data)) &&
                (!o.columnwise || line_aligned(out.columnwise_data));
#pragma omp parallel num_threads(thread_count(o.num_threads))
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
#pragma omp for schedule(static)
    for (int64_t i = 0; i < bands; ++i) {
      Band b = base;
      b.src = static_cast<const std::byte*>(x.data) + i * kBlock * row_bytes;
      b.rows = static_cast<int>(std::min<int64_t>(kBlock, m - i * kBlock));
      if (o.rowwise) {
        b.row_data = out.rowwise_data.data_as<uint8_t>() + i * kBlock * b.data_stride;         // (M, K[/2])
        b.row_scale = out.rowwise_scale.data_as<uint8_t>() + i * kBlock * b.row_scale_stride;  // (M, K/32)
      }
      if (o.columnwise) {
        b.col_data = out.columnwise_data.data_as<uint8_t>() + i * kBlock * b.data_stride;  // (M, K[/2])
        b.col_scale = out.columnwise_scale.data_as<uint8_t>() + i * k;                     // (M/32, K)
      }
      quantize_band<Codec, kPacked, kRule, kDType>(b);
    }
  }
}

template <typename Codec, bool kPacked, DType kDType>
void quantize_with_rule(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  switch (mx_scale_rule(o.scale_mode)) {
    case MxScaleRule::Floor: return quantize_with<Codec, kPacked, MxScaleRule::Floor, kDType>(x, o, out);
    case MxScaleRule::Ceil: return quantize_with<Codec, kPacked, MxScaleRule::Ceil, kDType>(x, o, out);
    case MxScaleRule::Even: return quantize_with<Codec, kPacked, MxScaleRule::Even, kDType>(x, o, out);
    case MxScaleRule::RCeil: return quantize_with<Codec, kPacked, MxScaleRule::RCeil, kDType>(x, o, out);
  }
}

// False for NVFP4 (not an MX scheme), having written nothing.
template <DType kDType>
bool quantize_with_scheme(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  switch (o.scheme) {
    case Scheme::MXFP8_E4M3: quantize_with_rule<E4M3Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP8_E5M2: quantize_with_rule<E5M2Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP6_E2M3: quantize_with_rule<E2M3Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP6_E3M2: quantize_with_rule<E3M2Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP4: quantize_with_rule<E2M1Codec, true, kDType>(x, o, out); return true;
    case Scheme::NVFP4: break;
  }
  return false;
}

}  // namespace

bool quantize_mx_avx512(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  // Chunks are whole blocks of 32 columns: a columnwise-only call may have any last dim, and then
  // the portable kernel runs.
  if (kernel_set() != KernelSet::Avx512 || !x.contiguous_rows() || x.cols % kBlock != 0) return false;
  switch (x.dtype) {
    case DType::BF16: return quantize_with_scheme<DType::BF16>(x, o, out);
    case DType::F16: return quantize_with_scheme<DType::F16>(x, o, out);
    case DType::F32: return quantize_with_scheme<DType::F32>(x, o, out);
    default: return false;
  }
}

#else

bool quantize_mx_avx512(const InputMatrix&, const QuantizeOptions&, QuantizedTensor&) { return false; }

#endif

}  // namespace microscale::cpu
