// Standalone scale swizzle on the device: compact u8 [R, C] -> the cuBLAS 128x4 layout
// [roundup(R,128), roundup(C,4)], zero padding. One thread per output byte (scales are small).
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"
#include "microscale/layout.hpp"

namespace microscale::cuda {
namespace {

__global__ void swizzle_kernel(const uint8_t* compact, int64_t rows, int64_t cols, uint8_t* out,
                               int64_t total) {
  const int64_t tiles_per_row = (cols + 3) / 4;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tile = o / 512, within = o % 512;
    const int64_t r = (tile / tiles_per_row) * 128 + ((within % 16) / 4) * 32 + within / 16;
    const int64_t c = (tile % tiles_per_row) * 4 + within % 4;
    out[o] = (r < rows && c < cols) ? compact[r * cols + c] : 0;
  }
}

void require_device_u8(const TensorView& t, const char* what) {
  if (t.device != Device::CUDA) throw Error(std::string(what) + " must be a CUDA tensor");
  if (t.dtype != DType::U8) throw Error(std::string(what) + " must be u8");
  if (t.ndim() != 2 || !t.is_contiguous())
    throw Error(std::string(what) + " must be a contiguous 2-D tensor");
  if (t.data == nullptr && t.numel() > 0) throw Error(std::string(what) + " has a null data pointer");
}

}  // namespace

void swizzle_scales(const TensorView& compact, const TensorView& swizzled, void* stream) {
  require_device_u8(compact, "compact scales");
  require_device_u8(swizzled, "swizzled scales");
  const int64_t rows = compact.shape[0], cols = compact.shape[1];
  if (swizzled.shape[0] != swizzled_rows(rows) || swizzled.shape[1] != swizzled_cols(cols)) {
    throw Error("swizzled scales of a " + shape_string(compact.shape) + " matrix must be [" +
                std::to_string(swizzled_rows(rows)) + ", " + std::to_string(swizzled_cols(cols)) + "], got " +
                shape_string(swizzled.shape));
  }
  const int64_t total = swizzled.numel();
  if (total == 0) return;
  const int64_t blocks = (total + 255) / 256;
  swizzle_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0,
                   static_cast<cudaStream_t>(stream)>>>(static_cast<const uint8_t*>(compact.data), rows, cols,
                                                        static_cast<uint8_t*>(swizzled.data), total);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
