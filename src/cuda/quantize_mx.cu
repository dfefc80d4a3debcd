// MX quantization (blocks of 32, E8M0 scales, every element format and scale mode), rowwise and
// columnwise (non-transposed, blocks along M) from ONE read of the input.
//
// A CTA of 128 threads owns a 32 x 128 tile of X in shared memory (bf16/f16 kept as loaded and
// widened in registers, fp32 as is; 16-byte loads):
//   column phase: thread t = column k0 + t: the block amax down the 32 rows, its E8M0 byte
//     (consecutive lanes, consecutive bytes) and 2^(127 - e) into shared memory;
//   row phase: thread = (row lane, 32-column block warp): the row block's amax and byte, then the
//     32 elements encoded twice, with the row's scale and with each column's, each direction's
//     codes put in a shared-memory stage (32 bytes, 16 for FP4); FP8 codes come from the hardware
//     conversion and FP4 codes from e2m1x8_rn (fast_codec.cuh), both exact; FP8 blocks with a NaN
//     scale keep the software encoder;
//   write-out (v6): a whole, aligned tile leaves the stage coalesced (lanes along a row, 16 bytes
//     each; a row's 4 scale bytes as one word); other tiles per thread as before.
// With 32x32 scale tiles (Tile::k32x32, TE's MXFP8 2D quantization) warp w's 32 columns are one
// scale tile: the column phase takes the warp's largest block amax as every column's, and the row
// phase gives each row block the scale of its warp's tile and encodes it once for both directions.
#include <cmath>

#include "core/element_codec.hpp"
#include "core/scale_rule.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/fast_codec.cuh"
#include "cuda/launchers.hpp"

namespace microscale::cuda {
namespace {

constexpr int kTM = 32, kTK = 128, kThreads = 128;

struct MxParams {
  DeviceMatrix x;
  OutputPointers out;
  bool rowwise, columnwise, swizzled;
  bool scale_tiles;      // 32x32 scale tiles (Tile::k32x32)
  bool aligned;          // data outputs 16-byte aligned with a row pitch that is a multiple of 16
  bool row_scale_words;  // a row's 4 scale bytes of a tile form an aligned 4-byte word
  MxScaleRule rule;
  int emax, mantissa_bits;
  float max_normal;
  int64_t tiles_k, tiles;
};

// Largest |v| of 32 values, or NaN when any is NaN (torch.amax propagates NaN).
// Four independent fmaxf chains (fmaxf skips NaN and |v| >= +0, so the order cannot matter),
// one FMNMX per element instead of a 32-deep compare/select chain.
__device__ __forceinline__ float block_amax32(const float (&v)[32]) {
  float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  bool any_nan = false;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    any_nan |= v[i] != v[i];
    m[i % 4] = fmaxf(m[i % 4], fabsf(v[i]));
  }
  const float amax = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
  return any_nan ? bits_to_float(0x7FC00000u) : amax;
}

// The largest of the warp's 32 block amaxes, NaN when any is NaN (as block_amax32), in every lane.
__device__ __forceinline__ float warp_amax(float amax) {
  const bool any_nan = __any_sync(0xFFFFFFFFu, amax != amax);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  return any_nan ? bits_to_float(0x7FC00000u) : amax;
}

template <typename Codec, bool kPacked>
__device__ __forceinline__ void pack_codes(const uint8_t (&codes)[32], uint32_t (&words)[kPacked ? 4 : 8]) {
  if constexpr (kPacked) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t x = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) x |= static_cast<uint32_t>(codes[8 * w + i]) << (4 * i);
      words[w] = x;
    }
  } else {
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      words[w] = static_cast<uint32_t>(codes[4 * w]) | (static_cast<uint32_t>(codes[4 * w + 1]) << 8) |
                 (static_cast<uint32_t>(codes[4 * w + 2]) << 16) |
                 (static_cast<uint32_t>(codes[4 * w + 3]) << 24);
    }
  }
}

template <typename Codec>
inline constexpr bool kIsFp8 = std::is_same_v<Codec, E4M3Codec> || std::is_same_v<Codec, E5M2Codec>;

// A block's element times its inverse scale: mx_scaled_element (the CPU's: a NaN element keeps
// its bits, so that its FP8 code keeps its sign). E2M1 gives every NaN the code 0x7, so for it
// the plain product serves, and the device returns the canonical NaN 0x7FFFFFFF (positive) from
// any product with a NaN operand: e2m1x8_rn<false>'s precondition, without a select per element.
template <typename Codec>
__device__ __forceinline__ float scaled_element(float v, float inverse) {
  if constexpr (std::is_same_v<Codec, E2M1Codec>) {
    return v * inverse;
  } else {
    return mx_scaled_element(v, inverse);
  }
}

// Codes of 32 scaled values, packed. `finite` promises every x is finite (no block scale of the
// values is 0xFF): FP8 then takes the hardware conversion (fast_codec.cuh), else encode_rn. E2M1
// always takes e2m1x8_rn (equal to encode_rn on x from scaled_element<E2M1Codec>: no NaN there
// has its sign bit set).
template <typename Codec, bool kPacked>
__device__ __forceinline__ void encode32(const float (&x)[32], bool finite,
                                         uint32_t (&words)[kPacked ? 4 : 8]) {
  static_assert(!kPacked || std::is_same_v<Codec, E2M1Codec>, "only E2M1 is packed");
  if constexpr (kPacked) {
#pragma unroll
    for (int w = 0; w < 4; ++w) words[w] = e2m1x8_rn<false>(x + 8 * w);  // x from scaled_element
    return;
  } else {
    if constexpr (kIsFp8<Codec>) {
      if (finite) {
#pragma unroll
        for (int w = 0; w < 8; ++w) {
          words[w] =
              fp8x4_rn<std::is_same_v<Codec, E5M2Codec>>(x[4 * w], x[4 * w + 1], x[4 * w + 2], x[4 * w + 3]);
        }
        return;
      }
    }
    uint8_t codes[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) codes[i] = Codec::encode_rn(x[i]);
    pack_codes<Codec, kPacked>(codes, words);
  }
}

// Output staging (v6): each direction's codes of the tile go to shared memory first (a row of
// kRowBytes code bytes per tile row, pitch + 16 so 8 lanes storing 16 bytes at the same column of
// 8 consecutive rows hit distinct banks), then a whole, aligned tile is written with consecutive
// lanes on consecutive 16-byte chunks of the same row (a warp stores 4 (FP8) or 8 (FP4) rows of 128 / 64
// contiguous bytes per instruction instead of 32 rows of 16), and the 4 row-direction scale bytes of
// a row as one 4-byte word. Ragged or unaligned tiles store from the stage per thread as before.
template <bool kPacked>
struct MxStage {
  static constexpr int kRowBytes = kPacked ? kTK / 2 : kTK;  // code bytes of one tile row
  static constexpr int kBlockBytes = kRowBytes / 4;          // one 32-column block
  static constexpr int kPitch = kRowBytes + 16;
  static constexpr int kBytes = 2 * kTM * kPitch;  // rowwise, then columnwise
};

template <int N>
__device__ __forceinline__ void stage_words(uint8_t* dst, const uint32_t (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N; i += 4)
    *reinterpret_cast<uint4*>(dst + 4 * i) = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
}

template <int N>
__device__ __forceinline__ void unstage_words(const uint8_t* src, uint32_t (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    const uint4 q = *reinterpret_cast<const uint4*>(src + 4 * i);
    w[i] = q.x;
    w[i + 1] = q.y;
    w[i + 2] = q.z;
    w[i + 3] = q.w;
  }
}

template <typename T, typename Codec, bool kPacked>
__device__ __forceinline__ void mx_tile(const MxParams& p, const Stored<T>* tile, float* column_inverse,
                                        uint8_t* tile_scales, uint8_t* stage, uint8_t* row_scales, int64_t m0,
                                        int64_t k0) {
  constexpr int kLd = kTilePitch<T, kTK>;
  using S = MxStage<kPacked>;
  const int64_t M = p.x.rows, K = p.x.cols;
  const int64_t data_cols = kPacked ? K / 2 : K;
  const int t = threadIdx.x;
  uint8_t* stage_row = stage;
  uint8_t* stage_col = stage + kTM * S::kPitch;

  bool columns_finite = true;
  if (p.columnwise || p.scale_tiles) {
    const int64_t col = k0 + t;
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = tile_value<T>(tile, i * kLd + t);
    float amax = block_amax32(v);
    if (p.scale_tiles) amax = warp_amax(amax);  // the warp's 32 columns are one scale tile
    const uint8_t s = mx_scale_byte(amax, p.rule, p.emax, p.mantissa_bits, p.max_normal);
    column_inverse[t] = mx_inverse_scale(s);
    if (p.scale_tiles && t % 32 == 0) tile_scales[t / 32] = s;
    if (p.columnwise && col < K && m0 < M) {
      // compact [M/32, K]; swizzled as the transpose [K, M/32]
      const int64_t o = p.swizzled ? scale_offset(col, m0 / 32, M / 32, true) : (m0 / 32) * K + col;
      p.out.columnwise_scale[o] = s;
    }
    // Every column scale below 0xFF: every element of the tile and every inverse finite.
    columns_finite = __syncthreads_or(s == 0xFF) == 0;
  }

  const int warp = t / 32, lane = t % 32;
  const int64_t row = m0 + lane;
  const int64_t c0 = k0 + warp * 32;
  const bool active = row < M && c0 < K;
  constexpr int kWords = kPacked ? 4 : 8;
  uint8_t* my_row = stage_row + lane * S::kPitch + warp * S::kBlockBytes;
  uint8_t* my_col = stage_col + lane * S::kPitch + warp * S::kBlockBytes;
  uint8_t row_scale = 0;
  if (active && p.scale_tiles) {
    // One scale for the row block and its columns: one encoding, staged for each direction asked.
    float v[32];
    tile_row<T>(tile + lane * kLd + warp * 32, v);
    const uint8_t s = tile_scales[warp];
    const float inverse = column_inverse[warp * 32];
    float x[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = scaled_element<Codec>(v[i], inverse);
    uint32_t words[kWords];
    encode32<Codec, kPacked>(x, s != 0xFF, words);
    if (p.rowwise) {
      stage_words(my_row, words);
      row_scales[lane * 4 + warp] = s;
      row_scale = s;
    }
    if (p.columnwise) stage_words(my_col, words);
  } else if (active) {
    float v[32];
    tile_row<T>(tile + lane * kLd + warp * 32, v);
    if (p.rowwise) {
      const uint8_t s = mx_scale_byte(block_amax32(v), p.rule, p.emax, p.mantissa_bits, p.max_normal);
      const float inverse = mx_inverse_scale(s);
      float x[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] = scaled_element<Codec>(v[i], inverse);
      uint32_t words[kWords];
      encode32<Codec, kPacked>(x, s != 0xFF, words);
      stage_words(my_row, words);
      row_scales[lane * 4 + warp] = s;
      row_scale = s;
    }
    if (p.columnwise) {
      float x[32];
#pragma unroll
      for (int q = 0; q < 32; q += 4) {
        const float4 inv = *reinterpret_cast<const float4*>(&column_inverse[warp * 32 + q]);
        x[q] = scaled_element<Codec>(v[q], inv.x);
        x[q + 1] = scaled_element<Codec>(v[q + 1], inv.y);
        x[q + 2] = scaled_element<Codec>(v[q + 2], inv.z);
        x[q + 3] = scaled_element<Codec>(v[q + 3], inv.w);
      }
      uint32_t words[kWords];
      encode32<Codec, kPacked>(x, columns_finite, words);
      stage_words(my_col, words);
    }
  }
  __syncthreads();

  if (p.aligned && m0 + kTM <= M && k0 + kTK <= K) {
    // Whole tile, 16-byte aligned rows: consecutive lanes write consecutive 16-byte chunks of a row.
    constexpr int kChunksPerRow = S::kRowBytes / 16;
    constexpr int kPerThread = kTM * kChunksPerRow / kThreads;
    const int64_t byte0 = kPacked ? k0 / 2 : k0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int idx = t + j * kThreads;
      const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
      const int64_t o = (m0 + r) * data_cols + byte0 + c * 16;
      if (p.rowwise) {
        *reinterpret_cast<uint4*>(p.out.rowwise_data + o) =
            *reinterpret_cast<const uint4*>(stage_row + r * S::kPitch + c * 16);
      }
      if (p.columnwise) {
        *reinterpret_cast<uint4*>(p.out.columnwise_data + o) =
            *reinterpret_cast<const uint4*>(stage_col + r * S::kPitch + c * 16);
      }
    }
    if (p.rowwise && t < kTM) {
      // The row's 4 scales (blocks k0/32 .. +3) are 4 consecutive bytes, compact or swizzled.
      const uint32_t w = *reinterpret_cast<const uint32_t*>(row_scales + t * 4);
      const int64_t o = scale_offset(m0 + t, k0 / 32, K / 32, p.swizzled);
      if (p.row_scale_words) {
        *reinterpret_cast<uint32_t*>(p.out.rowwise_scale + o) = w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) p.out.rowwise_scale[o + j] = static_cast<uint8_t>(w >> (8 * j));
      }
    }
    return;
  }
  if (!active) return;
  if (p.rowwise) {
    uint32_t words[kWords];
    unstage_words(my_row, words);
    store_bytes(p.out.rowwise_data + row * data_cols + (kPacked ? c0 / 2 : c0), words, kWords * 4);
    p.out.rowwise_scale[scale_offset(row, c0 / 32, K / 32, p.swizzled)] = row_scale;
  }
  if (p.columnwise) {
    uint32_t words[kWords];
    unstage_words(my_col, words);
    const int64_t valid_cols = K - c0 < 32 ? K - c0 : 32;
    const int valid = static_cast<int>(kPacked ? valid_cols / 2 : valid_cols);
    store_bytes(p.out.columnwise_data + row * data_cols + (kPacked ? c0 / 2 : c0), words, valid);
  }
}

// One tile per CTA (a persistent grid with the next tile's loads in flight was slower: docs/perf.md).
template <typename T, typename Codec, bool kPacked>
__global__ void __launch_bounds__(kThreads) mx_quantize_kernel(const MxParams p) {
  constexpr int kLd = kTilePitch<T, kTK>;
  __shared__ __align__(16) Stored<T> tile[kTM * kLd];
  __shared__ __align__(16) float column_inverse[kTK];
  __shared__ uint8_t tile_scales[kTK / 32];
  __shared__ __align__(16) uint8_t stage[MxStage<kPacked>::kBytes];
  __shared__ __align__(16) uint8_t row_scales[kTM * 4];
  const int64_t m0 = (blockIdx.x / p.tiles_k) * kTM, k0 = (blockIdx.x % p.tiles_k) * kTK;
  TileLoader<T, kTM, kTK, kThreads, kLd> loader;
  loader.fetch(p.x, m0, k0);
  loader.commit(p.x, m0, k0, tile);
  __syncthreads();
  mx_tile<T, Codec, kPacked>(p, tile, column_inverse, tile_scales, stage, row_scales, m0, k0);
}

template <typename T>
void launch_for_dtype(const MxParams& p, Scheme scheme, cudaStream_t stream) {
#define MX_LAUNCH(CODEC, PACKED) \
  mx_quantize_kernel<T, CODEC, PACKED><<<static_cast<unsigned>(p.tiles), kThreads, 0, stream>>>(p)
  switch (scheme) {
    case Scheme::MXFP8_E4M3: MX_LAUNCH(E4M3Codec, false); break;
    case Scheme::MXFP8_E5M2: MX_LAUNCH(E5M2Codec, false); break;
    case Scheme::MXFP6_E2M3: MX_LAUNCH(E2M3Codec, false); break;
    case Scheme::MXFP6_E3M2: MX_LAUNCH(E3M2Codec, false); break;
    case Scheme::MXFP4: MX_LAUNCH(E2M1Codec, true); break;
    case Scheme::NVFP4: break;
  }
#undef MX_LAUNCH
}

}  // namespace

void launch_mx_quantize(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o,
                        const OutputPointers& out, cudaStream_t stream) {
  const FormatInfo& f = format_info(element_format(o.scheme));
  MxParams p{};
  p.x = x;
  p.out = out;
  p.rowwise = o.rowwise;
  p.columnwise = o.columnwise;
  p.swizzled = o.scale_layout == ScaleLayout::Swizzled;
  p.scale_tiles = o.tile == Tile::k32x32;
  p.rule = mx_scale_rule(o.scale_mode);
  p.emax = f.emax;
  p.mantissa_bits = f.mantissa_bits;
  p.max_normal = f.max_normal;
  const bool packed = o.scheme == Scheme::MXFP4;
  const int64_t data_cols = packed ? x.cols / 2 : x.cols;
  const auto a16 = [](const void* q) { return q == nullptr || reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  p.aligned = data_cols % 16 == 0 && a16(out.rowwise_data) && a16(out.columnwise_data);
  p.row_scale_words =
      reinterpret_cast<uintptr_t>(out.rowwise_scale) % 4 == 0 && (p.swizzled || (x.cols / 32) % 4 == 0);
  p.tiles_k = (x.cols + kTK - 1) / kTK;
  p.tiles = p.tiles_k * ((x.rows + kTM - 1) / kTM);
  switch (dtype) {
    case DType::BF16: launch_for_dtype<Bf16>(p, o.scheme, stream); break;
    case DType::F16: launch_for_dtype<F16>(p, o.scheme, stream); break;
    default: launch_for_dtype<float>(p, o.scheme, stream); break;
  }
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
