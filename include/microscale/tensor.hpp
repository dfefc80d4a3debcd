// microscale/tensor.hpp — a non-owning TensorView and an owning host Tensor.
//
// The library's entry points take TensorViews (dtype, shape, strides in elements, device,
// pointer), so callers hand over memory they own (a torch tensor, a numpy array, an mmapped file)
// without copies. Results come back as Tensors, which own host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace microscale {

/// @brief Element types a TensorView can hold.
enum class DType : uint8_t { F32, BF16, F16, U8 };

/// @brief Bytes per element.
size_t dtype_size(DType dtype);
/// @brief "f32", "bf16", "f16", "u8".
std::string_view dtype_name(DType dtype);

enum class Device : uint8_t { CPU, CUDA };

/// @brief A strided, non-owning view of memory.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  ///< in elements; empty means contiguous (row-major)
  Device device = Device::CPU;

  /// @brief A contiguous view of a buffer of `size_bytes`; throws if the shape needs more bytes.
  static TensorView from_buffer(const void* data, size_t size_bytes, DType dtype, std::vector<int64_t> shape);

  int64_t numel() const;
  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  /// @brief Strides in elements (the contiguous ones when `strides` is empty).
  std::vector<int64_t> effective_strides() const;
  bool is_contiguous() const;
};

/// @brief An owning, contiguous host tensor (zero-initialised, unless made by uninitialized()).
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);
  /// @brief A tensor whose bytes are left as they are (not zeroed): for an output every byte of
  /// which the caller writes (the allocating quantize() and dequantize() do), where zeroing first
  /// would write the memory twice.
  static Tensor uninitialized(DType dtype, std::vector<int64_t> shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* data() { return storage_.get(); }
  const void* data() const { return storage_.get(); }
  template <typename T>
  T* data_as() {
    return static_cast<T*>(data());
  }
  template <typename T>
  const T* data_as() const {
    return static_cast<const T*>(data());
  }

  TensorView view() const;
  /// @brief Same bytes, new shape with the same element count.
  Tensor reshaped(std::vector<int64_t> shape) const;

 private:
  Tensor(DType dtype, std::vector<int64_t> shape, bool zeroed);

  std::shared_ptr<std::byte[]> storage_;
  DType dtype_ = DType::U8;
  std::vector<int64_t> shape_;
};

/// @brief A contiguous f32 copy of an f32/bf16/f16 CPU tensor (any positive strides that fold to
/// 2-D), flattened to [rows, cols] = [product of leading dims, last dim]; exact widening.
Tensor to_f32_matrix(const TensorView& x);

/// @brief "[128, 64]"
std::string shape_string(const std::vector<int64_t>& shape);

/// @brief Frees the large host buffers (1 MiB or more) that Tensors left behind for reuse, at
/// most 512 MiB; returns how many bytes that was. Tensors still alive keep theirs. The reuse spares
/// repeated calls (a training step's quantizations) fresh pages; call this when a long-lived
/// process is done with such calls, as torch.cuda.empty_cache() does for PyTorch's CUDA cache.
size_t release_cached_host_memory();

}  // namespace microscale
