// MX quantizer written with AVX-512 intrinsics: every MX scheme (FP8 E4M3/E5M2, FP6 E2M3/E3M2,
// FP4 E2M1) and scale rule, rowwise and columnwise; equal bit for bit to quantize_mx_ref.cpp
// (tests/cpp/quantize_test.cpp runs it on random, special and boundary inputs, golden_test.cpp on
// the golden cases). Inputs with strided columns take the portable fast path.
//
// Three kernels. bf16 and f16 inputs stay in 16-bit lanes (32 lanes per register): with
// byte-sized codes (FP8, FP6) quantize_chunk16 (codes by an integer subtract and shift since
// the block scales are powers of two; FP6's format subnormals by the subnormal form of
// mx16_form.hpp where every block allows it), which hands chunks with Inf/NaN (bf16: also tiny
// scales) to the general one; with FP4 codes quantize_chunk16_fp4 (codes by the two-step form of
// mx16_form.hpp where every block of the chunk allows it, else by thresholds).
// The general kernel (fp32 lanes) takes everything else.
//
// The kernel's parts, each in a header that only this file includes:
//   mx_avx512_band.hpp           a band of 32 input rows (the unit of threading), code stores
//   mx_avx512_chunk.hpp          the general kernel: chunks in fp32 lanes (quantize_chunk)
//   mx_avx512_chunk16.hpp        bf16 / f16 with byte-sized codes, FP8 and FP6 (quantize_chunk16)
//   mx_avx512_chunk16_fp4.hpp    bf16 / f16 to FP4 (quantize_chunk16_fp4)
// This file walks a band's chunks (quantize_band) and the bands on the threads (quantize_with).
#include <algorithm>

#include "core/fp_environment.hpp"
#include "cpu/avx512.hpp"
#include "cpu/avx512_codecs.hpp"
#include "cpu/e2m1_thresholds.hpp"
#include "cpu/encode_fast.hpp"
#include "cpu/kernel_set.hpp"
#include "cpu/mx_avx512_band.hpp"
#include "cpu/mx_avx512_chunk.hpp"
#include "cpu/mx_avx512_chunk16.hpp"
#include "cpu/mx_avx512_chunk16_fp4.hpp"
#include "cpu/quantize_kernels.hpp"
#include "cpu/row_loader.hpp"

namespace microscale::cpu {

#ifdef MICROSCALE_HAVE_AVX512_KERNELS
namespace {

using namespace avx512;

template <typename Codec, bool kPacked, MxScaleRule kRule, DType kDType>
MICROSCALE_AVX512 void quantize_band(const Band& b) {
  constexpr int kTiles = kChunkTiles<kPacked>;
  alignas(64) float buffer[kBlock][kMaxChunkCols];  // the chunk as fp32 [32, 16 * kTiles]
  int64_t col = 0;
  if constexpr ((kDType == DType::BF16 || kDType == DType::F16) && kPacked) {
    if (b.rows == kBlock) {
      alignas(64) uint16_t buffer16[kBlock][kFp4ChunkCols];  // the chunk's inputs [32, 128]
      for (; col + kFp4ChunkCols <= b.k; col += kFp4ChunkCols)
        quantize_chunk16_fp4<kRule, 4, kDType>(b, col, buffer16);
      if (col + 2 * k16Lanes <= b.k) {
        quantize_chunk16_fp4<kRule, 2, kDType>(b, col, buffer16);
        col += 2 * k16Lanes;
      }
      if (col < b.k) quantize_chunk16_fp4<kRule, 1, kDType>(b, col, buffer16);
      if (b.stream) _mm_sfence();
      return;
    }
  }
  if constexpr ((kDType == DType::BF16 || kDType == DType::F16) && !kPacked) {
    if (b.rows == kBlock) {
      alignas(64) uint16_t buffer16[kBlock][k16ChunkCols];  // the chunk's inputs [32, 64]
      for (; col + k16ChunkCols <= b.k; col += k16ChunkCols) {
        if (!quantize_chunk16<Codec, kRule, 2, kDType>(b, col, buffer16))
          quantize_chunk<Codec, kPacked, kRule, kDType, kTiles>(b, col, buffer);
      }
      if (col < b.k && !quantize_chunk16<Codec, kRule, 1, kDType>(b, col, buffer16))
        quantize_chunk<Codec, kPacked, kRule, kDType, 2>(b, col, buffer);
      if (b.stream) _mm_sfence();
      return;
    }
  }
  for (; col + kTiles * kLanes <= b.k; col += kTiles * kLanes)
    quantize_chunk<Codec, kPacked, kRule, kDType, kTiles>(b, col, buffer);
  // The rest (K is a multiple of 32): FP4 one chunk of 64 columns, then one of 32.
  if constexpr (kPacked) {
    if (col + 4 * kLanes <= b.k) {
      quantize_chunk<Codec, kPacked, kRule, kDType, 4>(b, col, buffer);
      col += 4 * kLanes;
    }
  }
  if (col < b.k) quantize_chunk<Codec, kPacked, kRule, kDType, 2>(b, col, buffer);
  if (b.stream) _mm_sfence();  // streamed stores are weakly ordered: publish them before returning
}

template <typename Codec, bool kPacked, MxScaleRule kRule, DType kDType>
void quantize_with(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  const FormatInfo& f = format_info(element_format(o.scheme));
  const int64_t m = x.rows, k = x.cols;
  const int64_t bands = (m + kBlock - 1) / kBlock;  // columnwise: M % 32 == 0 is checked
  const int64_t row_bytes = x.row_stride * element_bytes<kDType>();

  Band base;
  base.row_bytes = row_bytes;
  base.k = k;
  base.emax = f.emax;
  base.mantissa_bits = f.mantissa_bits;
  base.max_normal = f.max_normal;
  base.data_stride = kPacked ? k / 2 : k;
  base.row_scale_stride = k / kBlock;
  if constexpr (kPacked && (kDType == DType::BF16 || kDType == DType::F16)) {
    base.fp4_thresholds = mx_e2m1_thresholds(kDType).below;
    base.fp4_wide_thresholds = wide_fp4_thresholds<kDType>();
  }
  // Large outputs are written with streaming stores: they cannot stay in the caches anyway, and a
  // streamed whole line skips the read for ownership that a plain store costs (measured: 15.5 ->
  // 13.5 ms at 4096 x 4096 bf16, MXFP8 both directions). Needs every full chunk's lines aligned;
  // small outputs stay cached for whoever reads them next.
  const int64_t data_bytes = (int64_t{o.rowwise} + int64_t{o.columnwise}) * m * base.data_stride;
  base.stream = k % (kChunkTiles<kPacked> * kLanes) == 0 && data_bytes >= kStreamBytes &&
                (!o.rowwise || line_aligned(out.rowwise_data)) &&
                (!o.columnwise || line_aligned(out.columnwise_data));
#pragma omp parallel num_threads(thread_count(o.num_threads))
  {
    const IeeeSubnormals ieee;  // per thread (fp_environment.hpp)
#pragma omp for schedule(static)
    for (int64_t i = 0; i < bands; ++i) {
      Band b = base;
      b.src = static_cast<const std::byte*>(x.data) + i * kBlock * row_bytes;
      b.rows = static_cast<int>(std::min<int64_t>(kBlock, m - i * kBlock));
      if (o.rowwise) {
        b.row_data = out.rowwise_data.data_as<uint8_t>() + i * kBlock * b.data_stride;         // (M, K[/2])
        b.row_scale = out.rowwise_scale.data_as<uint8_t>() + i * kBlock * b.row_scale_stride;  // (M, K/32)
      }
      if (o.columnwise) {
        b.col_data = out.columnwise_data.data_as<uint8_t>() + i * kBlock * b.data_stride;  // (M, K[/2])
        b.col_scale = out.columnwise_scale.data_as<uint8_t>() + i * k;                     // (M/32, K)
      }
      quantize_band<Codec, kPacked, kRule, kDType>(b);
    }
  }
}

template <typename Codec, bool kPacked, DType kDType>
void quantize_with_rule(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  switch (mx_scale_rule(o.scale_mode)) {
    case MxScaleRule::Floor: return quantize_with<Codec, kPacked, MxScaleRule::Floor, kDType>(x, o, out);
    case MxScaleRule::Ceil: return quantize_with<Codec, kPacked, MxScaleRule::Ceil, kDType>(x, o, out);
    case MxScaleRule::Even: return quantize_with<Codec, kPacked, MxScaleRule::Even, kDType>(x, o, out);
    case MxScaleRule::RCeil: return quantize_with<Codec, kPacked, MxScaleRule::RCeil, kDType>(x, o, out);
  }
}

// False for NVFP4 (not an MX scheme), having written nothing.
template <DType kDType>
bool quantize_with_scheme(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  switch (o.scheme) {
    case Scheme::MXFP8_E4M3: quantize_with_rule<E4M3Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP8_E5M2: quantize_with_rule<E5M2Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP6_E2M3: quantize_with_rule<E2M3Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP6_E3M2: quantize_with_rule<E3M2Codec, false, kDType>(x, o, out); return true;
    case Scheme::MXFP4: quantize_with_rule<E2M1Codec, true, kDType>(x, o, out); return true;
    case Scheme::NVFP4: break;
  }
  return false;
}

}  // namespace

bool quantize_mx_avx512(const InputMatrix& x, const QuantizeOptions& o, QuantizedTensor& out) {
  // Chunks are whole blocks of 32 columns: a columnwise-only call may have any last dim, and then
  // the portable kernel runs.
  if (kernel_set() != KernelSet::Avx512 || !x.contiguous_rows() || x.cols % kBlock != 0) return false;
  switch (x.dtype) {
    case DType::BF16: return quantize_with_scheme<DType::BF16>(x, o, out);
    case DType::F16: return quantize_with_scheme<DType::F16>(x, o, out);
    case DType::F32: return quantize_with_scheme<DType::F32>(x, o, out);
    default: return false;
  }
}

#else

bool quantize_mx_avx512(const InputMatrix&, const QuantizeOptions&, QuantizedTensor&) { return false; }

#endif

}  // namespace microscale::cpu
