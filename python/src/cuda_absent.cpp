// bind_cuda for builds without the CUDA backend: only the question whether it is there.
#include "bindings.hpp"

namespace microscale::python {

void bind_cuda(nb::module_& m) {
  m.def(
      "cuda_built", []() { return false; }, "Whether this build has the CUDA backend.");
}

}  // namespace microscale::python
