// Stacked MoE experts ([E, in, out], Llama 4 / Qwen3-VL-MoE) under modelopt and compressed-tensors:
// split into one [out, in] weight per expert, gate and up sharing an NVFP4 global scale; kept where
// the model's gate/up layout is not known, and never quantized in part.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"
#include "temp_path.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

namespace fs = std::filesystem;
using testing_data::Fill;
using testing_data::random_tensor;

constexpr int64_t kExperts = 2, kHidden = 32, kInter = 64;
const std::string kPrefix = "language_model.model.layers.0.feed_forward.experts";

fs::path fresh_dir(const std::string& name) {
  const fs::path p = testing_paths::temp_path(name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

struct StackedModel {
  fs::path dir;
  Tensor gate_up;  // f32 [E, H, 2I]
  Tensor down;     // f32 [E, I, H]
};

// A Llama 4-like model: stacked experts, a router and an attention projection. Expert 0's up half
// is 8x larger than its gate half, so a shared global scale differs from the gate's own.
StackedModel make_stacked_model(const std::string& name, const std::string& config) {
  StackedModel m{fresh_dir(name),
                 random_tensor(DType::F32, {kExperts, kHidden, 2 * kInter}, Fill::Normal, 21),
                 random_tensor(DType::F32, {kExperts, kInter, kHidden}, Fill::Normal, 22)};
  for (int64_t i = 0; i < kHidden; ++i) {
    for (int64_t o = kInter; o < 2 * kInter; ++o) m.gate_up.data_as<float>()[i * 2 * kInter + o] *= 8.0f;
  }
  const Tensor router = random_tensor(DType::F32, {kExperts, kHidden}, Fill::Normal, 23);
  const Tensor q = random_tensor(DType::F32, {kHidden, kHidden}, Fill::Normal, 24);
  write_safetensors(
      (m.dir / "model.safetensors").string(),
      {{kPrefix + ".gate_up_proj", "F32", m.gate_up.shape(), m.gate_up.data(), m.gate_up.nbytes()},
       {kPrefix + ".down_proj", "F32", m.down.shape(), m.down.data(), m.down.nbytes()},
       {"language_model.model.layers.0.feed_forward.router.weight", "F32", router.shape(), router.data(),
        router.nbytes()},
       {"language_model.model.layers.0.self_attn.q_proj.weight", "F32", q.shape(), q.data(), q.nbytes()}});
  std::ofstream(m.dir / "config.json") << config;
  return m;
}

constexpr const char* kLlama4Config =
    R"({"model_type": "llama4", "text_config": {"model_type": "llama4_text"}})";

// Expert e's weights [out, in] by index arithmetic on the stacked [E, in, out] (gate_up_proj: gate
// the first half of the last dim, up the second, as transformers' chunk(2, dim=-1)).
Tensor expert_weight(const StackedModel& m, int64_t e, const std::string& which) {
  const bool down = which == "down_proj";
  const int64_t out = down ? kHidden : kInter, in = down ? kInter : kHidden;
  const int64_t out_total = down ? kHidden : 2 * kInter, first = which == "up_proj" ? kInter : 0;
  const float* stacked = (down ? m.down : m.gate_up).data_as<float>() + e * in * out_total;
  Tensor w(DType::F32, {out, in});
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) w.data_as<float>()[o * in + i] = stacked[i * out_total + first + o];
  }
  return w;
}

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::fmax(m, std::fabs(t.data_as<float>()[i]));
  return m;
}

std::string expert_name(int64_t e, const std::string& which) {
  return kPrefix + "." + std::to_string(e) + "." + which + ".weight";
}

struct Combo {
  CheckpointFormat format;
  Convention convention;
};

TEST(StackedExperts, GateUpLayoutFromTheConfig) {
  const auto layout = [](const std::string& config) {
    const fs::path dir = fresh_dir("stacked_layout");
    const Tensor w = random_tensor(DType::F32, {16, 16}, Fill::Normal, 1);
    write_safetensors((dir / "model.safetensors").string(), {{"w", "F32", w.shape(), w.data(), w.nbytes()}});
    if (!config.empty()) std::ofstream(dir / "config.json") << config;
    return stacked_gate_up_layout(Checkpoint::open(dir.string()));
  };
  EXPECT_EQ(layout(kLlama4Config), StackedGateUp::Halves);
  EXPECT_EQ(layout(R"({"model_type": "llama4_text"})"), StackedGateUp::Halves);
  EXPECT_EQ(layout(R"({"model_type": "qwen3_vl_moe"})"), StackedGateUp::Halves);
  EXPECT_EQ(layout(R"({"model_type": "x", "text_config": {"model_type": "qwen3_vl_moe_text"}})"),
            StackedGateUp::Halves);
  EXPECT_EQ(layout(R"({"model_type": "gpt_oss"})"), StackedGateUp::Interleaved);
  EXPECT_EQ(layout(R"({"model_type": "llama"})"), StackedGateUp::Unknown);
  EXPECT_EQ(layout(R"({"model_type": 4, "text_config": []})"), StackedGateUp::Unknown);
  EXPECT_EQ(layout(""), StackedGateUp::Unknown);
  EXPECT_THROW(split_stacked_experts("a.experts.gate_up_proj", {2, 4, 7}), Error);  // odd 2I
  EXPECT_THROW(split_stacked_experts("a.experts.up_proj", {2, 4, 8}), Error);
  EXPECT_THROW(split_stacked_experts("a.experts.down_proj", {4, 8}), Error);
}

TEST(StackedExperts, SplitPerExpertInEveryConvention) {
  const StackedModel m = make_stacked_model("stacked_in", kLlama4Config);
  const Combo combos[] = {{CheckpointFormat::NVFP4, Convention::ModelOpt},
                          {CheckpointFormat::MXFP8, Convention::ModelOpt},
                          {CheckpointFormat::NVFP4, Convention::CompressedTensors},
                          {CheckpointFormat::MXFP8, Convention::CompressedTensors},
                          {CheckpointFormat::MXFP4, Convention::CompressedTensors}};
  for (const Combo& combo : combos) {
    const std::string what =
        std::string(checkpoint_format_name(combo.format)) + "/" + convention_name(combo.convention);
    SCOPED_TRACE(what);
    const bool nvfp4 = combo.format == CheckpointFormat::NVFP4;
    const bool ct = combo.convention == Convention::CompressedTensors;
    const fs::path out = fresh_dir("stacked_out");
    ConvertOptions o;
    o.format = combo.format;
    o.convention = combo.convention;
    const std::vector<TensorReport> reports = convert_checkpoint(m.dir.string(), out.string(), o);
    for (const TensorReport& r : reports) {
      const bool experts = r.name.starts_with(kPrefix);
      EXPECT_EQ(r.quantized, experts || r.name.ends_with("q_proj.weight")) << r.name;
      if (experts) {  // one report for the stacked tensor, over all its experts
        EXPECT_GT(r.sqnr_db, combo.format == CheckpointFormat::MXFP8 ? 25.0 : 8.0) << r.name;
        EXPECT_LT(r.bytes_after, r.bytes_before) << r.name;
      }
    }
    const Checkpoint q = Checkpoint::open(out.string());
    EXPECT_FALSE(q.contains(kPrefix + ".gate_up_proj"));
    EXPECT_FALSE(q.contains(kPrefix + ".down_proj"));
    // Each expert's weights are those of the library's quantizer on that expert's [out, in], NVFP4
    // gate and up against one amax (engines fuse them into w13, under one global scale).
    std::map<std::string, const DetectedWeight*> found;
    const std::vector<DetectedWeight> weights = read_quantized_weights(q);
    for (const DetectedWeight& w : weights) found[w.name] = &w;
    ASSERT_EQ(weights.size(), 3u * kExperts + 1);
    for (int64_t e = 0; e < kExperts; ++e) {
      const float gate_up_amax =
          std::fmax(max_abs(expert_weight(m, e, "gate_proj")), max_abs(expert_weight(m, e, "up_proj")));
      for (const std::string which : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string name = expert_name(e, which);
        ASSERT_TRUE(found.count(name)) << name;
        const Tensor w = expert_weight(m, e, which);
        QuantizeOptions qo;
        qo.scheme = nvfp4                                     ? Scheme::NVFP4
                    : combo.format == CheckpointFormat::MXFP8 ? Scheme::MXFP8_E4M3
                                                              : Scheme::MXFP4;
        if (nvfp4 && which != "down_proj") qo.amax_rowwise = gate_up_amax;
        const Tensor expected = dequantize(quantize(w.view(), qo), Usage::Rowwise, DType::F32);
        const Tensor& got = found[name]->values;
        ASSERT_EQ(got.shape(), w.shape()) << name;
        int64_t bad = 0;
        for (int64_t i = 0; i < expected.numel(); ++i) {
          const float a = got.data_as<float>()[i], b = expected.data_as<float>()[i];
          // compressed-tensors NVFP4 stores the encode scale: within 2 ulps (as the round trip test)
          bad += !(std::fabs(a - b) <= (nvfp4 && ct ? 3e-7f * std::fabs(b) : 0.0f));
        }
        EXPECT_EQ(bad, 0) << name;
      }
      if (nvfp4) {  // one global scale for gate and up of an expert, its own for down
        const std::string suffix = ct ? "_global_scale" : "_scale_2";
        const auto global = [&](const std::string& which) {
          float v;
          std::memcpy(&v, q.at(expert_name(e, which) + suffix).data, 4);
          return v;
        };
        EXPECT_EQ(global("gate_proj"), global("up_proj"));
        const float down_amax = max_abs(expert_weight(m, e, "down_proj"));
        EXPECT_FLOAT_EQ(ct ? 2688.0f / global("down_proj") : 2688.0f * global("down_proj"), down_amax);
        EXPECT_FLOAT_EQ(ct ? 2688.0f / global("gate_proj") : 2688.0f * global("gate_proj"), gate_up_amax);
      }
    }
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
    const nlohmann::json ignored = config["quantization_config"]["ignore"];
    EXPECT_NE(std::find(ignored.begin(), ignored.end(), "language_model.model.layers.0.feed_forward.router"),
              ignored.end());
    EXPECT_EQ(std::find(ignored.begin(), ignored.end(), kPrefix), ignored.end());
  }
}

// Without a known gate/up layout the stacked experts stay as they are, their module in the ignore
// list (engines then load them unquantized); a layer's experts quantized in part is an error.
TEST(StackedExperts, KeptUnlessTheLayoutIsKnownAndNeverInPart) {
  for (const std::string config : {R"({"model_type": "some_moe"})", R"({"model_type": "gpt_oss"})"}) {
    SCOPED_TRACE(config);
    const StackedModel m = make_stacked_model("stacked_unknown_in", config);
    const fs::path out = fresh_dir("stacked_unknown_out");
    const std::vector<TensorReport> reports =
        convert_checkpoint(m.dir.string(), out.string(), ConvertOptions{});
    for (const TensorReport& r : reports) {
      if (!r.name.starts_with(kPrefix)) continue;
      EXPECT_FALSE(r.quantized) << r.name;
      EXPECT_NE(r.kept_because.find(config.find("gpt_oss") != std::string::npos ? "gpt-oss convention"
                                                                                : "layout is not known"),
                std::string::npos)
          << r.kept_because;
    }
    const Checkpoint q = Checkpoint::open(out.string());
    const Checkpoint original = Checkpoint::open(m.dir.string());
    for (const std::string& name : {kPrefix + ".gate_up_proj", kPrefix + ".down_proj"}) {
      ASSERT_TRUE(q.contains(name)) << name;
      EXPECT_EQ(0, std::memcmp(q.at(name).data, original.at(name).data, original.at(name).nbytes)) << name;
    }
    const nlohmann::json config_out = nlohmann::json::parse(std::ifstream(out / "config.json"));
    const nlohmann::json ignored = config_out["quantization_config"]["ignore"];
    EXPECT_EQ(std::count(ignored.begin(), ignored.end(), kPrefix), 1);
  }
  const StackedModel m = make_stacked_model("stacked_part_in", kLlama4Config);
  ConvertOptions partly;
  partly.rules.skip.push_back("*down_proj");
  try {
    convert_checkpoint(m.dir.string(), fresh_dir("stacked_part_out").string(), partly);
    ADD_FAILURE() << "experts quantized in part";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("partly quantized"), std::string::npos) << e.what();
  }
  ConvertOptions none;
  none.rules.skip.push_back("*experts*");
  const fs::path out = fresh_dir("stacked_none_out");
  convert_checkpoint(m.dir.string(), out.string(), none);
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
  const nlohmann::json ignored = config["quantization_config"]["ignore"];
  EXPECT_EQ(std::count(ignored.begin(), ignored.end(), kPrefix), 1);
}

// NVFP4 W4A4: each expert's input scale from its own calibration entry, else from its stacked
// tensor's; gate and up of an expert share the max of theirs.
TEST(StackedExperts, CalibrationPerExpertOrStacked) {
  const StackedModel m = make_stacked_model("stacked_calib_in", kLlama4Config);
  const fs::path calib = fresh_dir("stacked_calib") / "calibration.safetensors";
  const float q_amax = 2.0f, gate_up_amax = 3.0f, down_amax = 5.0f, down1_amax = 7.0f, up1_amax = 11.0f;
  write_safetensors(calib.string(),
                    {{"language_model.model.layers.0.self_attn.q_proj.input_amax", "F32", {}, &q_amax, 4},
                     {kPrefix + ".gate_up_proj.input_amax", "F32", {}, &gate_up_amax, 4},
                     {kPrefix + ".down_proj.input_amax", "F32", {}, &down_amax, 4},
                     {kPrefix + ".1.down_proj.input_amax", "F32", {}, &down1_amax, 4},
                     {kPrefix + ".1.up_proj.input_amax", "F32", {}, &up1_amax, 4}});
  ConvertOptions o;
  o.calibration = calib.string();
  const fs::path out = fresh_dir("stacked_calib_out");
  convert_checkpoint(m.dir.string(), out.string(), o);
  const Checkpoint q = Checkpoint::open(out.string());
  const auto input_amax = [&](int64_t e, const std::string& which) {
    float v;
    std::memcpy(&v, q.at(kPrefix + "." + std::to_string(e) + "." + which + ".input_scale").data, 4);
    return v * 2688.0f;
  };
  EXPECT_FLOAT_EQ(input_amax(0, "gate_proj"), gate_up_amax);
  EXPECT_FLOAT_EQ(input_amax(0, "up_proj"), gate_up_amax);
  EXPECT_FLOAT_EQ(input_amax(0, "down_proj"), down_amax);
  EXPECT_FLOAT_EQ(input_amax(1, "gate_proj"), up1_amax);  // the max of gate's 3 and up's own 11
  EXPECT_FLOAT_EQ(input_amax(1, "up_proj"), up1_amax);
  EXPECT_FLOAT_EQ(input_amax(1, "down_proj"), down1_amax);
  // Neither the expert's entry nor the stacked tensor's: an error naming both.
  const fs::path missing = fresh_dir("stacked_calib_missing") / "calibration.safetensors";
  write_safetensors(missing.string(),
                    {{"language_model.model.layers.0.self_attn.q_proj.input_amax", "F32", {}, &q_amax, 4},
                     {kPrefix + ".gate_up_proj.input_amax", "F32", {}, &gate_up_amax, 4}});
  o.calibration = missing.string();
  try {
    convert_checkpoint(m.dir.string(), fresh_dir("stacked_calib_missing_out").string(), o);
    ADD_FAILURE() << "accepted a calibration without the experts' down_proj";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(kPrefix + ".0.down_proj.input_amax"), std::string::npos) << what;
    EXPECT_NE(what.find(kPrefix + ".down_proj.input_amax"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace microscale
