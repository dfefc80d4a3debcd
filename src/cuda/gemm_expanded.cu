// The expanded path of the NVFP4 GEMM (cuda.hpp's GemmPath::Expanded), for large shapes:
//
//   codes + E4M3 scales --expand_nvfp4--> bf16 A [L, M, K] and B [L, N, K] (workspace)
//     --cuBLAS BF16 GEMM, fp32 accumulation--> D = alpha' * sum, written by cuBLAS (no C, no bias,
//       D contiguous), or an fp32 [L, M, N] in the workspace --launch_gemm_epilogue--> D (+ beta C)
//       (+ bias)
//
// Exactness: an E2M1 value (at most 2 significant bits) times an E4M3 scale (at most 4) has at most
// 6 significant bits and lies within [2^-10, 6 * 448], so bf16 (8 significant bits, fp32's range)
// holds every product exactly; the global scales stay in alpha', as on the fused path. cuBLAS
// multiplies bf16 exactly and accumulates in fp32 (CUBLAS_COMPUTE_32F, reduced-precision
// reductions disallowed), so the numerics are the fused kernel's: exact blocks, fp32 sums in some
// order. Why a second path: the fused kernel converts each tile once per output tile it serves and
// is bound by that conversion (docs/perf.md); here each block is converted once, in a pass at
// memory speed, and the tensor cores run cuBLAS's tuned kernels.
#include <cublas_v2.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "cuda/cuda_check.hpp"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_nvfp4.hpp"
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

// Workspace: bf16 A, bf16 B, alpha' and beta for cuBLAS, cuBLAS's scratch, then the fp32 product
// (only when the epilogue kernel finishes D; last, so a call that needs no product asks for
// less), each starting on a 256-byte boundary.
struct ExpandedLayout {
  size_t a = 0, b = 0, alpha_beta = 0, cublas = 0, product = 0, total = 0;
};
ExpandedLayout layout_of(int64_t m, int64_t n, int64_t k, int64_t batches) {
  const auto up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  ExpandedLayout l;
  l.b = up(static_cast<size_t>(batches * m * k) * 2);
  l.alpha_beta = l.b + up(static_cast<size_t>(batches * n * k) * 2);
  l.cublas = l.alpha_beta + 256;
  l.product = l.cublas + kCublasWorkspaceBytes;
  l.total = l.product + up(static_cast<size_t>(batches * m * n) * sizeof(float));
  return l;
}

// e2m1 magnitude bits (3) -> the fp32 bit pattern of its value: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ uint32_t e2m1_float_bits(uint32_t magnitude) {
  if (magnitude < 2) return magnitude == 0 ? 0u : 0x3F000000u;          // 0 and the subnormal 0.5
  const uint32_t exponent = magnitude >> 1, mantissa = magnitude & 1u;  // (1 + m/2) * 2^(e - 1)
  return ((exponent + 126u) << 23) | (mantissa << 22);
}

// Each CUDA block expands one row of one batch (blockIdx.x = l * rows + row; one division per
// block, not per element), each thread a 16-code block at a time: 8 bytes of codes and its E4M3
// scale -> 16 bf16 values (32 bytes) of out [L, rows, K], contiguous.
__global__ void expand_nvfp4(const __grid_constant__ Nvfp4GemmOperand op, int64_t rows, int64_t k,
                             uint16_t* out) {
  const int64_t row = blockIdx.x % rows, l = blockIdx.x / rows;
  const uint8_t* codes_row = op.data + l * op.batch_bytes + row * op.row_bytes;
  const uint8_t* scales = op.scales + l * op.scale_batch_bytes;
  // The row's scales: compact [rows, K/16], or the 128x4 swizzled image (512-byte atoms, K/64 of them
  // per 128-row band).
  const int64_t scale_row = op.swizzled
                                ? (row / 128) * (k / 64) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4
                                : row * op.scale_row_bytes;
  uint16_t* out_row = out + (l * rows + row) * k;
  for (int j = static_cast<int>(threadIdx.x); j < k / 16; j += static_cast<int>(blockDim.x)) {
    const uint2 codes = *reinterpret_cast<const uint2*>(codes_row + j * 8);
    const uint8_t scale_code = scales[scale_row + (op.swizzled ? (j / 4) * 512 + j % 4 : j)];
    const float scale = __half2float(__half(__nv_cvt_fp8_to_halfraw(scale_code, __NV_E4M3)));
    uint32_t packed[8];
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      const uint32_t word = q < 8 ? codes.x : codes.y;
      const uint32_t code = (word >> (4 * (q % 8))) & 0xFu;
      // Exact (see the file comment): the fp32 product's low 16 bits are zero, so its top half is
      // the bf16 value. The sign is the code's (a negative zero stays negative).
      const float value = __uint_as_float(e2m1_float_bits(code & 7u)) * scale;
      const uint32_t bits = (__float_as_uint(value) >> 16) ^ ((code & 8u) << 12);
      packed[q / 2] = q % 2 ? packed[q / 2] | (bits << 16) : bits;
    }
    uint4* dst = reinterpret_cast<uint4*>(out_row + j * 16);
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
}

void launch_expand(const Nvfp4GemmOperand& op, int64_t rows, int64_t k, int64_t batches, uint16_t* out,
                   cudaStream_t stream) {
  // One CUDA block per row and batch: rows * batches < 2^31 (gridDim.x), checked by the caller.
  const int threads = static_cast<int>(std::min<int64_t>(k / 16, 256));
  expand_nvfp4<<<static_cast<unsigned>(rows * batches), threads, 0, stream>>>(op, rows, k, out);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

// alpha' (the epilogue's, with the device or host amaxes) and beta = 0 for cuBLAS's device
// pointer mode: cuBLAS then writes D = alpha' * sum itself, rounded once.
__global__ void write_alpha_beta(const __grid_constant__ Nvfp4GemmParams p, float* alpha_beta) {
  alpha_beta[0] = effective_alpha(p);
  alpha_beta[1] = 0.0f;
}

// Whether cuBLAS can write D itself: no C or bias, D contiguous rows of N (batches M * N apart) in a
// dtype cuBLAS writes. Else the fp32 product goes through launch_gemm_epilogue.
bool cublas_writes_d(const Nvfp4GemmParams& p) {
  const EpilogueTensor& d = p.d;
  // bf16 inputs give bf16 or f32 outputs (cublasGemmEx's table has no bf16 -> f16).
  return !p.has_c && p.bias == nullptr && (d.dtype == DType::BF16 || d.dtype == DType::F32) &&
         d.strides[1] == 1 && d.strides[0] == p.n && (p.batches == 1 || d.strides[2] == p.m * p.n);
}

cudaDataType cublas_type(DType dtype) { return dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

size_t expanded_nvfp4_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches) {
  return layout_of(m, n, k, batches).total;
}

void launch_expanded_nvfp4_gemm(const Nvfp4GemmParams& problem, cudaStream_t stream, void* workspace,
                                size_t workspace_bytes) {
  // cuBLAS's int sizes, and the expansion's grid of one block per row and batch.
  if (problem.m * problem.batches > INT_MAX || problem.n * problem.batches > INT_MAX || problem.k > INT_MAX)
    throw Error("cuda::gemm: the expanded path takes M * L, N * L and K below 2^31");
  const ExpandedLayout layout = layout_of(problem.m, problem.n, problem.k, problem.batches);
  const bool direct = cublas_writes_d(problem);
  const StreamWorkspace scratch(direct ? layout.product : layout.total, workspace, workspace_bytes, stream);
  auto* a16 = reinterpret_cast<uint16_t*>(scratch.data() + layout.a);
  auto* b16 = reinterpret_cast<uint16_t*>(scratch.data() + layout.b);
  auto* product = reinterpret_cast<float*>(scratch.data() + layout.product);
  launch_expand(problem.a, problem.m, problem.k, problem.batches, a16, stream);
  launch_expand(problem.b, problem.n, problem.k, problem.batches, b16, stream);

  // Row-major D [M, N] = A [M, K] B [N, K]^T is column-major D^T [N, M] = op(B) op(A) with B
  // transposed: cuBLAS's "TN", lda = ldb = K.
  const int m = static_cast<int>(problem.m), n = static_cast<int>(problem.n), k = static_cast<int>(problem.k);
  cublasHandle_t handle = cublas_handle();
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");  // resets the workspace: set it after
  check_cublas(cublasSetWorkspace(handle, scratch.data() + layout.cublas, kCublasWorkspaceBytes),
               "cublasSetWorkspace");
  const auto multiply = [&](const float* alpha, const float* beta, void* out, cudaDataType out_type) {
    check_cublas(
        cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, alpha, b16, CUDA_R_16BF, k,
                                   problem.n * problem.k, a16, CUDA_R_16BF, k, problem.m * problem.k, beta,
                                   out, out_type, n, problem.m * problem.n, static_cast<int>(problem.batches),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  };
  if (direct) {
    // Note: D = alpha' * sum with alpha' from the device; a zero alpha' (alpha = 0 or an amax of
    // 0) may let cuBLAS skip the product, so NaN codes' blocks give 0 here where the epilogue
    // kernel gives NaN.
    auto* alpha_beta = reinterpret_cast<float*>(scratch.data() + layout.alpha_beta);
    write_alpha_beta<<<1, 1, 0, stream>>>(problem, alpha_beta);
    MICROSCALE_CUDA_CHECK(cudaGetLastError());
    check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE), "cublasSetPointerMode");
    multiply(alpha_beta, alpha_beta + 1, problem.d.data, cublas_type(problem.d.dtype));
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  multiply(&one, &zero, product, CUDA_R_32F);
  Nvfp4GemmParams p = problem;
  p.splits = 1;
  p.workspace = product;
  launch_gemm_epilogue(p, stream);
}

}  // namespace microscale::cuda
