// The CPU kernel sets a test runs quantize() on: every set the CPU has (src/cpu/kernel_set.hpp),
// each once.
#pragma once

#include <cstdlib>

#include "cpu/kernel_set.hpp"

namespace microscale::testing_data {

/// MICROSCALE_CPU_KERNELS values, from the best set to the portable one.
inline constexpr const char* kKernelSets[] = {"auto", "avx2", "portable"};

/// Sets MICROSCALE_CPU_KERNELS to `kernels`; false when that gives the same set as a value before
/// it in kKernelSets (on a CPU without AVX-512, "avx2" is "auto"), which the caller then skips.
inline bool select_kernel_set(const char* kernels) {
  setenv("MICROSCALE_CPU_KERNELS", kernels, 1);
  const cpu::KernelSet set = cpu::kernel_set();
  for (const char* earlier : kKernelSets) {
    if (earlier == kernels) break;
    setenv("MICROSCALE_CPU_KERNELS", earlier, 1);
    const bool same = cpu::kernel_set() == set;
    setenv("MICROSCALE_CPU_KERNELS", kernels, 1);
    if (same) return false;
  }
  return true;
}

}  // namespace microscale::testing_data
