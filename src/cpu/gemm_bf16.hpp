// The CPU GEMM's bf16 route: a panel product of bf16 operands with fp32 accumulation through
// oneDNN's matmul, on CPUs that multiply bf16 natively (AVX512-BF16, AMX-BF16), where it runs at
// about twice fp32's rate. Built when CMake finds oneDNN (MICROSCALE_HAVE_ONEDNN).
#pragma once

#include <cstdint>

namespace microscale::cpu {

/// Whether bf16_panel_product runs here: built with oneDNN, a CPU with native bf16 products, and
/// MICROSCALE_CPU_GEMM not "sgemm" (the switch that forces OpenBLAS's sgemm, read once).
bool bf16_gemm_available();

/// out [M, N] (fp32, row-major) = A B^T, or += A B^T with `accumulate`: A [M, width] and B
/// [N, width] bf16 bits, row-major. Products exact, sums in fp32.
void bf16_panel_product(const uint16_t* a, const uint16_t* b, int64_t m, int64_t n, int64_t width,
                        bool accumulate, float* out);

}  // namespace microscale::cpu
