// Runs the GPU half of `microscale bench` (tools/bench_cuda.cpp) without the rest of the CLI, so
// tests/gpu/run.sh can exercise it on the GPU machine (which lacks CLI11 and OpenBLAS).
#include <cstdio>

#include "bench_cuda.hpp"
#include "microscale/error.hpp"

int main() {
  try {
    return microscale::tools::run_bench_cuda(8192, 20) ? 0 : 1;
  } catch (const microscale::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
