// `microscale bench` on a GPU: microscale::cuda::quantize of a SIZE x SIZE bf16 tensor, timed with
// CUDA events (median of repeats after a warm-up), beside cudaMemcpyAsync device-to-device of the
// input in the same run. GB/s = (bytes read + bytes written) / time.
#include "bench_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "microscale/cuda.hpp"
#include "microscale/error.hpp"
#include "microscale/half.hpp"

namespace microscale::tools {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}

// A device buffer freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double median_ms(int repeats, const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  launch();  // warm-up
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    launch();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

bool run_bench_cuda(int64_t size, int repeats) {
  if (cuda::device_count() == 0) {
    std::printf("\nGPU: no CUDA device visible, GPU figures skipped\n");
    return false;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::vector<int64_t> shape = {size, size};
  std::vector<uint16_t> host(static_cast<size_t>(size * size));
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  for (uint16_t& v : host) v = float_to_bf16(normal(rng));
  const size_t in_bytes = host.size() * 2;
  DeviceBuffer input(in_bytes), copy(in_bytes);
  check(cudaMemcpy(input.ptr, host.data(), in_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  TensorView in;
  in.data = input.ptr;
  in.dtype = DType::BF16;
  in.shape = shape;
  in.device = Device::CUDA;

  const double copy_ms = median_ms(repeats, [&] {
    check(cudaMemcpyAsync(copy.ptr, input.ptr, in_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
  });
  const double copy_rate = 2.0 * static_cast<double>(in_bytes) / (copy_ms * 1e-3);
  std::printf("\nGPU quantize on %s, %lldx%lld bf16; GB/s = (bytes read + written) / time\n", prop.name,
              static_cast<long long>(size), static_cast<long long>(size));
  std::printf("%-22s %10s %10s %12s\n", "case", "us", "GB/s", "vs d2d copy");
  std::printf("%-22s %10.1f %10.1f %11.2fx\n", "d2d copy", copy_ms * 1e3, copy_rate / 1e9, 1.0);

  struct Case {
    const char* name;
    Scheme scheme;
    bool rht;
    Tile tile;
  };
  for (const Case& c : {Case{"nvfp4 row+col rht", Scheme::NVFP4, true, Tile::k1x16},
                        Case{"nvfp4 16x16 row+col", Scheme::NVFP4, false, Tile::k16x16},
                        Case{"mxfp8 row+col", Scheme::MXFP8_E4M3, false, Tile::k1x16},
                        Case{"mxfp4 row+col", Scheme::MXFP4, false, Tile::k1x16}}) {
    QuantizeOptions o;
    o.scheme = c.scheme;
    o.rowwise = o.columnwise = true;
    o.rht = c.rht;
    o.tile = c.tile;
    const QuantizedShapes s = quantized_shapes(shape, o);
    const int64_t bytes_out =
        numel(s.rowwise_data) + numel(s.rowwise_scale) + numel(s.columnwise_data) + numel(s.columnwise_scale);
    DeviceBuffer rd(numel(s.rowwise_data)), rs(numel(s.rowwise_scale)), cd(numel(s.columnwise_data)),
        cs(numel(s.columnwise_scale)), amax(2 * sizeof(float));
    auto view = [](const DeviceBuffer& b, const std::vector<int64_t>& sh) {
      TensorView v;
      v.data = b.ptr;
      v.dtype = DType::U8;
      v.shape = sh;
      v.device = Device::CUDA;
      return v;
    };
    cuda::QuantizedViews out{view(rd, s.rowwise_data), view(rs, s.rowwise_scale), view(cd, s.columnwise_data),
                             view(cs, s.columnwise_scale), static_cast<float*>(amax.ptr)};
    const double ms = median_ms(repeats, [&] { cuda::quantize(in, o, out, nullptr); });
    const double rate = static_cast<double>(in_bytes + static_cast<size_t>(bytes_out)) / (ms * 1e-3);
    std::printf("%-22s %10.1f %10.1f %11.2fx\n", c.name, ms * 1e3, rate / 1e9, rate / copy_rate);
  }
  return true;
}

}  // namespace microscale::tools
