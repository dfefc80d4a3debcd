// The parts of the _C extension module, each registered by its own file.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "microscale/quantize.hpp"

namespace microscale::python {

namespace nb = nanobind;

/// "rowwise" / "columnwise" (throws microscale::Error otherwise).
Usage parse_usage(const std::string& name);

void bind_quantize(nb::module_& m);    // quantize_bindings.cpp
void bind_gemm(nb::module_& m);        // gemm_bindings.cpp
void bind_training(nb::module_& m);    // training_bindings.cpp: recipes, Linear forward/backward
void bind_checkpoint(nb::module_& m);  // checkpoint_bindings.cpp: checkpoint conversion
void bind_cuda(nb::module_& m);        // cuda_bindings.cpp (CUDA builds) or cuda_absent.cpp

}  // namespace microscale::python
