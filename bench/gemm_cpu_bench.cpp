// CPU block-scaled GEMM throughput beside OpenBLAS sgemm on the same shape, in one run.
//
// GFLOP/s = 2 M N K / time. NVFP4 x NVFP4 (both with amax) and MXFP8 E4M3 x MXFP8 E4M3, operands
// quantized beforehand (the GEMM cost only: dequantizing panels + sgemm + epilogue), f32 output;
// baseline: cblas_sgemm on fp32 operands of the same shape. Shapes 1024^3 and 2048^3.
// mxfp8_wgrad multiplies two MXFP8 columnwise operands (TE's layout: codes not transposed, so the
// GEMM reads each logical row down a column), as the Linear's weight gradient does.
// The table printed last gives each GEMM's ratio to sgemm.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "microscale/gemm.hpp"
#include "microscale/quantize.hpp"

namespace {

using namespace microscale;

Tensor random_f32(int64_t rows, int64_t cols, uint32_t seed) {
  Tensor t(DType::F32, {rows, cols});
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
  return t;
}

void BM_sgemm(benchmark::State& state) {
  const int64_t s = state.range(0);
  const Tensor a = random_f32(s, s, 1), b = random_f32(s, s, 2);
  Tensor c(DType::F32, {s, s});
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s), static_cast<int>(s),
                static_cast<int>(s), 1.0f, a.data_as<float>(), static_cast<int>(s), b.data_as<float>(),
                static_cast<int>(s), 0.0f, c.data_as<float>(), static_cast<int>(s));
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * s * s * s, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_block_scaled(benchmark::State& state, Scheme scheme, Usage usage) {
  const int64_t s = state.range(0);
  const Tensor a = random_f32(s, s, 1), b = random_f32(s, s, 2);
  QuantizeOptions o;
  o.scheme = scheme;
  o.rowwise = usage == Usage::Rowwise;
  o.columnwise = usage == Usage::Columnwise;
  const QuantizedTensor qa = quantize(a.view(), o), qb = quantize(b.view(), o);
  const GemmOperand oa = GemmOperand::from(qa, usage), ob = GemmOperand::from(qb, usage);
  Tensor d(DType::F32, {s, s});
  for (auto _ : state) {
    gemm_into(oa, ob, GemmProblem{}, d.view());
    benchmark::DoNotOptimize(d.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * s * s * s, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

class TableReporter : public benchmark::ConsoleReporter {
 public:
  // The table's rate of a benchmark: its median over repetitions where there are several
  // (--benchmark_repetitions; with --benchmark_report_aggregates_only the single runs never reach
  // this reporter), else its one run.
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (!r.counters.count("GFLOP/s")) continue;
      const std::string name = r.run_name.str();
      const double rate = r.counters.at("GFLOP/s").value;
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median") {
        rates[name] = rate;
        from_median.insert(name);
      } else if (r.run_type == Run::RT_Iteration && !from_median.count(name)) {
        rates[name] = rate;
      }
    }
  }
  std::map<std::string, double> rates;
  std::set<std::string> from_median;
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> sizes = {1024, 2048};
  for (int64_t s : sizes) {
    benchmark::RegisterBenchmark("sgemm", BM_sgemm)->Arg(s)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("nvfp4", BM_block_scaled, Scheme::NVFP4, Usage::Rowwise)
        ->Arg(s)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("mxfp8", BM_block_scaled, Scheme::MXFP8_E4M3, Usage::Rowwise)
        ->Arg(s)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("mxfp8_wgrad", BM_block_scaled, Scheme::MXFP8_E4M3, Usage::Columnwise)
        ->Arg(s)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%-12s %8s %10s %10s\n", "gemm", "M=N=K", "GFLOP/s", "vs sgemm");
  for (int64_t s : sizes) {
    std::string suffix = "/";  // appended piece by piece: GCC 12's -Wrestrict false positive on "/" + ...
    suffix += std::to_string(s);
    suffix += "/real_time";
    const double base = reporter.rates["sgemm" + suffix];
    for (const char* name : {"sgemm", "nvfp4", "mxfp8", "mxfp8_wgrad"}) {
      const double r = reporter.rates[name + suffix];
      if (r == 0) continue;  // filtered out
      std::printf("%-12s %8lld %10.1f %9.2fx\n", name, static_cast<long long>(s), r / 1e9,
                  base > 0 ? r / base : 0.0);
    }
  }
  benchmark::Shutdown();
  return 0;
}
