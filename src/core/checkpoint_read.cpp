// read_quantized_weights: recognise each convention's tensor names and dequantize them.
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/fp_environment.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"
#include "microscale/format.hpp"

namespace microscale {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// a * b for the dimensions of a header (each >= 0), or an error naming `tensor` when it overflows.
int64_t checked_product(int64_t a, int64_t b, const std::string& tensor) {
  int64_t p = 0;
  if (__builtin_mul_overflow(a, b, &p)) throw Error("tensor '" + tensor + "' has a shape too large");
  return p;
}

int64_t numel(const std::vector<int64_t>& shape, const std::string& tensor) {
  int64_t n = 1;
  for (int64_t d : shape) n = checked_product(n, d, tensor);
  return n;
}

// value[i] = code(i) * block_scale(i / block), with FP4 codes two per byte (low nibble first) or
// one FP8 code per byte; `scale_of(byte)` decodes a block scale.
template <typename ScaleOf>
Tensor dequantize_blocks(const SafetensorsEntry& data, bool fp4, const SafetensorsEntry& scales, int block,
                         std::vector<int64_t> shape, ScaleOf scale_of) {
  // Blocks run along the last dimension and never cross a row.
  if (shape.empty() || shape.back() % block != 0) {
    throw Error("tensor '" + data.name + "' of " + shape_string(shape) +
                ": its last dimension is not a multiple of the block of " + std::to_string(block));
  }
  const int64_t n = numel(shape, data.name);
  if (static_cast<int64_t>(data.nbytes) * (fp4 ? 2 : 1) != n) {
    throw Error("tensor '" + data.name + "' holds " + std::to_string(data.nbytes) +
                " bytes, not the codes of " + shape_string(shape));
  }
  if (static_cast<int64_t>(scales.nbytes) * block != n) {
    throw Error("tensor '" + scales.name + "' holds " + std::to_string(scales.nbytes) +
                " scales, not one per " + std::to_string(block) + " of " + shape_string(shape));
  }
  Tensor out(DType::F32, std::move(shape));
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data);
  const auto* s = reinterpret_cast<const uint8_t*>(scales.data);
  float* v = out.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t code = fp4 ? static_cast<uint8_t>((bytes[i / 2] >> (4 * (i % 2))) & 0xF) : bytes[i];
    v[i] = decode(fp4 ? Format::E2M1 : Format::E4M3, code) * scale_of(s[i / block]);
  }
  return out;
}

float e8m0(uint8_t b) { return decode(Format::E8M0, b); }  // 2^(b - 127), NaN for 0xFF

float scalar_f32(const SafetensorsEntry& e) {
  if (e.dtype != "F32" || e.nbytes != 4) throw Error("tensor '" + e.name + "' must be one F32 value");
  float v;
  std::memcpy(&v, e.data, 4);
  return v;
}

// FP4 codes are stored as U8 with two per byte (header shape in bytes, as ModelOpt,
// compressed-tensors and gpt-oss write them) or as the F4 dtype (header shape in elements).
std::vector<int64_t> fp4_logical_shape(const SafetensorsEntry& e) {
  std::vector<int64_t> s = e.shape;
  if (e.dtype == "U8" && !s.empty()) s.back() = checked_product(s.back(), 2, e.name);
  return s;
}

bool is_fp4_storage(const SafetensorsEntry& e) { return e.dtype == "U8" || e.dtype == "F4"; }

// f32 [E, R, C] -> [E, C, R]
Tensor transpose_last_two(const Tensor& t) {
  const int64_t batches = t.shape()[0], rows = t.shape()[1], cols = t.shape()[2];
  Tensor out(DType::F32, {batches, cols, rows});
  const float* src = t.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) dst[(b * cols + c) * rows + r] = src[(b * rows + r) * cols + c];
    }
  }
  return out;
}

Convention mxfp8_convention(const Checkpoint& c) {
  if (c.config_json().find("compressed-tensors") != std::string::npos) return Convention::CompressedTensors;
  return Convention::ModelOpt;
}

}  // namespace

std::vector<DetectedWeight> read_quantized_weights(const Checkpoint& c) {
  const IeeeSubnormals ieee;  // dequantizes with fp32 scales (fp_environment.hpp)
  std::vector<DetectedWeight> found;
  for (const Checkpoint::Entry& entry : c.tensors()) {
    const SafetensorsEntry& e = *entry.tensor;
    const std::string& n = e.name;
    if (ends_with(n, "_blocks") && c.contains(n.substr(0, n.size() - 7) + "_scales")) {
      // gpt-oss MXFP4: <T>_blocks [.., N, K/32, 16], <T>_scales [.., N, K/32]; experts' [E, out,
      // in/32, 16] go back to transformers' [E, in, out], as its loader transposes them.
      const std::string base = n.substr(0, n.size() - 7);
      if (e.dtype != "U8" || e.shape.size() < 2 || e.shape.back() != 16)
        throw Error("'" + n + "' is not gpt-oss MXFP4 blocks");
      std::vector<int64_t> shape(e.shape.begin(), e.shape.end() - 2);
      shape.push_back(checked_product(e.shape[e.shape.size() - 2], 32, n));
      Tensor values = dequantize_blocks(e, true, c.at(base + "_scales"), 32, shape, e8m0);
      if (values.shape().size() == 3) values = transpose_last_two(values);
      found.push_back({base, CheckpointFormat::MXFP4, Convention::GptOss, std::move(values)});
    } else if (ends_with(n, "_packed") && c.contains(n.substr(0, n.size() - 7) + "_scale")) {
      // compressed-tensors NVFP4 (with a global scale) or MXFP4
      const std::string base = n.substr(0, n.size() - 7);
      const SafetensorsEntry& scale = c.at(base + "_scale");
      if (c.contains(base + "_global_scale")) {
        const float global = scalar_f32(c.at(base + "_global_scale"));
        found.push_back({base, CheckpointFormat::NVFP4, Convention::CompressedTensors,
                         dequantize_blocks(e, true, scale, 16, fp4_logical_shape(e), [&](uint8_t b) {
                           return decode(Format::E4M3, b) / global;  // CT stores the encode scale
                         })});
      } else {
        found.push_back({base, CheckpointFormat::MXFP4, Convention::CompressedTensors,
                         dequantize_blocks(e, true, scale, 32, fp4_logical_shape(e), e8m0)});
      }
    } else if (c.contains(n + "_scale") && !ends_with(n, "_scale")) {
      const SafetensorsEntry& scale = c.at(n + "_scale");
      if (is_fp4_storage(e) && scale.dtype == "F8_E4M3" && c.contains(n + "_scale_2")) {
        // ModelOpt NVFP4: x = code * (scale * weight_scale_2)
        const float s2 = scalar_f32(c.at(n + "_scale_2"));
        found.push_back({n, CheckpointFormat::NVFP4, Convention::ModelOpt,
                         dequantize_blocks(e, true, scale, 16, fp4_logical_shape(e),
                                           [&](uint8_t b) { return decode(Format::E4M3, b) * s2; })});
      } else if (e.dtype == "F8_E4M3" && scale.dtype == "U8") {
        // MXFP8 (ModelOpt or compressed-tensors: the same tensors)
        found.push_back({n, CheckpointFormat::MXFP8, mxfp8_convention(c),
                         dequantize_blocks(e, false, scale, 32, e.shape, e8m0)});
      }
    }
  }
  return found;
}

}  // namespace microscale
