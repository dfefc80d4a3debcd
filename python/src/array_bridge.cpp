#include "array_bridge.hpp"

#include <memory>
#include <string>
#include <utility>

#include "microscale/error.hpp"

namespace microscale::python {
namespace {

DType dtype_of(nb::dlpack::dtype t, const char* what) {
  using nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == static_cast<uint8_t>(dtype_code::Float) && t.bits == 32) return DType::F32;
    if (t.code == static_cast<uint8_t>(dtype_code::Float) && t.bits == 16) return DType::F16;
    if (t.code == static_cast<uint8_t>(dtype_code::Bfloat) && t.bits == 16) return DType::BF16;
    if (t.code == static_cast<uint8_t>(dtype_code::UInt) && t.bits == 8) return DType::U8;
  }
  throw Error(std::string(what) + ": unsupported dtype (code " + std::to_string(t.code) + ", " +
              std::to_string(t.bits) + " bits); expected float32, bfloat16, float16 or uint8");
}

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return nb::dtype<float>();
    case DType::U8: return nb::dtype<uint8_t>();
    case DType::F16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::BF16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  }
  throw Error("unknown dtype");
}

template <typename Array>
TensorView view_of_array(const Array& array, const char* what) {
  TensorView v;
  v.dtype = dtype_of(array.dtype(), what);
  const int device = array.device_type();
  if (device == nb::device::cpu::value) {
    v.device = Device::CPU;
  } else if (device == nb::device::cuda::value) {
    v.device = Device::CUDA;
  } else {
    throw Error(std::string(what) + ": arrays must live in CPU or CUDA memory (DLPack device type " +
                std::to_string(device) + ")");
  }
  v.data = const_cast<void*>(static_cast<const void*>(array.data()));
  v.shape.resize(array.ndim());
  v.strides.resize(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) {
    v.shape[i] = static_cast<int64_t>(array.shape(i));
    v.strides[i] = array.stride(i);
  }
  return v;
}

}  // namespace

TensorView view_of(const AnyArray& array, const char* what) { return view_of_array(array, what); }

TensorView view_of_output(const nb::ndarray<>& array, const char* what) { return view_of_array(array, what); }

ResultArray to_array(Tensor tensor) {
  auto owned = std::make_unique<Tensor>(std::move(tensor));
  std::vector<size_t> shape(owned->shape().begin(), owned->shape().end());
  void* data = owned->data();
  const nb::dlpack::dtype dtype = dlpack_dtype(owned->dtype());
  nb::capsule owner(owned.get(), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  owned.release();
  return ResultArray(data, shape.size(), shape.data(), owner, nullptr, dtype);
}

std::optional<ResultArray> array_or_none(const Tensor& tensor) {
  if (!tensor.defined()) return std::nullopt;
  return to_array(tensor);
}

DType parse_float_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16") return DType::F16;
  throw Error("unknown output dtype '" + name + "' (float32, bfloat16, float16)");
}

}  // namespace microscale::python
