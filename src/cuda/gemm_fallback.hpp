// The expanded GEMM path's exact fallback (src/cuda/gemm_fallback.cu), for operands whose values
// bf16 may not hold.
#pragma once

#include <cuda_runtime.h>

#include "cuda/gemm_params.hpp"

namespace microscale::cuda {

/// Whether some value of `op` may lie below bf16's smallest step (2^-133): an MX element format
/// whose smallest step times the smallest scale (2^-127) does (E4M3, E5M2). NVFP4 and the MX
/// 6- and 4-bit formats always fit.
bool may_not_fit_bf16(const GemmDeviceOperand& op);

/// When `*inexact` (device int) is set, recomputes every sum of `p` exactly in fp32 from the
/// codes: into p.workspace ([L, M, N] fp32 sums) or, `direct`, into D as alpha' * sum. Otherwise
/// its blocks return at once. p.batches <= 65535 (checked by cuda::gemm).
void launch_exact_fallback(const GemmDeviceParams& p, const int* inexact, bool direct, cudaStream_t stream);

}  // namespace microscale::cuda
