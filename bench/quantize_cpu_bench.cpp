// CPU quantize throughput beside memcpy, in one run.
//
// Effective bandwidth = (bytes read + bytes written) / time, for a 4096x4096 bf16 input (32 MiB):
// NVFP4 rowwise+columnwise with and without RHT, NVFP4 16x16 (both directions; also with both amaxes
// given, as a tensor-parallel weight is quantized), MXFP8 E4M3, MXFP4,
// MXFP6 E2M3 and E3M2 rowwise+columnwise, and NVFP4, MXFP8 and MXFP6 E2M3 rowwise+columnwise of
// the same values as f16 (32 MiB too); the fast path (the best kernel set the CPU has: AVX-512, AVX2 or
// portable; MICROSCALE_CPU_KERNELS=avx2 picks the AVX2 set on an AVX-512 CPU) on 1 thread and on all threads,
// its portable kernels and the reference path on 1. The baseline is memcpy of the input (read 32 MiB + write
// 32 MiB) on the same thread counts. The table printed last gives each figure as a ratio to memcpy and to the
// reference path. A second table: NVFP4 row+col of small inputs (16 x 4096 to 1024 x 1024 bf16) on one
// thread, where a call's fixed costs (its threshold tables, its buffers) show, beside memcpy of the same
// input. A third: dequantize of one usage of the input (NVFP4 and MXFP8, rowwise and MXFP8's
// columnwise, to bf16 or f32) on 1 and all threads beside memcpy and dequantize_ref.
//
// Run: build/release/bench/bench_quantize_cpu [--benchmark_format=json]  (takes about a minute)
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "microscale/half.hpp"
#include "microscale/quantize.hpp"

namespace {

using namespace microscale;

constexpr int64_t kRows = 4096, kCols = 4096;

// The 4096 x 4096 input: Gaussian bf16 values, or the same values as f16.
const Tensor& input(DType dtype = DType::BF16) {
  static const Tensor bf16 = [] {
    Tensor t(DType::BF16, {kRows, kCols});
    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<uint16_t>()[i] = float_to_bf16(normal(rng));
    return t;
  }();
  static const Tensor f16 = [] {
    Tensor t(DType::F16, {kRows, kCols});
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data_as<uint16_t>()[i] = float_to_half(bf16_to_float(bf16.data_as<uint16_t>()[i]));
    return t;
  }();
  return dtype == DType::F16 ? f16 : bf16;
}

// max |x| of the bf16 input (Gaussian: no NaN).
float input_amax() {
  static const float amax = [] {
    float m = 0.0f;
    const Tensor& x = input();
    for (int64_t i = 0; i < x.numel(); ++i)
      m = std::max(m, std::fabs(bf16_to_float(x.data_as<uint16_t>()[i])));
    return m;
  }();
  return amax;
}

int64_t output_bytes(const QuantizedTensor& q) {
  int64_t n = 0;
  for (const Tensor* t : {&q.rowwise_data, &q.rowwise_scale, &q.columnwise_data, &q.columnwise_scale}) {
    if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  }
  return n;
}

struct Case {
  const char* name;
  QuantizeOptions options;
  DType dtype = DType::BF16;  // of the input
};

std::vector<Case> cases() {
  QuantizeOptions nvfp4;
  nvfp4.rowwise = nvfp4.columnwise = true;
  QuantizeOptions nvfp4_rht = nvfp4;
  nvfp4_rht.rht = true;
  QuantizeOptions nvfp4_2d = nvfp4;
  nvfp4_2d.tile = Tile::k16x16;
  // A weight of a tensor-parallel layer: the amax all-reduced over the group is given, so the call
  // reads its input once (no pass 1).
  QuantizeOptions nvfp4_2d_given = nvfp4_2d;
  nvfp4_2d_given.amax_rowwise = nvfp4_2d_given.amax_columnwise = input_amax();
  // TE's nvfp4_4over6 for weights, with its default bound (256)
  QuantizeOptions nvfp4_4over6 = nvfp4_2d;
  nvfp4_4over6.four_over_six = FourOverSix::MinMae;
  nvfp4_4over6.nvfp4_e4m3_max = 256;
  // TE's row_scaled_activation: a global scale per row of X and of X^T (the portable kernel)
  QuantizeOptions nvfp4_row_scaled = nvfp4;
  nvfp4_row_scaled.row_scaled = true;
  QuantizeOptions mxfp8 = nvfp4;
  mxfp8.scheme = Scheme::MXFP8_E4M3;
  // TE's MXFP8 2D quantization (enable_2d_quantization) of weights: 32x32 tiles (the portable kernel)
  QuantizeOptions mxfp8_2d = mxfp8;
  mxfp8_2d.tile = Tile::k32x32;
  QuantizeOptions mxfp4 = nvfp4;
  mxfp4.scheme = Scheme::MXFP4;
  QuantizeOptions mxfp6 = nvfp4;
  mxfp6.scheme = Scheme::MXFP6_E2M3;
  QuantizeOptions mxfp6_e3m2 = nvfp4;
  mxfp6_e3m2.scheme = Scheme::MXFP6_E3M2;
  return {{"nvfp4_row_col", nvfp4},
          {"nvfp4_row_col_rht", nvfp4_rht},
          {"nvfp4_16x16", nvfp4_2d},
          {"nvfp4_16x16_amax_given", nvfp4_2d_given},
          {"nvfp4_16x16_4over6", nvfp4_4over6},
          {"nvfp4_row_col_row_scaled", nvfp4_row_scaled},
          {"mxfp8_row_col", mxfp8},
          {"mxfp8_32x32", mxfp8_2d},
          {"mxfp4_row_col", mxfp4},
          {"mxfp6_e2m3_row_col", mxfp6},
          {"mxfp6_e3m2_row_col", mxfp6_e3m2},
          {"nvfp4_row_col_f16", nvfp4, DType::F16},
          {"mxfp8_row_col_f16", mxfp8, DType::F16},
          {"mxfp6_e2m3_row_col_f16", mxfp6, DType::F16}};
}

void BM_memcpy(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const size_t bytes = input().nbytes();
  std::vector<std::byte> dst(bytes);
  const auto* src = static_cast<const std::byte*>(input().data());
  for (auto _ : state) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int chunk = 0; chunk < 64; ++chunk) {
      const size_t begin = bytes * chunk / 64, end = bytes * (chunk + 1) / 64;
      std::memcpy(dst.data() + begin, src + begin, end - begin);
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * bytes));
}

// Small calls: NVFP4 row+col of these bf16 shapes (Gaussian), one thread.
const std::vector<std::pair<int64_t, int64_t>> kSmallShapes = {
    {16, 4096}, {128, 128}, {128, 4096}, {1024, 1024}};

const Tensor& small_input(int64_t rows, int64_t cols) {
  static std::map<std::pair<int64_t, int64_t>, Tensor> inputs;
  auto [it, added] = inputs.try_emplace({rows, cols}, DType::BF16, std::vector<int64_t>{rows, cols});
  if (added) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < it->second.numel(); ++i)
      it->second.data_as<uint16_t>()[i] = float_to_bf16(normal(rng));
  }
  return it->second;
}

std::string small_name(const char* what, int64_t rows, int64_t cols) {
  return std::string(what) + "/" + std::to_string(rows) + "x" + std::to_string(cols);
}

void BM_small_memcpy(benchmark::State& state, int64_t rows, int64_t cols) {
  const Tensor& x = small_input(rows, cols);
  std::vector<std::byte> dst(x.nbytes());
  for (auto _ : state) {
    std::memcpy(dst.data(), x.data(), x.nbytes());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
}

void BM_small_quantize(benchmark::State& state, int64_t rows, int64_t cols) {
  const Tensor& x = small_input(rows, cols);
  QuantizeOptions o;
  o.rowwise = o.columnwise = true;
  o.num_threads = 1;
  QuantizedTensor q;
  quantize_into(x.view(), o, q);
  for (auto _ : state) {
    quantize_into(x.view(), o, q);
    benchmark::DoNotOptimize(q.rowwise_data.data());
  }
}

enum class Path { Fast, Portable, Reference };

void BM_quantize(benchmark::State& state, Case c, Path path) {
  QuantizeOptions o = c.options;
  o.num_threads = static_cast<int>(state.range(0));
  // The fast path's portable kernels instead of the best set (src/cpu/kernel_set.hpp). The fast
  // path takes the set MICROSCALE_CPU_KERNELS asks for, if set (=avx2 measures the AVX2 set on an
  // AVX-512 machine), and it is put back after.
  const char* asked = std::getenv("MICROSCALE_CPU_KERNELS");
  const std::string fast_kernels = asked != nullptr ? asked : "";
  if (path == Path::Portable) setenv("MICROSCALE_CPU_KERNELS", "portable", 1);
  int64_t moved = 0;
  // The fast paths write into the same buffers every iteration, as memcpy does; like memcpy's
  // destination, they are allocated and touched before the timed loop.
  const Tensor& x = input(c.dtype);
  QuantizedTensor q;
  if (path != Path::Reference) quantize_into(x.view(), o, q);
  for (auto _ : state) {
    if (path == Path::Reference) {
      q = quantize_ref(x.view(), o);
    } else {
      quantize_into(x.view(), o, q);
    }
    moved = static_cast<int64_t>(x.nbytes()) + output_bytes(q);
    benchmark::DoNotOptimize(q.rowwise_data.data());
  }
  if (fast_kernels.empty()) {
    unsetenv("MICROSCALE_CPU_KERNELS");
  } else {
    setenv("MICROSCALE_CPU_KERNELS", fast_kernels.c_str(), 1);
  }
  state.SetBytesProcessed(state.iterations() * moved);
}

// Dequantize of one usage of the 4096x4096 input, quantized beforehand: bytes = codes + scales read
// + output written.
struct DequantizeCase {
  const char* name;
  Scheme scheme;
  Usage usage;
  DType out;
};

const std::vector<DequantizeCase> kDequantizeCases = {
    {"nvfp4_rowwise_bf16", Scheme::NVFP4, Usage::Rowwise, DType::BF16},
    {"nvfp4_rowwise_f32", Scheme::NVFP4, Usage::Rowwise, DType::F32},
    {"mxfp8_rowwise_bf16", Scheme::MXFP8_E4M3, Usage::Rowwise, DType::BF16},
    {"mxfp8_columnwise_bf16", Scheme::MXFP8_E4M3, Usage::Columnwise, DType::BF16},
};

void BM_dequantize(benchmark::State& state, DequantizeCase c, Path path) {
  QuantizeOptions o;
  o.scheme = c.scheme;
  o.rowwise = c.usage == Usage::Rowwise;
  o.columnwise = c.usage == Usage::Columnwise;
  const QuantizedTensor q = quantize(input().view(), o);
  const int threads = static_cast<int>(state.range(0));
  const int outer = omp_get_max_threads();
  omp_set_num_threads(threads);  // dequantize runs on the OpenMP default team
  int64_t moved = 0;
  for (auto _ : state) {
    const Tensor d =
        path == Path::Reference ? dequantize_ref(q, c.usage, c.out) : dequantize(q, c.usage, c.out);
    moved = output_bytes(q) + static_cast<int64_t>(d.nbytes());
    benchmark::DoNotOptimize(d.data());
  }
  omp_set_num_threads(outer);
  state.SetBytesProcessed(state.iterations() * moved);
}

// Collects bytes/second per benchmark name for the closing table: the median over repetitions
// (a single run's figure when there is one repetition).
class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      // Seconds per iteration, for the small calls (which report no bytes).
      const double per_iteration = r.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(r.time_unit);
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median") {
        seconds[r.run_name.str()] = per_iteration;
      } else if (r.run_type == Run::RT_Iteration && !medians.count(r.run_name.str())) {
        seconds[r.run_name.str()] = per_iteration;
      }
      if (!r.counters.count("bytes_per_second")) continue;
      const double rate = r.counters.at("bytes_per_second").value;
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median") {
        rates[r.run_name.str()] = rate;
        medians.insert(r.run_name.str());
      } else if (r.run_type == Run::RT_Iteration && !medians.count(r.run_name.str())) {
        rates[r.run_name.str()] = rate;
      }
    }
  }
  std::map<std::string, double> rates, seconds;
  std::set<std::string> medians;
};

}  // namespace

int main(int argc, char** argv) {
  // The input is made before any benchmark: inside one, its ~0.6 s would be timed (an iteration
  // of whichever case the random interleaving runs first), and Google Benchmark would then give
  // that case a single iteration per repetition.
  input(DType::BF16);
  input(DType::F16);
  for (const auto& [rows, cols] : kSmallShapes) small_input(rows, cols);
  const int all = omp_get_max_threads();
  for (int threads : {1, all}) {
    benchmark::RegisterBenchmark("memcpy", BM_memcpy)
        ->Arg(threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const Case& c : cases()) {
    for (int threads : {1, all}) {
      benchmark::RegisterBenchmark((std::string("fast/") + c.name).c_str(), BM_quantize, c, Path::Fast)
          ->Arg(threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark((std::string("portable/") + c.name).c_str(), BM_quantize, c, Path::Portable)
        ->Arg(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("ref/") + c.name).c_str(), BM_quantize, c, Path::Reference)
        ->Arg(1)
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const DequantizeCase& c : kDequantizeCases) {
    for (int threads : {1, all}) {
      benchmark::RegisterBenchmark((std::string("dequantize/") + c.name).c_str(), BM_dequantize, c,
                                   Path::Fast)
          ->Arg(threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark((std::string("dequantize_ref/") + c.name).c_str(), BM_dequantize, c,
                                 Path::Reference)
        ->Arg(1)
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const auto& [rows, cols] : kSmallShapes) {
    benchmark::RegisterBenchmark(small_name("small/memcpy", rows, cols).c_str(), BM_small_memcpy, rows, cols)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(small_name("small/nvfp4_row_col", rows, cols).c_str(), BM_small_quantize,
                                 rows, cols)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  // Defaults, before the caller's flags (which win): 5 repetitions in random interleaved order, so
  // that each figure and its memcpy baseline are medians over the same stretch of a noisy machine.
  std::string repetitions = "--benchmark_repetitions=5";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::vector<char*> args = {argv[0], repetitions.data(), interleave.data()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  auto rate = [&](const std::string& name) {
    auto it = reporter.rates.find(name);
    return it == reporter.rates.end() ? 0.0 : it->second;
  };
  // Only what ran is printed (a --benchmark_filter selects a part): a row per measured figure, and
  // "-" for a ratio whose baseline did not run.
  const auto ratio = [](double figure, double baseline, int decimals = 2) {
    char text[32] = "-";
    if (baseline > 0) std::snprintf(text, sizeof text, "%.*fx", decimals, figure / baseline);
    return std::string(text);
  };
  std::printf(
      "\n4096x4096 bf16 (f16 where the case says so), effective GB/s = (bytes read + written) / time, "
      "medians; %d hardware threads\n",
      all);
  std::printf("%-24s %8s %10s %12s %12s %16s\n", "case", "threads", "GB/s", "vs memcpy", "vs ref(1t)",
              "vs portable(1t)");
  for (const Case& c : cases()) {
    const double ref = rate(std::string("ref/") + c.name + "/1/iterations:1/real_time");
    const double portable = rate(std::string("portable/") + c.name + "/1/real_time");
    for (int threads : {1, all}) {
      std::string suffix = "/";  // (not "/" + std::to_string(...): a GCC 12 -Wrestrict false positive)
      suffix += std::to_string(threads);
      suffix += "/real_time";
      const double fast = rate(std::string("fast/") + c.name + suffix);
      if (fast == 0) continue;
      const double copy = rate("memcpy" + suffix);
      std::printf("%-24s %8d %10.2f %12s %12s %16s\n", c.name, threads, fast / 1e9, ratio(fast, copy).c_str(),
                  ratio(fast, ref, 1).c_str(), ratio(fast, portable, 1).c_str());
    }
    if (portable > 0) std::printf("%-24s %8d %10.2f   (portable kernels)\n", c.name, 1, portable / 1e9);
  }
  bool dequantize_header = false;
  for (const DequantizeCase& c : kDequantizeCases) {
    const double ref = rate(std::string("dequantize_ref/") + c.name + "/1/iterations:1/real_time");
    for (int threads : {1, all}) {
      std::string suffix = "/";
      suffix += std::to_string(threads);
      suffix += "/real_time";
      const double fast = rate(std::string("dequantize/") + c.name + suffix);
      if (fast == 0) continue;
      if (!dequantize_header) {
        std::printf(
            "\ndequantize, 4096x4096 quantized beforehand, GB/s = (codes + scales + output bytes) / time\n");
        std::printf("%-24s %8s %10s %12s %12s\n", "case", "threads", "GB/s", "vs memcpy", "vs ref(1t)");
        dequantize_header = true;
      }
      std::printf("%-24s %8d %10.2f %12s %12s\n", c.name, threads, fast / 1e9,
                  ratio(fast, rate("memcpy" + suffix)).c_str(), ratio(fast, ref, 1).c_str());
    }
  }
  std::printf("\nsmall calls: NVFP4 row+col, bf16, 1 thread, fast path; medians\n");
  std::printf("%-24s %12s %14s %12s\n", "shape", "us per call", "memcpy (us)", "vs memcpy");
  for (const auto& [rows, cols] : kSmallShapes) {
    const auto time = [&](const char* what) {
      auto it = reporter.seconds.find(small_name(what, rows, cols) + "/real_time");
      return it == reporter.seconds.end() ? 0.0 : it->second;
    };
    const double call = time("small/nvfp4_row_col"), copy = time("small/memcpy");
    if (call == 0) continue;
    std::printf("%-24s %12.1f %14.2f %12s\n", (std::to_string(rows) + "x" + std::to_string(cols)).c_str(),
                call * 1e6, copy * 1e6, ratio(call, copy, 1).c_str());
  }
  const double copy_one = rate("memcpy/1/real_time"),
               copy_all = rate("memcpy/" + std::to_string(all) + "/real_time");
  if (copy_one > 0) std::printf("%-24s %8d %10.2f\n", "memcpy", 1, copy_one / 1e9);
  if (copy_all > 0) std::printf("%-24s %8d %10.2f\n", "memcpy", all, copy_all / 1e9);
  // On a shared VM another tenant can take the other CPUs for a while: the copy on all threads
  // then runs no faster than on one, and every all-threads ratio of this run is against a wrong
  // baseline (seen on the 2-vCPU development VM, docs/perf.md).
  if (all > 1 && copy_one > 0 && copy_all > 0 && copy_all < copy_one) {
    std::printf(
        "note: memcpy on %d threads ran slower than on 1: the CPUs were not all ours during this run, so "
        "its %d-thread ratios are not usable\n",
        all, all);
  }
  benchmark::Shutdown();
  return 0;
}
