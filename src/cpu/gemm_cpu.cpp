// CPU block-scaled GEMM. Each K-panel of both operands is dequantized exactly (a code times its
// block scale has at most 2 + 4 significant bits), and the panels' products accumulate into an
// fp32 [M, N] buffer, panel after panel. A panel goes the bf16 route (gemm_bf16.hpp: oneDNN,
// about twice sgemm's rate where the CPU multiplies bf16), dequantized straight to bf16, when
// every value of both panels is a bf16 value of magnitude 0 or >= 2^-56 (then every product and
// partial sum is a multiple of 2^-126, so none is subnormal and the bf16 instructions' flushing
// never acts) and no earlier panel of the product went through sgemm; else it is dequantized to
// fp32 (again, where the bf16 pass found a value unfit) for OpenBLAS's sgemm.
// Both multiply exactly and add in fp32. The global scales and the epilogue are applied by the
// caller (src/core/gemm.cpp).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/operand_access.hpp"
#include "cpu/decode_codes.hpp"
#include "cpu/gemm_bf16.hpp"
#include "cpu/gemm_kernels.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {
namespace {

// K elements per panel: a multiple of both block sizes. Long panels let sgemm block K itself
// (each extra panel re-reads and re-writes the fp32 accumulator); measured at 2048^3 on 2 cores:
// 512 -> 0.75x sgemm, 4096 -> see docs/perf.md. Memory: (M + N) * kPanel * 4 bytes.
constexpr int64_t kPanel = 4096;

// The bits of 2^-56 as fp32: a nonzero bf16 value at least this large has its last significant
// bit at 2^-63 or above, so products of two are multiples of 2^-126.
constexpr uint32_t kSmallestBits = (127u - 56u) << 23;

/// dst = the bf16 bits of src when every value is a bf16 value (its low 16 bits zero), finite,
/// and 0 or of magnitude >= 2^-56; returns 0 when they all were (dst is then complete).
uint32_t to_bf16_row(const float* src, int64_t count, uint16_t* dst) {
  uint32_t unfit = 0;
#pragma omp simd reduction(| : unfit)
  for (int64_t i = 0; i < count; ++i) {  // branch-free: vectorised
    const uint32_t bits = float_bits(src[i]), magnitude = bits & 0x7FFFFFFFu;
    unfit |= (bits & 0xFFFFu) | static_cast<uint32_t>(magnitude != 0 && magnitude < kSmallestBits) |
             static_cast<uint32_t>(magnitude >= 0x7F800000u);
    dst[i] = static_cast<uint16_t>(bits >> 16);
  }
  return unfit;
}

/// dst [rows, width] = the operand's panel as bf16 bits, each row dequantized into an fp32 row
/// buffer of its thread's and converted there: one pass over the panel's memory. Returns whether
/// every value passed to_bf16_row's test (dst is then complete, else unusable).
bool bf16_panel(const OperandReader& reader, int64_t l, int64_t k0, int64_t width, uint16_t* dst) {
  // kColumnGroup row buffers per OpenMP thread (panel_rows decodes a transposed operand's rows a
  // group at a time; width x 4 bytes each, 256 KiB a thread at the longest panel), sized here:
  // nothing in the parallel region allocates.
  thread_local std::vector<float> rows;
  const auto threads = static_cast<size_t>(omp_get_max_threads());
  const auto per_thread = static_cast<size_t>(kColumnGroup * width);
  rows.resize(std::max(rows.size(), threads * per_thread));
  float* buffers = rows.data();
  return reader.panel_rows(
             l, k0, width,
             [buffers, per_thread, width](int64_t r) {
               return buffers + omp_get_thread_num() * per_thread + (r % kColumnGroup) * width;
             },
             [dst, width](int64_t r, const float* row) {
               return to_bf16_row(row, width, dst + r * width);
             }) == 0;
}

}  // namespace

void gemm_accumulate(const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, int64_t k,
                     int64_t batches, float* acc) {
  const OperandReader ra(a), rb(b);
  const bool bf16_route = bf16_gemm_available();
  // Kept across calls (per thread): fresh buffers cost page faults and zeroing on every GEMM.
  // (Sized when first needed: a product whose panels all take the bf16 route needs no fp32 ones.)
  thread_local std::vector<float> panel_a, panel_b;
  thread_local std::vector<uint16_t> panel_a16, panel_b16;
  const auto a_size = static_cast<size_t>(m * std::min(k, kPanel));
  const auto b_size = static_cast<size_t>(n * std::min(k, kPanel));
  if (bf16_route) {
    panel_a16.resize(std::max(panel_a16.size(), a_size));
    panel_b16.resize(std::max(panel_b16.size(), b_size));
  }
  for (int64_t l = 0; l < batches; ++l) {
    float* out = acc + l * m * n;
    // Once a panel went through sgemm, the rest of this product does too: its sums may be
    // subnormal, and the bf16 route, accumulating onto them, might flush them.
    bool bf16_panels = bf16_route;
    for (int64_t k0 = 0; k0 < k; k0 += kPanel) {
      const int64_t width = std::min(kPanel, k - k0);
      // (M, width) and (N, width) bf16, exact
      bf16_panels = bf16_panels && bf16_panel(ra, l, k0, width, panel_a16.data()) &&
                    bf16_panel(rb, l, k0, width, panel_b16.data());
      if (bf16_panels) {
        bf16_panel_product(panel_a16.data(), panel_b16.data(), m, n, width, k0 != 0, out);
        continue;
      }
      panel_a.resize(std::max(panel_a.size(), a_size));
      panel_b.resize(std::max(panel_b.size(), b_size));
      ra.dequantize_panel(l, k0, width, panel_a.data());  // (M, width) fp32, exact
      rb.dequantize_panel(l, k0, width, panel_b.data());  // (N, width) fp32, exact
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(width), 1.0f, panel_a.data(), static_cast<int>(width), panel_b.data(),
                  static_cast<int>(width), k0 == 0 ? 0.0f : 1.0f, out, static_cast<int>(n));
    }
  }
}

}  // namespace microscale::cpu
