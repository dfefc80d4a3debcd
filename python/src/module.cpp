// microscale._C: the nanobind extension under the Python package (python/microscale). The
// library's errors arrive as microscale.Error (a ValueError) carrying the reason.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "microscale/error.hpp"

NB_MODULE(_C, m) {
  namespace nb = nanobind;
  m.doc() = "microscale's C++ library (block-scaled NVFP4 / MXFP8 / MXFP6 / MXFP4 numerics)";
  nb::exception<microscale::Error>(m, "Error", PyExc_ValueError);
#ifdef NDEBUG
  // nanobind's exit-time report of instances still alive when this module goes: objects that
  // other code keeps past it (a script's global recipe, pytest's parameters, seen with torch 2.11)
  // are listed as "leaks". A development check: on in debug builds only.
  nb::set_leak_warnings(false);
#endif
  microscale::python::bind_quantize(m);
  microscale::python::bind_gemm(m);
  microscale::python::bind_training(m);
  microscale::python::bind_checkpoint(m);
  microscale::python::bind_cuda(m);
}
