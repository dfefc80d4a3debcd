// Device-side building blocks shared by the CUDA quantize kernels: the input as a strided matrix,
// element loads of every input dtype, the shared-memory tile loader (16-byte loads when the tile
// is whole and aligned), scale offsets (compact or swizzled) and byte-run stores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/input_matrix.hpp"
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

/// A checked InputMatrix (core/input_matrix.hpp) as the kernels read it.
inline DeviceMatrix device_matrix(const InputMatrix& x) {
  DeviceMatrix d{};
  d.data = x.data;
  d.rows = x.rows;
  d.cols = x.cols;
  d.row_stride = x.row_stride;
  d.col_stride = x.col_stride;
  const int64_t bytes = static_cast<int64_t>(dtype_size(x.dtype));
  d.vector_ok = x.col_stride == 1 && (reinterpret_cast<uintptr_t>(x.data) % 16) == 0 &&
                (x.row_stride * bytes) % 16 == 0;
  return d;
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return static_cast<const float*>(p)[i];
  }
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
    out[0] = bits_to_float(w << 16);
    out[1] = bits_to_float(w & 0xFFFF0000u);
  } else {
    out[0] = half_to_float(static_cast<uint16_t>(w));
    out[1] = half_to_float(static_cast<uint16_t>(w >> 16));
  }
}

/// Element type a tile keeps in shared memory: the raw 16-bit pattern of bf16/f16 inputs (half the
/// shared-memory bytes and stores of an fp32 tile; widened in registers when read), fp32 as is.
template <typename T>
using Stored = std::conditional_t<kElemBytes<T> == 2, uint16_t, float>;

/// Row pitch (elements) of a TK-wide tile of Stored<T>: a multiple of 16 bytes plus 16, so 8 lanes
/// reading 16 bytes at the same column of 8 consecutive rows hit distinct banks.
template <typename T, int TK>
inline constexpr int kTilePitch = kElemBytes<T> == 2 ? TK + 8 : TK + 4;

/// One stored element as fp32 (exact).
template <typename T>
__device__ __forceinline__ float tile_value(const Stored<T>* tile, int i) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return bits_to_float(static_cast<uint32_t>(tile[i]) << 16);
  } else if constexpr (std::is_same_v<T, F16>) {
    return half_to_float(tile[i]);
  } else {
    return tile[i];
  }
}

/// N (multiple of 8) consecutive stored elements from a 16-byte aligned address, as fp32.
template <typename T, int N>
__device__ __forceinline__ void tile_row(const Stored<T>* src, float (&v)[N]) {
  if constexpr (kElemBytes<T> == 2) {
#pragma unroll
    for (int q = 0; q < N; q += 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(src + q);
      widen<T>(w.x, v + q + 0);
      widen<T>(w.y, v + q + 2);
      widen<T>(w.z, v + q + 4);
      widen<T>(w.w, v + q + 6);
    }
  } else {
#pragma unroll
    for (int q = 0; q < N; q += 4) {
      const float4 f = *reinterpret_cast<const float4*>(src + q);
      v[q] = f.x;
      v[q + 1] = f.y;
      v[q + 2] = f.z;
      v[q + 3] = f.w;
    }
  }
}

/// Loads [TM, TK] tiles at (m0, k0) into shared memory as Stored<T> (row pitch LD elements;
/// entries outside the matrix read as 0), in two steps: fetch() issues the 16-byte loads of a
/// whole, aligned tile into registers; commit() stores them unchanged into shared memory (a ragged
/// or unaligned tile is read element by element in commit()). (v2 kept the next tile's fetch in
/// flight during the current tile: slower, docs/perf.md.)
template <typename T, int TM, int TK, int THREADS, int LD>
struct TileLoader {
  static constexpr int kBytes = elem_bytes<T>();
  static constexpr int kPerVec = 16 / kBytes;
  static constexpr int kVecPerRow = TK / kPerVec;
  static constexpr int kVecs = TM * kVecPerRow;
  static_assert(kVecs % THREADS == 0, "tile must split evenly into 16-byte vectors");
  static_assert((LD * kBytes) % 16 == 0, "rows must stay 16-byte aligned");
  static constexpr int kPerThread = kVecs / THREADS;
  uint4 v[kPerThread];
  bool vec = false;

  // Vector j of a thread is row first_row() + j * kRowStep, column vector lane() of the tile: one
  // address computed, the others a constant step away (per-vector 64-bit index arithmetic was
  // ~2 instructions per element of the NVFP4 kernel, docs/perf.md CUDA v9).
  static constexpr int kRowStep = THREADS / kVecPerRow;
  static_assert(THREADS % kVecPerRow == 0, "a thread's vectors must share a column");
  static __device__ __forceinline__ int first_row() { return static_cast<int>(threadIdx.x / kVecPerRow); }
  static __device__ __forceinline__ int lane() { return static_cast<int>(threadIdx.x % kVecPerRow); }

  __device__ __forceinline__ void fetch(const DeviceMatrix& x, int64_t m0, int64_t k0) {
    vec = x.vector_ok && m0 + TM <= x.rows && k0 + TK <= x.cols;
    if (!vec) return;
    const int64_t row_bytes = x.row_stride * kBytes;
    const char* p =
        static_cast<const char*>(x.data) + (m0 + first_row()) * row_bytes + (k0 + lane() * kPerVec) * kBytes;
    const int64_t step = kRowStep * row_bytes;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) v[j] = __ldcs(reinterpret_cast<const uint4*>(p + j * step));
  }

  __device__ __forceinline__ void commit(const DeviceMatrix& x, int64_t m0, int64_t k0,
                                         Stored<T>* tile) const {
    if (vec) {
      Stored<T>* q = tile + first_row() * LD + lane() * kPerVec;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) *reinterpret_cast<uint4*>(q + j * kRowStep * LD) = v[j];
    } else {
      for (int id = threadIdx.x; id < TM * TK; id += THREADS) {
        const int r = id / TK, c = id % TK;
        const int64_t gr = m0 + r, gc = k0 + c;
        const bool inside = gr < x.rows && gc < x.cols;
        const int64_t e = inside ? gr * x.row_stride + gc * x.col_stride : 0;
        if constexpr (kBytes == 2) {
          tile[r * LD + c] =
              inside ? static_cast<const uint16_t*>(x.data)[e] : uint16_t{0};  // +0 in bf16 and f16
        } else {
          tile[r * LD + c] = inside ? static_cast<const float*>(x.data)[e] : 0.0f;
        }
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
          *reinterpret_cast<uint4*>(dst + 4 * i) =
              make_uint4(words[i], words[i + 1], words[i + 2], words[i + 3]);
        }
        return;
      }
    }
    if constexpr (N % 2 == 0) {
      if ((a & 7) == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2)
          *reinterpret_cast<uint2*>(dst + 4 * i) = make_uint2(words[i], words[i + 1]);
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

/// Stores every lane's 32 bytes at its dst (a 32-byte run, any 16-byte aligned address) as two
/// 16-byte stores per lane, with the lanes of each pair (2j, 2j + 1) trading halves, so that the
/// first store instruction writes lane 2j's whole run and the second lane 2j + 1's: 16 runs per
/// instruction instead of a half of each of 32. A 32-byte aligned run is one L2 sector, written
/// once instead of twice (docs/perf.md, CUDA v10). Every lane of the warp must call it; a warp
/// with an unaligned dst stores lane by lane.
__device__ __forceinline__ void store_runs32_paired(uint8_t* dst, const uint32_t (&w)[8]) {
  if (!__all_sync(0xFFFFFFFFu, (reinterpret_cast<uintptr_t>(dst) & 15) == 0)) {
    store_bytes(dst, w, 32);
    return;
  }
  const bool odd = threadIdx.x & 1;  // the lane's parity: the kernels' blocks are 1-D
  // Even lanes send their second half, odd lanes their first.
  uint32_t got[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) got[q] = __shfl_xor_sync(0xFFFFFFFFu, odd ? w[q] : w[4 + q], 1);
  uint8_t* const partner = reinterpret_cast<uint8_t*>(
      __shfl_xor_sync(0xFFFFFFFFu, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(dst)), 1));
  // First: the even lane's run (its first half, then its second from the odd lane).
  *reinterpret_cast<uint4*>(odd ? partner + 16 : dst) =
      odd ? make_uint4(got[0], got[1], got[2], got[3]) : make_uint4(w[0], w[1], w[2], w[3]);
  // Second: the odd lane's run (its first half from the even lane, then its second).
  *reinterpret_cast<uint4*>(odd ? dst + 16 : partner) =
      odd ? make_uint4(w[4], w[5], w[6], w[7]) : make_uint4(got[0], got[1], got[2], got[3]);
}

/// Largest |v| skipping NaN (a NaN never wins), as TE's amax kernels and the CPU backend.
/// m must not be NaN (every caller starts from +0): then fmaxf (which returns the non-NaN operand)
/// equals `a > m ? a : m` exactly, and compiles to one FMNMX with the |.| modifier instead of a
/// compare and a select.
__device__ __forceinline__ float max_abs_skip_nan(float m, float v) { return fmaxf(m, fabsf(v)); }

}  // namespace microscale::cuda
