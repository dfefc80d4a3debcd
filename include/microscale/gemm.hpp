// microscale/gemm.hpp — block-scaled GEMM: D = alpha * A B^T [+ beta * C] [+ bias].
//
// Operands are "K-major" logical matrices: A is [M, K] and B is [N, K], K being the contraction
// (and, for quantized operands, the blocked) dimension; a batch dim L may follow: [M, K, L].
// A quantized operand is data + block scales (+ an NVFP4 amax); a dense operand is a plain
// f32/bf16/f16 tensor (mixed GEMMs: bf16 activations x FP4/FP8 weights).
//
// Numerics: D[m, n] = alpha * sum over K-blocks (sa * sb * sum a*b) with exact dequantization of
// each block (code * block scale is exact in fp32) and fp32 accumulation; for two NVFP4 operands
// with amaxes, alpha is multiplied by amax_a * amax_b * RN(1 / (6*6*448*448)) in fp32, left to
// right, as TransformerEngine's cuBLASLt call does (numerics-te.md §6); with one NVFP4 operand
// (mixed with a dense one), by amax * RN(1 / 2688). An operand quantized with 4over6's bound of
// 256 puts 256 in place of its 448, as TE does.
// A row-scaled NVFP4 operand (row_amaxes) follows TE's general_gemm for it: alpha as above with
// every global amax taken as 1, D = RN(alpha * sum) in fp32, then D[m, n] times the global amaxes:
// RN(D * RN(row_a[m] * b)) when B has one amax or one row (or RN(D * RN(a * row_b[n])) when A
// has), else RN(RN(D * row_a[m]) * row_b[n]); the bias added in fp32, then C (beta 1 only: TE's
// accumulate) added to D rounded to D's dtype.
//
// Which stored data a Linear GEMM reads follows TransformerEngine's layout strings:
// te_gemm_operands(A, B, "TN" | "NN" | "NT") gives the operands of D = op(B) op(A)^T, taking a
// tensor's rowwise data when it is used untransposed along its last dim and columnwise otherwise.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "microscale/quantize.hpp"
#include "microscale/tensor.hpp"

namespace microscale {

/// @brief One GEMM operand, as a logical [rows, K] (or [rows, K, L]) matrix.
struct GemmOperand {
  /// Dense operand: f32/bf16/f16 [rows, K] or [rows, K, L] (any positive strides). Used when
  /// `quantized` is false.
  TensorView dense;

  bool quantized = false;
  Scheme scheme = Scheme::NVFP4;
  /// Codes [rows, K] (one per byte) or [rows, K/2] (FP4), optionally [.., L]: K-major.
  TensorView data;
  /// Block scales: compact [rows, K/block] (or [rows, K/block, L]); or swizzled, one
  /// [roundup(rows,128), roundup(K/block,4)] image per batch, batches contiguous.
  TensorView scales;
  ScaleLayout scale_layout = ScaleLayout::Compact;
  /// NVFP4 global amax (the tensor's S_enc = 2688 / amax); absent = no global scale (e.g. the
  /// GPU MODE interface, whose scales carry everything).
  std::optional<float> amax;
  /// NVFP4 E4M3 bound of that global scale: S_enc = 6 * nvfp4_e4m3_max / amax (256 for 4over6's).
  int nvfp4_e4m3_max = 448;
  /// Row-scaled NVFP4 (QuantizeOptions::row_scaled): f32 [rows], row r's global amax, in place of
  /// `amax`. Not with a batch dim.
  TensorView row_amaxes;
  /// MX columnwise outputs are stored untransposed: data [K, rows] (FP4: [K, rows/2]) with compact
  /// scales [K/block, rows]. Swizzled scales are always those of the logical [rows, K/block].
  bool stored_transposed = false;

  /// @brief A quantized tensor's rowwise or columnwise output as an operand. Rowwise is [M, K];
  /// NVFP4 columnwise is X^T [K, M]; MX columnwise (stored [M, K], blocks along M) is read as its
  /// transpose [K, M].
  static GemmOperand from(const QuantizedTensor& q, Usage usage);
  /// @brief A dense tensor as an operand.
  static GemmOperand from_dense(const TensorView& x);
};

/// @brief What to compute (kept apart from any tuning choice).
struct GemmProblem {
  float alpha = 1.0f;
  float beta = 0.0f;               ///< used when `c` is given
  std::optional<TensorView> c;     ///< [M, N] or [M, N, L], any dtype of D
  std::optional<TensorView> bias;  ///< [N] f32/bf16/f16, added after alpha (and beta*C)
  DType out_dtype = DType::F32;    ///< f32, bf16 or f16
};

/// @brief D = alpha * A B^T (+ beta C) (+ bias) for A [M, K(, L)] and B [N, K(, L)]; D is
/// [M, N] or [M, N, L] with `out_dtype`.
Tensor gemm(const GemmOperand& a, const GemmOperand& b, const GemmProblem& problem = {});

/// @brief The same into a caller's tensor `d` ([M, N(, L)], contiguous or strided, f32/bf16/f16).
void gemm_into(const GemmOperand& a, const GemmOperand& b, const GemmProblem& problem, const TensorView& d);

/// @brief TransformerEngine's general_gemm(A, B, layout): the two operands of D = op(B) op(A)^T.
/// layout[0] says how A is used (T: rowwise, N: columnwise), layout[1] how B is (N: rowwise,
/// T: columnwise). fprop "TN" (W, x): y = x W^T; dgrad "NN" (W, dy): dx = dy W;
/// wgrad "NT" (x, dy): dW = dy^T x. Returns {first, second} for gemm(first, second).
std::pair<GemmOperand, GemmOperand> te_gemm_operands(const QuantizedTensor& a, const QuantizedTensor& b,
                                                     std::string_view layout);

}  // namespace microscale
