// Format/convention names and the rules that decide which tensors are quantized.
#include <nlohmann/json.hpp>

#include "core/ascii_lowercase.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"

namespace microscale {

CheckpointFormat parse_checkpoint_format(const std::string& name) {
  const std::string lower = ascii_lowercase(name);
  if (lower == "nvfp4") return CheckpointFormat::NVFP4;
  if (lower == "mxfp8") return CheckpointFormat::MXFP8;
  if (lower == "mxfp4") return CheckpointFormat::MXFP4;
  throw Error("unknown format '" + name + "' (expected nvfp4, mxfp8 or mxfp4)");
}

Convention parse_convention(const std::string& name) {
  const std::string lower = ascii_lowercase(name);
  if (lower == "modelopt") return Convention::ModelOpt;
  if (lower == "compressed-tensors") return Convention::CompressedTensors;
  if (lower == "gpt-oss") return Convention::GptOss;
  throw Error("unknown convention '" + name + "' (expected modelopt, compressed-tensors or gpt-oss)");
}

const char* checkpoint_format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::NVFP4: return "nvfp4";
    case CheckpointFormat::MXFP8: return "mxfp8";
    case CheckpointFormat::MXFP4: return "mxfp4";
  }
  return "?";
}

const char* convention_name(Convention c) {
  switch (c) {
    case Convention::ModelOpt: return "modelopt";
    case Convention::CompressedTensors: return "compressed-tensors";
    case Convention::GptOss: return "gpt-oss";
  }
  return "?";
}

bool is_gpt_oss_model(const Checkpoint& c) {
  const nlohmann::json config = nlohmann::json::parse(c.config_json(), nullptr, /*allow_exceptions=*/false);
  return config.is_object() && config.value("model_type", nlohmann::json()) == "gpt_oss";
}

Convention default_convention(CheckpointFormat f, const Checkpoint& input) {
  if (f != CheckpointFormat::MXFP4) return Convention::ModelOpt;
  return is_gpt_oss_model(input) ? Convention::GptOss : Convention::CompressedTensors;
}

void check_supported(CheckpointFormat f, Convention c) {
  const bool ok = (c == Convention::ModelOpt && f != CheckpointFormat::MXFP4) ||
                  c == Convention::CompressedTensors ||
                  (c == Convention::GptOss && f == CheckpointFormat::MXFP4);
  if (!ok) {
    throw Error(std::string("the ") + convention_name(c) + " convention has no " + checkpoint_format_name(f) +
                " layout (modelopt: nvfp4, mxfp8; compressed-tensors: nvfp4, mxfp8, mxfp4; gpt-oss: mxfp4)");
  }
}

ConvertOptions convert_options(const std::string& input, const std::string& format,
                               const std::string& convention, const std::string& scale_mode) {
  ConvertOptions o;
  o.format = parse_checkpoint_format(format);
  if (!convention.empty()) {
    o.convention = parse_convention(convention);
  } else {  // mxfp4's default depends on the model; the others' do not (no need to open the input)
    o.convention = o.format == CheckpointFormat::MXFP4 ? default_convention(o.format, Checkpoint::open(input))
                                                       : Convention::ModelOpt;
  }
  check_supported(o.format, o.convention);
  if (!scale_mode.empty()) {
    if (o.format == CheckpointFormat::NVFP4)
      throw Error("the scale mode applies to the MX formats, not nvfp4");
    o.mx_scale_mode = parse_scale_mode(scale_mode);
  }
  return o;
}

bool wildcard_match(const std::string& pattern, const std::string& text) {
  // Iterative matcher with backtracking to the last '*'.
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<std::string> LayerRules::default_skips() {
  // What serving engines keep in high precision (ModelOpt's and llm-compressor's default
  // exclusions, gpt-oss's modules_to_not_convert): embeddings, norms, the output head, MoE
  // routers/gates, and small heads. Also the vision side of multimodal models, which llm-compressor's
  // recipes ignore and vLLM builds unquantized for some (Llama 4's vision_model and projector).
  return {"*embed*",  "*norm*",         "*Norm*",         "*lm_head*",    "*router*",
          "*.gate.*", "*mlp.gate",      "*pooler*",       "*classifier*", "*position*",
          "*score*",  "*vision_model*", "*vision_tower*", "*visual*",     "*multi_modal_projector*"};
}

std::string LayerRules::keep_reason(const std::string& name, const std::string& dtype,
                                    const std::vector<int64_t>& shape, int block) const {
  if (dtype != "F32" && dtype != "BF16" && dtype != "F16") return "not floating (" + dtype + ")";
  if (shape.size() < 2) return "rank " + std::to_string(shape.size()) + " (bias/norm vector)";
  for (const std::string& pattern : skip) {
    if (wildcard_match(pattern, name)) return "skip pattern '" + pattern + "'";
  }
  if (!only.empty()) {
    bool any = false;
    for (const std::string& pattern : only) any = any || wildcard_match(pattern, name);
    if (!any) return "matches no --only pattern";
  }
  if (shape.back() % block != 0)
    return "last dim " + std::to_string(shape.back()) + " not a multiple of " + std::to_string(block);
  return "";
}

}  // namespace microscale
