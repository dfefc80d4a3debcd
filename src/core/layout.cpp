// Scale swizzle / unswizzle on the host (the reference for the CUDA versions).
#include "microscale/layout.hpp"

#include "microscale/error.hpp"

namespace microscale {

namespace {
void require_u8_contiguous_2d(const TensorView& v, const char* what) {
  if (v.dtype != DType::U8)
    throw Error(std::string(what) + " must be u8, got " + std::string(dtype_name(v.dtype)));
  if (v.ndim() != 2) throw Error(std::string(what) + " must be 2-D, got " + shape_string(v.shape));
  if (!v.is_contiguous()) throw Error(std::string(what) + " must be contiguous");
  const int64_t n = v.numel();  // throws for a negative or overflowing shape
  if (v.data == nullptr && n > 0) throw Error(std::string(what) + " has a null data pointer");
}

// Bytes of the swizzled image of a [rows, cols] scale matrix, or an error where that overflows.
int64_t swizzled_bytes(int64_t rows, int64_t cols) {
  constexpr int64_t kLimit = int64_t{1} << 40;  // far beyond any scale matrix; keeps the math exact
  if (rows < 0 || cols < 0 || rows > kLimit || cols > kLimit) {
    throw Error("scale matrix shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                "] is out of range");
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(swizzled_rows(rows), swizzled_cols(cols), &bytes)) {
    throw Error("scale matrix shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                "] is too large");
  }
  return bytes;
}
}  // namespace

Tensor swizzle_scales(const TensorView& compact) {
  require_u8_contiguous_2d(compact, "compact scales");
  const int64_t rows = compact.shape[0], cols = compact.shape[1];
  swizzled_bytes(rows, cols);  // range check
  Tensor out(DType::U8, {swizzled_rows(rows), swizzled_cols(cols)});
  const auto* src = static_cast<const uint8_t*>(compact.data);
  auto* dst = out.data_as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[swizzled_offset(r, c, cols)] = src[r * cols + c];
  }
  return out;
}

Tensor unswizzle_scales(const TensorView& swizzled, int64_t rows, int64_t cols) {
  const int64_t needed = swizzled_bytes(rows, cols);
  if (swizzled.dtype != DType::U8) throw Error("swizzled scales must be u8");
  if (!swizzled.is_contiguous()) throw Error("swizzled scales must be contiguous");
  if (swizzled.numel() != needed) {
    throw Error("swizzled scales hold " + std::to_string(swizzled.numel()) + " bytes; a [" +
                std::to_string(rows) + ", " + std::to_string(cols) + "] scale matrix needs " +
                std::to_string(needed));
  }
  if (swizzled.data == nullptr && needed > 0) throw Error("swizzled scales have a null data pointer");
  Tensor out(DType::U8, {rows, cols});
  const auto* src = static_cast<const uint8_t*>(swizzled.data);
  auto* dst = out.data_as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[swizzled_offset(r, c, cols)];
  }
  return out;
}

}  // namespace microscale
