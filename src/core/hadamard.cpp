#include "microscale/hadamard.hpp"

#include "core/fp_environment.hpp"
#include "core/input_matrix.hpp"
#include "cpu/rht.hpp"
#include "microscale/error.hpp"

namespace microscale {

Tensor hadamard16(const TensorView& x, uint16_t sign_mask, bool inverse) {
  const IeeeSubnormals ieee;  // whatever FTZ/DAZ the caller set (fp_environment.hpp)
  const InputMatrix in = make_input_matrix(x);
  if (in.cols % 16 != 0)
    throw Error("hadamard16 needs the last dim divisible by 16, got " + shape_string(x.shape));
  Tensor out(DType::F32, x.shape);
  float* y = out.data_as<float>();
  for (int64_t r = 0; r < in.rows; ++r) {
    for (int64_t c0 = 0; c0 < in.cols; c0 += 16) {
      for (int j = 0; j < 16; ++j) {
        double sum = 0.0;
        for (int i = 0; i < 16; ++i) {
          // forward: sum_i x_i M[i][j]; inverse: sum_i x_i M[j][i]
          const double coefficient = (inverse ? rht_sign(sign_mask, j, i) : rht_sign(sign_mask, i, j)) * 0.25;
          sum += coefficient * in.at(r, c0 + i);
        }
        y[r * in.cols + c0 + j] = static_cast<float>(sum);
      }
    }
  }
  return out;
}

}  // namespace microscale
