// microscale/host_device.hpp — MICROSCALE_HOST_DEVICE: one definition of a small function for the
// host compiler and for nvcc (host and device), so the CPU and CUDA backends share formulas.
#pragma once

#if defined(__CUDACC__)
#define MICROSCALE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MICROSCALE_HOST_DEVICE inline
#endif
