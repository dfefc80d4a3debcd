// The RHT of a band of 16 fp32 rows, column by column (the portable NVFP4 kernels' columnwise
// operand with --rht): equal bit for bit to rht.hpp's reference sums and rounding.
#pragma once

#include <cstdint>

#include "cpu/rht.hpp"

namespace microscale::cpu {

/// tile[c * 16 + j] = output j of the RHT of column c of `band` (16 rows of `k` floats, row-major),
/// rounded to bf16 as the reference does and returned as its exact fp32 value.
void rht_band(const float* band, int64_t k, const RhtCoefficients& t, float* tile);

/// out[j] = output j of the RHT of one column (x[0], x[stride], ..., x[15 * stride]), rounded as
/// rht_band rounds, whatever its values: the columns a vectorised transform cannot give exactly.
void rht_column_exact(const float* x, int64_t stride, const RhtCoefficients& t, float* out);

/// max(at_least, the largest |output| of rht_band on `band`, NaN outputs ignored as amaxes ignore
/// NaN), for at_least a bf16 value >= 0 (a running max). Columns whose outputs cannot exceed
/// at_least are not transformed (pass 1's columnwise amax: most of a tensor's bands, once a few
/// have set the running max).
float rht_band_max_abs(const float* band, int64_t k, const RhtCoefficients& t, float at_least);

}  // namespace microscale::cpu
