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

// K elements per panel: a multiple of both block sizes, small enough to keep panels in cache.
constexpr int64_t kPanel = 512;

}  // namespace

void gemm_accumulate(const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, int64_t k, int64_t batches,
                     float* acc) {
  const OperandReader ra(a), rb(b);
  std::vector<float> panel_a(static_cast<size_t>(m * std::min(k, kPanel)));
  std::vector<float> panel_b(static_cast<size_t>(n * std::min(k, kPanel)));
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
