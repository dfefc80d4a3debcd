// CUDA error checking: every runtime call and kernel launch of the CUDA backend goes through
// MICROSCALE_CUDA_CHECK, which turns a failure into a microscale::Error naming the call.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "microscale/error.hpp"

namespace microscale::cuda {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    throw Error(std::string("CUDA call ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                cudaGetErrorString(status));
  }
}

}  // namespace microscale::cuda

#define MICROSCALE_CUDA_CHECK(call) ::microscale::cuda::check((call), #call, __FILE__, __LINE__)
