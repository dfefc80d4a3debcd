// Which quantized weights serving engines fuse into one GEMM, so that they share one NVFP4
// global scale (fused_weight_groups).
#include <array>
#include <map>
#include <string_view>
#include <utility>

#include "microscale/checkpoint.hpp"

namespace microscale {

namespace {

// Sibling modules that vLLM and SGLang load into one fused Linear (their packed_modules_mapping),
// and TensorRT-LLM too: the fused layer takes a single global scale (vLLM and SGLang the max of the
// parts', TensorRT-LLM asserts that they are equal), so each part's block scales must have been
// computed against it. ModelOpt and llm-compressor unify the parts' amax before they export.
constexpr std::array<std::array<std::string_view, 3>, 5> kFusedSiblings = {{
    {"q_proj", "k_proj", "v_proj"},          // qkv_proj (Llama, Mistral, Qwen, Gemma, ...)
    {"gate_proj", "up_proj", ""},            // gate_up_proj, also per MoE expert (Qwen, DeepSeek)
    {"query", "key", "value"},               // BERT's qkv_proj
    {"w1", "w3", ""},                        // Mixtral's experts: w13
    {"q_a_proj", "kv_a_proj_with_mqa", ""},  // DeepSeek's fused_qkv_a_proj
}};

constexpr std::string_view kWeightSuffix = ".weight";

}  // namespace

std::vector<std::vector<size_t>> fused_weight_groups(const std::vector<std::string>& weight_names) {
  // (parent module, sibling set) -> members, in input order.
  std::map<std::pair<std::string, size_t>, std::vector<size_t>> members;
  for (size_t i = 0; i < weight_names.size(); ++i) {
    const std::string_view name = weight_names[i];
    if (name.size() <= kWeightSuffix.size() || !name.ends_with(kWeightSuffix)) continue;
    const std::string_view module = name.substr(0, name.size() - kWeightSuffix.size());
    const size_t dot = module.rfind('.');
    const std::string_view parent =
        dot == std::string_view::npos ? std::string_view() : module.substr(0, dot);
    const std::string_view leaf = dot == std::string_view::npos ? module : module.substr(dot + 1);
    for (size_t set = 0; set < kFusedSiblings.size(); ++set) {
      for (std::string_view sibling : kFusedSiblings[set]) {
        if (!sibling.empty() && leaf == sibling) members[{std::string(parent), set}].push_back(i);
      }
    }
  }
  std::vector<std::vector<size_t>> groups;
  for (auto& [key, indices] : members) {
    if (indices.size() >= 2) groups.push_back(std::move(indices));
  }
  return groups;
}

}  // namespace microscale
