#include "cpu/kernel_set.hpp"

#include <cstdlib>
#include <cstring>

#include "cpu/avx512.hpp"

namespace microscale::cpu {

bool cpu_has_avx512() {
#ifdef MICROSCALE_HAVE_AVX512_KERNELS
  // NOTE: GCC's and Clang's checks include the OS's XSAVE support for the ZMM state.
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

KernelSet kernel_set() {
  static const bool has_avx512 = cpu_has_avx512();
  const char* forced = std::getenv("MICROSCALE_CPU_KERNELS");
  if (forced != nullptr && std::strcmp(forced, "portable") == 0) return KernelSet::Portable;
  return has_avx512 ? KernelSet::Avx512 : KernelSet::Portable;
}

}  // namespace microscale::cpu
