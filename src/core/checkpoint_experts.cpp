// MoE experts stacked in one tensor per projection ([experts, in, out]: gpt-oss, Llama 4,
// Qwen3-VL-MoE), and the per-expert [out, in] weights that quantized checkpoints hold instead.
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

StackedGateUp stacked_gate_up_layout(const Checkpoint& c) {
  const nlohmann::json config = nlohmann::json::parse(c.config_json(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return StackedGateUp::Unknown;
  const auto model_type = [](const nlohmann::json& j) {
    const nlohmann::json type = j.value("model_type", nlohmann::json());
    return type.is_string() ? type.get<std::string>() : std::string();
  };
  const std::string top = model_type(config);
  if (top == "gpt_oss") return StackedGateUp::Interleaved;
  const nlohmann::json text = config.value("text_config", nlohmann::json());
  if (gate_up_in_halves(top) || (text.is_object() && gate_up_in_halves(model_type(text))))
    return StackedGateUp::Halves;
  return StackedGateUp::Unknown;
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

TensorView expert_slice_view(const TensorView& stacked, const ExpertSlice& slice) {
  TensorView v = stacked;
  v.data =
      static_cast<std::byte*>(stacked.data) + slice.offset * static_cast<int64_t>(dtype_size(stacked.dtype));
  v.shape = {slice.out, slice.in};
  v.strides = {slice.out_stride, slice.in_stride};
  return v;
}

}  // namespace microscale
