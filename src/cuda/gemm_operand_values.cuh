// Reading a block-scaled GEMM operand's values on the device (the expanded path's copy kernel and
// its exact fallback): element code -> value by the branch-free codecs (core/element_codec.hpp,
// equal to microscale::decode for every code), block scale code -> value (E4M3 for NVFP4, E8M0
// for MX), and where a logical element (l, r, k) of a K-major or MX-columnwise operand lies.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "core/element_codec.hpp"
#include "cuda/common.cuh"
#include "cuda/gemm_params.hpp"

namespace microscale::cuda {

/// The element codec of a scheme, as a compile-time choice (the copy kernel is instantiated per
/// scheme, so that each decodes with straight-line code). NVFP4 and MXFP4: E2M1.
template <Scheme S>
using SchemeCodec = std::conditional_t<
    S == Scheme::MXFP8_E4M3, E4M3Codec,
    std::conditional_t<
        S == Scheme::MXFP8_E5M2, E5M2Codec,
        std::conditional_t<S == Scheme::MXFP6_E2M3, E2M3Codec,
                           std::conditional_t<S == Scheme::MXFP6_E3M2, E3M2Codec, E2M1Codec>>>>;

/// The value of element code `code` (a nibble for FP4, a byte otherwise). A byte that is no code of
/// a 6-bit format (high bits set) reads as NaN, where the CPU GEMM throws (a kernel cannot).
template <Scheme S>
__device__ __forceinline__ float element_value(uint32_t code) {
  using Codec = SchemeCodec<S>;
  if constexpr (Codec::kWidth == 6) {
    if (code > 0x3Fu) return bits_to_float(0x7FC00000u);
  }
  return Codec::decode(code);
}

/// element_value for a scheme known at run time.
__device__ __forceinline__ float element_value(Scheme scheme, uint32_t code) {
  switch (scheme) {
    case Scheme::NVFP4: return element_value<Scheme::NVFP4>(code);
    case Scheme::MXFP8_E4M3: return element_value<Scheme::MXFP8_E4M3>(code);
    case Scheme::MXFP8_E5M2: return element_value<Scheme::MXFP8_E5M2>(code);
    case Scheme::MXFP6_E2M3: return element_value<Scheme::MXFP6_E2M3>(code);
    case Scheme::MXFP6_E3M2: return element_value<Scheme::MXFP6_E3M2>(code);
    default: return element_value<Scheme::MXFP4>(code);
  }
}

/// A block scale code's value: E4M3 (NVFP4) or E8M0 (MX: 2^(s - 127), 0xFF NaN), exact in fp32.
__device__ __forceinline__ float block_scale_value(Scheme scheme, uint8_t s) {
  if (scheme == Scheme::NVFP4) return __half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E4M3)));
  if (s == 0xFF) return bits_to_float(0x7FC00000u);
  return bits_to_float(s == 0 ? 0x00400000u : static_cast<uint32_t>(s) << 23);  // 2^-127 is subnormal
}

/// The scale code of logical row r's K-block kb in batch l of an operand [rows, K].
__device__ __forceinline__ uint8_t block_scale_code(const GemmDeviceOperand& op, int64_t k, int block,
                                                    int64_t l, int64_t r, int64_t kb) {
  const uint8_t* scales = op.scales + l * op.scale_batch_bytes;
  if (op.swizzled) return scales[scale_offset(r, kb, k / block, true)];  // the logical [rows, K/block]
  return op.stored_transposed ? scales[kb * op.scale_row_bytes + r] : scales[r * op.scale_row_bytes + kb];
}

/// Logical element (r, kk) of batch l, exactly as the CPU GEMM's OperandReader reads it (without
/// an NVFP4 global scale).
__device__ __forceinline__ float operand_value(const GemmDeviceOperand& op, int64_t k, int block, bool packed,
                                               int64_t l, int64_t r, int64_t kk) {
  const int64_t i = op.stored_transposed ? kk : r, j = op.stored_transposed ? r : kk;
  const uint8_t byte = op.data[l * op.batch_bytes + i * op.row_bytes + (packed ? j / 2 : j)];
  const uint32_t code = packed ? (byte >> (4 * (j % 2))) & 0x0Fu : byte;
  return element_value(op.scheme, code) *
         block_scale_value(op.scheme, block_scale_code(op, k, block, l, r, kk / block));
}

}  // namespace microscale::cuda
