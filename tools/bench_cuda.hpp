// The GPU half of `microscale bench` (built when the CUDA backend is).
#pragma once

#include <cstdint>

namespace microscale::tools {

/// Prints quantize bandwidth on GPU 0 beside a device-to-device copy of the same input; returns
/// false (printing why) when no GPU is usable.
bool run_bench_cuda(int64_t size, int repeats);

}  // namespace microscale::tools
