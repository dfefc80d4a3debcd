// The expanded path of the CUDA GEMM (cuda.hpp's GemmPath::Expanded): every block-scaled pair
// (NVFP4 x NVFP4, MX x MX), and the fastest route for large NVFP4 shapes:
//
//   codes + block scales --expand_operand--> bf16 copies of A and B, in the codes' stored
//     orientation (workspace)
//     --cuBLAS BF16 GEMM, fp32 accumulation--> D = alpha' * sum, written by cuBLAS (no C, no bias,
//       D contiguous), or an fp32 [L, M, N] in the workspace --launch_gemm_epilogue--> D (+ beta C)
//       (+ bias)
//     [--launch_exact_fallback--> the same result from the codes, when a value did not fit bf16]
//
// Exactness: a code's value times its block scale is what the CPU GEMM multiplies (exact in fp32).
// bf16 has fp32's exponent range and 8 significant bits; such a product has at most 4 (MX: E4M3,
// E2M3) or 6 (NVFP4: E2M1 x E4M3) and is a bf16 value unless it falls below bf16's smallest
// subnormal step, 2^-133: never for NVFP4 (>= 2^-10) or MXFP6/MXFP4 (steps 2^-4..2^-1 times scales
// >= 2^-127); for MXFP8, in blocks whose scale is below 2^-124 (E4M3) or 2^-117 (E5M2), i.e. of
// values below ~2^-115. The copy kernel flags such a value, and the fallback (gemm_fallback.cu)
// then recomputes the result from the codes. The NVFP4 global scales stay in alpha', as on the
// fused path. cuBLAS multiplies bf16 exactly and accumulates in fp32 (CUBLAS_COMPUTE_32F,
// reduced-precision reductions disallowed): exact blocks and fp32 accumulation in the tensor
// cores' order, within the fp32 accumulation bound of the CPU GEMM's result. Why this path for
// NVFP4 too: the fused kernel converts each tile once per output tile it serves and is bound by
// that conversion (docs/perf.md); here each block is converted once, in a pass at memory speed,
// and the tensor cores run cuBLAS's tuned kernels.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "cuda/cuda_check.hpp"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_expanded.hpp"
#include "cuda/gemm_fallback.hpp"
#include "cuda/gemm_operand_values.cuh"
#include "cuda/stream_workspace.hpp"
#include "microscale/error.hpp"

namespace microscale::cuda {
namespace {

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLAS call ") + call + " failed: " + cublasGetStatusString(status));
}

// One cuBLAS handle per device and host thread (handles are not safe to share between threads
// that call at once), made on first use and kept for the process: creating one costs
// milliseconds, and destroying it at exit could run after the driver is gone.
cublasHandle_t cublas_handle() {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  int device = 0;
  MICROSCALE_CUDA_CHECK(cudaGetDevice(&device));
  auto found = handles.find(device);
  if (found != handles.end()) return found->second;
  cublasHandle_t handle = nullptr;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  // Tensor cores for bf16 always; no reduced-precision reductions (the sums stay fp32).
  check_cublas(
      cublasSetMathMode(handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
      "cublasSetMathMode");
  handles.emplace(device, handle);
  return handle;
}

// cuBLAS's own scratch, handed over with each call (cublasSetWorkspace) instead of the handle's
// default, which all streams would share: a call's result then does not depend on what runs on
// other streams, and CUDA graphs capture memory of their own. 32 MiB: cuBLAS's advice for Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Workspace: bf16 A, bf16 B, the control words (alpha' and beta for cuBLAS, the copies' inexact
// flag), cuBLAS's scratch, then the fp32 product (only when the epilogue kernel finishes D; last,
// so a call that needs no product asks for less), each starting on a 256-byte boundary. A copy's
// rows are padded to 16 values (see ExpandedShape), so its size is bounded by L * M16 * K16 * 2.
struct ExpandedLayout {
  size_t a = 0, b = 0, control = 0, cublas = 0, product = 0, total = 0;
};
int64_t round_up16(int64_t x) { return (x + 15) / 16 * 16; }
ExpandedLayout layout_of(int64_t m, int64_t n, int64_t k, int64_t batches) {
  const auto up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  ExpandedLayout l;
  l.b = up(static_cast<size_t>(batches * round_up16(m) * round_up16(k)) * 2);
  l.control = l.b + up(static_cast<size_t>(batches * round_up16(n) * round_up16(k)) * 2);
  l.cublas = l.control + 256;
  l.product = l.cublas + kCublasWorkspaceBytes;
  l.total = l.product + up(static_cast<size_t>(batches * m * n) * sizeof(float));
  return l;
}

// An operand's bf16 copy keeps the stored orientation of its codes: `stored_rows` rows of `cols`
// values, `ld` apart (cols rounded up to 16, so that every row starts 32-byte aligned). K-major:
// [rows, K]; MX columnwise: [K, rows].
struct ExpandedShape {
  int64_t stored_rows, cols, ld;
};
ExpandedShape expanded_shape(const GemmDeviceOperand& op, int64_t rows, int64_t k) {
  return op.stored_transposed ? ExpandedShape{k, rows, round_up16(rows)}
                              : ExpandedShape{rows, k, round_up16(k)};
}

// What the copy kernel reads besides the operand.
struct ExpandParams {
  GemmDeviceOperand op;
  int64_t k;  // the operand's K (for the swizzled scales' row length)
  ExpandedShape shape;
  uint16_t* out;  // [L, stored_rows, ld]
  int* inexact;   // set to 1 where a value is not a bf16 value; null where none can be
};

constexpr int kGroup = 16;  // values per thread and step: one NVFP4 block, half an MX block

// Each CUDA block copies one stored row of one batch (blockIdx.x = l * stored_rows + i: one
// division per block, not per element), each thread 16 values at a time: 16 codes (8 bytes of FP4,
// 16 of the byte formats; one vector load when whole and `VectorLoads`), their scales (one for a
// K-major group, one per value for an MX columnwise row), 16 bf16 values (32 bytes) out. One
// instantiation per scheme, so that each decodes its codes with straight-line code.
template <Scheme S, bool VectorLoads>
__global__ void expand_operand(const __grid_constant__ ExpandParams p) {
  constexpr bool kPacked = S == Scheme::NVFP4 || S == Scheme::MXFP4;
  constexpr int kBlock = S == Scheme::NVFP4 ? 16 : 32;
  // Only MXFP8 values can fall below bf16's smallest step (gemm_fallback.hpp).
  constexpr bool kMayRound = S == Scheme::MXFP8_E4M3 || S == Scheme::MXFP8_E5M2;
  const GemmDeviceOperand& op = p.op;
  const int64_t i = blockIdx.x % p.shape.stored_rows, l = blockIdx.x / p.shape.stored_rows;
  const uint8_t* codes_row = op.data + l * op.batch_bytes + i * op.row_bytes;
  uint16_t* out_row = p.out + (l * p.shape.stored_rows + i) * p.shape.ld;
  bool inexact = false;
  // The bf16 bits of code `code` times `scale`: exact in fp32 (at most 6 significant bits), whose
  // top half is the bf16 value unless it is an fp32 subnormal with bits below bf16's last (a NaN
  // keeps a NaN's top half: CUDA's NaNs are 0x7FFFFFFF).
  const auto bf16_bits = [&inexact](uint32_t code, float scale) {
    const uint32_t u = __float_as_uint(element_value<S>(code) * scale);
    if constexpr (kMayRound) inexact |= (u & 0x7F800000u) == 0 && (u & 0xFFFFu) != 0;
    return u >> 16;
  };
  // K-major: a group lies in one block of row i. MX columnwise: value q is row c0 + q's, of K-block
  // i / kBlock.
  const auto scale_of = [&](int64_t c) {
    return block_scale_value(S, op.stored_transposed ? block_scale_code(op, p.k, kBlock, l, c, i / kBlock)
                                                     : block_scale_code(op, p.k, kBlock, l, i, c / kBlock));
  };
  const auto code_at = [codes_row](int64_t c) -> uint32_t {
    return kPacked ? (codes_row[c / 2] >> (4 * (c % 2))) & 0x0Fu : codes_row[c];
  };
  for (int64_t c0 = static_cast<int64_t>(threadIdx.x) * kGroup; c0 < p.shape.cols;
       c0 += static_cast<int64_t>(blockDim.x) * kGroup) {
    if (c0 + kGroup > p.shape.cols) {  // a row's last, partial group: one value at a time
      for (int64_t c = c0; c < p.shape.cols; ++c)
        out_row[c] = static_cast<uint16_t>(bf16_bits(code_at(c), scale_of(c)));
      continue;
    }
    // A whole group, unrolled (every index known at compile time: the arrays stay in registers).
    uint32_t codes[kGroup];
    if constexpr (VectorLoads && kPacked) {
      const uint2 w = *reinterpret_cast<const uint2*>(codes_row + c0 / 2);
#pragma unroll
      for (int q = 0; q < kGroup; ++q) codes[q] = ((q < 8 ? w.x : w.y) >> (4 * (q % 8))) & 0x0Fu;
    } else if constexpr (VectorLoads) {
      const uint4 w = *reinterpret_cast<const uint4*>(codes_row + c0);
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int q = 0; q < kGroup; ++q) codes[q] = (words[q / 4] >> (8 * (q % 4))) & 0xFFu;
    } else {
#pragma unroll
      for (int q = 0; q < kGroup; ++q) codes[q] = code_at(c0 + q);
    }
    const float group_scale = op.stored_transposed ? 0.0f : scale_of(c0);
    uint32_t packed[kGroup / 2];
#pragma unroll
    for (int q = 0; q < kGroup; q += 2) {
      const uint32_t lo = bf16_bits(codes[q], op.stored_transposed ? scale_of(c0 + q) : group_scale);
      const uint32_t hi = bf16_bits(codes[q + 1], op.stored_transposed ? scale_of(c0 + q + 1) : group_scale);
      packed[q / 2] = lo | (hi << 16);
    }
    uint4* dst = reinterpret_cast<uint4*>(out_row + c0);
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
  if (kMayRound && inexact && p.inexact) *p.inexact = 1;  // every writer writes 1
}

template <Scheme S>
void launch_expand_as(const ExpandParams& p, int64_t batches, cudaStream_t stream) {
  const bool packed = S == Scheme::NVFP4 || S == Scheme::MXFP4;
  const int64_t load = packed ? 8 : 16;  // bytes of one group's codes
  const bool vector_loads =
      aligned(p.op.data, load) && p.op.row_bytes % load == 0 && p.op.batch_bytes % load == 0;
  // One CUDA block per stored row and batch: stored_rows * batches < 2^31 (gridDim.x), checked by
  // the caller.
  const int groups = static_cast<int>(std::min<int64_t>((p.shape.cols + kGroup - 1) / kGroup, 256));
  const int threads = std::max(32, (groups + 31) / 32 * 32);
  const unsigned blocks = static_cast<unsigned>(p.shape.stored_rows * batches);
  if (vector_loads) {
    expand_operand<S, true><<<blocks, threads, 0, stream>>>(p);
  } else {
    expand_operand<S, false><<<blocks, threads, 0, stream>>>(p);
  }
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

void launch_expand(const GemmDeviceOperand& op, int64_t rows, int64_t k, int64_t batches, uint16_t* out,
                   int* inexact, cudaStream_t stream) {
  ExpandParams p{};
  p.op = op;
  p.k = k;
  p.shape = expanded_shape(op, rows, k);
  p.out = out;
  p.inexact = inexact;
  switch (op.scheme) {
    case Scheme::NVFP4: launch_expand_as<Scheme::NVFP4>(p, batches, stream); break;
    case Scheme::MXFP8_E4M3: launch_expand_as<Scheme::MXFP8_E4M3>(p, batches, stream); break;
    case Scheme::MXFP8_E5M2: launch_expand_as<Scheme::MXFP8_E5M2>(p, batches, stream); break;
    case Scheme::MXFP6_E2M3: launch_expand_as<Scheme::MXFP6_E2M3>(p, batches, stream); break;
    case Scheme::MXFP6_E3M2: launch_expand_as<Scheme::MXFP6_E3M2>(p, batches, stream); break;
    case Scheme::MXFP4: launch_expand_as<Scheme::MXFP4>(p, batches, stream); break;
  }
}

// alpha' (the epilogue's, with the device or host amaxes) and beta = 0 for cuBLAS's device
// pointer mode: cuBLAS then writes D = alpha' * sum itself, rounded once.
__global__ void write_alpha_beta(const __grid_constant__ GemmDeviceParams p, float* alpha_beta) {
  alpha_beta[0] = effective_alpha(p);
  alpha_beta[1] = 0.0f;
}

// Whether cuBLAS can write D itself: no C or bias, D contiguous rows of N (batches M * N apart) in a
// dtype cuBLAS writes, and alpha not 0 (cuBLAS may then skip the product, where NaN blocks must
// give NaN). Else the fp32 product goes through launch_gemm_epilogue.
bool cublas_writes_d(const GemmDeviceParams& p) {
  const EpilogueTensor& d = p.d;
  // bf16 inputs give bf16 or f32 outputs (cublasGemmEx's table has no bf16 -> f16).
  return !p.has_c && p.bias == nullptr && p.alpha != 0.0f &&
         (d.dtype == DType::BF16 || d.dtype == DType::F32) && d.strides[1] == 1 && d.strides[0] == p.n &&
         (p.batches == 1 || d.strides[2] == p.m * p.n);
}

cudaDataType cublas_type(DType dtype) { return dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

size_t expanded_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches) {
  return layout_of(m, n, k, batches).total;
}

void launch_expanded_gemm(const GemmDeviceParams& problem, cudaStream_t stream, void* workspace,
                          size_t workspace_bytes) {
  // cuBLAS's int sizes, and the copies' grids of one block per stored row and batch.
  // (Rounded up to 16: the copies' leading dimensions.)
  if (round_up16(std::max({problem.m, problem.n, problem.k})) > INT_MAX / problem.batches)
    throw Error("cuda::gemm: the expanded path takes M * L, N * L and K * L below 2^31");
  const ExpandedLayout layout = layout_of(problem.m, problem.n, problem.k, problem.batches);
  // alpha' on the host where no amax is on the device (MX; NVFP4 amaxes given by value): cuBLAS
  // then takes it by value, and a zero alpha' goes through the epilogue kernel (NaN blocks).
  const bool alpha_on_host = problem.a.amax == nullptr && problem.b.amax == nullptr;
  const float host_alpha = alpha_on_host ? effective_alpha(problem) : 0.0f;
  const bool direct = cublas_writes_d(problem) && !(alpha_on_host && host_alpha == 0.0f);
  const StreamWorkspace scratch(direct ? layout.product : layout.total, workspace, workspace_bytes, stream);
  auto* a16 = reinterpret_cast<uint16_t*>(scratch.data() + layout.a);
  auto* b16 = reinterpret_cast<uint16_t*>(scratch.data() + layout.b);
  auto* product = reinterpret_cast<float*>(scratch.data() + layout.product);
  auto* alpha_beta = reinterpret_cast<float*>(scratch.data() + layout.control);
  // The copies' flag, only where a value may not fit bf16 (MXFP8 operands).
  const bool fallback = may_not_fit_bf16(problem.a) || may_not_fit_bf16(problem.b);
  int* inexact = fallback ? reinterpret_cast<int*>(scratch.data() + layout.control + 16) : nullptr;
  if (fallback) MICROSCALE_CUDA_CHECK(cudaMemsetAsync(inexact, 0, sizeof(int), stream));
  launch_expand(problem.a, problem.m, problem.k, problem.batches, a16, inexact, stream);
  launch_expand(problem.b, problem.n, problem.k, problem.batches, b16, inexact, stream);

  // Row-major D [M, N] = A [M, K] B [N, K]^T is column-major D^T [N, M] = op(B) op(A). A K-major
  // copy [rows, K] is column-major K x rows (op T for B, op N for A, ld = K); an MX columnwise
  // copy [K, rows] is column-major rows x K (op N for B, op T for A, ld = rows rounded up).
  const ExpandedShape sa = expanded_shape(problem.a, problem.m, problem.k);
  const ExpandedShape sb = expanded_shape(problem.b, problem.n, problem.k);
  const cublasOperation_t op_a = problem.a.stored_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = problem.b.stored_transposed ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int m = static_cast<int>(problem.m), n = static_cast<int>(problem.n), k = static_cast<int>(problem.k);
  cublasHandle_t handle = cublas_handle();
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");  // resets the workspace: set it after
  check_cublas(cublasSetWorkspace(handle, scratch.data() + layout.cublas, kCublasWorkspaceBytes),
               "cublasSetWorkspace");
  const auto multiply = [&](const float* alpha, const float* beta, void* out, cudaDataType out_type) {
    check_cublas(cublasGemmStridedBatchedEx(
                     handle, op_b, op_a, n, m, k, alpha, b16, CUDA_R_16BF, static_cast<int>(sb.ld),
                     sb.stored_rows * sb.ld, a16, CUDA_R_16BF, static_cast<int>(sa.ld),
                     sa.stored_rows * sa.ld, beta, out, out_type, n, problem.m * problem.n,
                     static_cast<int>(problem.batches), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
  };
  const float one = 1.0f, zero = 0.0f;
  if (direct && alpha_on_host) {
    check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    multiply(&host_alpha, &zero, problem.d.data, cublas_type(problem.d.dtype));
  } else if (direct) {
    // Note: D = alpha' * sum with alpha' from the device; a device amax of 0 makes alpha' 0, which
    // may let cuBLAS skip the product, so NaN codes' blocks give 0 here where the epilogue kernel
    // gives NaN.
    write_alpha_beta<<<1, 1, 0, stream>>>(problem, alpha_beta);
    MICROSCALE_CUDA_CHECK(cudaGetLastError());
    check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE), "cublasSetPointerMode");
    multiply(alpha_beta, alpha_beta + 1, problem.d.data, cublas_type(problem.d.dtype));
  }
  if (direct) {
    if (fallback) launch_exact_fallback(problem, inexact, true, stream);
    return;
  }
  check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  multiply(&one, &zero, product, CUDA_R_32F);
  GemmDeviceParams p = problem;
  p.splits = 1;
  p.workspace = product;
  if (fallback) launch_exact_fallback(p, inexact, false, stream);
  launch_gemm_epilogue(p, stream);
}

}  // namespace microscale::cuda
