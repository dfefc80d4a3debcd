// Helpers of the GPU test and benchmark programs: CK() exits on a failed CUDA call (these are
// plain programs, not the library, whose calls throw microscale::Error), and DeviceBuffer owns a
// cudaMalloc'd buffer, optionally filled from host memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#define CK(call)                                                                                    \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                                 \
    }                                                                                               \
  } while (0)

struct DeviceBuffer {
  void* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t bytes) : n(bytes) { CK(cudaMalloc(&p, bytes ? bytes : 1)); }
  DeviceBuffer(const void* host, size_t bytes) : DeviceBuffer(bytes) {
    if (bytes) CK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};
