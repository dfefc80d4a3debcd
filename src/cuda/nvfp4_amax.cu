// NVFP4 amax pass: max|X| and, for RHT columnwise output, max|RHT(X^T)| (the transform computed
// here and again in the quantize kernel: recomputing is cheaper than caching it in memory). A
// row-scaled tensor's amaxes per row of X and of X^T come from two plain kernels of their own.
//
// A thread owns a patch of 8 rows x 16 bytes (16 rows x 4 columns, 8-byte loads, for the RHT,
// which transforms its 4 column chunks in registers); lanes run along K. Per-thread maxima reduce through
// warp shuffles to one atomicMax per warp on the fp32 bits (all values >= 0, NaN skipped). The loads are
// plain (L2-allocating): the quantize kernel walks the tensor backwards and finds this pass's tail in L2.
#include <algorithm>
#include <cfloat>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launchers.hpp"
#include "cuda/rht.cuh"

namespace microscale::cuda {
namespace {

constexpr int kThreads = 128;

struct AmaxParams {
  DeviceMatrix x;
  float* amax;
  bool abs_to_row, abs_to_col, rht_to_col;
  uint16_t rht_mask;
  int64_t groups_k;  // 8-column groups per row chunk
  int64_t patches;
};

__global__ void amax_init_kernel(float* amax, float row, float col) {
  amax[0] = row;
  amax[1] = col;
}

// Element c of a row's raw words.
template <typename T, int N>
__device__ __forceinline__ float value_at(const uint32_t (&raw)[N], int c) {
  if constexpr (std::is_same_v<T, float>) {
    return bits_to_float(raw[c]);
  } else {
    const uint32_t w = raw[c / 2];
    const uint16_t h = static_cast<uint16_t>(c % 2 == 0 ? w : w >> 16);
    if constexpr (std::is_same_v<T, Bf16>)
      return bf16_to_float(h);
    else
      return half_to_float(h);
  }
}

template <typename T, bool kRht>
__global__ void __launch_bounds__(kThreads) nvfp4_amax_kernel(const AmaxParams p) {
  constexpr int kBytes = elem_bytes<T>();
  constexpr int kRows = kRht ? 16 : 8;           // the RHT needs whole 16-row chunks
  constexpr int kCols = kRht ? 4 : 16 / kBytes;  // 8- or 16-byte loads along a row
  constexpr int kWords = kCols * kBytes / 4;
  float abs_max = 0.0f, rht_max = 0.0f;
  [[maybe_unused]] float coefficient[16];
  if constexpr (kRht) rht_input_coefficients(p.rht_mask, coefficient);
  for (int64_t patch = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; patch < p.patches;
       patch += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r0 = (patch / p.groups_k) * kRows, c0 = (patch % p.groups_k) * kCols;
    uint32_t raw[kRows][kWords];
    if (p.x.vector_ok && r0 + kRows <= p.x.rows && c0 + kCols <= p.x.cols) {
      const char* base = static_cast<const char*>(p.x.data) + (r0 * p.x.row_stride + c0) * kBytes;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const char* row = base + i * p.x.row_stride * kBytes;
        if constexpr (kWords == 4) {
          const uint4 q = __ldg(reinterpret_cast<const uint4*>(row));
          raw[i][0] = q.x, raw[i][1] = q.y, raw[i][2] = q.z, raw[i][3] = q.w;
        } else {
          const uint2 q = __ldg(reinterpret_cast<const uint2*>(row));
          raw[i][0] = q.x, raw[i][1] = q.y;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int64_t r = r0 + i, col = c0 + c;
          const float f = (r < p.x.rows && col < p.x.cols)
                              ? Elem<T>::load(p.x.data, r * p.x.row_stride + col * p.x.col_stride)
                              : 0.0f;
          if constexpr (kBytes == 2) {
            // back to the 16-bit pattern (exact: the value came from one)
            const uint32_t bits16 = std::is_same_v<T, Bf16> ? (float_bits(f) >> 16) : float_to_half(f);
            if (c % 2 == 0)
              raw[i][c / 2] = bits16;
            else
              raw[i][c / 2] |= bits16 << 16;
          } else {
            raw[i][c] = float_bits(f);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) abs_max = max_abs_skip_nan(abs_max, value_at<T>(raw[i], c));
    }
    if constexpr (kRht) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float chunk[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) chunk[i] = value_at<T>(raw[i], c);
        rht_max = fmaxf(rht_max, rht16_max_abs(chunk, coefficient, p.rht_mask));
      }
    }
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) {
    abs_max = fmaxf(abs_max, __shfl_xor_sync(0xFFFFFFFFu, abs_max, s));
    rht_max = fmaxf(rht_max, __shfl_xor_sync(0xFFFFFFFFu, rht_max, s));
  }
  if (threadIdx.x % 32 == 0) {
    // Non-negative fp32 values order as their bit patterns.
    auto* bits = reinterpret_cast<unsigned int*>(p.amax);
    if (p.abs_to_row) atomicMax(bits, __float_as_uint(abs_max));
    if (p.abs_to_col) atomicMax(bits + 1, __float_as_uint(abs_max));
    if (p.rht_to_col) atomicMax(bits + 1, __float_as_uint(rht_max));
  }
}

// Row-scaled NVFP4: one warp per row of X, its amax to amax[2 + row] and the largest to amax[0]
// (zeroed before).
template <typename T>
__global__ void __launch_bounds__(kThreads) row_amaxes_kernel(const DeviceMatrix x, float* amax) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kThreads / 32) + threadIdx.x / 32;
  if (row >= x.rows) return;
  float m = 0.0f;
  for (int64_t c = threadIdx.x % 32; c < x.cols; c += 32)
    m = max_abs_skip_nan(m, Elem<T>::load(x.data, row * x.row_stride + c * x.col_stride));
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
  if (threadIdx.x % 32 == 0) {
    amax[2 + row] = m;
    // Non-negative fp32 values order as their bit patterns.
    atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
  }
}

// Row-scaled NVFP4: column c of X's amax (row c of X^T) to amax[2 + M + c] and the largest to
// amax[1] (zeroed before): a thread per column of a chunk of `chunk_rows` rows (consecutive threads
// read consecutive columns).
constexpr int64_t kColumnRows = 256;  // the chunk, unless the grid's 65535 chunks need longer ones

template <typename T>
__global__ void __launch_bounds__(kThreads)
    column_amaxes_kernel(const DeviceMatrix x, float* amax, int64_t chunk_rows) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (col >= x.cols) return;
  const int64_t r0 = blockIdx.y * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < x.rows ? r0 + chunk_rows : x.rows;
  float m = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    m = max_abs_skip_nan(m, Elem<T>::load(x.data, r * x.row_stride + col * x.col_stride));
  atomicMax(reinterpret_cast<unsigned int*>(amax + 2 + x.rows + col), __float_as_uint(m));
  atomicMax(reinterpret_cast<unsigned int*>(amax + 1), __float_as_uint(m));
}

template <typename T>
void launch_row_scaled(const DeviceMatrix& x, const QuantizeOptions& o, float* amax, cudaStream_t stream) {
  if (o.rowwise && x.rows > 0) {
    const auto grid = static_cast<unsigned>((x.rows + kThreads / 32 - 1) / (kThreads / 32));
    row_amaxes_kernel<T><<<grid, kThreads, 0, stream>>>(x, amax);
    MICROSCALE_CUDA_CHECK(cudaGetLastError());
  }
  if (o.columnwise && x.rows > 0 && x.cols > 0) {
    const int64_t most_chunks = 65535;  // gridDim.y's limit
    const int64_t chunk_rows = std::max(kColumnRows, (x.rows + most_chunks - 1) / most_chunks);
    const dim3 grid(static_cast<unsigned>((x.cols + kThreads - 1) / kThreads),
                    static_cast<unsigned>((x.rows + chunk_rows - 1) / chunk_rows));
    column_amaxes_kernel<T><<<grid, kThreads, 0, stream>>>(x, amax, chunk_rows);
    MICROSCALE_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void launch_nvfp4_row_scaled_amax(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o, float* amax,
                                  cudaStream_t stream) {
  const size_t floats = static_cast<size_t>(2 + x.rows + x.cols);
  MICROSCALE_CUDA_CHECK(cudaMemsetAsync(amax, 0, floats * sizeof(float), stream));
  switch (dtype) {
    case DType::BF16: launch_row_scaled<Bf16>(x, o, amax, stream); break;
    case DType::F16: launch_row_scaled<F16>(x, o, amax, stream); break;
    default: launch_row_scaled<float>(x, o, amax, stream); break;
  }
}

void launch_nvfp4_amax(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o, float* amax,
                       cudaStream_t stream) {
  const bool rht = o.columnwise && o.rht;
  AmaxParams p{};
  p.x = x;
  p.amax = amax;
  p.abs_to_row = o.rowwise && !o.amax_rowwise;
  p.abs_to_col = o.columnwise && !rht && !o.amax_columnwise;
  p.rht_to_col = o.columnwise && rht && !o.amax_columnwise;
  p.rht_mask = o.rht_sign_mask;
  amax_init_kernel<<<1, 1, 0, stream>>>(amax, o.amax_rowwise.value_or(0.0f),
                                        o.amax_columnwise.value_or(0.0f));
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
  if (!p.abs_to_row && !p.abs_to_col && !p.rht_to_col) return;
  const bool with_rht = p.rht_to_col;
  const int rows = with_rht ? 16 : 8;
  const int cols = with_rht ? 4 : (dtype == DType::F32 ? 4 : 8);
  p.groups_k = (x.cols + cols - 1) / cols;
  p.patches = p.groups_k * ((x.rows + rows - 1) / rows);
  int device = 0, sms = 0;
  MICROSCALE_CUDA_CHECK(cudaGetDevice(&device));
  MICROSCALE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t wanted = (p.patches + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sms) * 16;
  const unsigned grid = static_cast<unsigned>(wanted < cap ? wanted : cap);
  switch (dtype) {
    case DType::BF16:
      if (with_rht)
        nvfp4_amax_kernel<Bf16, true><<<grid, kThreads, 0, stream>>>(p);
      else
        nvfp4_amax_kernel<Bf16, false><<<grid, kThreads, 0, stream>>>(p);
      break;
    case DType::F16: nvfp4_amax_kernel<F16, false><<<grid, kThreads, 0, stream>>>(p); break;
    default: nvfp4_amax_kernel<float, false><<<grid, kThreads, 0, stream>>>(p); break;
  }
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
