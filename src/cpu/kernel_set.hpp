// Which CPU kernels quantize() runs. Every set equals the reference bit for bit; the choice only
// changes speed.
//   Avx512:   the hand-vectorised AVX-512 kernels (quantize_*_avx512.cpp), on CPUs with AVX-512
//             F/BW/DQ/VL;
//   Avx2:     the portable fast path, with parts of the 16-bit kernels in AVX2 (NVFP4's chunks,
//             nvfp4_chunk_avx2.cpp, and RHT, nvfp4_rht_avx2.cpp; MXFP8's, MXFP6's and MXFP4's
//             chunks, mx16_chunk_avx2.cpp), on CPUs with AVX2 (AMD Zen 2/3, Intel client parts);
//   Portable: the portable fast path as plain C++ (quantize_nvfp4.cpp, quantize_nvfp4_16.cpp,
//             quantize_mx.cpp, quantize_mx16.cpp), compiled for x86-64-v4/-v3/baseline
//             (cpu_dispatch.hpp) or any other target.
//
// The environment variable MICROSCALE_CPU_KERNELS=portable or =avx2 asks for a set below the best
// one the CPU has ("avx512" or "auto" keep the best). A set the CPU does not have is never used:
// the request gives the best set at or below it. It is read on every call, so a test can switch it
// (the tests run every set the CPU has; benchmarks compare them).
#pragma once

namespace microscale::cpu {

/// Ordered from the least to the most the CPU must have.
enum class KernelSet { Portable, Avx2, Avx512 };

/// The best set this CPU (and its OS) runs, whatever the environment says.
KernelSet cpu_kernel_set();

/// The kernel set for this call (see above).
KernelSet kernel_set();

}  // namespace microscale::cpu
