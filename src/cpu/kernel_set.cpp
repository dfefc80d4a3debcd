#include "cpu/kernel_set.hpp"

#include <cstdlib>
#include <cstring>

#include "cpu/avx512.hpp"

namespace microscale::cpu {

KernelSet cpu_kernel_set() {
#ifdef MICROSCALE_HAVE_AVX512_KERNELS
  // NOTE: GCC's and Clang's checks include the OS's XSAVE support for the YMM and ZMM state.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return KernelSet::Avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return KernelSet::Avx2;
#endif
  return KernelSet::Portable;
}

KernelSet kernel_set() {
  static const KernelSet best = cpu_kernel_set();
  const char* forced = std::getenv("MICROSCALE_CPU_KERNELS");
  if (forced == nullptr) return best;
  if (std::strcmp(forced, "portable") == 0) return KernelSet::Portable;
  if (std::strcmp(forced, "avx2") == 0 && best > KernelSet::Avx2) return KernelSet::Avx2;
  return best;
}

}  // namespace microscale::cpu
