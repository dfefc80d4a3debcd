// microscale._C: the nanobind extension under the Python package (python/microscale). The
// library's errors arrive as microscale.Error (a ValueError) carrying the reason.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "microscale/error.hpp"

NB_MODULE(_C, m) {
  namespace nb = nanobind;
  m.doc() = "microscale's C++ library (block-scaled NVFP4 / MXFP8 / MXFP6 / MXFP4 numerics)";
  nb::exception<microscale::Error>(m, "Error", PyExc_ValueError);
  microscale::python::bind_quantize(m);
  microscale::python::bind_gemm(m);
  microscale::python::bind_training(m);
  microscale::python::bind_cuda(m);
}
