// microscale/checkpoint.hpp — model checkpoints: sharded safetensors, serving-engine conventions,
// and the conversion of a BF16/FP32 checkpoint into an NVFP4 / MXFP8 / MXFP4 one.
//
// Conventions written and read (shared/spec/checkpoint-formats.md), for a quantized Linear `p`
// with weight `p.weight` [N, K] (leading dims of an N-D weight fold into N):
//   modelopt (NVIDIA ModelOpt unified HF export; vLLM/SGLang/TensorRT-LLM `quant_method: modelopt`)
//     nvfp4: p.weight U8 [N, K/2], p.weight_scale F8_E4M3 [N, K/16], p.weight_scale_2 F32 [] = 1/S_enc
//     mxfp8: p.weight F8_E4M3 [N, K],  p.weight_scale U8 (E8M0) [N, K/32]
//   compressed-tensors (llm-compressor; vLLM `quant_method: compressed-tensors`)
//     nvfp4: p.weight_packed U8 [N, K/2], p.weight_scale F8_E4M3 [N, K/16],
//            p.weight_global_scale F32 [1] = S_enc (the inverse of ModelOpt's weight_scale_2)
//     mxfp4: p.weight_packed U8 [N, K/2], p.weight_scale U8 (E8M0) [N, K/32]
//     mxfp8: p.weight F8_E4M3 [N, K],  p.weight_scale U8 (E8M0) [N, K/32]
//   gpt-oss (OpenAI gpt-oss / transformers `quant_method: mxfp4`): the MoE experts only
//     mxfp4: <T>_blocks U8 [E, out, in/32, 16], <T>_scales U8 (E8M0) [E, out, in/32], for an
//            expert weight T [E, in, out] (is_stacked_expert_weight); the rest stays as it was
// FP4 codes are packed two per byte, element 2j in the low nibble, in every convention.
// NVFP4 activations also need a static global scale (W4A4): with a calibration file (the input
// amax of each Linear, see ConvertOptions::calibration) ModelOpt gets p.input_scale F32 [] =
// amax/2688 and compressed-tensors p.input_global_scale F32 [1] = 2688/amax, and the configs say
// NVFP4 (W4A4); without one the checkpoint is weight-only (ModelOpt: quant_algo W4A16_NVFP4;
// compressed-tensors: no input_activations, llm-compressor's NVFP4A16 scheme). MX activations
// need no calibration (their block scales are computed at run time).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "microscale/quantize.hpp"
#include "microscale/safetensors.hpp"

namespace microscale {

/// @brief A checkpoint: one .safetensors file, or a directory holding model.safetensors or a
/// sharded set with model.safetensors.index.json. Files are mapped, tensors are zero-copy views.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);

  /// @brief Every tensor, with the index of the file (shard) that holds it, in file order.
  struct Entry {
    const SafetensorsEntry* tensor;
    size_t shard;
  };
  const std::vector<Entry>& tensors() const { return entries_; }
  const std::vector<std::string>& shard_names() const { return shard_names_; }  ///< file names
  const SafetensorsFile& shard(size_t i) const { return shards_[i]; }
  bool contains(const std::string& name) const { return by_name_.count(name) != 0; }
  /// @brief Throws microscale::Error naming the tensor when absent.
  const SafetensorsEntry& at(const std::string& name) const;
  /// @brief The directory (or the file's directory) the checkpoint came from.
  const std::string& directory() const { return directory_; }
  /// @brief config.json of the directory, parsed, or an empty string when absent.
  const std::string& config_json() const { return config_json_; }

 private:
  std::vector<SafetensorsFile> shards_;
  std::vector<std::string> shard_names_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> by_name_;
  std::string directory_;
  std::string config_json_;
};

/// @brief Streaming writer: declare every tensor (name, dtype, shape) first, then write their
/// bytes in declaration order; the file holds the header and one tensor at a time in memory.
class SafetensorsStreamWriter {
 public:
  void declare(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape);
  /// @brief Writes the header; then write() each declared tensor in order.
  void begin(const std::string& path, const std::map<std::string, std::string>& metadata = {});
  void write(const std::string& name, const void* data, size_t nbytes);
  /// @brief Checks that every declared tensor was written and closes the file.
  void finish();
  SafetensorsStreamWriter();
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

 private:
  struct Declared {
    std::string name, dtype;
    std::vector<int64_t> shape;
    size_t nbytes;
  };
  std::vector<Declared> declared_;
  size_t next_ = 0;
  struct File;
  std::unique_ptr<File> file_;
};

enum class CheckpointFormat { NVFP4, MXFP8, MXFP4 };
enum class Convention { ModelOpt, CompressedTensors, GptOss };

CheckpointFormat parse_checkpoint_format(const std::string& name);  ///< nvfp4 | mxfp8 | mxfp4
Convention parse_convention(const std::string& name);  ///< modelopt | compressed-tensors | gpt-oss
const char* checkpoint_format_name(CheckpointFormat f);
const char* convention_name(Convention c);
/// @brief MoE experts stacked in one tensor per projection, as gpt-oss, Llama 4 and Qwen3-VL-MoE
/// store them: `*.experts.gate_up_proj` [E, H, 2I] or `*.experts.down_proj` [E, I, H], that is
/// [experts, in, out]. The gpt-oss convention quantizes these alone (MXFP4 blocks along `in`:
/// `_blocks` [E, out, in/32, 16]); modelopt and compressed-tensors split them per expert
/// (split_stacked_experts), as engines load quantized experts.
bool is_stacked_expert_weight(const std::string& name, const std::vector<int64_t>& shape);
/// @brief Whether the checkpoint's config.json says model_type "gpt_oss".
bool is_gpt_oss_model(const Checkpoint& c);

/// @brief Where gate and up lie along the last dim (2I) of a stacked `gate_up_proj`.
enum class StackedGateUp {
  Unknown,      ///< no config.json, or a model not known here: not split
  Halves,       ///< gate = [..., :I], up = [..., I:] (Llama 4, Qwen3-VL-MoE: `chunk(2, dim=-1)`)
  Interleaved,  ///< gate = [..., 0::2], up = [..., 1::2] (gpt-oss)
};
/// @brief A checkpoint's stacked experts as its config.json describes them (model_type, top-level
/// or text_config's): the gate/up layout, and the dims that the tensors' shapes must match before
/// they are split (0 where config.json lacks them): E (num_local_experts / num_experts), H
/// (hidden_size), I (intermediate_size for Llama 4, moe_intermediate_size for Qwen3-VL-MoE).
struct StackedExpertLayout {
  StackedGateUp gate_up = StackedGateUp::Unknown;
  int64_t experts = 0, hidden = 0, intermediate = 0;
};
StackedExpertLayout stacked_expert_layout(const Checkpoint& c);
/// @brief Why the stacked expert weight `name` [E, in, out] cannot be split per expert under
/// `layout` (a sentence for the report), or empty when it can: the layout must be `Halves` and the
/// shape [E, H, 2I] (gate_up_proj) or [E, I, H] (down_proj) with config.json's dims, and not also
/// readable as the transposed [E, out, in] (H = 2I, or H = I), which Qwen3-VL-MoE checkpoints saved
/// by transformers 5 may hold.
std::string stacked_expert_split_problem(const std::string& name, const std::vector<int64_t>& shape,
                                         const StackedExpertLayout& layout);

/// @brief One expert's Linear weight [out, in] inside a stacked expert weight [E, in, out_total]:
/// element (o, i) lies at offset + o * out_stride + i * in_stride of the stacked tensor.
struct ExpertSlice {
  std::string name;  ///< as a per-expert checkpoint names it: `<prefix>.experts.<e>.gate_proj.weight`
  int64_t offset = 0;
  int64_t out = 0, in = 0;
  int64_t out_stride = 1, in_stride = 0;
};
/// @brief The per-expert weights of a stacked expert weight (is_stacked_expert_weight) whose
/// gate_up_proj holds gate and up as `Halves`, in the order engines and llm-compressor name them:
/// for each expert e, `gate_up_proj` gives `<prefix>.experts.<e>.gate_proj.weight` and
/// `.up_proj.weight` [I, H]; `down_proj` gives `<prefix>.experts.<e>.down_proj.weight` [H, I].
/// Throws microscale::Error for another tensor or an odd 2I.
std::vector<ExpertSlice> split_stacked_experts(const std::string& name, const std::vector<int64_t>& shape);
/// @brief Each expert of a stacked expert weight [E, in, out] whole, as [out, in] (gpt-oss), named
/// `name`.
std::vector<ExpertSlice> whole_stacked_experts(const std::string& name, const std::vector<int64_t>& shape);
/// @brief The [out, in] view of `slice` in the stacked tensor `stacked` (no copy; strided).
TensorView expert_slice_view(const TensorView& stacked, const ExpertSlice& slice);
/// @brief `slice` of the CPU tensor `stacked` copied into a contiguous [out, in] tensor of its dtype
/// (the quantizers' fast paths take contiguous rows).
Tensor copy_expert_slice(const TensorView& stacked, const ExpertSlice& slice);
/// @brief The convention used when none is given: modelopt for nvfp4 and mxfp8; for mxfp4 gpt-oss
/// for a gpt-oss model (is_gpt_oss_model), else compressed-tensors.
Convention default_convention(CheckpointFormat f, const Checkpoint& input);
/// @brief Throws microscale::Error when a convention has no layout for a format.
void check_supported(CheckpointFormat f, Convention c);

/// @brief Groups of weights that serving engines fuse into one GEMM: the q/k/v projections
/// (q_proj, k_proj, v_proj; BERT's query, key, value), gate_proj and up_proj (also per MoE expert),
/// Mixtral's experts' w1 and w3, DeepSeek's q_a_proj and kv_a_proj_with_mqa, each group the
/// siblings under one parent module (names `parent.leaf.weight`). The fused layer has a single
/// global scale, so NVFP4 conversions give each group one amax, the max of its members'
/// (convert_checkpoint). Each group lists two or more indices into `weight_names`, in input order.
std::vector<std::vector<size_t>> fused_weight_groups(const std::vector<std::string>& weight_names);

/// @brief Which tensors are quantized. Only floating (F32/BF16/F16) tensors of rank >= 2 whose K
/// is a multiple of the block are candidates; by default embeddings, norms, lm_head, routers and
/// gates, position tables, classifier/pooler heads and the vision side of multimodal models stay
/// high precision (`default_skips()`).
/// `skip` and `only` are fnmatch-style patterns (`*` and `?`) on the full tensor name: a tensor
/// matching `skip` is kept; when `only` is non-empty a tensor must match one of its patterns.
struct LayerRules {
  std::vector<std::string> skip = default_skips();
  std::vector<std::string> only;
  static std::vector<std::string> default_skips();
  /// @brief Empty when the tensor is quantized, else the reason it is kept.
  std::string keep_reason(const std::string& name, const std::string& dtype,
                          const std::vector<int64_t>& shape, int block) const;
};

/// @brief fnmatch-style match of `*` (any run) and `?` (one character).
bool wildcard_match(const std::string& pattern, const std::string& text);

/// @brief One tensor's outcome in a conversion.
struct TensorReport {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  bool quantized = false;
  std::string kept_because;  ///< when not quantized
  double sqnr_db = 0.0;      ///< dequantized vs original (quantized tensors)
  double max_abs_error = 0.0;
  uint64_t bytes_before = 0;
  uint64_t bytes_after = 0;  ///< all tensors written for it (data + scales + global scale)
};

struct ConvertOptions {
  CheckpointFormat format = CheckpointFormat::NVFP4;
  Convention convention = Convention::ModelOpt;
  LayerRules rules;
  ScaleMode mx_scale_mode = ScaleMode::RCeil;
  /// NVFP4 only: the weights' blocks by TransformerEngine's 4over6 (each block the better of its
  /// usual scale and 1.5 times it, FourOverSix in quantize.hpp), with the global-scale bound
  /// `nvfp4_e4m3_max` (448, or TE's 4over6 default 256). The files are plain NVFP4 either way:
  /// the global scale written is the tensor's (or its fused group's) 1/S_enc (S_enc for
  /// compressed-tensors), so any
  /// engine's decode, code * scale * global, reads them.
  FourOverSix four_over_six = FourOverSix::Off;
  bool four_over_six_scaled_error = false;  ///< QuantizeOptions::four_over_six_scaled_error
  int nvfp4_e4m3_max = 448;
  int num_threads = 0;
  /// NVFP4 only: a safetensors file with, for each quantized Linear `p` (weight `p.weight`), either
  /// `p.input_amax` (F32, one value: the max |x| seen at its input) or `p.input` (F32/BF16/F16
  /// activation samples, any shape, whose max |x| is taken). Every quantized Linear needs one.
  std::string calibration;
  /// Called after each tensor: (index, count, report of that tensor).
  std::function<void(size_t, size_t, const TensorReport&)> progress;
};

/// @brief ConvertOptions from names, as the CLI and the Python package take them: `format` (nvfp4 |
/// mxfp8 | mxfp4); `convention`, or empty for the format's default (default_convention: it reads
/// `input`'s config.json for mxfp4), checked against the format; `scale_mode` for the MX formats
/// (empty: rceil; an error for nvfp4). The layer rules and the rest stay at their defaults.
ConvertOptions convert_options(const std::string& input, const std::string& format,
                               const std::string& convention, const std::string& scale_mode);

/// @brief Converts `input` (file or directory) into the directory `output_dir`: the tensors (one
/// output shard per input shard, plus model.safetensors.index.json when sharded), config.json with
/// the convention's quantization_config, hf_quant_config.json for modelopt, and the directory's
/// other small files copied. Returns one report per input tensor. A conversion that throws
/// before its last JSON file is written removes the files and directories it had made.
std::vector<TensorReport> convert_checkpoint(const std::string& input, const std::string& output_dir,
                                             const ConvertOptions& options);

/// @brief A quantized weight found in a checkpoint, dequantized to f32 with its original shape.
struct DetectedWeight {
  std::string name;  ///< the original weight name (p.weight, or T for gpt-oss)
  CheckpointFormat format;
  Convention convention;
  Tensor values;  ///< f32, the original shape (gpt-oss experts as transformers has them: [E, in, out])
};

/// @brief Finds every quantized weight of a checkpoint in any supported convention and
/// dequantizes it (`inspect`, round-trip tests).
std::vector<DetectedWeight> read_quantized_weights(const Checkpoint& checkpoint);

}  // namespace microscale
