// The parts of the _C extension module, each registered by its own file.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "microscale/quantize.hpp"

namespace microscale::python {

namespace nb = nanobind;

/// "rowwise" / "columnwise" (throws microscale::Error otherwise).
Usage parse_usage(const std::string& name);

void bind_quantize(nb::module_& m);  // quantize_bindings.cpp
void bind_training(nb::module_& m);  // training_bindings.cpp: recipes, Linear forward/backward

}  // namespace microscale::python
