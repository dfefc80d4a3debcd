// `microscale bench`: quantize and GEMM speed on this machine's CPU, each beside its baseline
// (memcpy of the same bytes; OpenBLAS sgemm of the same shape) measured in the same run.
// Medians of repeated runs. With the CUDA backend built and a GPU visible, also the GPU quantize
// kernels beside a device-to-device copy. The bench/ programs and tests/gpu/run.sh hold the sweeps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "microscale/gemm.hpp"
#include "microscale/half.hpp"
#include "microscale/quantize.hpp"
#include "quantize_checkpoint.hpp"
#include "threads_option.hpp"
#ifdef MICROSCALE_HAVE_CUDA
#include "bench_cuda.hpp"
#endif

namespace microscale::tools {
namespace {

double median_seconds(int repeats, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void run_bench(int64_t size, int gemm_size, int threads, int repeats) {
  Tensor x(DType::BF16, {size, size});
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<uint16_t>()[i] = float_to_bf16(normal(rng));
  std::vector<std::byte> copy(x.nbytes());
  const double t_copy = median_seconds(repeats, [&] { std::memcpy(copy.data(), x.data(), x.nbytes()); });
  const double copy_rate = 2.0 * static_cast<double>(x.nbytes()) / t_copy;

  std::printf("CPU quantize, %lldx%lld bf16, %d thread(s) (0 = all); GB/s = (bytes read + written) / time\n",
              static_cast<long long>(size), static_cast<long long>(size), threads);
  std::printf("%-22s %10s %10s %12s\n", "case", "ms", "GB/s", "vs memcpy");
  std::printf("%-22s %10.2f %10.2f %11.2fx\n", "memcpy", t_copy * 1e3, copy_rate / 1e9, 1.0);
  struct Case {
    const char* name;
    Scheme scheme;
    bool rht;
  };
  for (const Case& c :
       {Case{"nvfp4 row+col", Scheme::NVFP4, false}, Case{"nvfp4 row+col rht", Scheme::NVFP4, true},
        Case{"mxfp8 row+col", Scheme::MXFP8_E4M3, false}, Case{"mxfp4 row+col", Scheme::MXFP4, false}}) {
    QuantizeOptions o;
    o.scheme = c.scheme;
    o.rowwise = o.columnwise = true;
    o.rht = c.rht;
    o.num_threads = threads;
    size_t out_bytes = 0;
    QuantizedTensor q;  // outputs reused between repeats, as memcpy reuses its destination
    const double t = median_seconds(repeats, [&] {
      quantize_into(x.view(), o, q);
      out_bytes = q.rowwise_data.nbytes() + q.rowwise_scale.nbytes() + q.columnwise_data.nbytes() +
                  q.columnwise_scale.nbytes();
    });
    const double rate = static_cast<double>(x.nbytes() + out_bytes) / t;
    std::printf("%-22s %10.2f %10.2f %11.2fx\n", c.name, t * 1e3, rate / 1e9, rate / copy_rate);
  }

  // GEMM: NVFP4 and MXFP8 operands against sgemm on fp32 operands of the same shape.
  const int64_t g = gemm_size;
  Tensor a(DType::F32, {g, g}), b(DType::F32, {g, g});
  for (int64_t i = 0; i < a.numel(); ++i) {
    a.data_as<float>()[i] = normal(rng);
    b.data_as<float>()[i] = normal(rng);
  }
  Tensor d(DType::F32, {g, g});
  const double flops = 2.0 * static_cast<double>(g) * g * g;
  const double t_sgemm = median_seconds(repeats, [&] {
    gemm_into(GemmOperand::from_dense(a.view()), GemmOperand::from_dense(b.view()), GemmProblem{}, d.view());
  });
  std::printf("\nCPU GEMM, M = N = K = %lld; GFLOP/s = 2MNK / time\n", static_cast<long long>(g));
  std::printf("%-22s %10s %10s %12s\n", "case", "ms", "GFLOP/s", "vs sgemm");
  std::printf("%-22s %10.2f %10.1f %11.2fx\n", "sgemm (fp32 operands)", t_sgemm * 1e3, flops / t_sgemm / 1e9,
              1.0);
  for (Scheme s : {Scheme::NVFP4, Scheme::MXFP8_E4M3}) {
    QuantizeOptions o;
    o.scheme = s;
    const QuantizedTensor qa = quantize(a.view(), o), qb = quantize(b.view(), o);
    const double t = median_seconds(repeats, [&] {
      gemm_into(GemmOperand::from(qa, Usage::Rowwise), GemmOperand::from(qb, Usage::Rowwise), GemmProblem{},
                d.view());
    });
    std::printf("%-22s %10.2f %10.1f %11.2fx\n", std::string(scheme_name(s)).c_str(), t * 1e3,
                flops / t / 1e9, t_sgemm / t);
  }
#ifdef MICROSCALE_HAVE_CUDA
  run_bench_cuda(size, std::max(repeats, 5));
#else
  std::printf("\n(built without CUDA: GPU figures come from tests/gpu/run.sh; see docs/perf.md)\n");
#endif
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto size = std::make_shared<int64_t>(4096);
  auto gemm = std::make_shared<int>(1024);
  auto threads = std::make_shared<int>(0);
  auto repeats = std::make_shared<int>(5);
  CLI::App* cmd =
      app.add_subcommand("bench",
                         "Quantize and GEMM speed on this machine's CPU, each beside its baseline "
                         "(memcpy, OpenBLAS sgemm) measured in the same run.");
  cmd->add_option("--size", *size, "quantize a SIZE x SIZE bf16 tensor (default 4096)")
      ->check(CLI::Range(32, 65536));
  cmd->add_option("--gemm-size", *gemm, "GEMM M = N = K (default 1024)")->check(CLI::Range(32, 16384));
  add_threads_option(cmd, *threads);
  cmd->add_option("--repeats", *repeats, "timed runs per case; the median is shown (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->callback([=] {
    if (*size % 32 != 0 || *gemm % 32 != 0)
      throw CLI::ValidationError("--size and --gemm-size must be multiples of 32");
    run_bench(*size, *gemm, *threads, *repeats);
  });
}

}  // namespace microscale::tools
