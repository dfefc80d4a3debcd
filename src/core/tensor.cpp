// TensorView / Tensor basics and their argument checks.
#include "microscale/tensor.hpp"

#include <cstdint>
#include <limits>

#include "core/buffer_pool.hpp"
#include "microscale/error.hpp"

namespace microscale {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16:
    case DType::F16: return 2;
    case DType::U8: return 1;
  }
  throw Error("unknown dtype id " + std::to_string(static_cast<int>(dtype)));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::U8: return "u8";
  }
  throw Error("unknown dtype id " + std::to_string(static_cast<int>(dtype)));
}

namespace {
// Product of the dims, with an error instead of overflow or a negative dim; with
// `element_bytes`, also when the byte count numel * element_bytes would overflow.
int64_t checked_numel(const std::vector<int64_t>& shape, int64_t element_bytes = 1) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("negative dimension in shape " + shape_string(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      throw Error("shape " + shape_string(shape) + " has too many elements");
    }
    n *= d;
  }
  if (n > std::numeric_limits<int64_t>::max() / element_bytes) {
    throw Error("shape " + shape_string(shape) + " has too many bytes");
  }
  return n;
}
}  // namespace

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorView TensorView::from_buffer(const void* data, size_t size_bytes, DType dtype,
                                   std::vector<int64_t> shape) {
  const int64_t n = checked_numel(shape, static_cast<int64_t>(dtype_size(dtype)));
  if (data == nullptr && n > 0) throw Error("null data pointer for shape " + shape_string(shape));
  const size_t needed = static_cast<size_t>(n) * dtype_size(dtype);
  if (size_bytes < needed) {
    throw Error("buffer of " + std::to_string(size_bytes) + " bytes is too short for " +
                std::string(dtype_name(dtype)) + " " + shape_string(shape) + " (needs " +
                std::to_string(needed) + ")");
  }
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.shape = std::move(shape);
  return v;
}

int64_t TensorView::numel() const { return checked_numel(shape); }

std::vector<int64_t> TensorView::effective_strides() const {
  if (!strides.empty()) {
    if (strides.size() != shape.size()) {
      throw Error("strides " + shape_string(strides) + " do not match shape " + shape_string(shape));
    }
    return strides;
  }
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = ndim() - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

bool TensorView::is_contiguous() const {
  if (strides.empty()) return true;
  std::vector<int64_t> s = effective_strides();
  int64_t expected = 1;
  for (int64_t i = ndim() - 1; i >= 0; --i) {
    if (shape[i] != 1 && s[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : Tensor(dtype, std::move(shape), true) {}

Tensor Tensor::uninitialized(DType dtype, std::vector<int64_t> shape) {
  return Tensor(dtype, std::move(shape), false);
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape, bool zeroed)
    : dtype_(dtype), shape_(std::move(shape)) {
  const size_t bytes = static_cast<size_t>(checked_numel(shape_, static_cast<int64_t>(dtype_size(dtype_)))) *
                       dtype_size(dtype_);
  // Data 64-byte aligned (a cache line, a ZMM register): the quantizers write whole output lines.
  // NOTE: a plain buffer plus an offset, not aligned new: glibc serves large aligned allocations
  // with fresh pages every time (page faults measured at ~40 % of a 4096 x 4096 quantize); and
  // large buffers from zeroed_buffer's pool, which reuses them (buffer_pool.hpp says why).
  constexpr size_t kAlignment = 64;
  const std::shared_ptr<std::byte[]> owner =
      zeroed ? detail::zeroed_buffer(bytes + kAlignment) : detail::uninitialized_buffer(bytes + kAlignment);
  const size_t offset = (kAlignment - reinterpret_cast<uintptr_t>(owner.get()) % kAlignment) % kAlignment;
  storage_ = std::shared_ptr<std::byte[]>(owner, owner.get() + offset);
}

int64_t Tensor::numel() const { return checked_numel(shape_); }

TensorView Tensor::view() const {
  TensorView v;
  v.data = const_cast<void*>(data());
  v.dtype = dtype_;
  v.shape = shape_;
  return v;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  if (checked_numel(shape) != numel()) {
    throw Error("cannot reshape " + shape_string(shape_) + " to " + shape_string(shape));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

}  // namespace microscale
