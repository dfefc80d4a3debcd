// convert_checkpoint: plan every output tensor from shapes alone, write each shard's header,
// then quantize and stream one tensor at a time (a checkpoint larger than memory converts).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/fp_environment.hpp"
#include "core/input_matrix.hpp"
#include "core/quantize_checks.hpp"
#include "core/require.hpp"
#include "core/scale_math.hpp"
#include "core/unfinished_outputs.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"
#include "microscale/error_stats.hpp"
#include "microscale/output_file.hpp"

namespace microscale {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct OutputSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

// A quantized weight as written: an input tensor whole (gpt-oss: its experts, stacked), or one
// expert of stacked experts split per expert.
struct WeightPiece {
  size_t tensor;                     // index into the checkpoint's tensors
  std::string name;                  // the written weight's name (the input's, or the expert's)
  std::optional<ExpertSlice> slice;  // the expert's [out, in] within the input tensor
  std::vector<OutputSpec> specs;     // what it is written as, in write order (quantized_specs)
};

int block_of(CheckpointFormat f) { return f == CheckpointFormat::NVFP4 ? 16 : 32; }

Scheme scheme_of(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::NVFP4: return Scheme::NVFP4;
    case CheckpointFormat::MXFP8: return Scheme::MXFP8_E4M3;
    case CheckpointFormat::MXFP4: return Scheme::MXFP4;
  }
  return Scheme::NVFP4;
}

std::vector<int64_t> with_last(std::vector<int64_t> shape, std::vector<int64_t> last) {
  shape.pop_back();
  shape.insert(shape.end(), last.begin(), last.end());
  return shape;
}

// [..., a, b] -> [..., b, a]
std::vector<int64_t> swap_last_two(std::vector<int64_t> shape) {
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  return shape;
}

// The tensors a quantized weight `name` [..., N, K] becomes (see checkpoint.hpp), in write order.
// gpt-oss: an expert weight [E, in, out] (is_stacked_expert_weight), stored along `in`.
std::vector<OutputSpec> quantized_specs(const std::string& name, const std::vector<int64_t>& shape,
                                        CheckpointFormat f, Convention c) {
  const int64_t k = shape.back();
  const bool ct = c == Convention::CompressedTensors;
  switch (f) {
    case CheckpointFormat::NVFP4:
      if (ct) {
        return {{name + "_packed", "U8", with_last(shape, {k / 2})},
                {name + "_scale", "F8_E4M3", with_last(shape, {k / 16})},
                {name + "_global_scale", "F32", {1}}};
      }
      return {{name, "U8", with_last(shape, {k / 2})},
              {name + "_scale", "F8_E4M3", with_last(shape, {k / 16})},
              {name + "_scale_2", "F32", {}}};
    case CheckpointFormat::MXFP8:
      return {{name, "F8_E4M3", shape}, {name + "_scale", "U8", with_last(shape, {k / 32})}};
    case CheckpointFormat::MXFP4:
      if (c == Convention::GptOss) {
        const std::vector<int64_t> out_in = swap_last_two(shape);  // [E, out, in]
        const int64_t in = out_in.back();
        return {{name + "_blocks", "U8", with_last(out_in, {in / 32, 16})},
                {name + "_scales", "U8", with_last(out_in, {in / 32})}};
      }
      return {{name + "_packed", "U8", with_last(shape, {k / 2})},
              {name + "_scale", "U8", with_last(shape, {k / 32})}};
  }
  return {};
}

// The module holding a parameter: the name up to its last dot ("a.b.experts.down_proj" -> "a.b.experts").
std::string module_of_tensor(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return weight_name.substr(0, weight_name.size() - suffix.size());
  }
  return weight_name;
}

// A gpt-oss expert weight w [E, in, out] quantized as E weights [out, in], each expert's slice
// copied transposed (copy_expert_slice): rowwise data [E * out, in/2] and scales [E * out, in/32],
// which are the bytes of _blocks [E, out, in/32, 16] and _scales [E, out, in/32]. `errors` gets
// each expert's dequantized values against its slice.
QuantizedTensor quantize_gpt_oss_experts(const TensorView& w, const QuantizeOptions& o,
                                         ErrorAccumulator& errors) {
  const int64_t experts = w.shape[0], in = w.shape[1], out = w.shape[2];
  if (experts * in * out == 0) throw Error("empty tensors cannot be quantized, got " + shape_string(w.shape));
  QuantizedTensor all;
  all.scheme = o.scheme;
  all.rows = experts * out;
  all.cols = in;
  all.shape = {experts * out, in};
  all.rowwise_data = Tensor(DType::U8, {experts * out, in / 2});
  all.rowwise_scale = Tensor(DType::U8, {experts * out, in / 32});
  int64_t e = 0;
  for (const ExpertSlice& expert : whole_stacked_experts("", w.shape)) {
    const Tensor slice = copy_expert_slice(w, expert);  // contiguous rows: the fast path
    const QuantizedTensor q = quantize(slice.view(), o);
    std::memcpy(all.rowwise_data.data_as<uint8_t>() + e * q.rowwise_data.nbytes(), q.rowwise_data.data(),
                q.rowwise_data.nbytes());
    std::memcpy(all.rowwise_scale.data_as<uint8_t>() + e * q.rowwise_scale.nbytes(), q.rowwise_scale.data(),
                q.rowwise_scale.nbytes());
    const Tensor deq = dequantize(q, Usage::Rowwise, DType::F32);
    const Tensor ref = to_f32_matrix(slice.view());
    errors.add(ref.data_as<float>(), deq.data_as<float>(), ref.numel());
    ++e;
  }
  return all;
}

// Writes a quantized piece's tensors (its specs, in order): data, scales, and for NVFP4 the global
// scale and, with a calibration, the activation's static scale, as the convention defines them.
// Returns the bytes written.
uint64_t write_quantized_piece(SafetensorsStreamWriter& writer, const WeightPiece& piece,
                               const QuantizedTensor& q, Convention convention,
                               const std::map<std::string, float>& input_amax) {
  const std::vector<OutputSpec>& specs = piece.specs;
  const bool ct = convention == Convention::CompressedTensors;
  writer.write(specs[0].name, q.rowwise_data.data(), q.rowwise_data.nbytes());
  writer.write(specs[1].name, q.rowwise_scale.data(), q.rowwise_scale.nbytes());
  uint64_t bytes = q.rowwise_data.nbytes() + q.rowwise_scale.nbytes();
  if (specs.size() >= 3) {  // NVFP4 global scale: ModelOpt's decode 1/S_enc, or CT's S_enc
    // (An engine decodes code * scale * global, whatever bound gave S_enc: 448, or 4over6's 256.)
    require(!q.row_scaled, "a checkpoint's NVFP4 weights take one global scale per tensor, not per row");
    const float s_enc = nvfp4_global_encode_scale(q.rowwise_amax, q.nvfp4_e4m3_max);
    const float global = ct ? s_enc : 1.0f / s_enc;
    writer.write(specs[2].name, &global, sizeof global);
    bytes += sizeof global;
  }
  if (specs.size() == 4) {  // the activation's static scale
    const float amax = input_amax.at(module_of(piece.name));
    const float input_scale = ct ? 2688.0f / amax : amax / 2688.0f;
    writer.write(specs[3].name, &input_scale, sizeof input_scale);
    bytes += sizeof input_scale;
  }
  return bytes;
}

// NVFP4: the weights an engine fuses into one GEMM share its single global scale
// (fused_weight_groups), so each group is quantized with one amax, the max of its members' (found
// here by a first read of those weights). Returns that amax for each tensor of a group (empty for
// the others); with `input_amax` (a calibration), the group's members get one input amax too, the
// max of theirs. A group whose amax is Inf keeps each member's own (an override must be finite;
// a weight holding Inf is broken at any scale).
std::vector<std::optional<float>> fused_group_amaxes(const Checkpoint& ckpt,
                                                     const std::vector<WeightPiece>& pieces,
                                                     std::map<std::string, float>* input_amax) {
  std::vector<std::string> names;
  for (const WeightPiece& piece : pieces) names.push_back(piece.name);
  std::vector<std::optional<float>> amaxes(pieces.size());
  for (const std::vector<size_t>& group : fused_weight_groups(names)) {
    float amax = 0.0f, group_input_amax = 0.0f;
    for (size_t p : group) {
      const WeightPiece& piece = pieces[p];
      const Checkpoint::Entry& entry = ckpt.tensors()[piece.tensor];
      try {
        const TensorView tensor = ckpt.shard(entry.shard).view(entry.tensor->name);
        const InputMatrix x =
            make_input_matrix(piece.slice ? expert_slice_view(tensor, *piece.slice) : tensor);
        for (int64_t r = 0; r < x.rows; ++r) {
          for (int64_t c = 0; c < x.cols; ++c) amax = max_abs_skipping_nan(amax, x.at(r, c));
        }
      } catch (const Error& err) {
        throw Error("tensor '" + entry.tensor->name + "': " + err.reason());
      }
      if (input_amax) group_input_amax = std::max(group_input_amax, input_amax->at(module_of(piece.name)));
    }
    for (size_t p : group) {
      if (std::isfinite(amax)) amaxes[p] = amax;
      if (input_amax) (*input_amax)[module_of(pieces[p].name)] = group_input_amax;
    }
  }
  return amaxes;
}

constexpr float kMinCalibrationAmax = 2688.0f * std::numeric_limits<float>::min();

// Input amax of each quantized Linear (by module name) from the calibration file.
std::map<std::string, float> calibration_amaxes(const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::map<std::string, float> amax;
  for (const SafetensorsEntry& e : f.tensors()) {
    const auto take = [&](const std::string& suffix) {
      return e.name.size() > suffix.size() &&
                     e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) == 0
                 ? e.name.substr(0, e.name.size() - suffix.size())
                 : std::string();
    };
    float value = 0.0f;
    std::string module = take(".input_amax");
    if (!module.empty()) {
      if (e.dtype != "F32" || e.nbytes != 4)
        throw Error("calibration tensor '" + e.name + "' must be one F32 value");
      std::memcpy(&value, e.data, 4);
    } else if (!(module = take(".input")).empty()) {
      Tensor x;
      try {
        x = to_f32_matrix(f.view(e.name));
      } catch (const Error& err) {
        throw Error("calibration tensor '" + e.name + "' of '" + path + "': " + err.reason());
      }
      for (int64_t i = 0; i < x.numel(); ++i) value = max_abs_skipping_nan(value, x.data_as<float>()[i]);
    } else {
      continue;
    }
    // Engines divide by ModelOpt's input_scale (amax / 2688) and multiply by compressed-tensors'
    // input_global_scale (2688 / amax): an amax below 2688 x FLT_MIN would make the first
    // subnormal or zero and the second Inf.
    if (!std::isfinite(value) || value < kMinCalibrationAmax) {
      char got[32];
      std::snprintf(got, sizeof got, "%g", static_cast<double>(value));
      throw Error("calibration amax of '" + module + "' in '" + path +
                  "' must be finite and at least 2688 x FLT_MIN (~3.2e-35), got " + got);
    }
    amax[module] = value;
  }
  return amax;
}

json quantization_config(const ConvertOptions& o, const std::vector<std::string>& ignored, bool w4a4) {
  const bool fp4 = o.format != CheckpointFormat::MXFP8;
  const int group = block_of(o.format);
  json producer = {{"name", "microscale"}, {"version", "0.1.0"}};
  switch (o.convention) {
    case Convention::ModelOpt:
      return {
          {"quant_method", "modelopt"},
          {"quant_algo", o.format == CheckpointFormat::NVFP4 ? (w4a4 ? "NVFP4" : "W4A16_NVFP4") : "MXFP8"},
          {"config_groups",
           {{"group_0",
             {{"weights",
               {{"num_bits", fp4 ? 4 : 8}, {"type", "float"}, {"group_size", group}, {"dynamic", false}}},
              {"input_activations",
               w4a4 ? json{{"num_bits", 4}, {"type", "float"}, {"group_size", group}, {"dynamic", false}}
                    : json(nullptr)},
              {"targets", {"Linear"}}}}}},
          {"ignore", ignored},
          {"producer", producer}};
    case Convention::CompressedTensors:
      return {{"quant_method", "compressed-tensors"},
              // The weights are stored packed: transformers builds the packed layout only for a
              // "compressed" status (the default, "initialized", expects dense weights).
              {"quantization_status", "compressed"},
              {"format", o.format == CheckpointFormat::NVFP4   ? "nvfp4-pack-quantized"
                         : o.format == CheckpointFormat::MXFP4 ? "mxfp4-pack-quantized"
                                                               : "mxfp8-quantized"},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"weights",
                   {{"num_bits", fp4 ? 4 : 8},
                    {"type", "float"},
                    {"strategy", o.format == CheckpointFormat::NVFP4 ? "tensor_group" : "group"},
                    {"group_size", group},
                    {"symmetric", true},
                    {"dynamic", false},
                    // As compressed-tensors' presets serialize them: E8M0 scales are torch.uint8 (vLLM
                    // takes MXFP8 only with that scale_dtype).
                    {"scale_dtype",
                     o.format == CheckpointFormat::NVFP4 ? "torch.float8_e4m3fn" : "torch.uint8"}}},
                  {"input_activations", w4a4 ? json{{"num_bits", 4},
                                                    {"type", "float"},
                                                    {"strategy", "tensor_group"},
                                                    {"group_size", group},
                                                    {"symmetric", true},
                                                    {"dynamic", "local"}}
                                             : json(nullptr)}}}}},
              {"ignore", ignored},
              {"producer", producer}};
    case Convention::GptOss:
      return {{"quant_method", "mxfp4"}, {"modules_to_not_convert", ignored}, {"producer", producer}};
  }
  return {};
}

// Copies the files of directory `from` into `to`, subdirectories too, except `output_dir` itself
// when it lies inside the input and, at the top level (`top`), the names in `skip` (what the
// conversion wrote) and every .safetensors file (the weights, converted or not the model's).
// Subdirectories are copied whole (a sentence-transformers Dense module keeps its own weights). Symbolic
// links to files are followed (a Hugging Face cache links into its blobs); links to directories, and FIFOs,
// sockets and devices, are skipped: a link could lead out of the model or back into it.
void copy_model_files(const fs::path& from, const fs::path& to, const fs::path& output_dir, bool top,
                      const std::vector<std::string>& skip) {
  // NOTE: the error_code forms throughout: an unreadable directory is our Error, not a
  // std::filesystem_error escaping to the caller.
  std::error_code listing;
  fs::directory_iterator it(from, listing);
  for (; !listing && it != fs::directory_iterator(); it.increment(listing)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (top && (std::find(skip.begin(), skip.end(), name) != skip.end() ||
                entry.path().extension() == ".safetensors"))
      continue;
    std::error_code ec;  // a broken link is neither equivalent, nor a directory, nor a regular file
    if (fs::equivalent(entry.path(), output_dir, ec)) continue;
    const fs::path target = to / name;
    if (entry.is_directory(ec)) {
      if (entry.is_symlink(ec)) continue;
      fs::create_directories(target, ec);
      if (ec) throw Error("cannot create '" + target.string() + "': " + ec.message());
      copy_model_files(entry.path(), target, output_dir, false, {});
    } else if (entry.is_regular_file(ec)) {
      // Remembered while copied: a signal meanwhile removes the partial copy.
      const int record = unfinished_outputs::remember(target.string(), unfinished_outputs::Kind::File);
      fs::copy_file(entry.path(), target, fs::copy_options::overwrite_existing, ec);
      unfinished_outputs::forget(record);
      if (ec) throw Error("cannot copy '" + entry.path().string() + "': " + ec.message());
    }
  }
  if (listing) throw Error("cannot list '" + from.string() + "': " + listing.message());
}

// The files a conversion writes into its output directory, removed again unless keep() is called,
// and the directories it created for it (when empty then): a conversion that fails leaves no file
// of its own behind. A file of an earlier run that it had replaced is not restored. Until then
// they are remembered for remove_unfinished_outputs, so a signal handler can do the same.
class PartialOutput {
 public:
  /// `created_dirs`: the directories the conversion created, deepest first.
  explicit PartialOutput(std::vector<fs::path> created_dirs) : created_dirs_(std::move(created_dirs)) {
    try {
      for (const fs::path& d : created_dirs_) remember(d.string(), unfinished_outputs::Kind::Directory);
    } catch (...) {  // no destructor runs for a constructor that throws
      forget_all();
      throw;
    }
  }
  PartialOutput(const PartialOutput&) = delete;
  PartialOutput& operator=(const PartialOutput&) = delete;
  ~PartialOutput() {
    if (kept_) return;
    forget_all();
    std::error_code ec;  // best effort, no throwing from a destructor
    for (const fs::path& f : files_) fs::remove(f, ec);
    for (const fs::path& d : created_dirs_) fs::remove(d, ec);  // removes an empty directory only
  }
  /// Runs `commit`, which puts the file `path` in place, and records the file: a failure after
  /// removes it (an older file of that name stays if `commit` fails), and so does a signal from
  /// just before the commit on (the older file then goes a moment early).
  template <typename Commit>
  void put_in_place(const std::string& path, Commit&& commit) {
    files_.reserve(files_.size() + 1);  // no allocation, so no throw, once the file is in place
    remember(path, unfinished_outputs::Kind::File);
    try {
      commit();
    } catch (...) {  // not in place: an older file of that name is not ours to remove
      unfinished_outputs::forget(records_.back());
      records_.back() = -1;
      throw;
    }
    files_.emplace_back(path);
  }
  void keep() {
    forget_all();
    kept_ = true;
  }

 private:
  void remember(const std::string& path, unfinished_outputs::Kind kind) {
    records_.push_back(-1);  // first: a record is never made that records_ cannot hold
    records_.back() = unfinished_outputs::remember(path, kind);
  }
  void forget_all() {
    for (int r : records_) unfinished_outputs::forget(r);
    records_.clear();
  }

  std::vector<fs::path> created_dirs_;
  std::vector<fs::path> files_;
  std::vector<int> records_;  // unfinished_outputs handles of both
  bool kept_ = false;
};

}  // namespace

std::vector<TensorReport> convert_checkpoint(const std::string& input, const std::string& output_dir,
                                             const ConvertOptions& o) {
  const IeeeSubnormals ieee;  // scales and reports in fp32 (fp_environment.hpp)
  check_supported(o.format, o.convention);
  const Checkpoint ckpt = Checkpoint::open(input);
  std::error_code ec;
  std::vector<fs::path> missing_dirs;  // what create_directories makes, deepest first
  for (fs::path p = output_dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing_dirs.push_back(p);
    if (p == p.parent_path()) break;
  }
  fs::create_directories(output_dir, ec);
  if (!fs::is_directory(output_dir, ec)) {
    throw Error("cannot create the output directory '" + output_dir + "'" + (ec ? ": " + ec.message() : ""));
  }
  // Until the last JSON file is written, a failure removes what this call wrote.
  PartialOutput partial(std::move(missing_dirs));
  if (fs::equivalent(fs::path(output_dir), fs::path(ckpt.directory()), ec)) {
    throw Error("the output directory must differ from the input's");
  }
  const int block = block_of(o.format);
  QuantizeOptions qo;
  qo.scheme = scheme_of(o.format);
  qo.scale_mode = o.mx_scale_mode;
  if (o.four_over_six != FourOverSix::Off || o.four_over_six_scaled_error || o.nvfp4_e4m3_max != 448) {
    require(o.format == CheckpointFormat::NVFP4, "4over6 and the global-scale bound apply to nvfp4");
    qo.four_over_six = o.four_over_six;
    qo.four_over_six_scaled_error = o.four_over_six_scaled_error;
    qo.nvfp4_e4m3_max = o.nvfp4_e4m3_max;
    // Options quantize would refuse (an unknown mode, the bound 256 without 4over6), refused
    // before anything is written: quantize's own checks, on a blockable stand-in input.
    const Tensor stand_in(DType::F32, {16, 16});
    validate_quantize(make_input_matrix(stand_in.view()), qo);
  }
  validate_thread_count(o.num_threads);  // before anything is written, as quantize would
  qo.num_threads = o.num_threads;
  const bool w4a4 = !o.calibration.empty();
  if (w4a4 && o.format != CheckpointFormat::NVFP4) {
    throw Error("--calibration applies to nvfp4 (MX activations need no static scale)");
  }
  std::map<std::string, float> input_amax =
      w4a4 ? calibration_amaxes(o.calibration) : std::map<std::string, float>{};
  // The input's config.json, checked before anything is written: its quantization_config is set.
  json config = json::object();
  if (!ckpt.config_json().empty()) {
    try {
      config = json::parse(ckpt.config_json());
    } catch (const json::exception& e) {
      throw Error("config.json of the input is not valid JSON: " + std::string(e.what()));
    }
    if (!config.is_object()) throw Error("config.json of the input is not a JSON object");
  }

  // gpt-oss MXFP4 holds gpt-oss's MoE experts only, whose K (their `in`) is the middle dim; other
  // models may store experts under the same names in another layout.
  const bool gpt_oss = o.convention == Convention::GptOss;
  if (gpt_oss && !ckpt.config_json().empty() && !is_gpt_oss_model(ckpt)) {
    throw Error("the gpt-oss convention is for gpt-oss models, and config.json of '" + input +
                "' has another model_type; MXFP4 of other models: the compressed-tensors convention");
  }
  // Stacked MoE experts under modelopt and compressed-tensors: engines load quantized experts one
  // Linear [out, in] per expert (vLLM's and SGLang's expert mappings, llm-compressor's output), so
  // they are split where the model's gate/up layout is known.
  const StackedExpertLayout expert_layout = stacked_expert_layout(ckpt);
  std::set<std::string> stacked_modules;  // the experts modules holding stacked weights
  for (const Checkpoint::Entry& entry : ckpt.tensors()) {
    if (is_stacked_expert_weight(entry.tensor->name, entry.tensor->shape))
      stacked_modules.insert(module_of_tensor(entry.tensor->name));
  }
  // A tensor of such a module besides its stacked weights (gpt-oss's biases): one, by module.
  std::map<std::string, std::string> stacked_module_other;
  for (const Checkpoint::Entry& entry : ckpt.tensors()) {
    const std::string module = module_of_tensor(entry.tensor->name);
    if (stacked_modules.count(module) && !is_stacked_expert_weight(entry.tensor->name, entry.tensor->shape))
      stacked_module_other.emplace(module, entry.tensor->name);
  }

  // Plan: what each input tensor becomes.
  std::vector<TensorReport> reports(ckpt.tensors().size());
  std::vector<WeightPiece> pieces;
  std::vector<std::vector<size_t>> pieces_of(ckpt.tensors().size());  // indices into pieces
  std::vector<std::string> ignored;
  std::map<std::string, std::pair<int, int>> experts;      // stacked experts module -> (quantized, kept)
  std::map<std::string, std::string> expert_kept_because;  // a kept stacked tensor and why, by module
  for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
    const SafetensorsEntry& e = *ckpt.tensors()[i].tensor;
    TensorReport& r = reports[i];
    r.name = e.name;
    r.shape = e.shape;
    r.dtype = e.dtype;
    r.bytes_before = e.nbytes;
    const bool stacked = is_stacked_expert_weight(e.name, e.shape);
    std::vector<ExpertSlice> slices;  // split per expert; empty: written as one weight
    if (gpt_oss) {
      if (!stacked) {
        r.kept_because = "not a gpt-oss MoE expert weight";
      } else if (e.shape[1] % block != 0) {
        r.kept_because =
            "in (dim 1) " + std::to_string(e.shape[1]) + " not a multiple of " + std::to_string(block);
      } else {
        r.kept_because = o.rules.keep_reason(e.name, e.dtype, swap_last_two(e.shape), block);
      }
    } else if (stacked) {
      r.kept_because = stacked_expert_split_problem(e.name, e.shape, expert_layout);
      const auto other = stacked_module_other.find(module_of_tensor(e.name));
      if (r.kept_because.empty() && other != stacked_module_other.end()) {
        // Split, its module's other tensors would keep their stacked names, which make vLLM's Llama 4
        // loader take every expert tensor for a stacked one.
        r.kept_because =
            "its experts module also holds '" + other->second + "', which has no per-expert form here";
      }
      if (r.kept_because.empty()) {
        slices = split_stacked_experts(e.name, e.shape);
        r.kept_because = o.rules.keep_reason(e.name, e.dtype, {slices[0].out, slices[0].in}, block);
      }
    } else if (stacked_modules.count(module_of_tensor(e.name))) {
      // gpt-oss's stacked biases [E, 2I], [E, H]: not Linear weights, kept with their experts.
      r.kept_because = "not a weight of the stacked experts module '" + module_of_tensor(e.name) + "'";
    } else {
      r.kept_because = o.rules.keep_reason(e.name, e.dtype, e.shape, block);
    }
    r.quantized = r.kept_because.empty();
    if (stacked) {
      auto& [quantized, kept] = experts[module_of_tensor(e.name)];
      ++(r.quantized ? quantized : kept);
      if (!r.quantized) expert_kept_because.emplace(module_of_tensor(e.name), e.name + ": " + r.kept_because);
    }
    if (!r.quantized) {
      if (e.shape.size() >= 2 && !stacked && !stacked_modules.count(module_of_tensor(e.name)))
        ignored.push_back(module_of(e.name));
      continue;
    }
    const size_t first_piece = pieces.size();
    if (slices.empty()) {
      pieces.push_back({i, e.name, std::nullopt, quantized_specs(e.name, e.shape, o.format, o.convention)});
    } else {
      for (const ExpertSlice& slice : slices)
        pieces.push_back({i, slice.name, slice,
                          quantized_specs(slice.name, {slice.out, slice.in}, o.format, o.convention)});
    }
    for (size_t p = first_piece; p < pieces.size(); ++p) {
      pieces_of[i].push_back(p);
      if (!w4a4) continue;
      // A split expert takes its own input amax, else its stacked tensor's (one for all experts),
      // else, for gate and up, which see the experts module's input, that module's.
      const std::string module = module_of(pieces[p].name);
      if (!input_amax.count(module)) {
        std::vector<std::string> keys;
        if (!slices.empty()) {
          keys.push_back(module_of(e.name));
          if (e.name.ends_with(".gate_up_proj")) keys.push_back(module_of_tensor(e.name));
        }
        const auto found = std::find_if(keys.begin(), keys.end(),
                                        [&](const std::string& k) { return input_amax.count(k) != 0; });
        if (found == keys.end()) {
          std::string also;
          for (const std::string& k : keys) also += (also.empty() ? " (nor '" : "', '") + k + ".input_amax";
          throw Error("the calibration file has no '" + module +
                      ".input_amax' (or .input) for the quantized '" + e.name + "'" +
                      (also.empty() ? "" : also + "')"));
        }
        input_amax[module] = input_amax.at(*found);
      }
      const bool ct = o.convention == Convention::CompressedTensors;
      pieces[p].specs.push_back({module + (ct ? ".input_global_scale" : ".input_scale"), "F32",
                                 ct ? std::vector<int64_t>{1} : std::vector<int64_t>{}});
    }
  }

  // vLLM, SGLang and transformers take a layer's experts module whole: all its weights quantized,
  // or (listed in the ignore list / modules_to_not_convert) none.
  std::string a_module_quantized, a_module_kept;
  for (const auto& [module, count] : experts) {
    const auto [quantized, kept] = count;
    if (quantized > 0 && kept > 0) {
      throw Error("the experts of '" + module +
                  "' would be partly quantized (engines load a layer's experts all quantized or none); "
                  "quantize or skip both gate_up_proj and down_proj (kept: " +
                  expert_kept_because.at(module) + ")");
    }
    (quantized > 0 ? a_module_quantized : a_module_kept) = module;
    if (quantized > 0) continue;
    ignored.push_back(module);
    // vLLM and SGLang ask compressed-tensors whether a MoE layer is ignored by its first expert's
    // names (an exact match, no prefix): listed too, for every convention.
    if (!gpt_oss) {
      for (const char* projection : {"gate_proj", "up_proj", "down_proj"})
        ignored.push_back(module + ".0." + projection);
    }
  }
  const bool any_expert_quantized = !a_module_quantized.empty();
  // vLLM's Llama 4 and SGLang's Qwen3-VL-MoE loaders read one form of experts per checkpoint: once
  // they meet stacked names they take every expert name for one.
  if (!gpt_oss && !a_module_quantized.empty() && !a_module_kept.empty()) {
    throw Error(
        "the experts of some layers would be split per expert and others kept stacked (engines "
        "read one form per checkpoint); quantize or skip the experts of every layer (split: '" +
        a_module_quantized + "'; kept: " + expert_kept_because.at(a_module_kept) + ")");
  }
  if (gpt_oss && !any_expert_quantized) {
    throw Error(
        "the gpt-oss convention holds gpt-oss's MoE experts (*.experts.gate_up_proj and "
        "*.experts.down_proj, [experts, in, out]), and none of '" +
        input + "' is quantized" +
        (experts.empty() ? " (it has none; MXFP4 of other models: the compressed-tensors convention)"
                         : " (all kept by the layer rules)"));
  }

  // NVFP4: the weights an engine fuses into one GEMM share its single global scale (fused_group_amaxes).
  const std::vector<std::optional<float>> weight_amax =
      o.format == CheckpointFormat::NVFP4 ? fused_group_amaxes(ckpt, pieces, w4a4 ? &input_amax : nullptr)
                                          : std::vector<std::optional<float>>(pieces.size());

  // Write shard by shard, in the input's order.
  json weight_map = json::object();
  uint64_t total_size = 0;
  size_t done = 0;
  for (size_t s = 0; s < ckpt.shard_names().size(); ++s) {
    SafetensorsStreamWriter writer;
    for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
      if (ckpt.tensors()[i].shard != s) continue;
      const SafetensorsEntry& e = *ckpt.tensors()[i].tensor;
      if (!reports[i].quantized) {
        writer.declare(e.name, e.dtype, e.shape);
        weight_map[e.name] = ckpt.shard_names()[s];
      }
      for (size_t p : pieces_of[i]) {
        for (const OutputSpec& spec : pieces[p].specs) {
          writer.declare(spec.name, spec.dtype, spec.shape);
          weight_map[spec.name] = ckpt.shard_names()[s];
        }
      }
    }
    const std::string shard_path = (fs::path(output_dir) / ckpt.shard_names()[s]).string();
    writer.begin(shard_path, {{"format", "pt"}});
    for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
      if (ckpt.tensors()[i].shard != s) continue;
      const SafetensorsEntry& e = *ckpt.tensors()[i].tensor;
      TensorReport& r = reports[i];
      if (!r.quantized) {
        writer.write(e.name, e.data, e.nbytes);
        r.bytes_after = e.nbytes;
      } else {
        const TensorView view = ckpt.shard(s).view(e.name);
        ErrorAccumulator errors;
        for (size_t p : pieces_of[i]) {
          const WeightPiece& piece = pieces[p];
          QuantizeOptions piece_options = qo;
          piece_options.amax_rowwise = weight_amax[p];  // its fused group's, if any
          QuantizedTensor q;
          try {
            if (gpt_oss) {
              q = quantize_gpt_oss_experts(view, piece_options, errors);
            } else {
              // An expert copied out whole: the quantizers' fast paths take contiguous rows.
              const Tensor copy = piece.slice ? copy_expert_slice(view, *piece.slice) : Tensor();
              const TensorView weight = piece.slice ? copy.view() : view;
              q = quantize(weight, piece_options);
              const Tensor deq = dequantize(q, Usage::Rowwise, DType::F32);
              const Tensor ref = to_f32_matrix(weight);
              errors.add(ref.data_as<float>(), deq.data_as<float>(), ref.numel());
            }
          } catch (const Error& err) {
            throw Error("tensor '" + e.name + "'" + (piece.slice ? " ('" + piece.name + "')" : "") + ": " +
                        err.reason());
          }
          r.bytes_after += write_quantized_piece(writer, piece, q, o.convention, input_amax);
        }
        const ErrorStats stats = errors.result();
        r.sqnr_db = stats.sqnr_db;
        r.max_abs_error = stats.max_abs_error;
      }
      total_size += r.bytes_after;
      if (o.progress) o.progress(++done, reports.size(), r);
    }
    partial.put_in_place(shard_path, [&] { writer.finish(); });
  }
  // An index for shards, and for a single shard the input indexed (model-00001-of-00001: its
  // name is not model.safetensors, so loaders find it through the index only).
  const bool input_indexed =
      fs::is_directory(input, ec) && fs::exists(fs::path(input) / "model.safetensors.index.json", ec);
  if (ckpt.shard_names().size() > 1 || input_indexed) {
    const std::string index_path = (fs::path(output_dir) / "model.safetensors.index.json").string();
    partial.put_in_place(index_path, [&] {
      write_text_file(index_path,
                      json{{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}}.dump(2));
    });
  }

  // config.json with the quantization_config; hf_quant_config.json for ModelOpt.
  config["quantization_config"] = quantization_config(o, ignored, w4a4);
  const std::string config_path = (fs::path(output_dir) / "config.json").string();
  partial.put_in_place(config_path, [&] { write_text_file(config_path, config.dump(2)); });
  if (o.convention == Convention::ModelOpt) {
    json hf = {{"producer", {{"name", "microscale"}, {"version", "0.1.0"}}},
               {"quantization",
                {{"quant_algo", config["quantization_config"]["quant_algo"]},
                 {"kv_cache_quant_algo", nullptr},
                 {"group_size", block},
                 {"exclude_modules", ignored}}}};
    const std::string hf_path = (fs::path(output_dir) / "hf_quant_config.json").string();
    partial.put_in_place(hf_path, [&] { write_text_file(hf_path, hf.dump(2)); });
  }
  partial.keep();  // the last file is in place: the model is whole
  // The rest of the model directory (tokenizer, module configs...) is copied as it is.
  if (fs::is_directory(input, ec)) {
    std::vector<std::string> written = ckpt.shard_names();
    for (const char* name : {"config.json", "model.safetensors.index.json", "hf_quant_config.json"})
      written.emplace_back(name);
    copy_model_files(ckpt.directory(), output_dir, output_dir, true, written);
  }
  return reports;
}

}  // namespace microscale
