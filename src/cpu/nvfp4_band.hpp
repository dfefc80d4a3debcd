// A band of 16 input rows widened to fp32 ([rows, K] row-major), as the portable NVFP4 kernels
// hold it: its amax, its 16x16 tiles' amaxes, and its transpose (the columnwise blocks).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/input_matrix.hpp"
#include "cpu/cpu_dispatch.hpp"
#include "microscale/half.hpp"

namespace microscale::cpu {

/// |v| as bits, 0 for a NaN pattern: so a NaN never wins a max, as fmaxf in TE's amax kernels; the
/// rest compare as unsigned integers, which vectorises. NOTE: a mask, not `?:`: GCC 12 vectorises
/// the reductions over it only in that form.
MICROSCALE_CPU_INLINE uint32_t abs_bits_skipping_nan(float v) {
  const uint32_t a = float_bits(v) & 0x7FFFFFFFu;
  return a & (0u - static_cast<uint32_t>(a <= 0x7F800000u));
}

/// max(start, |v[0..n)|) on the bits (abs_bits_skipping_nan).
MICROSCALE_CPU_INLINE float max_abs(const float* v, int64_t n, float start) {
  uint32_t m = float_bits(start);
  for (int64_t i = 0; i < n; ++i) m = std::max(m, abs_bits_skipping_nan(v[i]));
  const uint32_t result = m;
  return bits_to_float(result);
}

/// column_bits[c] = max(column_bits[c], |row[c]| as bits) for c < n, NaN patterns dropped (as
/// max_abs): a block of rows' column maxima, one contiguous row at a time (vertical maxima).
MICROSCALE_CPU_INLINE void max_column_bits(const float* row, int64_t n, uint32_t* column_bits) {
  for (int64_t c = 0; c < n; ++c) column_bits[c] = std::max(column_bits[c], abs_bits_skipping_nan(row[c]));
}

/// max|v[0..n)|, NaN skipped.
float band_max_abs(const float* v, int64_t n);

/// tile[c * 16 + i] = band[i * k + c]: a full band's 16-element column chunks as rows.
void transpose_band(const float* band, int64_t k, float* tile);

/// Amax of every 16x16 tile of a full band: tile_amax[kb] over rows 0..15, columns 16kb..16kb+15.
void band_tile_amax(const float* band, int64_t k, float* tile_amax);

/// A row-scaled tensor's amaxes (pass 1), NaN skipped: row_amax[m] = max|x[m, :]| and
/// col_amax[k] = max|x[:, k]|, each left alone where null. Threads over bands of 16 rows.
void row_scaled_amaxes(const InputMatrix& x, int threads, float* row_amax, float* col_amax);

}  // namespace microscale::cpu
