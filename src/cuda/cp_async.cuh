// Asynchronous global -> shared copies (cp.async, sm_80+), shared by the GEMM kernels that stage
// raw codes in shared memory while they work on earlier ones (gemm_nvfp4.cu and the skinny kernels).
#pragma once

#include <cstdint>

namespace microscale::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, zero-filled when !valid (nothing is read then).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

/// 4 bytes global -> shared, zero-filled when !valid.
__device__ __forceinline__ void copy4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

/// Closes this thread's group of copies issued since the last commit.
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most `Pending` of this thread's committed groups are still in flight. The
/// "memory" clobber keeps the compiler from moving shared-memory reads of the copied bytes above
/// the wait (the skinny kernel reads them with no barrier in between).
template <int Pending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

}  // namespace microscale::cuda
