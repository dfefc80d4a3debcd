// Device scratch memory for one GEMM call: the caller's buffer when it is large enough and
// 256-byte aligned, otherwise memory from the stream-ordered pool (cudaMallocAsync), given back on
// the stream however the call ends (a launch that throws included).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_check.hpp"

namespace microscale::cuda {

class StreamWorkspace {
 public:
  StreamWorkspace(size_t need, void* given, size_t given_bytes, cudaStream_t stream) : stream_(stream) {
    if (need == 0) return;
    if (given != nullptr && given_bytes >= need && reinterpret_cast<uintptr_t>(given) % 256 == 0) {
      data_ = given;
    } else {
      MICROSCALE_CUDA_CHECK(cudaMallocAsync(&owned_, need, stream));
      data_ = owned_;
    }
  }
  ~StreamWorkspace() {
    if (owned_) cudaFreeAsync(owned_, stream_);  // ordered after the call's kernels on the stream
  }
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(data_); }

 private:
  cudaStream_t stream_;
  void* data_ = nullptr;
  void* owned_ = nullptr;
};

}  // namespace microscale::cuda
