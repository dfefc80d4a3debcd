// CPU block-scaled GEMM. Each K-panel of both operands is dequantized exactly to fp32 (a code
// times its block scale has at most 2 + 4 significant bits, so the product is exact), and
// OpenBLAS sgemm accumulates panel after panel into an fp32 [M, N] buffer (beta = 1 after the
// first). The global scales and the epilogue are applied by the caller (src/core/gemm.cpp).
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/operand_access.hpp"
#include "cpu/gemm_kernels.hpp"

namespace microscale::cpu {
namespace {

// K elements per panel: a multiple of both block sizes. Long panels let sgemm block K itself
// (each extra panel re-reads and re-writes the fp32 accumulator); measured at 2048^3 on 2 cores:
// 512 -> 0.75x sgemm, 4096 -> see docs/perf.md. Memory: (M + N) * kPanel * 4 bytes.
constexpr int64_t kPanel = 4096;

}  // namespace

void gemm_accumulate(const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, int64_t k,
                     int64_t batches, float* acc) {
  const OperandReader ra(a), rb(b);
  // Kept across calls (per thread): fresh buffers cost page faults and zeroing on every GEMM.
  thread_local std::vector<float> panel_a, panel_b;
  panel_a.resize(std::max(panel_a.size(), static_cast<size_t>(m * std::min(k, kPanel))));
  panel_b.resize(std::max(panel_b.size(), static_cast<size_t>(n * std::min(k, kPanel))));
  for (int64_t l = 0; l < batches; ++l) {
    float* out = acc + l * m * n;
    for (int64_t k0 = 0; k0 < k; k0 += kPanel) {
      const int64_t width = std::min(kPanel, k - k0);
      ra.dequantize_panel(l, k0, width, panel_a.data());  // (M, width) fp32, exact
      rb.dequantize_panel(l, k0, width, panel_b.data());  // (N, width) fp32, exact
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(width), 1.0f, panel_a.data(), static_cast<int>(width), panel_b.data(),
                  static_cast<int>(width), k0 == 0 ? 0.0f : 1.0f, out, static_cast<int>(n));
    }
  }
}

}  // namespace microscale::cpu
