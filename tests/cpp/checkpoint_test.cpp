// Checkpoints: sharded reading, the streaming writer, layer rules, and the round trip of every
// convention x format (write, read back, dequantize, compare with the library's bytes and values).
#include "microscale/checkpoint.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "microscale/error.hpp"
#include "microscale/output_file.hpp"
#include "temp_path.hpp"
#include "test_data.hpp"

namespace microscale {
namespace {

namespace fs = std::filesystem;
using testing_data::Fill;
using testing_data::random_tensor;

fs::path fresh_dir(const std::string& name) {
  const fs::path p = testing_paths::temp_path(name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A small BERT-like model directory: two shards, an index, a config.json and a tokenizer file.
fs::path make_model(const std::string& name) {
  const fs::path dir = fresh_dir(name);
  static const Tensor q = random_tensor(DType::BF16, {64, 128}, Fill::Normal, 1);
  static const Tensor up = random_tensor(DType::F32, {128, 64}, Fill::Heavy, 2);
  static const Tensor experts = random_tensor(DType::BF16, {2, 32, 64}, Fill::Normal, 3);
  static const Tensor emb = random_tensor(DType::F32, {100, 64}, Fill::Normal, 4);
  static const Tensor norm = random_tensor(DType::F32, {64}, Fill::Normal, 5);
  static const Tensor odd = random_tensor(DType::F32, {8, 40}, Fill::Normal, 6);
  const std::vector<int64_t> ids = {0, 1, 2, 3};
  write_safetensors(
      (dir / "model-00001-of-00002.safetensors").string(),
      {{"model.embed_tokens.weight", "F32", emb.shape(), emb.data(), emb.nbytes()},
       {"model.layers.0.self_attn.q_proj.weight", "BF16", q.shape(), q.data(), q.nbytes()},
       {"model.layers.0.input_layernorm.weight", "F32", norm.shape(), norm.data(), norm.nbytes()}});
  write_safetensors(
      (dir / "model-00002-of-00002.safetensors").string(),
      {{"model.layers.0.mlp.up_proj.weight", "F32", up.shape(), up.data(), up.nbytes()},
       {"model.layers.0.mlp.experts.gate_up_proj", "BF16", experts.shape(), experts.data(), experts.nbytes()},
       {"model.layers.0.mlp.odd.weight", "F32", odd.shape(), odd.data(), odd.nbytes()},
       {"position_ids", "I64", {4}, ids.data(), 32}});
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const char* n : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.0.input_layernorm.weight"}) {
    index["weight_map"][n] = "model-00001-of-00002.safetensors";
  }
  for (const char* n : {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.experts.gate_up_proj",
                        "model.layers.0.mlp.odd.weight", "position_ids"}) {
    index["weight_map"][n] = "model-00002-of-00002.safetensors";
  }
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "hidden_size": 64})";
  std::ofstream(dir / "tokenizer.json") << "{}";
  return dir;
}

TEST(Checkpoint, ReadsShardsThroughTheIndex) {
  const fs::path dir = make_model("read");
  const Checkpoint c = Checkpoint::open(dir.string());
  EXPECT_EQ(c.shard_names().size(), 2u);
  EXPECT_EQ(c.tensors().size(), 7u);
  EXPECT_TRUE(c.contains("model.layers.0.mlp.up_proj.weight"));
  EXPECT_EQ(c.at("position_ids").dtype, "I64");
  EXPECT_NE(c.config_json().find("llama"), std::string::npos);
  EXPECT_THROW(c.at("nope"), Error);
  // A single file works too.
  EXPECT_EQ(Checkpoint::open((dir / "model-00001-of-00002.safetensors").string()).tensors().size(), 3u);
}

TEST(Checkpoint, BadDirectoriesAreErrors) {
  const fs::path empty = fresh_dir("empty");
  EXPECT_THROW(Checkpoint::open(empty.string()), Error);
  EXPECT_THROW(Checkpoint::open((empty / "missing").string()), Error);
  const fs::path bad = make_model("bad_index");
  std::ofstream(bad / "model.safetensors.index.json") << "{not json";
  EXPECT_THROW(Checkpoint::open(bad.string()), Error);
  std::ofstream(bad / "model.safetensors.index.json") << R"({"weight_map": {"a": "../../etc/passwd"}})";
  EXPECT_THROW(Checkpoint::open(bad.string()), Error);
}

TEST(Checkpoint, AnIndexNamingATensorTwiceIsAnError) {
  // A JSON parser keeps the second entry: the first shard, listed by that entry only, would be
  // left out of the model without a word.
  const fs::path dir = make_model("twice");
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"position_ids": "model-00001-of-00002.safetensors",
                            "position_ids": "model-00002-of-00002.safetensors"}})";
  try {
    Checkpoint::open(dir.string());
    ADD_FAILURE() << "an index naming 'position_ids' twice was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names 'position_ids' twice"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, StaleIndexEntriesAreIgnored) {
  // Index entries are not checked against the shards (loaders read every tensor of the shards it
  // lists): a stale entry is ignored, and the output's index lists what the shards hold.
  const fs::path stale = make_model("index_stale");
  nlohmann::json index = nlohmann::json::parse(std::ifstream(stale / "model.safetensors.index.json"));
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";  // tied: not stored
  std::ofstream(stale / "model.safetensors.index.json") << index.dump();
  EXPECT_FALSE(Checkpoint::open(stale.string()).contains("lm_head.weight"));
  const fs::path out = fresh_dir("index_stale_out");
  convert_checkpoint(stale.string(), out.string(), ConvertOptions{});
  const nlohmann::json written = nlohmann::json::parse(std::ifstream(out / "model.safetensors.index.json"));
  EXPECT_FALSE(written["weight_map"].contains("lm_head.weight"));
  EXPECT_TRUE(written["weight_map"].contains("position_ids"));
}

TEST(Checkpoint, ShardNamesNeedOnlyBePlainFileNames) {
  // Two dots in a name are not a path out of the directory.
  const fs::path dir = fresh_dir("dots");
  const std::vector<float> a(32 * 32, 1.0f);
  write_safetensors((dir / "model..safetensors").string(), {{"w", "F32", {32, 32}, a.data(), a.size() * 4}});
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"w": "model..safetensors"}})";
  EXPECT_TRUE(Checkpoint::open(dir.string()).contains("w"));
  using namespace std::string_literals;
  for (const std::string& name : {".."s, "."s, ""s, "sub/model.safetensors"s, "model..safetensors\0x"s}) {
    std::ofstream(dir / "model.safetensors.index.json")
        << nlohmann::json{{"weight_map", {{"w", name}}}}.dump();  // a NUL as \u0000
    EXPECT_THROW(Checkpoint::open(dir.string()), Error) << name;
  }
}

TEST(Checkpoint, ASingleIndexedShardKeepsItsIndex) {
  // model-00001-of-00001.safetensors is found through the index only: the output needs one too.
  const fs::path dir = fresh_dir("one_shard");
  const std::vector<float> a(32 * 32, 1.0f);
  write_safetensors((dir / "model-00001-of-00001.safetensors").string(),
                    {{"p.weight", "F32", {32, 32}, a.data(), a.size() * 4}});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"p.weight": "model-00001-of-00001.safetensors"}})";
  const fs::path out = fresh_dir("one_shard_out");
  convert_checkpoint(dir.string(), out.string(), ConvertOptions{});
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_TRUE(Checkpoint::open(out.string()).contains("p.weight_scale"));
}

TEST(Checkpoint, ConversionCopiesTheModelDirectoryOnce) {
  // The output inside a subdirectory of the input is not copied into itself; links to
  // directories are not followed; a FIFO and a dangling link are skipped, not read.
  const fs::path model = make_model("copy_in");
  fs::create_directories(model / "1_Pooling");
  std::ofstream(model / "1_Pooling" / "config.json") << "{}";
  std::error_code ec;
  fs::create_directory_symlink("/etc", model / "etc_link", ec);
  if (!ec) fs::create_directory_symlink(".", model / "loop", ec);
  if (!ec) fs::create_symlink("/nonexistent_target", model / "dangling", ec);
  if (ec || ::mkfifo((model / "pipe").c_str(), 0600) != 0)
    GTEST_SKIP() << "the temporary directory's file system has no symbolic links or FIFOs";
  const fs::path out = model / "1_Pooling" / "quantized";
  convert_checkpoint(model.string(), out.string(), ConvertOptions{});
  EXPECT_TRUE(fs::exists(out / "1_Pooling" / "config.json"));
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(out / "1_Pooling" / "quantized"));
  EXPECT_FALSE(fs::exists(out / "etc_link"));
  EXPECT_FALSE(fs::exists(out / "loop"));
  EXPECT_FALSE(fs::exists(out / "pipe"));
  EXPECT_FALSE(fs::is_symlink(out / "dangling"));
  EXPECT_TRUE(Checkpoint::open(out.string()).contains("model.layers.0.self_attn.q_proj.weight_scale"));
}

TEST(Checkpoint, ConfigThatIsNotAnObjectFailsBeforeWriting) {
  const fs::path model = make_model("array_config");
  std::ofstream(model / "config.json") << "[1, 2]";
  const fs::path out = fresh_dir("array_config_out");
  EXPECT_THROW(convert_checkpoint(model.string(), out.string(), ConvertOptions{}), Error);
  EXPECT_TRUE(fs::is_empty(out));
}

// A conversion that fails half way (here the second shard meets a file size limit, as on a full
// disk) removes the shards it had written, and the output directory if it created it.
TEST(Checkpoint, AFailedConversionLeavesNoPartialModel) {
  const fs::path model = fresh_dir("partial_model");
  const Tensor w = random_tensor(DType::BF16, {32, 64}, Fill::Normal, 71);
  const Tensor emb = random_tensor(DType::F32, {256, 256}, Fill::Normal, 72);  // 256 KiB, kept
  write_safetensors((model / "model-00001-of-00002.safetensors").string(),
                    {{"model.layers.0.q_proj.weight", "BF16", w.shape(), w.data(), w.nbytes()}});
  write_safetensors((model / "model-00002-of-00002.safetensors").string(),
                    {{"model.embed_tokens.weight", "F32", emb.shape(), emb.data(), emb.nbytes()}});
  std::ofstream(model / "model.safetensors.index.json")
      << R"({"weight_map": {"model.layers.0.q_proj.weight": "model-00001-of-00002.safetensors",
                            "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}})";
  std::ofstream(model / "config.json") << R"({"model_type": "llama"})";

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 64 * 1024)
    GTEST_SKIP() << "file size hard limit below 64 KiB";
  const fs::path fresh_root = testing_paths::temp_path("partial_out_new");
  fs::remove_all(fresh_root);
  const fs::path fresh = fresh_root / "a" / "b";  // three directories to create
  // An output directory with files of its own: an unrelated one, and a shard of an earlier run
  // that this one fails to replace.
  const fs::path existing = fresh_dir("partial_out_existing");
  std::ofstream(existing / "notes.txt") << "mine";
  std::ofstream(existing / "model-00002-of-00002.safetensors") << "earlier";
  std::vector<std::string> errors;
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;  // the first shard (~1 KiB) fits, the second does not
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  for (const fs::path& out : {fresh, existing}) {
    try {
      convert_checkpoint(model.string(), out.string(), ConvertOptions{});
      errors.emplace_back("no error");
    } catch (const Error& e) {
      errors.emplace_back(e.what());
    }
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("error while writing"), std::string::npos) << e;
    EXPECT_NE(e.find("model-00002-of-00002"), std::string::npos) << e;  // the first shard was written
  }
  EXPECT_FALSE(fs::exists(fresh_root));  // created by the conversion, removed with it
  // The first shard removed again, no temporary file left, the directory's own files kept.
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(existing)) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"model-00002-of-00002.safetensors", "notes.txt"}));
  // Without the limit the same conversion completes.
  convert_checkpoint(model.string(), fresh.string(), ConvertOptions{});
  EXPECT_TRUE(Checkpoint::open(fresh.string()).contains("model.embed_tokens.weight"));
}

// What the CLI's signal handler does mid-conversion (remove_unfinished_outputs): the finished first
// shard, the second one's temporary file and the directories the conversion made go; the files
// the output directory held before stay.
TEST(Checkpoint, AnInterruptedConversionCanRemoveWhatItWrote) {
  const fs::path model = make_model("interrupted_in");
  const fs::path fresh_root = testing_paths::temp_path("interrupted_out_new");
  fs::remove_all(fresh_root);
  const fs::path existing = fresh_dir("interrupted_out_existing");
  std::ofstream(existing / "notes.txt") << "mine";
  struct Stop {};  // ends the conversion as the signal would end the process
  for (const fs::path& out : {fresh_root / "a" / "b", existing}) {
    SCOPED_TRACE(out.string());
    ConvertOptions o;
    std::vector<std::string> before, after;
    o.progress = [&](size_t done, size_t, const TensorReport&) {
      if (done < 4) return;  // the first tensor of the second shard is in its temporary file
      for (const auto& entry : fs::directory_iterator(out))
        before.push_back(entry.path().filename().string());
      remove_unfinished_outputs();
      if (fs::exists(out)) {
        for (const auto& entry : fs::directory_iterator(out))
          after.push_back(entry.path().filename().string());
      }
      throw Stop{};
    };
    EXPECT_THROW(convert_checkpoint(model.string(), out.string(), o), Stop);
    std::sort(before.begin(), before.end());
    ASSERT_EQ(before.size(), out == existing ? 3u : 2u);
    EXPECT_EQ(before[0].rfind(".model-00002-of-00002.safetensors.", 0), 0u) << before[0];  // temporary
    EXPECT_EQ(before[1], "model-00001-of-00002.safetensors");
    if (out == existing) {
      EXPECT_EQ(after, std::vector<std::string>{"notes.txt"});
    } else {
      EXPECT_TRUE(after.empty());
      EXPECT_FALSE(fs::exists(fresh_root));  // the three directories it created
    }
  }
  EXPECT_EQ(remove_unfinished_outputs(), 0);  // nothing left remembered after the unwinding
}

TEST(Checkpoint, StreamWriterChecksOrderAndSizes) {
  const fs::path dir = fresh_dir("stream");
  const std::vector<float> a = {1, 2, 3, 4};
  SafetensorsStreamWriter w;
  w.declare("a", "F32", {2, 2});
  w.declare("b", "F8_E4M3", {3});
  w.begin((dir / "x.safetensors").string(), {{"k", "v"}});
  EXPECT_THROW(w.write("b", a.data(), 3), Error);  // out of order
  w.write("a", a.data(), 16);
  EXPECT_THROW(w.write("b", a.data(), 2), Error);  // wrong size
  EXPECT_THROW(w.finish(), Error);                 // b missing
  w.write("b", a.data(), 3);
  w.finish();
  const SafetensorsFile f = SafetensorsFile::open((dir / "x.safetensors").string());
  EXPECT_EQ(f.at("b").dtype, "F8_E4M3");
  EXPECT_EQ(f.metadata().at("k"), "v");
}

TEST(Checkpoint, LayerRules) {
  const LayerRules rules;
  EXPECT_EQ(rules.keep_reason("model.layers.0.mlp.up_proj.weight", "BF16", {64, 64}, 16), "");
  EXPECT_NE(rules.keep_reason("model.embed_tokens.weight", "BF16", {64, 64}, 16), "");
  EXPECT_NE(rules.keep_reason("lm_head.weight", "BF16", {64, 64}, 16), "");
  EXPECT_NE(rules.keep_reason("model.layers.0.mlp.gate.weight", "BF16", {64, 64}, 16), "");
  EXPECT_NE(rules.keep_reason("model.layers.0.mlp.router.weight", "BF16", {64, 64}, 16), "");
  EXPECT_NE(rules.keep_reason("model.norm.weight", "BF16", {64}, 16), "");
  // The vision side of multimodal models (Llama 4, Qwen-VL, LLaVA-like names).
  for (const char* vision :
       {"vision_model.model.layers.0.self_attn.q_proj.weight", "multi_modal_projector.linear_1.weight",
        "model.visual.blocks.0.attn.qkv.weight", "model.vision_tower.encoder.layers.0.mlp.fc1.weight"})
    EXPECT_NE(rules.keep_reason(vision, "BF16", {64, 64}, 16), "") << vision;
  EXPECT_NE(rules.keep_reason("x.weight", "I64", {64, 64}, 16), "");
  EXPECT_NE(rules.keep_reason("x.weight", "F32", {64, 40}, 32), "");
  LayerRules only;
  only.only = {"*q_proj*"};
  EXPECT_EQ(only.keep_reason("a.q_proj.weight", "F32", {16, 16}, 16), "");
  EXPECT_NE(only.keep_reason("a.k_proj.weight", "F32", {16, 16}, 16), "");
  EXPECT_TRUE(wildcard_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate"));
  EXPECT_FALSE(wildcard_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate_proj"));
  EXPECT_TRUE(wildcard_match("a?c*", "abcdef"));
}

struct Combo {
  CheckpointFormat format;
  Convention convention;
};

TEST(Checkpoint, RoundTripEveryConvention) {
  const Combo combos[] = {{CheckpointFormat::NVFP4, Convention::ModelOpt},
                          {CheckpointFormat::MXFP8, Convention::ModelOpt},
                          {CheckpointFormat::NVFP4, Convention::CompressedTensors},
                          {CheckpointFormat::MXFP8, Convention::CompressedTensors},
                          {CheckpointFormat::MXFP4, Convention::CompressedTensors}};
  // gpt-oss (the MoE experts only): GptOssQuantizesTheExpertsAlongTheirInput.
  const fs::path model = make_model("roundtrip_in");
  const Checkpoint original = Checkpoint::open(model.string());
  for (const Combo& combo : combos) {
    const std::string what =
        std::string(checkpoint_format_name(combo.format)) + "/" + convention_name(combo.convention);
    SCOPED_TRACE(what);
    const fs::path out = fresh_dir(std::string("roundtrip_") + checkpoint_format_name(combo.format) + "_" +
                                   convention_name(combo.convention));
    ConvertOptions o;
    o.format = combo.format;
    o.convention = combo.convention;
    size_t progress_calls = 0;
    o.progress = [&](size_t, size_t, const TensorReport&) { ++progress_calls; };
    const std::vector<TensorReport> reports = convert_checkpoint(model.string(), out.string(), o);
    EXPECT_EQ(progress_calls, reports.size());
    // The sharding, the index, config.json and the other files come along.
    EXPECT_TRUE(fs::exists(out / "model-00001-of-00002.safetensors"));
    EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
    EXPECT_EQ(config["model_type"], "llama");
    EXPECT_TRUE(config.contains("quantization_config"));
    EXPECT_EQ(fs::exists(out / "hf_quant_config.json"), combo.convention == Convention::ModelOpt);

    const Checkpoint q = Checkpoint::open(out.string());
    // Kept tensors are byte-identical.
    // (Stacked experts of a model whose gate/up layout is not known are kept: StackedExperts*.)
    for (const char* kept :
         {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "position_ids",
          "model.layers.0.mlp.odd.weight", "model.layers.0.mlp.experts.gate_up_proj"}) {
      ASSERT_TRUE(q.contains(kept)) << kept;
      EXPECT_EQ(0, std::memcmp(q.at(kept).data, original.at(kept).data, original.at(kept).nbytes)) << kept;
    }
    // Every quantized weight is found again, and equals the library's own dequantization.
    const std::vector<DetectedWeight> weights = read_quantized_weights(q);
    ASSERT_EQ(weights.size(), 2u);
    for (const DetectedWeight& w : weights) {
      EXPECT_EQ(w.format, combo.format);
      EXPECT_EQ(w.convention, combo.convention);
      const TensorView src = original.shard(original.shard(0).contains(w.name) ? 0 : 1).view(w.name);
      QuantizeOptions qo;
      qo.scheme = combo.format == CheckpointFormat::NVFP4   ? Scheme::NVFP4
                  : combo.format == CheckpointFormat::MXFP8 ? Scheme::MXFP8_E4M3
                                                            : Scheme::MXFP4;
      const QuantizedTensor lib = quantize(src, qo);
      const Tensor expected = dequantize(lib, Usage::Rowwise, DType::F32);
      ASSERT_EQ(w.values.shape(), src.shape) << w.name;
      int64_t bad = 0;
      for (int64_t i = 0; i < expected.numel(); ++i) {
        const float a = w.values.data_as<float>()[i], b = expected.data_as<float>()[i];
        // compressed-tensors NVFP4 stores the encode scale: scale / S_enc vs our scale * RN(1/S_enc)
        // differ by at most 2 ulps; every other convention reproduces our values exactly.
        const float tolerance =
            combo.format == CheckpointFormat::NVFP4 && combo.convention == Convention::CompressedTensors
                ? 3e-7f * std::fabs(b)
                : 0.0f;
        bad += !(std::fabs(a - b) <= tolerance);
      }
      EXPECT_EQ(bad, 0) << w.name;
    }
    // The report: quantized tensors carry SQNR and shrink.
    for (const TensorReport& r : reports) {
      if (r.quantized) {
        EXPECT_GT(r.sqnr_db, combo.format == CheckpointFormat::MXFP8 ? 25.0 : 8.0) << r.name;
        EXPECT_LT(r.bytes_after, r.bytes_before) << r.name;
      }
    }
  }
}

// TransformerEngine's 4over6 for a checkpoint's NVFP4 weights (ConvertOptions::four_over_six):
// the files stay plain NVFP4, whose decode (code * scale * global) gives the library's own
// dequantization of its 4over6 quantization; with MSE and the bound 448 no tensor's error grows.
TEST(Checkpoint, FourOverSixWeightsAreReadAsPlainNvfp4) {
  const fs::path model = make_model("four_over_six_in");
  const Checkpoint original = Checkpoint::open(model.string());
  ConvertOptions plain;
  const std::vector<TensorReport> plain_reports =
      convert_checkpoint(model.string(), fresh_dir("four_over_six_plain").string(), plain);
  for (const Convention convention : {Convention::ModelOpt, Convention::CompressedTensors}) {
    for (const int bound : {448, 256}) {
      SCOPED_TRACE(std::string(convention_name(convention)) + " bound " + std::to_string(bound));
      ConvertOptions o;
      o.convention = convention;
      o.four_over_six = bound == 448 ? FourOverSix::MinMse : FourOverSix::MinMae;
      o.nvfp4_e4m3_max = bound;
      const fs::path out = fresh_dir("four_over_six_" + std::to_string(bound) + convention_name(convention));
      const std::vector<TensorReport> reports = convert_checkpoint(model.string(), out.string(), o);
      const std::vector<DetectedWeight> weights = read_quantized_weights(Checkpoint::open(out.string()));
      ASSERT_EQ(weights.size(), 2u);
      for (const DetectedWeight& w : weights) {
        const TensorView src = original.shard(original.shard(0).contains(w.name) ? 0 : 1).view(w.name);
        QuantizeOptions qo;
        qo.four_over_six = o.four_over_six;
        qo.nvfp4_e4m3_max = bound;
        const Tensor expected = dequantize(quantize(src, qo), Usage::Rowwise, DType::F32);
        QuantizeOptions without = qo;
        without.four_over_six = FourOverSix::Off;
        without.nvfp4_e4m3_max = 448;
        const Tensor usual = dequantize(quantize(src, without), Usage::Rowwise, DType::F32);
        int64_t bad = 0, moved = 0;
        for (int64_t i = 0; i < expected.numel(); ++i) {
          const float a = w.values.data_as<float>()[i], b = expected.data_as<float>()[i];
          const float tolerance = convention == Convention::CompressedTensors ? 3e-7f * std::fabs(b) : 0.0f;
          bad += !(std::fabs(a - b) <= tolerance);
          moved += a != usual.data_as<float>()[i];
        }
        EXPECT_EQ(bad, 0) << w.name;
        EXPECT_GT(moved, 0) << w.name;  // 4over6 picked other scales for some blocks
      }
      for (size_t i = 0; i < reports.size(); ++i) {
        if (reports[i].quantized && bound == 448) {
          EXPECT_GE(reports[i].sqnr_db, plain_reports[i].sqnr_db - 0.01) << reports[i].name;
        }
      }
    }
  }
  // What quantize refuses is refused before anything is written.
  ConvertOptions mx;
  mx.format = CheckpointFormat::MXFP8;
  mx.four_over_six = FourOverSix::MinMae;
  ConvertOptions bound_alone;
  bound_alone.nvfp4_e4m3_max = 256;
  for (const ConvertOptions& bad : {mx, bound_alone}) {
    const fs::path out = testing_paths::temp_path("four_over_six_refused");
    fs::remove_all(out);
    EXPECT_THROW(convert_checkpoint(model.string(), out.string(), bad), Error);
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST(Checkpoint, ConventionErrors) {
  EXPECT_THROW(check_supported(CheckpointFormat::NVFP4, Convention::GptOss), Error);
  EXPECT_THROW(check_supported(CheckpointFormat::MXFP4, Convention::ModelOpt), Error);
  EXPECT_THROW(parse_checkpoint_format("int4"), Error);
  EXPECT_THROW(parse_convention("awq"), Error);
  const fs::path model = make_model("conv_err");
  ConvertOptions o;
  o.convention = Convention::GptOss;
  EXPECT_THROW(convert_checkpoint(model.string(), fresh_dir("conv_err_out").string(), o), Error);
  EXPECT_THROW(convert_checkpoint(model.string(), model.string(), ConvertOptions{}), Error);  // in place
}

TEST(Checkpoint, HostileQuantizedLayoutsAreErrors) {
  const fs::path dir = fresh_dir("hostile_layouts");
  const std::vector<uint8_t> bytes(64, 0x38);
  const float one = 1.0f;
  const auto expect_rejected = [&](const std::vector<SafetensorsTensor>& tensors, const std::string& reason) {
    write_safetensors((dir / "model.safetensors").string(), tensors);
    const Checkpoint c = Checkpoint::open(dir.string());
    try {
      read_quantized_weights(c);
      ADD_FAILURE() << "accepted: " << reason;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  // MXFP8 [4, 16]: two scales for 64 values would make blocks that cross rows.
  expect_rejected({{"w", "F8_E4M3", {4, 16}, bytes.data(), 64}, {"w_scale", "U8", {2}, bytes.data(), 2}},
                  "not a multiple of the block");
  // Logical shapes that overflow int64 (zero elements, so the header itself is consistent).
  expect_rejected({{"w", "U8", {0, int64_t{1} << 62}, bytes.data(), 0},
                   {"w_scale", "F8_E4M3", {0}, bytes.data(), 0},
                   {"w_scale_2", "F32", {}, &one, 4}},
                  "too large");
  expect_rejected({{"e_blocks", "U8", {0, (int64_t{1} << 59) + 1, 16}, bytes.data(), 0},
                   {"e_scales", "U8", {0}, bytes.data(), 0}},
                  "too large");
}

}  // namespace
}  // namespace microscale

namespace microscale {
namespace {

// NVFP4 W4A4: a calibration file gives each quantized Linear its activation scale.
TEST(Checkpoint, CalibrationWritesInputScales) {
  const fs::path model = make_model("calib_in");
  const fs::path calib = fresh_dir("calib_file") / "calibration.safetensors";
  const float amax_q = 5.0f;
  Tensor up_samples = random_tensor(DType::BF16, {4, 64}, Fill::Normal, 9);
  float up_amax = 0.0f;
  for (int64_t i = 0; i + 1 < up_samples.numel(); ++i) {
    up_amax = std::fmax(up_amax, std::fabs(bf16_to_float(up_samples.data_as<uint16_t>()[i])));
  }
  // A signalling NaN last: skipped, as a quiet one (std::fmax alone would return NaN here).
  up_samples.data_as<uint16_t>()[up_samples.numel() - 1] = 0xFF81;
  write_safetensors(calib.string(), {{"model.layers.0.self_attn.q_proj.input_amax", "F32", {1}, &amax_q, 4},
                                     {"model.layers.0.mlp.up_proj.input", "BF16", up_samples.shape(),
                                      up_samples.data(), up_samples.nbytes()}});
  for (Convention convention : {Convention::ModelOpt, Convention::CompressedTensors}) {
    const fs::path out = fresh_dir(std::string("calib_out_") + convention_name(convention));
    ConvertOptions o;
    o.convention = convention;
    o.calibration = calib.string();
    convert_checkpoint(model.string(), out.string(), o);
    const Checkpoint q = Checkpoint::open(out.string());
    const bool ct = convention == Convention::CompressedTensors;
    const std::string name =
        std::string("model.layers.0.self_attn.q_proj") + (ct ? ".input_global_scale" : ".input_scale");
    ASSERT_TRUE(q.contains(name)) << name;
    float v;
    std::memcpy(&v, q.at(name).data, 4);
    EXPECT_EQ(v, ct ? 2688.0f / amax_q : amax_q / 2688.0f);
    std::memcpy(
        &v,
        q.at(std::string("model.layers.0.mlp.up_proj") + (ct ? ".input_global_scale" : ".input_scale")).data,
        4);
    EXPECT_EQ(v, ct ? 2688.0f / up_amax : up_amax / 2688.0f);
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
    if (!ct) {
      EXPECT_EQ(config["quantization_config"]["quant_algo"], "NVFP4");
    }
    EXPECT_FALSE(config["quantization_config"]["config_groups"]["group_0"]["input_activations"].is_null());
    // Weights read back unchanged by the extra tensors.
    EXPECT_EQ(read_quantized_weights(q).size(), 2u);
  }
  // A quantized Linear without calibration data, or calibration for MX, is an error.
  const fs::path partial = fresh_dir("calib_partial") / "calibration.safetensors";
  write_safetensors(partial.string(),
                    {{"model.layers.0.self_attn.q_proj.input_amax", "F32", {1}, &amax_q, 4}});
  ConvertOptions o;
  o.calibration = partial.string();
  EXPECT_THROW(convert_checkpoint(model.string(), fresh_dir("calib_bad").string(), o), Error);
  o.calibration = calib.string();
  o.format = CheckpointFormat::MXFP8;
  EXPECT_THROW(convert_checkpoint(model.string(), fresh_dir("calib_bad2").string(), o), Error);
  // An amax so small that amax / 2688 is no normal float (and 2688 / amax overflows): an error,
  // not an input_scale of 0 or an input_global_scale of Inf.
  const fs::path tiny = fresh_dir("calib_tiny") / "calibration.safetensors";
  const float tiny_amax = 1e-40f;
  write_safetensors(tiny.string(),
                    {{"model.layers.0.self_attn.q_proj.input_amax", "F32", {1}, &tiny_amax, 4},
                     {"model.layers.0.mlp.experts.gate_up_proj.input_amax", "F32", {}, &amax_q, 4},
                     {"model.layers.0.mlp.up_proj.input_amax", "F32", {}, &amax_q, 4}});
  o.calibration = tiny.string();
  o.format = CheckpointFormat::NVFP4;
  try {
    convert_checkpoint(model.string(), fresh_dir("calib_bad3").string(), o);
    ADD_FAILURE() << "a calibration amax of 1e-40 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 2688 x FLT_MIN"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace microscale

namespace microscale {
namespace {

TEST(Checkpoint, FusedWeightGroups) {
  const std::vector<std::string> names = {
      "model.layers.0.self_attn.q_proj.weight",               // 0
      "model.layers.0.self_attn.k_proj.weight",               // 1
      "model.layers.0.self_attn.v_proj.weight",               // 2
      "model.layers.0.self_attn.o_proj.weight",               // 3: fused with nothing
      "model.layers.0.mlp.gate_proj.weight",                  // 4
      "model.layers.0.mlp.up_proj.weight",                    // 5
      "model.layers.1.mlp.up_proj.weight",                    // 6: its gate_proj is not here
      "encoder.layer.0.attention.self.query.weight",          // 7
      "encoder.layer.0.attention.self.key.weight",            // 8
      "encoder.layer.0.attention.self.value.weight",          // 9
      "model.layers.0.block_sparse_moe.experts.0.w1.weight",  // 10
      "model.layers.0.block_sparse_moe.experts.0.w3.weight",  // 11
      "model.layers.0.block_sparse_moe.experts.1.w1.weight",  // 12: another expert's w1
      "model.layers.0.block_sparse_moe.experts.1.w3.weight",  // 13
      "model.layers.0.block_sparse_moe.experts.0.w2.weight",  // 14
      "model.layers.0.self_attn.q_a_proj.weight",             // 15
      "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",   // 16
      "model.layers.1.self_attn.q_proj.weight",               // 17: another layer's
      "model.layers.1.self_attn.k_proj.weight",               // 18
      "model.layers.2.self_attn.q_proj.bias",                 // 19: not a weight
      "model.layers.2.self_attn.k_proj.bias",                 // 20
  };
  std::vector<std::vector<size_t>> groups = fused_weight_groups(names);
  std::sort(groups.begin(), groups.end());
  const std::vector<std::vector<size_t>> expected = {{0, 1, 2}, {4, 5},   {7, 8, 9}, {10, 11},
                                                     {12, 13},  {15, 16}, {17, 18}};
  EXPECT_EQ(groups, expected);
}

// NVFP4: the q/k/v and gate/up weights an engine fuses share one global scale (the max of their
// amaxes), and with a calibration file one input scale; every other weight keeps its own.
TEST(Checkpoint, FusedLayersShareOneGlobalScale) {
  const fs::path dir = fresh_dir("fused_in");
  const std::string p = "model.layers.0.";
  struct Weight {
    std::string name;
    float gain;  // the amaxes differ by these factors
  };
  const std::vector<Weight> weights = {
      {p + "self_attn.q_proj.weight", 1.0f}, {p + "self_attn.k_proj.weight", 3.0f},
      {p + "self_attn.v_proj.weight", 0.5f}, {p + "self_attn.o_proj.weight", 0.7f},
      {p + "mlp.gate_proj.weight", 2.0f},    {p + "mlp.up_proj.weight", 0.3f}};
  std::vector<Tensor> values;
  std::vector<SafetensorsTensor> tensors;
  std::vector<float> calibration_amax;
  for (size_t i = 0; i < weights.size(); ++i) {
    Tensor t = random_tensor(DType::F32, {32, 64}, Fill::Normal, 40 + static_cast<uint32_t>(i));
    for (int64_t e = 0; e < t.numel(); ++e) t.data_as<float>()[e] *= weights[i].gain;
    values.push_back(t);
    calibration_amax.push_back(1.0f + static_cast<float>(i));
  }
  for (size_t i = 0; i < weights.size(); ++i)
    tensors.push_back({weights[i].name, "F32", values[i].shape(), values[i].data(), values[i].nbytes()});
  write_safetensors((dir / "model.safetensors").string(), tensors);
  const fs::path calib = fresh_dir("fused_calib") / "calibration.safetensors";
  std::vector<SafetensorsTensor> amaxes;
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::string module =
        weights[i].name.substr(0, weights[i].name.size() - std::string(".weight").size());
    amaxes.push_back({module + ".input_amax", "F32", {}, &calibration_amax[i], 4});
  }
  write_safetensors(calib.string(), amaxes);
  const auto amax_of = [&](size_t i) {
    float m = 0.0f;
    for (int64_t e = 0; e < values[i].numel(); ++e)
      m = std::fmax(m, std::fabs(values[i].data_as<float>()[e]));
    return m;
  };
  // Groups {q, k, v}, {o}, {gate, up}: each member's expected amax and input amax.
  const std::vector<std::vector<size_t>> groups = {{0, 1, 2}, {3}, {4, 5}};
  std::vector<float> group_amax(weights.size()), group_input(weights.size());
  for (const auto& group : groups) {
    float m = 0.0f, in = 0.0f;
    for (size_t i : group) m = std::fmax(m, amax_of(i)), in = std::fmax(in, calibration_amax[i]);
    for (size_t i : group) group_amax[i] = m, group_input[i] = in;
  }
  for (Convention convention : {Convention::ModelOpt, Convention::CompressedTensors}) {
    SCOPED_TRACE(convention_name(convention));
    const bool ct = convention == Convention::CompressedTensors;
    const fs::path out = fresh_dir(std::string("fused_out_") + convention_name(convention));
    ConvertOptions o;
    o.convention = convention;
    o.calibration = calib.string();
    convert_checkpoint(dir.string(), out.string(), o);
    const Checkpoint q = Checkpoint::open(out.string());
    const auto scalar = [&](const std::string& name) {
      float v = 0.0f;
      EXPECT_TRUE(q.contains(name)) << name;
      if (q.contains(name)) std::memcpy(&v, q.at(name).data, 4);
      return v;
    };
    for (size_t i = 0; i < weights.size(); ++i) {
      const std::string& name = weights[i].name;
      const std::string module = name.substr(0, name.size() - std::string(".weight").size());
      SCOPED_TRACE(name);
      // The bytes are those of the library's quantizer given the group's amax.
      QuantizeOptions qo;
      qo.amax_rowwise = group_amax[i];
      const QuantizedTensor lib = quantize(values[i].view(), qo);
      const std::string data_name = ct ? name + "_packed" : name;
      ASSERT_TRUE(q.contains(data_name));
      EXPECT_EQ(0, std::memcmp(q.at(data_name).data, lib.rowwise_data.data(), lib.rowwise_data.nbytes()));
      EXPECT_EQ(
          0, std::memcmp(q.at(name + "_scale").data, lib.rowwise_scale.data(), lib.rowwise_scale.nbytes()));
      const float s_enc = 2688.0f / group_amax[i];
      EXPECT_EQ(scalar(name + (ct ? "_global_scale" : "_scale_2")), ct ? s_enc : 1.0f / s_enc);
      EXPECT_EQ(scalar(module + (ct ? ".input_global_scale" : ".input_scale")),
                ct ? 2688.0f / group_input[i] : group_input[i] / 2688.0f);
    }
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
    if (ct) {
      EXPECT_EQ(config["quantization_config"]["quantization_status"], "compressed");
      EXPECT_EQ(config["quantization_config"]["config_groups"]["group_0"]["weights"]["scale_dtype"],
                "torch.float8_e4m3fn");
    }
  }
  // MX formats have no global scale to share; compressed-tensors says their E8M0 scales are uint8.
  for (CheckpointFormat format : {CheckpointFormat::MXFP8, CheckpointFormat::MXFP4}) {
    const fs::path out = fresh_dir(std::string("fused_out_ct_") + checkpoint_format_name(format));
    ConvertOptions o;
    o.format = format;
    o.convention = Convention::CompressedTensors;
    convert_checkpoint(dir.string(), out.string(), o);
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
    EXPECT_EQ(config["quantization_config"]["quantization_status"], "compressed");
    EXPECT_EQ(config["quantization_config"]["config_groups"]["group_0"]["weights"]["scale_dtype"],
              "torch.uint8");
  }
}

}  // namespace
}  // namespace microscale

namespace microscale {
namespace {

// gpt-oss MXFP4 holds the MoE experts only, in transformers' layout [E, in, out], stored as blocks
// along `in`: _blocks [E, out, in/32, 16], _scales [E, out, in/32]; the rest stays as it was.
TEST(Checkpoint, GptOssQuantizesTheExpertsAlongTheirInput) {
  const fs::path model = make_model("gptoss_in");  // experts.gate_up_proj [2, 32, 64] among others
  // As a llama (make_model's config), it is no gpt-oss model: MXFP4 defaults to compressed-tensors,
  // and the gpt-oss convention is an error, since other models may store experts otherwise.
  EXPECT_EQ(default_convention(CheckpointFormat::MXFP4, Checkpoint::open(model.string())),
            Convention::CompressedTensors);
  ConvertOptions o;
  o.format = CheckpointFormat::MXFP4;
  o.convention = Convention::GptOss;
  try {
    convert_checkpoint(model.string(), fresh_dir("gptoss_llama_out").string(), o);
    ADD_FAILURE() << "gpt-oss accepted a llama";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model_type"), std::string::npos) << e.what();
  }
  std::ofstream(model / "config.json") << R"({"model_type": "gpt_oss", "hidden_size": 64})";
  const Checkpoint original = Checkpoint::open(model.string());
  EXPECT_EQ(default_convention(CheckpointFormat::MXFP4, original), Convention::GptOss);
  EXPECT_EQ(default_convention(CheckpointFormat::NVFP4, original), Convention::ModelOpt);
  EXPECT_EQ(default_convention(CheckpointFormat::MXFP8, original), Convention::ModelOpt);
  const fs::path out = fresh_dir("gptoss_out");
  const std::vector<TensorReport> reports = convert_checkpoint(model.string(), out.string(), o);
  const Checkpoint q = Checkpoint::open(out.string());
  const std::string experts = "model.layers.0.mlp.experts.gate_up_proj";
  for (const TensorReport& r : reports) EXPECT_EQ(r.quantized, r.name == experts) << r.name;
  // Every other tensor, the dense Linear weights too, is byte-identical.
  for (const char* kept : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight",
                           "model.embed_tokens.weight", "position_ids"}) {
    ASSERT_TRUE(q.contains(kept)) << kept;
    EXPECT_EQ(0, std::memcmp(q.at(kept).data, original.at(kept).data, original.at(kept).nbytes)) << kept;
  }
  ASSERT_TRUE(q.contains(experts + "_blocks"));
  EXPECT_EQ(q.at(experts + "_blocks").shape, (std::vector<int64_t>{2, 64, 1, 16}));
  EXPECT_EQ(q.at(experts + "_scales").shape, (std::vector<int64_t>{2, 64, 1}));
  // Each expert [in, out] is the weight [out, in] transposed: its blocks are those of the library's
  // MXFP4 of that weight, and the values read back come out in the input's [E, in, out].
  const TensorView src = original.shard(1).view(experts);
  const Tensor x = to_f32_matrix(src);  // [E * in, out]
  const int64_t in = 32, out_dim = 64;
  const std::vector<DetectedWeight> weights = read_quantized_weights(q);
  ASSERT_EQ(weights.size(), 1u);
  ASSERT_EQ(weights[0].values.shape(), src.shape);
  for (int64_t e = 0; e < 2; ++e) {
    Tensor w(DType::F32, {out_dim, in});  // expert e as [out, in], contiguous
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t j = 0; j < out_dim; ++j)
        w.data_as<float>()[j * in + i] = x.data_as<float>()[(e * in + i) * out_dim + j];
    }
    QuantizeOptions qo;
    qo.scheme = Scheme::MXFP4;
    const QuantizedTensor lib = quantize(w.view(), qo);
    EXPECT_EQ(0, std::memcmp(
                     reinterpret_cast<const uint8_t*>(q.at(experts + "_blocks").data) + e * out_dim * in / 2,
                     lib.rowwise_data.data(), lib.rowwise_data.nbytes()));
    const Tensor expected = dequantize(lib, Usage::Rowwise, DType::F32);  // [out, in]
    int64_t bad = 0;
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t j = 0; j < out_dim; ++j) {
        bad += weights[0].values.data_as<float>()[(e * in + i) * out_dim + j] !=
               expected.data_as<float>()[j * in + i];
      }
    }
    EXPECT_EQ(bad, 0) << "expert " << e;
  }
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "mxfp4");
  // Errors rather than a checkpoint no engine loads:
  const auto expect_error = [&](const fs::path& in, const ConvertOptions& options,
                                const std::string& reason) {
    try {
      convert_checkpoint(in.string(), fresh_dir("gptoss_bad_out").string(), options);
      ADD_FAILURE() << "accepted: " << reason;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  // - a model without gpt-oss experts (its MXFP4 default is compressed-tensors);
  const fs::path dense = fresh_dir("gptoss_dense_in");
  const Tensor w = random_tensor(DType::BF16, {64, 64}, Fill::Normal, 7);
  write_safetensors((dense / "model.safetensors").string(),
                    {{"model.layers.0.mlp.up_proj.weight", "BF16", w.shape(), w.data(), w.nbytes()}});
  expect_error(dense, o, "it has none");
  // - every expert kept by the layer rules;
  ConvertOptions skipped = o;
  skipped.rules.skip.push_back("*experts*");
  expect_error(model, skipped, "all kept by the layer rules");
  // - a layer's experts partly kept: transformers and vLLM take an experts module whole.
  const fs::path both = fresh_dir("gptoss_both_in");
  const Tensor gate_up = random_tensor(DType::BF16, {2, 32, 64}, Fill::Normal, 8);
  const Tensor down = random_tensor(DType::BF16, {2, 32, 32}, Fill::Normal, 9);
  write_safetensors(
      (both / "model.safetensors").string(),
      {{"model.layers.0.mlp.experts.gate_up_proj", "BF16", gate_up.shape(), gate_up.data(), gate_up.nbytes()},
       {"model.layers.0.mlp.experts.down_proj", "BF16", down.shape(), down.data(), down.nbytes()}});
  std::ofstream(both / "config.json") << R"({"model_type": "gpt_oss"})";
  ConvertOptions partly = o;
  partly.rules.skip.push_back("*down_proj");
  expect_error(both, partly, "partly quantized");
  EXPECT_NO_THROW(convert_checkpoint(both.string(), fresh_dir("gptoss_both_out").string(), o));
}

}  // namespace
}  // namespace microscale
