// Device-side building blocks shared by the CUDA quantize kernels: the input as a strided matrix,
// element loads of every input dtype, the shared-memory tile loader (16-byte loads when the tile
// is whole and aligned), scale offsets (compact or swizzled) and byte-run stores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/scale_math.hpp"
#include "microscale/half.hpp"
#include "microscale/tensor.hpp"

namespace microscale::cuda {

/// The quantizer input [rows, cols] as the kernels read it (InputMatrix on the device).
struct DeviceMatrix {
  const void* data;
  int64_t rows, cols;
  int64_t row_stride, col_stride;  // elements
  bool vector_ok;                  // contiguous rows, 16-byte aligned base and row pitch
};

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
};
struct Bf16 {};
struct F16 {};
template <>
struct Elem<Bf16> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
};
template <>
struct Elem<F16> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return half_to_float(static_cast<const uint16_t*>(p)[i]);
  }
};
template <typename T>
inline constexpr int kElemBytes = std::is_same_v<T, float> ? 4 : 2;
template <typename T>
__host__ __device__ constexpr int elem_bytes() {
  return kElemBytes<T>;
}

// Widens one 32-bit word of a 16-byte vector of bf16 or f16 to its two fp32 values.
template <typename T>
__device__ __forceinline__ void widen(uint32_t w, float* out) {
  if constexpr (std::is_same_v<T, Bf16>) {
    out[0] = float_of(w << 16);
    out[1] = float_of(w & 0xFFFF0000u);
  } else {
    out[0] = half_to_float(static_cast<uint16_t>(w));
    out[1] = half_to_float(static_cast<uint16_t>(w >> 16));
  }
}

/// Loads [TM, TK] tiles at (m0, k0) into shared memory as fp32 (row pitch LD floats; entries
/// outside the matrix read as 0), in two steps (a persistent CTA can keep the next tile's loads in
/// flight while it works on the current one; measured slower here, docs/perf.md): fetch() issues the 16-byte loads of a whole, aligned
/// tile into registers; commit() widens them into shared memory (a ragged or unaligned tile is
/// read element by element in commit()).
template <typename T, int TM, int TK, int THREADS, int LD>
struct TileLoader {
  static constexpr int kBytes = elem_bytes<T>();
  static constexpr int kPerVec = 16 / kBytes;
  static constexpr int kVecPerRow = TK / kPerVec;
  static constexpr int kVecs = TM * kVecPerRow;
  static_assert(kVecs % THREADS == 0, "tile must split evenly into 16-byte vectors");
  static constexpr int kPerThread = kVecs / THREADS;
  uint4 v[kPerThread];
  bool vec = false;

  __device__ __forceinline__ void fetch(const DeviceMatrix& x, int64_t m0, int64_t k0) {
    vec = x.vector_ok && m0 + TM <= x.rows && k0 + TK <= x.cols;
    if (!vec) return;
    const char* base = static_cast<const char*>(x.data);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int id = threadIdx.x + j * THREADS;
      const int r = id / kVecPerRow, cv = id % kVecPerRow;
      const char* p = base + ((m0 + r) * x.row_stride + k0 + cv * kPerVec) * kBytes;
      v[j] = __ldcs(reinterpret_cast<const uint4*>(p));
    }
  }

  __device__ __forceinline__ void commit(const DeviceMatrix& x, int64_t m0, int64_t k0, float* tile) const {
    if (vec) {
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int id = threadIdx.x + j * THREADS;
        const int r = id / kVecPerRow, cv = id % kVecPerRow;
        float f[kPerVec];
        if constexpr (kBytes == 4) {
          f[0] = float_of(v[j].x);
          f[1] = float_of(v[j].y);
          f[2] = float_of(v[j].z);
          f[3] = float_of(v[j].w);
        } else {
          widen<T>(v[j].x, f + 0);
          widen<T>(v[j].y, f + 2);
          widen<T>(v[j].z, f + 4);
          widen<T>(v[j].w, f + 6);
        }
        float* dst = tile + r * LD + cv * kPerVec;
#pragma unroll
        for (int q = 0; q < kPerVec; q += 4) *reinterpret_cast<float4*>(dst + q) = make_float4(f[q], f[q + 1], f[q + 2], f[q + 3]);
      }
    } else {
      for (int id = threadIdx.x; id < TM * TK; id += THREADS) {
        const int r = id / TK, c = id % TK;
        const int64_t gr = m0 + r, gc = k0 + c;
        tile[r * LD + c] = (gr < x.rows && gc < x.cols) ? Elem<T>::load(x.data, gr * x.row_stride + gc * x.col_stride) : 0.0f;
      }
    }
  }
};

/// Byte offset of scale (r, c) of a [rows, cols] scale matrix, compact or swizzled (layout.hpp).
__device__ __forceinline__ int64_t scale_offset(int64_t r, int64_t c, int64_t cols, bool swizzled) {
  if (!swizzled) return r * cols + c;
  const int64_t tiles_per_row = (cols + 3) / 4;
  return ((r / 128) * tiles_per_row + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

/// Stores `valid` (<= N*4) bytes of `words` at dst: 16-, 8- or 4-byte stores when whole and aligned.
template <int N>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint32_t (&words)[N], int valid) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  if (valid == N * 4) {
    if constexpr (N % 4 == 0) {
      if ((a & 15) == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
          *reinterpret_cast<uint4*>(dst + 4 * i) = make_uint4(words[i], words[i + 1], words[i + 2], words[i + 3]);
        }
        return;
      }
    }
    if constexpr (N % 2 == 0) {
      if ((a & 7) == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2) *reinterpret_cast<uint2*>(dst + 4 * i) = make_uint2(words[i], words[i + 1]);
        return;
      }
    }
    if ((a & 3) == 0) {
#pragma unroll
      for (int i = 0; i < N; ++i) *reinterpret_cast<uint32_t*>(dst + 4 * i) = words[i];
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < N * 4; ++i) {
    if (i < valid) dst[i] = static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)));
  }
}

/// Largest |v| skipping NaN (a NaN never wins), as TE's amax kernels and the CPU backend.
__device__ __forceinline__ float max_abs_skip_nan(float m, float v) {
  const float a = fabsf(v);
  return a > m ? a : m;
}

}  // namespace microscale::cuda
