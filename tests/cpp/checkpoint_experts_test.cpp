// Stacked MoE experts ([E, in, out], Llama 4 / Qwen3-VL-MoE) under modelopt and compressed-tensors:
// split into one [out, in] weight per expert, gate and up sharing an NVFP4 global scale; kept where
// the model's layout or dims are not known, and never quantized in part.
#include <gtest/gtest.h>

#include <algorithm>
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
constexpr const char* kLlama4Config =
    R"({"model_type": "llama4", "text_config": {"model_type": "llama4_text", "num_local_experts": 2,
        "hidden_size": 32, "intermediate_size": 64}})";

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

// A Llama 4-like model: stacked experts, a router and an attention projection (with `biases`, also
// gpt-oss's stacked expert biases). Expert 0's up half is 8x larger than its gate half, so a shared
// global scale differs from the gate's own.
StackedModel make_stacked_model(const std::string& name, const std::string& config, bool biases = false) {
  StackedModel m{fresh_dir(name),
                 random_tensor(DType::F32, {kExperts, kHidden, 2 * kInter}, Fill::Normal, 21),
                 random_tensor(DType::F32, {kExperts, kInter, kHidden}, Fill::Normal, 22)};
  for (int64_t i = 0; i < kHidden; ++i) {
    for (int64_t o = kInter; o < 2 * kInter; ++o) m.gate_up.data_as<float>()[i * 2 * kInter + o] *= 8.0f;
  }
  const Tensor router = random_tensor(DType::F32, {kExperts, kHidden}, Fill::Normal, 23);
  const Tensor q = random_tensor(DType::F32, {kHidden, kHidden}, Fill::Normal, 24);
  const Tensor bias = random_tensor(DType::F32, {kExperts, 2 * kInter}, Fill::Normal, 25);
  std::vector<SafetensorsTensor> tensors = {
      {kPrefix + ".gate_up_proj", "F32", m.gate_up.shape(), m.gate_up.data(), m.gate_up.nbytes()},
      {kPrefix + ".down_proj", "F32", m.down.shape(), m.down.data(), m.down.nbytes()},
      {"language_model.model.layers.0.feed_forward.router.weight", "F32", router.shape(), router.data(),
       router.nbytes()},
      {"language_model.model.layers.0.self_attn.q_proj.weight", "F32", q.shape(), q.data(), q.nbytes()}};
  if (biases)
    tensors.push_back({kPrefix + ".gate_up_proj_bias", "F32", bias.shape(), bias.data(), bias.nbytes()});
  write_safetensors((m.dir / "model.safetensors").string(), tensors);
  std::ofstream(m.dir / "config.json") << config;
  return m;
}

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

// The quantization_config's ignore list of a converted model.
nlohmann::json ignore_list(const fs::path& out) {
  return nlohmann::json::parse(std::ifstream(out / "config.json"))["quantization_config"]["ignore"];
}

void expect_conversion_error(const fs::path& in, const ConvertOptions& o, const std::string& reason) {
  try {
    convert_checkpoint(in.string(), fresh_dir("stacked_error_out").string(), o);
    ADD_FAILURE() << "accepted: " << reason;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

struct Combo {
  CheckpointFormat format;
  Convention convention;
};

TEST(StackedExperts, LayoutFromTheConfig) {
  const auto layout = [](const std::string& config) {
    const fs::path dir = fresh_dir("stacked_layout");
    const Tensor w = random_tensor(DType::F32, {16, 16}, Fill::Normal, 1);
    write_safetensors((dir / "model.safetensors").string(), {{"w", "F32", w.shape(), w.data(), w.nbytes()}});
    if (!config.empty()) std::ofstream(dir / "config.json") << config;
    return stacked_expert_layout(Checkpoint::open(dir.string()));
  };
  const StackedExpertLayout llama4 = layout(kLlama4Config);
  EXPECT_EQ(llama4.gate_up, StackedGateUp::Halves);
  EXPECT_EQ(llama4.experts, kExperts);
  EXPECT_EQ(llama4.hidden, kHidden);
  EXPECT_EQ(llama4.intermediate, kInter);
  EXPECT_EQ(layout(R"({"model_type": "llama4_text"})").gate_up, StackedGateUp::Halves);
  const StackedExpertLayout qwen = layout(
      R"({"model_type": "qwen3_vl_moe", "text_config": {"model_type": "qwen3_vl_moe_text", "num_experts": 8,
          "hidden_size": 16, "moe_intermediate_size": 4, "intermediate_size": 99}})");
  EXPECT_EQ(qwen.gate_up, StackedGateUp::Halves);
  EXPECT_EQ(qwen.experts, 8);
  EXPECT_EQ(qwen.hidden, 16);
  EXPECT_EQ(qwen.intermediate, 4);  // the experts', not the dense MLP's
  EXPECT_EQ(layout(R"({"model_type": "qwen3_vl_moe"})").gate_up, StackedGateUp::Halves);
  EXPECT_EQ(layout(R"({"model_type": "gpt_oss"})").gate_up, StackedGateUp::Interleaved);
  EXPECT_EQ(layout(R"({"model_type": "llama"})").gate_up, StackedGateUp::Unknown);
  EXPECT_EQ(layout(R"({"model_type": 4, "text_config": []})").gate_up, StackedGateUp::Unknown);
  const StackedExpertLayout bad_dims = layout(
      R"({"model_type": "llama4", "hidden_size": "32", "num_local_experts": -2, "intermediate_size": 2.5})");
  EXPECT_EQ(bad_dims.hidden, 0);
  EXPECT_EQ(bad_dims.experts, 0);
  EXPECT_EQ(bad_dims.intermediate, 0);
  EXPECT_EQ(layout("").gate_up, StackedGateUp::Unknown);
  EXPECT_THROW(split_stacked_experts("a.experts.gate_up_proj", {2, 4, 7}), Error);  // odd 2I
  EXPECT_THROW(split_stacked_experts("a.experts.up_proj", {2, 4, 8}), Error);
  EXPECT_THROW(split_stacked_experts("a.experts.down_proj", {4, 8}), Error);
}

// copy_expert_slice: each expert's [out, in], contiguous, across several 64 x 64 tiles.
TEST(StackedExperts, CopyOfAnExpertSlice) {
  for (DType dtype : {DType::BF16, DType::F32}) {
    const int64_t experts = 3, in = 130, inter = 70;
    const Tensor stacked = random_tensor(dtype, {experts, in, 2 * inter}, Fill::Normal, 31);
    const Tensor f = to_f32_matrix(stacked.view());  // [E * in, 2I]
    for (const ExpertSlice& slice : split_stacked_experts("p.experts.gate_up_proj", stacked.shape())) {
      const Tensor copy = copy_expert_slice(stacked.view(), slice);
      ASSERT_EQ(copy.shape(), (std::vector<int64_t>{inter, in}));
      ASSERT_EQ(copy.dtype(), dtype);
      const Tensor got = to_f32_matrix(copy.view());
      const int64_t e = slice.offset / (in * 2 * inter), first = slice.offset % (in * 2 * inter);
      int64_t bad = 0;
      for (int64_t o = 0; o < inter; ++o) {
        for (int64_t i = 0; i < in; ++i)
          bad += got.data_as<float>()[o * in + i] != f.data_as<float>()[(e * in + i) * 2 * inter + first + o];
      }
      EXPECT_EQ(bad, 0) << slice.name;
    }
  }
}

// Split only what the config describes: the shapes must be its [E, in, out] and not square.
TEST(StackedExperts, SplitOnlyShapesTheConfigGives) {
  StackedExpertLayout l{StackedGateUp::Halves, 2, 32, 64};
  const auto problem = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return stacked_expert_split_problem(name, shape, l);
  };
  EXPECT_EQ(problem("p.experts.gate_up_proj", {2, 32, 128}), "");
  EXPECT_EQ(problem("p.experts.down_proj", {2, 64, 32}), "");
  EXPECT_NE(problem("p.experts.gate_up_proj", {2, 128, 32}).find("not the [2, 32, 128]"), std::string::npos);
  EXPECT_NE(problem("p.experts.down_proj", {2, 32, 64}).find("not the [2, 64, 32]"), std::string::npos);
  EXPECT_NE(problem("p.experts.down_proj", {3, 64, 32}), "");  // another number of experts
  l.intermediate = 16;                                         // 2I = H
  EXPECT_NE(problem("p.experts.gate_up_proj", {2, 32, 32}).find("square"), std::string::npos);
  l.intermediate = 32;  // I = H
  EXPECT_NE(problem("p.experts.down_proj", {2, 32, 32}).find("square"), std::string::npos);
  l.hidden = 0;
  EXPECT_NE(problem("p.experts.down_proj", {2, 32, 32}).find("lacks"), std::string::npos);
  l.gate_up = StackedGateUp::Unknown;
  EXPECT_NE(problem("p.experts.down_proj", {2, 32, 32}).find("not known"), std::string::npos);
  l.gate_up = StackedGateUp::Interleaved;
  EXPECT_NE(problem("p.experts.down_proj", {2, 32, 32}).find("gpt-oss"), std::string::npos);
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

// Stacked experts that cannot be split stay as they are, with the rest of their module, the
// module in the ignore list (engines then load them unquantized); a layer's experts quantized in
// part, or some layers' split and others kept, is an error.
TEST(StackedExperts, KeptUnlessSplittableAndNeverInPart) {
  for (
      const std::string& config :
      {std::string(R"({"model_type": "some_moe"})"), std::string(R"({"model_type": "gpt_oss"})"),
       std::string(
           R"({"model_type": "llama4", "num_local_experts": 2, "hidden_size": 64, "intermediate_size": 32})"),
       std::string(kLlama4Config)}) {
    SCOPED_TRACE(config);  // (the third: dims that the tensors do not have; the last: a bias beside them)
    const StackedModel m = make_stacked_model("stacked_kept_in", config, /*biases=*/true);
    for (Convention convention : {Convention::ModelOpt, Convention::CompressedTensors}) {
      const fs::path out = fresh_dir("stacked_kept_out");
      ConvertOptions o;
      o.convention = convention;
      for (const TensorReport& r : convert_checkpoint(m.dir.string(), out.string(), o)) {
        if (!r.name.starts_with(kPrefix)) continue;
        EXPECT_FALSE(r.quantized) << r.name;
        const std::string reason = r.name.ends_with("_bias")                         ? "not a weight of"
                                   : config.find("gpt_oss") != std::string::npos     ? "gpt-oss convention"
                                   : config.find("some_moe") != std::string::npos    ? "layout is not known"
                                   : config.find("text_config") != std::string::npos ? "also holds"
                                                                                     : "of config.json";
        EXPECT_NE(r.kept_because.find(reason), std::string::npos) << r.kept_because;
      }
      const Checkpoint q = Checkpoint::open(out.string());
      const Checkpoint original = Checkpoint::open(m.dir.string());
      for (const std::string& name :
           {kPrefix + ".gate_up_proj", kPrefix + ".down_proj", kPrefix + ".gate_up_proj_bias"}) {
        ASSERT_TRUE(q.contains(name)) << name;
        EXPECT_EQ(0, std::memcmp(q.at(name).data, original.at(name).data, original.at(name).nbytes)) << name;
      }
      // The module, and (vLLM and SGLang ask compressed-tensors by the first expert's names) those.
      const nlohmann::json ignored = ignore_list(out);
      for (const std::string& module :
           {kPrefix, kPrefix + ".0.gate_proj", kPrefix + ".0.up_proj", kPrefix + ".0.down_proj"})
        EXPECT_EQ(std::count(ignored.begin(), ignored.end(), module), 1) << module;
      EXPECT_EQ(std::count(ignored.begin(), ignored.end(), kPrefix + ".gate_up_proj_bias"), 0);
    }
  }
  const StackedModel m = make_stacked_model("stacked_part_in", kLlama4Config);
  ConvertOptions partly;
  partly.rules.skip.push_back("*down_proj");
  expect_conversion_error(m.dir, partly, "partly quantized");
  expect_conversion_error(m.dir, partly, "(kept: " + kPrefix + ".down_proj: skip pattern '*down_proj')");
  ConvertOptions none;
  none.rules.skip.push_back("*experts*");
  const fs::path out = fresh_dir("stacked_none_out");
  convert_checkpoint(m.dir.string(), out.string(), none);
  const nlohmann::json ignored = ignore_list(out);
  EXPECT_EQ(std::count(ignored.begin(), ignored.end(), kPrefix), 1);
  // Some layers' experts split and others kept stacked: engines read one form per checkpoint.
  const fs::path two = fresh_dir("stacked_two_layers_in");
  const std::string layer1 = "language_model.model.layers.1.feed_forward.experts";
  write_safetensors(
      (two / "model.safetensors").string(),
      {{kPrefix + ".gate_up_proj", "F32", m.gate_up.shape(), m.gate_up.data(), m.gate_up.nbytes()},
       {kPrefix + ".down_proj", "F32", m.down.shape(), m.down.data(), m.down.nbytes()},
       {layer1 + ".gate_up_proj", "F32", m.gate_up.shape(), m.gate_up.data(), m.gate_up.nbytes()},
       {layer1 + ".down_proj", "F32", m.down.shape(), m.down.data(), m.down.nbytes()}});
  std::ofstream(two / "config.json") << kLlama4Config;
  ConvertOptions one_layer;
  one_layer.rules.skip.push_back("*layers.1.*");
  expect_conversion_error(two, one_layer, "every layer");
  expect_conversion_error(two, one_layer,
                          "(split: '" + kPrefix + "'; kept: " + layer1 + ".gate_up_proj: skip pattern");
  EXPECT_NO_THROW(convert_checkpoint(two.string(), fresh_dir("stacked_two_out").string(), ConvertOptions{}));
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
  // gate and up see the experts module's input: its entry serves them too.
  const fs::path by_module = fresh_dir("stacked_calib_module") / "calibration.safetensors";
  write_safetensors(by_module.string(),
                    {{"language_model.model.layers.0.self_attn.q_proj.input_amax", "F32", {}, &q_amax, 4},
                     {kPrefix + ".input_amax", "F32", {}, &gate_up_amax, 4},
                     {kPrefix + ".down_proj.input_amax", "F32", {}, &down_amax, 4}});
  o.calibration = by_module.string();
  const fs::path out_module = fresh_dir("stacked_calib_module_out");
  convert_checkpoint(m.dir.string(), out_module.string(), o);
  const Checkpoint qm = Checkpoint::open(out_module.string());
  for (const std::string which : {"gate_proj", "up_proj", "down_proj"}) {
    float v;
    std::memcpy(&v, qm.at(kPrefix + ".1." + which + ".input_scale").data, 4);
    EXPECT_FLOAT_EQ(v * 2688.0f, which == "down_proj" ? down_amax : gate_up_amax) << which;
  }
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
