// microscale/cuda.hpp — the CUDA backend (sm_90a, Hopper): quantize, dequantize, swizzle and the
// block-scaled GEMM (NVFP4 and MX) on the device, into buffers the caller allocated (a PyTorch
// frontend passes its allocator's tensors).
//
// Same numerics as the CPU backend: byte for byte for quantization (data, scales, amaxes,
// stochastic rounding); the GEMM within the fp32 accumulation bound of the CPU's result (equal
// where every partial sum is exact: the tensor cores' fp32 sums are not IEEE adds in a fixed order).
// Every call is asynchronous on `stream` (a cudaStream_t; nullptr = the legacy default stream);
// arguments are checked on the host before anything is launched, and launch failures throw
// microscale::Error. No managed memory; the only allocation is the GEMM's workspace when the caller
// passes none (see cuda::gemm).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "microscale/gemm.hpp"
#include "microscale/quantize.hpp"
#include "microscale/tensor.hpp"

namespace microscale::cuda {

/// @brief Caller-allocated device outputs of a quantization (u8, contiguous, Device::CUDA),
/// shaped as quantized_shapes(input.shape, options) gives them. Outputs not asked for are ignored.
struct QuantizedViews {
  TensorView rowwise_data, rowwise_scale;
  TensorView columnwise_data, columnwise_scale;
  /// NVFP4: device fp32 [2] = {rowwise amax, columnwise amax} (written by quantize, read by
  /// dequantize); the override from the options when given. Unused for MX (may be null).
  /// Row-scaled NVFP4: fp32 [2 + M + K] = {the largest of each, the M amaxes of X's rows, the K of
  /// X^T's rows} (the torch frontend's QuantizedTensor.amax).
  float* amax = nullptr;
};

/// @brief Quantizes a device tensor; bit-exact with microscale::quantize_ref.
void quantize(const TensorView& input, const QuantizeOptions& options, const QuantizedViews& outputs,
              void* stream);

/// @brief Dequantizes one usage of `q` (quantized from an input of `shape` with `options`) into
/// `output` (device, contiguous, f32/bf16/f16): [M, K], or for NVFP4 columnwise X^T [K, M].
/// Same values as microscale::dequantize.
void dequantize(const QuantizedViews& q, const std::vector<int64_t>& shape, const QuantizeOptions& options,
                Usage usage, const TensorView& output, void* stream);

/// @brief Compact u8 [R, C] -> the 128x4 swizzled layout u8 [roundup(R,128), roundup(C,4)] (zero
/// padding), both on the device.
void swizzle_scales(const TensorView& compact, const TensorView& swizzled, void* stream);

/// @brief How cuda::gemm runs. All give the same numerics (exact blocks, fp32 accumulation):
/// - Fused: one kernel converts each tile of codes to fp16 in shared memory and multiplies it
///   with wgmma (src/cuda/gemm_nvfp4.cu); no copy of the operands. NVFP4 pairs whose K is a
///   multiple of 64 only. Best where M or N is small but M is not tiny.
/// - Skinny: for few rows of A (decode: a handful of tokens against a weight B), one kernel that
///   converts its share of the codes in registers and multiplies with mma.sync, reading B once
///   per 8, 16 or 32 rows of A (M <= 8, <= 16, more). NVFP4 pairs whose K is a multiple of 32
///   (src/cuda/gemm_nvfp4_skinny.cu) and K-major MXFP8 pairs, E4M3 or E5M2 either way
///   (src/cuda/gemm_mx_skinny.cu: each 32-value block multiplied apart and added to the fp32 sums
///   times its two E8M0 scales); any M, but meant for M <= 32.
/// - Expanded: the operands' blocks are written out once as exact bf16 values (codes times block
///   scales; the NVFP4 global scales stay in alpha), and cuBLAS multiplies them with fp32
///   accumulation. cuBLAS writes D itself (alpha' by value, or from the device when an amax is
///   there) when there is no C or bias and D is contiguous bf16 or f32; otherwise it writes an
///   fp32 [L, M, N] and the epilogue kernel applies alpha', C and the bias
///   (src/cuda/gemm_expanded.cu). One exception to the CPU's numerics there: when alpha' comes
///   from the device and is 0 (an amax of 0 on the device), cuBLAS may skip the product, so a
///   block with a NaN scale gives 0, not NaN (quantize never makes both: an amax of 0 means a
///   tensor of zeros). MXFP8 values below bf16's range
///   (blocks of values below ~2^-115) are caught on the device, and a slow exact kernel then
///   recomputes the result (src/cuda/gemm_fallback.cu). Needs workspace for the copies and M, N,
///   K times L below 2^31; takes every pair; fastest for large shapes.
/// - Auto: the skinny kernel where it takes the pair (layouts included) and M <= 32
///   (kSkinnyMaxRows); else the fused kernel where it takes the pair and M or N is below 512
///   (prefer_expanded_gemm in src/cuda/gemm_split.hpp) or the expanded path's sizes would not
///   hold; else the expanded path.
enum class GemmPath { Auto, Fused, Expanded, Skinny };

/// @brief D = alpha * A B^T (+ beta C) (+ bias) on the device, for two block-scaled operands of
/// one block size: NVFP4 x NVFP4, or MX x MX of any element formats (e.g. MXFP8 E4M3 x E5M2), as
/// GemmOperand::from gives them (K-major codes, or MX columnwise outputs stored transposed;
/// compact or swizzled scales; optionally batched).
/// The numerics of microscale::gemm: each block dequantized exactly, fp32 accumulation, alpha
/// times amax_a * amax_b / (6*6*448*448) when both NVFP4 operands carry an amax, times amax / 2688
/// when one does. An operand's amax is
/// either its host value (GemmOperand::amax) or a device float (`a_amax` / `b_amax`, e.g. the
/// QuantizedViews::amax entry of the usage); a row-scaled operand (GemmOperand::row_amaxes) is
/// refused: run it with unit amaxes into fp32 and apply microscale::gemm's outer scales after (the
/// torch frontend's gemm does). D, C and bias are device tensors (f32/bf16/f16; D
/// and C [M, N(, L)] with any positive strides, bias [N] contiguous); problem.out_dtype is
/// ignored (D's dtype rules); C is D itself or apart from it. Codes need contiguous stored rows;
/// L <= 65535 and M <= 65535 * 128 (Skinny: M <= 65535 * 32). The fused and skinny paths also need
/// rows and batches of codes 16-byte aligned; the fused path compact scale rows and batches 4-byte
/// aligned or swizzled scales 16-byte aligned, the skinny path both 2-byte aligned; for MXFP8 also
/// compact scale rows of an even number of scales (K % 64 == 0; swizzled scales take any K) and a
/// batch's codes and scales within 2 GiB. (The MX skinny kernel multiplies the scales exactly:
/// where the CPU GEMM's fp32 value code * scale would overflow, a scale above ~2^112 that no
/// quantizer writes, it gives the finite product instead of Inf.)
/// Anything else throws microscale::Error. One difference from the CPU GEMM: a byte of a 6-bit
/// format with its high bits set (no code) reads as NaN here, where the CPU GEMM throws.
///
/// The fused and skinny paths split K over several blocks when their output tiles are too few to
/// fill the GPU (e.g. M = 128) and add their fp32 sums in a second kernel (in a fixed order); the
/// expanded path needs room for the bf16 copies and the fp32 product. Each takes `workspace` (device
/// memory of `workspace_bytes`, 256-byte aligned) when it holds gemm_workspace_bytes(M, N, K, L,
/// path, scheme) bytes, otherwise memory from the stream-ordered pool (cudaMallocAsync, freed on
/// the stream).
void gemm(const GemmOperand& a, const GemmOperand& b, const GemmProblem& problem, const TensorView& d,
          void* stream, const float* a_amax = nullptr, const float* b_amax = nullptr,
          void* workspace = nullptr, size_t workspace_bytes = 0, GemmPath path = GemmPath::Auto);

/// @brief Bytes of workspace cuda::gemm uses for D [M, N(, L)] = A [M, K] B [N, K]^T of operands
/// of `scheme` (A's) on the current device along `path` (0: none): enough for any layout, C,
/// bias and D (the expanded path uses less when cuBLAS writes D itself). Pass the scheme for MX
/// operands: under Auto the NVFP4 default may answer for the fused or skinny path, whose workspace
/// is smaller (the call would then take memory from the stream-ordered pool). Under Auto the answer
/// assumes layouts the fused and skinny kernels read; operands they cannot read go to the expanded
/// path, which then takes its workspace from the pool.
size_t gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches = 1,
                            GemmPath path = GemmPath::Auto, Scheme scheme = Scheme::NVFP4);

/// @brief out[j] = the sum over the rows of x [rows, cols] (f32/bf16/f16 on the device, leading
/// dims folded into rows, any positive strides) of column j, in float64, rounded once to fp32
/// (out: a contiguous f32 [cols] on the device): the Linear's bias gradient, as core/linear.cpp
/// computes it, without a float64 copy of x. Deterministic (fixed chunks of rows, added in
/// order); within one fp32 ulp of the CPU's row-by-row float64 sum. Scratch: `workspace` (device
/// memory of column_sums_workspace_bytes, 256-byte aligned) when given; a workspace that is absent,
/// smaller or misaligned falls back to the stream-ordered pool's (an allocation that can cost ~100
/// us of host time per call).
void column_sums(const TensorView& x, const TensorView& out, void* stream, void* workspace = nullptr,
                 size_t workspace_bytes = 0);

/// @brief Bytes of scratch column_sums uses for an x of [rows, cols] (rows: the leading dims folded).
size_t column_sums_workspace_bytes(int64_t rows, int64_t cols);

/// @brief Visible CUDA devices (0 without a driver or device).
int device_count();

}  // namespace microscale::cuda
