// CPU GEMM: exact dequantization of K-panels to fp32, then OpenBLAS sgemm with fp32 accumulation.
#pragma once

#include "microscale/gemm.hpp"

namespace microscale::cpu {

/// Shapes already validated by the core. acc: fp32 [L][M, N], overwritten with sum_k A B^T.
void gemm_accumulate(const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, int64_t k,
                     int64_t batches, float* acc);

}  // namespace microscale::cpu
