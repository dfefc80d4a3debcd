// Which CPU kernels quantize() runs: the hand-vectorised AVX-512 ones (quantize_*_avx512.cpp) when
// the CPU has AVX-512 F/BW/DQ/VL, else the portable fast path (quantize_nvfp4.cpp,
// quantize_mx.cpp). Both equal the reference bit for bit; the choice only changes speed.
//
// The environment variable MICROSCALE_CPU_KERNELS=portable forces the portable path (tests run
// both sets; benchmarks compare them). It is read on every call, so a test can switch it.
#pragma once

namespace microscale::cpu {

enum class KernelSet { Avx512, Portable };

/// Whether this CPU (and its OS) runs the AVX-512 kernels, whatever the environment says.
bool cpu_has_avx512();

/// The kernel set for this call (see above).
KernelSet kernel_set();

}  // namespace microscale::cpu
