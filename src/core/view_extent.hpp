// How far a strided view reaches in memory and whether its strides give every element its own
// address: the output checks shared by the CPU GEMM (core/gemm.cpp) and the CUDA GEMM
// (cuda/gemm.cu). Header-only: the CUDA library compiles it as C++17.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "microscale/tensor.hpp"

namespace microscale {

/// The largest element offset `v` reaches, sum of (size - 1) * stride over its dims (strides
/// positive); nullopt where that overflows int64.
inline std::optional<int64_t> last_element_offset(const TensorView& v) {
  const std::vector<int64_t> strides = v.effective_strides();
  int64_t reach = 0, span = 0;
  for (int64_t i = 0; i < v.ndim(); ++i) {
    if (__builtin_mul_overflow(v.shape[i] - 1, strides[i], &span) ||
        __builtin_add_overflow(reach, span, &reach))
      return std::nullopt;
  }
  return reach;
}

/// Whether `v`'s strides (positive) map every element to its own address: with the dims of size
/// > 1 ordered by stride, each stride must step past everything the smaller ones reach. A view
/// whose reach overflows (last_element_offset) is reported as distinct here; check that first.
inline bool elements_distinct(const TensorView& v) {
  const std::vector<int64_t> strides = v.effective_strides();
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t i = 0; i < v.ndim(); ++i) {
    if (v.shape[i] > 1) dims.emplace_back(strides[i], v.shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0, span = 0;  // the largest offset the dims so far reach
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return false;
    // Past int64, no later stride can step over it: the view is out of range, not overlapping.
    if (__builtin_mul_overflow(size - 1, stride, &span) || __builtin_add_overflow(reach, span, &reach))
      return true;
  }
  return true;
}

}  // namespace microscale
