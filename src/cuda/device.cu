// Device discovery for the CUDA backend. The quantize and GEMM kernels (issues 4 and 3) build on
// this file's checks; the shared scale math and Philox stream are compiled for the device here
// so that CI, which has nvcc but no GPU, keeps them compiling.
#include "core/scale_math.hpp"
#include "cuda/cuda_check.hpp"
#include "microscale/cuda.hpp"
#include "microscale/philox.hpp"

namespace microscale::cuda {

/// Number of visible CUDA devices; 0 when there is no driver or no device.
int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

/// Compute capability major * 10 + minor of `device` (90 for Hopper).
int compute_capability(int device) {
  int major = 0, minor = 0;
  MICROSCALE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MICROSCALE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// Instantiates the host/device helpers in device code (compile coverage only; launched by no one).
__global__ void compile_shared_math(uint8_t* out, float amax, uint64_t seed) {
  uint32_t words[4];
  sr_block_bits(seed, 0, threadIdx.x, words);
  const float s_enc = nvfp4_global_encode_scale(amax);
  out[threadIdx.x] =
      mx_scale_byte(amax * s_enc, MxScaleRule::RCeil, 8, 3, 448.0f) ^ static_cast<uint8_t>(words[0]);
}

}  // namespace microscale::cuda
