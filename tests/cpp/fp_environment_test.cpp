// A caller's flush-to-zero / denormals-are-zero setting (x86 MXCSR FTZ and DAZ, as
// torch.set_flush_denormal(True) sets) changes no byte of quantize, quantize_ref, dequantize or
// the GEMM, and is still set when they return (src/core/fp_environment.hpp).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernel_sets.hpp"
#include "microscale/gemm.hpp"
#include "microscale/quantize.hpp"
#include "test_data.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace microscale {
namespace {

using testing_data::same_bytes;

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFlushBits = 0x8040u;  // FTZ | DAZ

// Sets (or clears) FTZ and DAZ on the calling thread and on every thread of the OpenMP pool.
void set_flush_everywhere(bool on) {
  const auto apply = [on] { _mm_setcsr(on ? (_mm_getcsr() | kFlushBits) : (_mm_getcsr() & ~kFlushBits)); };
  apply();
#pragma omp parallel
  apply();
}

// The FTZ and DAZ bits of every thread of the OpenMP pool, one entry per thread.
std::vector<unsigned> pool_flush_bits() {
  std::vector<unsigned> bits(static_cast<size_t>(omp_get_max_threads()), 0u);
#pragma omp parallel
  bits[static_cast<size_t>(omp_get_thread_num())] = _mm_getcsr() & kFlushBits;
  return bits;
}

// [64, 64] fp32 subnormals of both signs, so that blocks lie wholly in the subnormal range (their
// scales bring them into the formats' range); with `normal_first_row`, row 0 holds ordinary values
// (the NVFP4 amax is then normal), else the whole tensor is subnormal.
std::vector<float> subnormal_rows(bool normal_first_row) {
  std::vector<float> x(64 * 64);
  for (size_t i = 0; i < x.size(); ++i) {
    const float tiny = std::ldexp(static_cast<float>((i * 2654435761u) % 1000 + 1), -140);
    x[i] = (i % 2 == 1) ? -tiny : tiny;
  }
  if (normal_first_row) {
    for (int c = 0; c < 64; ++c) x[c] = (c + 1) * 1.0e-3f;
  }
  return x;
}

struct Outputs {
  QuantizedTensor fast, ref;
  // Per usage (rowwise, columnwise): the fast path's dequantized values and the product of the
  // usage's operand with itself (MX columnwise: the GEMM's transposed walk).
  std::vector<float> dequantized[2], product[2];
};

Outputs run_all(const TensorView& x, const QuantizeOptions& o) {
  Outputs r;
  r.fast = quantize(x, o);
  r.ref = quantize_ref(x, o);
  for (const Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
    const int u = usage == Usage::Rowwise ? 0 : 1;
    const Tensor d = dequantize(r.fast, usage);
    r.dequantized[u].assign(d.data_as<float>(), d.data_as<float>() + d.numel());
    const Tensor p = gemm(GemmOperand::from(r.fast, usage), GemmOperand::from(r.fast, usage));
    r.product[u].assign(p.data_as<float>(), p.data_as<float>() + p.numel());
  }
  return r;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(FpEnvironment, CallersFlushToZeroChangesNoByte) {
  // At least two threads, so that blocks are quantized on pool threads other than this one.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(std::max(2, saved_threads));
  for (const bool normal_first_row : {true, false}) {
    const std::vector<float> data = subnormal_rows(normal_first_row);
    // The same values in bf16 (rounded; still subnormal): the 16-bit kernels take those.
    Tensor data_bf16(DType::BF16, {64, 64});
    for (size_t i = 0; i < data.size(); ++i) data_bf16.data_as<uint16_t>()[i] = float_to_bf16(data[i]);
    for (const Scheme scheme : {Scheme::MXFP8_E4M3, Scheme::MXFP4, Scheme::NVFP4}) {
      for (const DType dtype : {DType::F32, DType::BF16}) {
        const TensorView x =
            dtype == DType::F32
                ? TensorView::from_buffer(data.data(), data.size() * sizeof(float), DType::F32, {64, 64})
                : data_bf16.view();
        QuantizeOptions o;
        o.scheme = scheme;
        o.rowwise = o.columnwise = true;
        o.scale_mode = ScaleMode::Floor;
        for (const char* kernels : testing_data::kKernelSets) {
          if (!testing_data::select_kernel_set(kernels)) continue;  // the same set as one before it
          const std::string what = std::string(scheme_name(scheme)) + " " + std::string(dtype_name(dtype)) +
                                   " [" + kernels + " kernels" + (normal_first_row ? "" : ", all subnormal") +
                                   "]";
          const Outputs ieee = run_all(x, o);
          set_flush_everywhere(true);
          volatile float tiny = 1.0e-30f;
          EXPECT_EQ(tiny * 1.0e-10f, 0.0f) << "FTZ did not take effect";
          const Outputs flushed = run_all(x, o);
          const unsigned after = _mm_getcsr() & kFlushBits;
          const std::vector<unsigned> pool_after = pool_flush_bits();
          set_flush_everywhere(false);
          EXPECT_EQ(after, kFlushBits) << what << ": the caller's FTZ/DAZ must be back after the calls";
          for (const unsigned bits : pool_after) EXPECT_EQ(bits, kFlushBits) << what << ": a pool thread's";
          for (const auto* q : {&flushed.fast, &flushed.ref}) {
            EXPECT_TRUE(same_bytes(q->rowwise_data, ieee.ref.rowwise_data)) << what;
            EXPECT_TRUE(same_bytes(q->rowwise_scale, ieee.ref.rowwise_scale)) << what;
            EXPECT_TRUE(same_bytes(q->columnwise_data, ieee.ref.columnwise_data)) << what;
            EXPECT_TRUE(same_bytes(q->columnwise_scale, ieee.ref.columnwise_scale)) << what;
            EXPECT_EQ(float_bits(q->rowwise_amax), float_bits(ieee.ref.rowwise_amax)) << what;
            EXPECT_EQ(float_bits(q->columnwise_amax), float_bits(ieee.ref.columnwise_amax)) << what;
          }
          for (const int u : {0, 1}) {
            const std::string usage = u == 0 ? " rowwise" : " columnwise";
            EXPECT_TRUE(same_floats(flushed.dequantized[u], ieee.dequantized[u]))
                << what << ": dequantize" << usage;
            EXPECT_TRUE(same_floats(flushed.product[u], ieee.product[u])) << what << ": gemm" << usage;
          }
        }
      }
    }
  }
  unsetenv("MICROSCALE_CPU_KERNELS");
  omp_set_num_threads(saved_threads);
}
#else
TEST(FpEnvironment, CallersFlushToZeroChangesNoByte) { GTEST_SKIP() << "x86 only (MXCSR)"; }
#endif

}  // namespace
}  // namespace microscale
