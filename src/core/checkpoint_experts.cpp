// MoE experts stacked in one tensor per projection ([experts, in, out]: gpt-oss, Llama 4,
// Qwen3-VL-MoE), and the per-expert [out, in] weights that quantized checkpoints hold instead.
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"

namespace microscale {

namespace {

constexpr std::string_view kGateUp = ".experts.gate_up_proj", kDown = ".experts.down_proj";

// Model types whose gate_up_proj is `chunk(2, dim=-1)` into gate and up (transformers'
// Llama4TextExperts and Qwen3VLMoeTextExperts), top-level or their text_config's.
bool gate_up_in_halves(const std::string& model_type) {
  return model_type == "llama4" || model_type == "llama4_text" || model_type == "qwen3_vl_moe" ||
         model_type == "qwen3_vl_moe_text";
}

}  // namespace

bool is_stacked_expert_weight(const std::string& name, const std::vector<int64_t>& shape) {
  return shape.size() == 3 && (name.ends_with(kGateUp) || name.ends_with(kDown));
}

StackedExpertLayout stacked_expert_layout(const Checkpoint& c) {
  StackedExpertLayout layout;
  const nlohmann::json config = nlohmann::json::parse(c.config_json(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return layout;
  const auto model_type = [](const nlohmann::json& j) {
    const nlohmann::json type = j.value("model_type", nlohmann::json());
    return type.is_string() ? type.get<std::string>() : std::string();
  };
  if (model_type(config) == "gpt_oss") {
    layout.gate_up = StackedGateUp::Interleaved;
    return layout;
  }
  // The text model's config: Llama 4 and Qwen3-VL-MoE nest it in text_config.
  nlohmann::json text = config.value("text_config", nlohmann::json());
  if (!text.is_object() || !gate_up_in_halves(model_type(text))) text = config;
  if (!gate_up_in_halves(model_type(text))) return layout;
  layout.gate_up = StackedGateUp::Halves;
  const auto dim = [&](const char* key) -> int64_t {
    const nlohmann::json v = text.value(key, nlohmann::json());
    return v.is_number_integer() && v.get<int64_t>() > 0 ? v.get<int64_t>() : 0;
  };
  const bool qwen = model_type(text).starts_with("qwen3_vl_moe");
  layout.experts = dim(qwen ? "num_experts" : "num_local_experts");
  layout.hidden = dim("hidden_size");
  layout.intermediate = dim(qwen ? "moe_intermediate_size" : "intermediate_size");
  return layout;
}

std::string stacked_expert_split_problem(const std::string& name, const std::vector<int64_t>& shape,
                                         const StackedExpertLayout& layout) {
  if (layout.gate_up == StackedGateUp::Interleaved)
    return "stacked gpt-oss experts: the gpt-oss convention (mxfp4) quantizes them";
  if (layout.gate_up != StackedGateUp::Halves) {
    return "stacked MoE experts [E, in, out] of a model whose gate/up layout is not known here "
           "(config.json model_type llama4 or qwen3_vl_moe is)";
  }
  if (layout.experts == 0 || layout.hidden == 0 || layout.intermediate == 0) {
    return "stacked MoE experts: config.json lacks the number of experts, hidden_size or the experts' "
           "intermediate size, against which the shape is checked";
  }
  const bool gate_up = name.ends_with(kGateUp);
  const int64_t in = gate_up ? layout.hidden : layout.intermediate;
  const int64_t out = gate_up ? 2 * layout.intermediate : layout.hidden;
  const std::vector<int64_t> expected = {layout.experts, in, out};
  if (shape != expected) {
    return "stacked MoE experts of shape " + shape_string(shape) + ", not the " + shape_string(expected) +
           " [experts, in, out] of config.json";
  }
  if (in == out) {
    return "stacked MoE experts " + shape_string(shape) +
           ": square, so [experts, in, out] and a transposed save read alike";
  }
  return "";
}

std::vector<ExpertSlice> split_stacked_experts(const std::string& name, const std::vector<int64_t>& shape) {
  if (!is_stacked_expert_weight(name, shape))
    throw Error("'" + name +
                "' is not a stacked expert weight (*.experts.gate_up_proj or *.experts.down_proj, rank 3)");
  const int64_t experts = shape[0], in = shape[1], out_total = shape[2];
  const bool gate_up = name.ends_with(kGateUp);
  const std::string prefix = name.substr(0, name.size() - (gate_up ? kGateUp : kDown).size()) + ".experts.";
  if (gate_up && out_total % 2 != 0)
    throw Error("'" + name + "': gate_up_proj's last dim " + std::to_string(out_total) + " is odd");
  std::vector<ExpertSlice> slices;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t base = e * in * out_total;
    const std::string expert = prefix + std::to_string(e);
    if (gate_up) {
      const int64_t half = out_total / 2;  // I
      slices.push_back({expert + ".gate_proj.weight", base, half, in, 1, out_total});
      slices.push_back({expert + ".up_proj.weight", base + half, half, in, 1, out_total});
    } else {
      slices.push_back({expert + ".down_proj.weight", base, out_total, in, 1, out_total});
    }
  }
  return slices;
}

std::vector<ExpertSlice> whole_stacked_experts(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() != 3) throw Error("'" + name + "' is not a stacked expert weight (rank 3)");
  const int64_t experts = shape[0], in = shape[1], out = shape[2];
  std::vector<ExpertSlice> slices;
  for (int64_t e = 0; e < experts; ++e) slices.push_back({name, e * in * out, out, in, 1, out});
  return slices;
}

namespace {

// out[o * in + i] = src[o * out_stride + i * in_stride], in 64 x 64 tiles so that both sides stay
// in L1 (one side is read or written with a stride of a whole row).
template <typename T>
void copy_transposing(const T* src, const ExpertSlice& s, T* out) {
  constexpr int64_t kTile = 64;
  for (int64_t i0 = 0; i0 < s.in; i0 += kTile) {
    for (int64_t o0 = 0; o0 < s.out; o0 += kTile) {
      const int64_t i1 = std::min(i0 + kTile, s.in), o1 = std::min(o0 + kTile, s.out);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t o = o0; o < o1; ++o) out[o * s.in + i] = src[o * s.out_stride + i * s.in_stride];
      }
    }
  }
}

}  // namespace

Tensor copy_expert_slice(const TensorView& stacked, const ExpertSlice& slice) {
  Tensor w(stacked.dtype, {slice.out, slice.in});
  const std::byte* src = static_cast<const std::byte*>(stacked.data) +
                         slice.offset * static_cast<int64_t>(dtype_size(stacked.dtype));
  switch (dtype_size(stacked.dtype)) {
    case 2: copy_transposing(reinterpret_cast<const uint16_t*>(src), slice, w.data_as<uint16_t>()); break;
    case 4: copy_transposing(reinterpret_cast<const uint32_t*>(src), slice, w.data_as<uint32_t>()); break;
    default:
      throw Error("stacked experts of dtype " + std::string(dtype_name(stacked.dtype)) + " cannot be split");
  }
  return w;
}

TensorView expert_slice_view(const TensorView& stacked, const ExpertSlice& slice) {
  TensorView v = stacked;
  v.data =
      static_cast<std::byte*>(stacked.data) + slice.offset * static_cast<int64_t>(dtype_size(stacked.dtype));
  v.shape = {slice.out, slice.in};
  v.strides = {slice.out_stride, slice.in_stride};
  return v;
}

}  // namespace microscale
