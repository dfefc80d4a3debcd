// Between Python arrays (anything with DLPack or the buffer protocol: numpy, torch, ...) and the
// library's TensorView / Tensor. Views borrow the caller's memory; results hand a Tensor's
// storage over to Python without copying.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "microscale/tensor.hpp"

namespace microscale::python {

namespace nb = nanobind;

/// An array argument of any dtype, device and strides (checked by view_of).
using AnyArray = nb::ndarray<nb::ro>;
/// A result: an array object with __dlpack__ and the buffer protocol (nanobind's array_api
/// framework), owning its memory: np.asarray and torch.from_dlpack take it without a copy.
using ResultArray = nb::ndarray<nb::array_api>;

/// A view of `array` (CPU or CUDA memory; f32, bf16, f16 or u8); `what` names it in errors.
TensorView view_of(const AnyArray& array, const char* what);

/// A writable view of `array` (the same rules), for outputs the caller allocated.
TensorView view_of_output(const nb::ndarray<>& array, const char* what);

/// Hands `tensor`'s storage to Python, shaped as it is.
ResultArray to_array(Tensor tensor);

/// to_array for a defined tensor (sharing its storage), None for an undefined one.
std::optional<ResultArray> array_or_none(const Tensor& tensor);

/// "float32", "bfloat16", "float16" as a DType (throws microscale::Error otherwise).
DType parse_float_dtype(const std::string& name);

}  // namespace microscale::python
