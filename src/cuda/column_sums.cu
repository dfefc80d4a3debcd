// microscale::cuda::column_sums: the sums over the rows of a device matrix, as the Linear's bias
// gradient needs them (core/linear.cpp's column_sums: in double, rounded once to fp32), without
// the float64 copy of the matrix a torch reduction with dtype=float64 makes first.
//
// Deterministic: the rows are cut into fixed chunks, each chunk's float64 sums written apart,
// and a second kernel adds a column's chunks in chunk order, so the result does not depend on how
// the blocks were scheduled. The sum is a float64 sum in another order than the CPU's row after
// row: equal after the rounding to fp32 but for ties and near-ties (one fp32 ulp at most).
#include <algorithm>
#include <cstdint>

#include "core/input_matrix.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/stream_workspace.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"

namespace microscale::cuda {
namespace {

constexpr int kColumnsPerBlock = 256;  // one column per thread: a row's loads are coalesced
constexpr int64_t kMaxChunks = 64;     // enough blocks to fill the GPU for a few thousand columns

// partial[chunk, col] = the float64 sum of x[rows of `chunk`, col].
template <typename T>
__global__ void chunk_column_sums(const __grid_constant__ DeviceMatrix x, int64_t rows_per_chunk,
                                  double* partial) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  if (col >= x.cols) return;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(x.rows, first + rows_per_chunk);
  double sum = 0.0;
#pragma unroll 8  // several rows' loads in flight per thread: the adds wait, the loads need not
  for (int64_t r = first; r < last; ++r) sum += Elem<T>::load(x.data, r * x.row_stride + col * x.col_stride);
  partial[blockIdx.y * x.cols + col] = sum;
}

// out[col] = fp32(the chunks' sums added in chunk order).
__global__ void finish_column_sums(const double* partial, int64_t chunks, int64_t cols, float* out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  if (col >= cols) return;
  double sum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) sum += partial[c * cols + col];
  out[col] = static_cast<float>(sum);
}

// Chunks of at least 32 rows; at most kMaxChunks of them (and so at most 65535: gridDim.y).
int64_t rows_per_chunk_of(int64_t rows) {
  return std::max<int64_t>(32, (rows + kMaxChunks - 1) / kMaxChunks);
}

// The partial sums' bytes: a float64 per chunk and column.
size_t partial_bytes(int64_t rows, int64_t cols) {
  const int64_t per_chunk = rows_per_chunk_of(rows);
  return static_cast<size_t>((rows + per_chunk - 1) / per_chunk * cols) * sizeof(double);
}

}  // namespace

size_t column_sums_workspace_bytes(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw Error("column_sums_workspace_bytes: sizes must be >= 0");
  return partial_bytes(rows, cols);
}

void column_sums(const TensorView& x, const TensorView& out, void* stream_handle, void* workspace,
                 size_t workspace_bytes) {
  const InputMatrix m = make_input_matrix(x, Device::CUDA);
  if (out.device != Device::CUDA || out.dtype != DType::F32 || !out.is_contiguous() || out.data == nullptr)
    throw Error("column_sums: the output must be a contiguous f32 CUDA tensor");
  if (out.numel() != m.cols)
    throw Error("column_sums: the output has " + std::to_string(out.numel()) + " elements, the input " +
                std::to_string(m.cols) + " columns");
  const DeviceMatrix d = device_matrix(m);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const int64_t rows_per_chunk = rows_per_chunk_of(m.rows);
  const int64_t chunks = (m.rows + rows_per_chunk - 1) / rows_per_chunk;
  const int64_t column_blocks = (m.cols + kColumnsPerBlock - 1) / kColumnsPerBlock;
  if (column_blocks > 0x7FFFFFFF) throw Error("column_sums: too many columns for one launch");
  // The caller's scratch when it is large enough (a PyTorch frontend's allocator: reused at no cost),
  // else the stream-ordered pool's, whose allocations cost ~100 us of host time where the pool
  // returned its memory at the last synchronization (its default release threshold).
  const StreamWorkspace partial(partial_bytes(m.rows, m.cols), workspace, workspace_bytes, stream);
  auto* sums = reinterpret_cast<double*>(partial.data());
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks));
  switch (m.dtype) {
    case DType::BF16:
      chunk_column_sums<Bf16><<<grid, kColumnsPerBlock, 0, stream>>>(d, rows_per_chunk, sums);
      break;
    case DType::F16:
      chunk_column_sums<F16><<<grid, kColumnsPerBlock, 0, stream>>>(d, rows_per_chunk, sums);
      break;
    default: chunk_column_sums<float><<<grid, kColumnsPerBlock, 0, stream>>>(d, rows_per_chunk, sums); break;
  }
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
  finish_column_sums<<<static_cast<unsigned>(column_blocks), kColumnsPerBlock, 0, stream>>>(
      sums, chunks, m.cols, static_cast<float*>(out.data));
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
