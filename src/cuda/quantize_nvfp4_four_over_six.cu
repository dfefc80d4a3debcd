// NVFP4 4over6 on the device (FourOverSix, quantize.hpp): one thread per 16-element block of one
// direction, the same fp32 operations in the same order as the CPU backend
// (cpu/quantize_nvfp4_ref.cpp; the formulas from core/scale_math.hpp, the encoders from
// core/element_codec.hpp). The amaxes are already in out.amax (launch_nvfp4_amax; 4over6 has no
// RHT, so both are max|x| or the overrides).
//
// Threads are numbered so that the 16 lanes of a half warp hold one 16x16 tile's blocks: rowwise,
// block b of 16 consecutive rows (thread b * M + r); columnwise, row block rb of 16 consecutive
// columns (thread rb * K + c). A tile's amax and its error sums are then shuffles within the half
// warp, the sums in TE's order (down by 8, 4, 2, 1). Rowwise 1x16 blocks run along the rows
// instead (thread r * K/16 + b), so that a warp reads and writes contiguous bytes. A rowwise
// block's 16 elements are read with 16-byte loads where the input allows (DeviceMatrix::vector_ok).

#include <cfloat>
#include <cstdint>

#include "core/element_codec.hpp"
#include "core/scale_math.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/fast_codec.cuh"
#include "cuda/launchers.hpp"

namespace microscale::cuda {
namespace {

constexpr int kThreads = 256;

struct FourOverSixParams {
  DeviceMatrix x;
  uint8_t* data;
  uint8_t* scale;
  const float* amax;         // this direction's
  const float* lead_amaxes;  // row-scaled (rowwise only): each row's amax, in place of *amax
  int64_t scale_cols;
  bool tile_2d, swizzled, scaled_error, squared;
  int e4m3_max;
};

// One candidate: its 16 codes packed (even element in the low nibble), its E4M3 scale and error.
struct Candidate {
  uint32_t words[2];
  uint32_t scale;
  float error;
};

__device__ __forceinline__ Candidate candidate(const float (&v)[16], float scale_f32, float s_enc,
                                               float s_dec, float amax, const FourOverSixParams& p) {
  float scale_value;  // E4M3Codec::encode_rn's code (scale_f32 is finite and >= 0) and its value
  Candidate c{{0u, 0u}, e4m3_scale(scale_f32, scale_value), 0.0f};
  const float encode_scale = nvfp4_block_encode_scale(scale_value, s_dec);
  const auto denominator = static_cast<float>(6 * p.e4m3_max);
  // The candidate value of each E2M1 magnitude: 7 divisions per block instead of 16. A negative
  // code's is the negation, exactly (four_over_six_candidate_value is odd), so the terms are the
  // CPU's bits.
  constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float dequantized[8];
#pragma unroll
  for (int m = 0; m < 8; ++m)
    dequantized[m] =
        four_over_six_candidate_value(kMagnitudes[m], scale_value, amax, denominator, p.scaled_error);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float unused;
    const uint32_t code = e2m1_code_and_value(v[i] * encode_scale, unused);  // any zero -> 0
    c.words[i / 8] |= code << (4 * (i % 8));
    // dequantized[code & 7] as a tree of selects on its bits (an indexed register array would
    // go to local memory), then the code's sign
    const float pair0 = code & 1u ? dequantized[1] : dequantized[0],
                pair1 = code & 1u ? dequantized[3] : dequantized[2];
    const float pair2 = code & 1u ? dequantized[5] : dequantized[4],
                pair3 = code & 1u ? dequantized[7] : dequantized[6];
    const float half0 = code & 2u ? pair1 : pair0, half1 = code & 2u ? pair3 : pair2;
    const float magnitude = code & 4u ? half1 : half0;
    const float candidate = bits_to_float(float_bits(magnitude) ^ ((code & 8u) << 28));
    c.error += four_over_six_error_term(candidate, four_over_six_input_value(v[i], s_enc, p.scaled_error),
                                        p.squared);
  }
  return c;
}

// The sum of a 16x16 tile's 16 block errors, held one per lane of a half warp, as TE's warp
// reduction adds them; every lane of the half gets it.
__device__ __forceinline__ float tile_error(float e) {
#pragma unroll
  for (int s = 8; s > 0; s >>= 1) e += __shfl_down_sync(0xFFFFFFFFu, e, s, 16);
  return __shfl_sync(0xFFFFFFFFu, e, 0, 16);
}

// The 16 elements of a rowwise block starting at element `first` of row-major storage: 16-byte
// loads (bf16/f16: two, f32: four), the input's rows 16-byte aligned (vector_ok).
template <typename T>
__device__ __forceinline__ void load_contiguous16(const void* base, int64_t first, float (&v)[16]) {
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(base) + first * kElemBytes<T>);
  if constexpr (kElemBytes<T> == 2) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const uint4 w = src[q];
      widen<T>(w.x, v + q * 8);
      widen<T>(w.y, v + q * 8 + 2);
      widen<T>(w.z, v + q * 8 + 4);
      widen<T>(w.w, v + q * 8 + 6);
    }
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 w = src[q];
      v[q * 4] = bits_to_float(w.x);
      v[q * 4 + 1] = bits_to_float(w.y);
      v[q * 4 + 2] = bits_to_float(w.z);
      v[q * 4 + 3] = bits_to_float(w.w);
    }
  }
}

template <typename T, bool kColumnwise, bool kTile2d>
__global__ void __launch_bounds__(kThreads)
    four_over_six_kernel(const __grid_constant__ FourOverSixParams p) {
  const int64_t M = p.x.rows, K = p.x.cols;
  const int64_t groups = kColumnwise ? (M / 16) * K : M * (K / 16);
  const int64_t g = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  // Threads past the end stay to the end (with zeros): the shuffles need every lane of a warp.
  const bool active = g < groups;
  // lead: the output row (rowwise: X's row r; columnwise: X^T's row, X's column c); block: the
  // 16-element block of that row.
  // NOTE: in 32 bits where the count allows (every divisor is at most the count): a 64-bit
  // division is a long software routine on the GPU, and these took about a quarter of the kernel.
  const int64_t divisor = kColumnwise ? K : kTile2d ? M : K / 16;
  int64_t quotient, remainder;
  if (groups <= 0xFFFFFFFF) {
    const auto g32 = static_cast<uint32_t>(g), d32 = static_cast<uint32_t>(divisor);
    quotient = g32 / d32;
    remainder = g32 % d32;
  } else {
    quotient = g / divisor;
    remainder = g % divisor;
  }
  const int64_t lead = kColumnwise || kTile2d ? remainder : quotient;
  const int64_t block = kColumnwise || kTile2d ? quotient : remainder;
  float v[16];
  if (active && !kColumnwise && p.x.vector_ok) {
    load_contiguous16<T>(p.x.data, lead * p.x.row_stride + block * 16, v);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int64_t r = kColumnwise ? block * 16 + i : lead, c = kColumnwise ? lead : block * 16 + i;
      v[i] = active ? Elem<T>::load(p.x.data, r * p.x.row_stride + c * p.x.col_stride) : 0.0f;
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = max_abs_skip_nan(amax, v[i]);
  if constexpr (kTile2d) {
#pragma unroll
    for (int s = 1; s < 16; s <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, s));
  }
  // Row-scaled (rowwise only): the row's own amax.
  const float global_amax = p.lead_amaxes != nullptr && active ? p.lead_amaxes[lead] : *p.amax;
  const float s_enc = nvfp4_global_encode_scale(global_amax, p.e4m3_max), s_dec = 1.0f / s_enc;
  const float base = four_over_six_base_scale(amax, s_enc);
  const Candidate map4 = candidate(v, four_over_six_map4_scale(base), s_enc, s_dec, global_amax, p);
  const Candidate map6 = candidate(v, min_nonnegative(base, 448.0f), s_enc, s_dec, global_amax, p);
  float error4 = map4.error, error6 = map6.error;
  if constexpr (kTile2d) {
    error4 = tile_error(error4);
    error6 = tile_error(error6);
  }
  if (!active) return;
  // The pick by value, field by field: a reference to either candidate would put both in local
  // memory (a 32-byte stack frame).
  const bool map4_wins = error4 < error6;  // a tie keeps map to 6
  const uint32_t word0 = map4_wins ? map4.words[0] : map6.words[0];
  const uint32_t word1 = map4_wins ? map4.words[1] : map6.words[1];
  const uint32_t scale = map4_wins ? map4.scale : map6.scale;
  const int64_t row_bytes = kColumnwise ? M / 2 : K / 2;
  uint8_t* dst = p.data + lead * row_bytes + block * 8;
  if ((reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(word0, word1);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) dst[j] = static_cast<uint8_t>((j < 4 ? word0 : word1) >> (8 * (j % 4)));
  }
  p.scale[scale_offset(lead, block, p.scale_cols, p.swizzled)] = static_cast<uint8_t>(scale);
}

template <bool kColumnwise>
void launch_direction(const FourOverSixParams& p, DType dtype, cudaStream_t stream) {
  const int64_t groups = kColumnwise ? (p.x.rows / 16) * p.x.cols : p.x.rows * (p.x.cols / 16);
  if (groups == 0) return;
  const auto grid = static_cast<unsigned>((groups + kThreads - 1) / kThreads);
  const auto launch = [&](auto kernel) { kernel<<<grid, kThreads, 0, stream>>>(p); };
  switch (dtype) {
    case DType::BF16:
      p.tile_2d ? launch(four_over_six_kernel<Bf16, kColumnwise, true>)
                : launch(four_over_six_kernel<Bf16, kColumnwise, false>);
      break;
    case DType::F16:
      p.tile_2d ? launch(four_over_six_kernel<F16, kColumnwise, true>)
                : launch(four_over_six_kernel<F16, kColumnwise, false>);
      break;
    default:
      p.tile_2d ? launch(four_over_six_kernel<float, kColumnwise, true>)
                : launch(four_over_six_kernel<float, kColumnwise, false>);
      break;
  }
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_nvfp4_four_over_six(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o,
                                const OutputPointers& out, cudaStream_t stream) {
  FourOverSixParams p{};
  p.x = x;
  p.tile_2d = o.tile == Tile::k16x16;
  p.swizzled = o.scale_layout == ScaleLayout::Swizzled;
  p.scaled_error = o.four_over_six_scaled_error;
  p.squared = o.four_over_six == FourOverSix::MinMse;
  p.e4m3_max = o.nvfp4_e4m3_max;
  if (o.rowwise) {
    p.data = out.rowwise_data;
    p.scale = out.rowwise_scale;
    p.amax = out.amax;
    p.lead_amaxes = o.row_scaled ? out.amax + 2 : nullptr;  // launch_nvfp4_row_scaled_amax's rows
    p.scale_cols = x.cols / 16;
    launch_direction<false>(p, dtype, stream);
  }
  if (o.columnwise) {
    p.data = out.columnwise_data;
    p.scale = out.columnwise_scale;
    p.amax = out.amax + 1;
    p.lead_amaxes = nullptr;  // row-scaled 4over6 is rowwise only (validate_quantize)
    p.scale_cols = x.rows / 16;
    launch_direction<true>(p, dtype, stream);
  }
}

}  // namespace microscale::cuda
