// microscale/quantize.hpp — block-scaled quantization: schemes, options, quantize(), dequantize().
//
// A QuantizedTensor is data + scales + scheme, so every entry point serves every format.
//
// The input is flattened to 2-D [M, K] (M = product of the leading dims, K = last dim).
//
// NVFP4 (TransformerEngine >= 2.14, NVFP4QuantizerRef numerics; numerics-te.md §1-5):
//   rowwise_data      u8  [M, K/2]   E2M1 codes, even element in the low nibble
//   rowwise_scale     u8  [M, K/16]  E4M3 block decode scales (compact), or swizzled (see layout.hpp)
//   rowwise_amax      f32            max|x|, or the override (global scale S_enc = 2688 / amax)
//   columnwise_*      the same for X^T ([K, M/2], [K, M/16]); with rht, of RHT(X^T) rounded to bf16,
//                     and columnwise_amax = max|RHT(X^T)|
//   Tile::k16x16 shares one scale per 16x16 tile (weights); rows/columns of a tile repeat it.
//   4over6 (TE's nvfp4_4over6): each block keeps the better of two encodings, and S_enc may be
//                     1536 / amax (nvfp4_e4m3_max = 256); see FourOverSix.
//   row_scaled (TE's row_scaled_nvfp4): one global scale per row of each direction's matrix:
//                     rowwise_amaxes f32 [M] = max|X[m, :]|, columnwise_amaxes f32 [K] = max|X[:, k]|
//                     (the rows of X^T); rowwise_amax / columnwise_amax then hold their largest.
// MX (torchao main to_mx numerics, OCP MX v1.0 blocks of 32; numerics-mx.md §3-5):
//   rowwise_data      u8  [M, K]     one code per byte (FP8, FP6 in the low 6 bits), FP4: [M, K/2]
//   rowwise_scale     u8  [M, K/32]  E8M0 exponents (compact) or swizzled
//   columnwise_data   u8  [M, K]     NOT transposed (TransformerEngine MXFP8 layout), blocks of 32
//                                    along M; FP4: [M, K/2]
//   columnwise_scale  u8  [M/32, K]  compact; swizzled as the transpose [K, M/32]
//   Tile::k32x32 (TE's MXFP8 2D quantization, weights) shares one scale per 32x32 tile, from the
//                     tile's amax: both directions then hold the same codes, and the rows/columns
//                     of a tile repeat its scale in each direction's scales.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "microscale/format.hpp"
#include "microscale/tensor.hpp"

namespace microscale {

/// @brief The block-scaled schemes.
enum class Scheme : uint8_t {
  NVFP4,       ///< E2M1 elements, 16-element blocks, E4M3 block scales, FP32 global scale
  MXFP8_E4M3,  ///< E4M3 elements, 32-element blocks, E8M0 scales
  MXFP8_E5M2,  ///< E5M2 elements, 32-element blocks, E8M0 scales
  MXFP6_E2M3,  ///< E2M3 elements, 32-element blocks, E8M0 scales
  MXFP6_E3M2,  ///< E3M2 elements, 32-element blocks, E8M0 scales
  MXFP4,       ///< E2M1 elements, 32-element blocks, E8M0 scales
};

/// @brief How an MX block's E8M0 scale is chosen from the block amax (numerics-mx.md §3.3).
enum class ScaleMode : uint8_t {
  Floor,  ///< OCP: 2^(floor(log2 amax) - emax); elements above max saturate
  Ceil,   ///< 2^(ceil(log2 amax) - emax)
  Even,   ///< amax rounded to the element's mantissa width first, then floor
  RCeil,  ///< round up amax * (1/max) to a power of two (torchao RCEIL; TE MXFP8 for finite blocks,
          ///< TE's kernels skip NaN in the amax and give Inf blocks 0xFE where torchao gives 0xFF)
};

/// @brief Scale-block shape: one-dimensional blocks (the default) or square tiles for weights.
enum class Tile : uint8_t {
  k1x16,   ///< 1-D blocks along the quantized dim: NVFP4's 1x16, MX's 1x32 ("1x32" parses to it)
  k16x16,  ///< NVFP4 only: one scale per 16x16 tile
  k32x32,  ///< MX only: one scale per 32x32 tile (TransformerEngine's MXFP8 2D quantization)
};

/// @brief NVFP4 "4over6" adaptive block scaling (TransformerEngine's `nvfp4_4over6`).
///
/// Each block is encoded twice: "map to 6", the usual scale (block amax / 6 * S_enc), and "map to
/// 4", that scale times 1.5, so that the block's largest elements land on E2M1's 4 instead of 6,
/// where the grid is finer relative to them. Each candidate is dequantized again and its error
/// against the input summed over the block (16x16 tiles: the tile's 16 rows, added as a tree),
/// and the block keeps the candidate with the smaller error; a tie keeps map to 6. Not with the
/// RHT or stochastic rounding (TE has neither for 4over6).
enum class FourOverSix : uint8_t {
  Off,
  MinMae,  ///< smaller sum of |dequantized - x|
  MinMse,  ///< smaller sum of (dequantized - x)^2
};

/// @brief Where scales go: compact [rows, blocks] or the cuBLAS 128x4 swizzled layout.
enum class ScaleLayout : uint8_t { Compact, Swizzled };

/// @brief Which of the two outputs of a quantization.
enum class Usage : uint8_t { Rowwise, Columnwise };

/// @brief Stochastic rounding: element i of a direction's row-major output draws byte i % 16 of
/// Philox4x32-10(key = seed, counter = {block, offset}) with block = i / 16, columnwise blocks
/// numbered after the M*K/16 rowwise ones; see philox.hpp. Same seed, same bytes, on any thread
/// count and, by construction, on CPU and GPU.
struct StochasticRounding {
  uint64_t seed = 0;
  uint64_t offset = 0;
  /// CUDA backend only: where set, the seed is read from this device address when the kernel runs,
  /// and `seed` is unused. A call captured into a CUDA graph then takes, on each replay, whatever the
  /// graph's earlier work wrote there (e.g. a draw from torch's CUDA generator), where a seed by value
  /// would be fixed at capture. The CPU backends reject it.
  const uint64_t* device_seed = nullptr;
};

/// The most CPU threads an options struct may ask for: more is a mistake, not a machine (an OpenMP
/// team of 100 000 threads overflows the runtime's stack and kills the process).
constexpr int kMaxThreads = 1024;

struct QuantizeOptions {
  Scheme scheme = Scheme::NVFP4;
  bool rowwise = true;
  bool columnwise = false;
  ScaleMode scale_mode = ScaleMode::RCeil;                ///< MX only
  Tile tile = Tile::k1x16;                                ///< NVFP4: 1x16 or 16x16; MX: 1-D or 32x32
  bool rht = false;                                       ///< NVFP4 columnwise only, bf16 input only
  uint16_t rht_sign_mask = 0xD7E8;                        ///< bit i set: sign of Hadamard row i is negative
  std::optional<StochasticRounding> stochastic_rounding;  ///< NVFP4 only
  std::optional<float> amax_rowwise;             ///< NVFP4: use this amax (e.g. all-reduced over a TP group)
  std::optional<float> amax_columnwise;          ///< NVFP4: the same for the columnwise (post-RHT) amax
  FourOverSix four_over_six = FourOverSix::Off;  ///< NVFP4 only
  /// 4over6's error in the scaled domain, TE's NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH: code * scale
  /// against x * S_enc, where the default compares code * scale * amax / (6 * nvfp4_e4m3_max) with x.
  bool four_over_six_scaled_error = false;
  /// NVFP4 E4M3 bound in the global scale, S_enc = 6 * nvfp4_e4m3_max / amax: 448, or 256 with
  /// 4over6 (TE's nvfp4_4over6_e4m3_use_256), which keeps map to 4's 1.5x scales below 448.
  int nvfp4_e4m3_max = 448;
  /// NVFP4 1x16: a global scale per row of each direction's matrix (X's rows, X^T's rows) instead of
  /// one per tensor, TE's row_scaled_nvfp4 (its recipe's row_scaled_activation). Not with the RHT,
  /// 16x16 tiles, stochastic rounding or amax overrides, as in TE; with 4over6, rowwise only.
  bool row_scaled = false;
  ScaleLayout scale_layout = ScaleLayout::Compact;
  int num_threads = 0;  ///< CPU fast path: 0 = all hardware threads; at most kMaxThreads
};

/// @brief Quantized data and scales; the outputs not asked for are undefined Tensors.
struct QuantizedTensor {
  Scheme scheme = Scheme::NVFP4;
  Tile tile = Tile::k1x16;
  bool rht = false;
  ScaleLayout scale_layout = ScaleLayout::Compact;
  std::vector<int64_t> shape;  ///< the original (unflattened) input shape
  int64_t rows = 0;            ///< M
  int64_t cols = 0;            ///< K
  Tensor rowwise_data, rowwise_scale;
  Tensor columnwise_data, columnwise_scale;
  float rowwise_amax = 0.0f;     ///< NVFP4 only
  float columnwise_amax = 0.0f;  ///< NVFP4 only
  int nvfp4_e4m3_max = 448;      ///< NVFP4 only: S_enc = 6 * nvfp4_e4m3_max / amax (448 or 256)
  /// NVFP4 row_scaled: row r of a direction's matrix has S_enc = 6 * nvfp4_e4m3_max / amaxes[r].
  bool row_scaled = false;
  Tensor rowwise_amaxes;     ///< row_scaled: f32 [M], max|X[m, :]|
  Tensor columnwise_amaxes;  ///< row_scaled: f32 [K], max|X[:, k]| (row k of X^T)

  bool has(Usage usage) const;
  /// @brief The global amax of row `r` of a usage's matrix (X, or X^T for NVFP4 columnwise): its
  /// row's amax when row_scaled, else the tensor's.
  float amax_of_row(Usage usage, int64_t r) const;
};

/// @brief Shapes of the outputs a quantization writes (u8 tensors); empty where not asked for.
///
/// Compact or swizzled scales per options.scale_layout (swizzled: [roundup(R,128), roundup(C,4)] of
/// the compact [R, C], MX columnwise as its transpose [K, M/32]). Every backend allocates from this,
/// and callers that bring their own buffers (the CUDA entry points, a PyTorch frontend) size them
/// with it. Assumes `options` are valid for `shape` (quantize() checks that).
struct QuantizedShapes {
  int64_t rows = 0;  ///< M: the product of the leading dims
  int64_t cols = 0;  ///< K: the last dim
  std::vector<int64_t> rowwise_data, rowwise_scale;
  std::vector<int64_t> columnwise_data, columnwise_scale;
};

/// @brief Output shapes of quantize(input of `shape`, options); throws for an empty shape.
QuantizedShapes quantized_shapes(const std::vector<int64_t>& shape, const QuantizeOptions& options);

/// @brief Element format of a scheme's data.
Format element_format(Scheme scheme);
/// @brief Elements per scale block along the quantized dimension (16 or 32).
int block_size(Scheme scheme);
bool is_mx(Scheme scheme);
/// @brief "nvfp4", "mxfp8_e4m3", ... and back (parse throws microscale::Error).
std::string_view scheme_name(Scheme scheme);
Scheme parse_scheme(std::string_view name);
std::string_view scale_mode_name(ScaleMode mode);
ScaleMode parse_scale_mode(std::string_view name);
/// @brief "1x16", "16x16", "32x32" and back; for an MX `scheme`, "1x32" parses to k1x16 (MX's 1-D
/// blocks by their own size; for nvfp4 it is an error). The parsers take any ASCII case.
std::string_view tile_name(Tile tile);
/// @brief The name a user of `scheme` writes: as tile_name, but "1x32" for MX's 1-D blocks (what the
/// CLI's metadata and Python's `tile` properties show; parse_tile reads it back for that scheme).
std::string_view tile_name(Tile tile, Scheme scheme);
Tile parse_tile(std::string_view name, Scheme scheme);
/// @brief "off", "mae", "mse" and back (TE's nvfp4_4over6_err_mode spells them MAE and MSE).
std::string_view four_over_six_name(FourOverSix mode);
FourOverSix parse_four_over_six(std::string_view name);

/// @brief Quantizes with the fast CPU path (threads + SIMD); equal bit for bit to quantize_ref.
QuantizedTensor quantize(const TensorView& input, const QuantizeOptions& options);

/// @brief quantize() into `out`'s buffers where they fit: each data/scale tensor of `out` that is
/// u8 of the needed shape is overwritten in place (every holder of it sees the new bytes), the
/// others are allocated. The steady state of a training step, which quantizes same-shaped
/// tensors again and again, then allocates nothing. On error `out` is left unchanged.
void quantize_into(const TensorView& input, const QuantizeOptions& options, QuantizedTensor& out);

/// @brief The reference path: plain single-threaded loops, written to be read.
QuantizedTensor quantize_ref(const TensorView& input, const QuantizeOptions& options);

/// @brief Dequantizes one usage to f32, bf16 or f16.
///
/// Rowwise gives [M, K]. Columnwise gives, for NVFP4, X^T [K, M] (RHT(X^T) if rht was on), and for
/// MX the non-transposed [M, K]. The result is reshaped to the original shape when it is [M, K].
/// MX: code * 2^(e-127) (NaN when e = 0xFF), exact in fp32, rounded once to the output dtype.
/// NVFP4: code * RN(scale_e4m3 * RN(1 / S_enc)) in fp32, then rounded to the output dtype
/// (S_enc = 6 * q.nvfp4_e4m3_max / amax, with the row's amax when row_scaled).
/// Throws Error for a byte that is no code of the element format (a 6-bit format's high bits set).
/// Threads + vectorised; equal to dequantize_ref bit for bit.
Tensor dequantize(const QuantizedTensor& q, Usage usage, DType out_dtype = DType::F32);

/// @brief dequantize's reference path: plain single-threaded loops (a table lookup per element).
Tensor dequantize_ref(const QuantizedTensor& q, Usage usage, DType out_dtype = DType::F32);

}  // namespace microscale
