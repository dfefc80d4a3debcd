// Which CPU kernels quantize() runs: the hand-vectorised AVX-512 ones (quantize_*_avx512.cpp) when
// the CPU has AVX-512 F/BW/DQ/VL, else the portable fast path (quantize_nvfp4.cpp,
// quantize_mx.cpp, quantize_mx16.cpp). Both equal the reference bit for bit; the choice only
// changes speed.
//
// The environment variable MICROSCALE_CPU_KERNELS=portable forces the portable set ("avx512" or
// "auto" keep the best one). It is read on every call, so a test can switch it (the tests run
// every set the CPU has; benchmarks compare them).
#pragma once

namespace microscale::cpu {

enum class KernelSet { Portable, Avx512 };

/// The best set this CPU (and its OS) runs, whatever the environment says.
KernelSet cpu_kernel_set();

/// The kernel set for this call (see above).
KernelSet kernel_set();

}  // namespace microscale::cpu
