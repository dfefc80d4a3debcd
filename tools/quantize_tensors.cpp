#include "quantize_tensors.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "four_over_six_options.hpp"
#include "microscale/error.hpp"
#include "microscale/error_stats.hpp"
#include "microscale/hadamard.hpp"
#include "microscale/quantize.hpp"
#include "microscale/safetensors.hpp"
#include "threads_option.hpp"

namespace microscale::tools {
namespace {

struct Args {
  std::string input, output, scheme, tile = "1x16";
  std::optional<std::string> scale_mode;
  bool rht = false, rowwise = false, columnwise = false, swizzle = false;
  std::optional<std::string> sr_seed;  // parsed by parse_seed (CLI11 wraps negatives and overflows)
  FourOverSixArgs four_over_six;
  bool row_scaled = false;
  int threads = 0;
};

// A decimal integer in [0, 2^64 - 1], all of the text.
uint64_t parse_seed(const std::string& text) {
  uint64_t seed = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seed);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw Error("--sr-seed must be a whole number from 0 to 18446744073709551615, got '" + text + "'");
  }
  return seed;
}

QuantizeOptions to_options(const Args& a) {
  QuantizeOptions o;
  o.scheme = parse_scheme(a.scheme);
  if (a.scale_mode) {
    if (!is_mx(o.scheme)) throw Error("--scale-mode applies to the MX schemes, not " + a.scheme);
    o.scale_mode = parse_scale_mode(*a.scale_mode);
  }
  o.tile = parse_tile(a.tile, o.scheme);  // a tile of the other family is refused by quantize's checks
  o.rht = a.rht;
  // Neither flag: both usages, as TransformerEngine's quantizers produce by default.
  o.rowwise = a.rowwise || !a.columnwise;
  o.columnwise = a.columnwise || !a.rowwise;
  o.scale_layout = a.swizzle ? ScaleLayout::Swizzled : ScaleLayout::Compact;
  if (a.sr_seed) o.stochastic_rounding = StochasticRounding{parse_seed(*a.sr_seed), 0};
  o.num_threads = a.threads;
  if (a.four_over_six.mode) {
    if (is_mx(o.scheme)) throw Error("--4over6 applies to nvfp4 only");
    o.four_over_six = parse_four_over_six(*a.four_over_six.mode);
  }
  o.four_over_six_scaled_error = a.four_over_six.scaled_error;
  o.nvfp4_e4m3_max = a.four_over_six.e4m3_max;
  if (a.row_scaled && is_mx(o.scheme)) throw Error("--row-scaled applies to nvfp4 only");
  o.row_scaled = a.row_scaled;
  return o;
}

// Dequantizes one usage and compares it with the input in the same orientation; NVFP4's
// columnwise output is X^T, and with RHT its transform is undone first.
ErrorStats usage_error(const TensorView& input, const QuantizedTensor& q, Usage usage, uint16_t rht_mask) {
  const bool transposed = usage == Usage::Columnwise && !is_mx(q.scheme);
  Tensor deq = dequantize(q, usage, DType::F32);
  if (transposed && q.rht) deq = hadamard16(deq.view(), rht_mask, /*inverse=*/true);
  const Tensor x = to_f32_matrix(input);  // [M, K]
  std::vector<float> ref(x.data_as<float>(), x.data_as<float>() + x.numel());
  if (transposed) {  // NVFP4 columnwise holds X^T [K, M]
    for (int64_t r = 0; r < q.rows; ++r) {
      for (int64_t c = 0; c < q.cols; ++c) ref[c * q.rows + r] = x.data_as<float>()[r * q.cols + c];
    }
  }
  return error_stats(ref.data(), deq.data_as<float>(), q.rows * q.cols);
}

void append(std::vector<SafetensorsTensor>& out, const std::string& name, const Tensor& t) {
  out.push_back({name, std::string(dtype_to_safetensors(t.dtype())), t.shape(), t.data(), t.nbytes()});
}

void run(const Args& a) {
  const QuantizeOptions options = to_options(a);
  std::error_code ec;
  if (std::filesystem::equivalent(a.input, a.output, ec)) {
    throw Error("the output '" + a.output + "' is the input file: write the quantized tensors elsewhere");
  }
  const SafetensorsFile in = SafetensorsFile::open(a.input);
  std::vector<SafetensorsTensor> out;
  std::vector<QuantizedTensor> keep;  // owns the bytes `out` points at
  std::vector<Tensor> amaxes;
  keep.reserve(in.tensors().size());
  amaxes.reserve(2 * in.tensors().size());

  std::printf("%-32s %-16s %-10s %10s %14s\n", "tensor", "shape", "usage", "SQNR dB", "max abs err");
  for (const SafetensorsEntry& e : in.tensors()) {
    const bool floating = e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16";
    if (!floating) {
      out.push_back({e.name, e.dtype, e.shape, e.data, e.nbytes});
      std::printf("%-32s %-16s %-10s %10s %14s\n", e.name.c_str(), shape_string(e.shape).c_str(), "kept", "-",
                  "-");
      continue;
    }
    const TensorView view = in.view(e.name);
    QuantizedTensor q;
    try {
      q = quantize(view, options);
    } catch (const Error& err) {
      throw Error("tensor '" + e.name + "' " + shape_string(e.shape) + ": " + err.reason());
    }
    for (Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
      if (!q.has(usage)) continue;
      const std::string prefix = e.name + (usage == Usage::Rowwise ? ".rowwise" : ".columnwise");
      append(out, prefix + "_data", usage == Usage::Rowwise ? q.rowwise_data : q.columnwise_data);
      append(out, prefix + "_scale", usage == Usage::Rowwise ? q.rowwise_scale : q.columnwise_scale);
      if (q.row_scaled) {  // one amax per row of the usage's matrix: F32 [M] or [K]
        append(out, prefix + "_amax", usage == Usage::Rowwise ? q.rowwise_amaxes : q.columnwise_amaxes);
      } else if (!is_mx(q.scheme)) {
        Tensor amax(DType::F32, {1});
        amax.data_as<float>()[0] = usage == Usage::Rowwise ? q.rowwise_amax : q.columnwise_amax;
        amaxes.push_back(amax);
        append(out, prefix + "_amax", amaxes.back());
      }
      const ErrorStats s = usage_error(view, q, usage, options.rht_sign_mask);
      std::printf("%-32s %-16s %-10s %10.2f %14.6g\n", e.name.c_str(), shape_string(e.shape).c_str(),
                  usage == Usage::Rowwise ? "rowwise" : "columnwise", s.sqnr_db, s.max_abs_error);
    }
    keep.push_back(std::move(q));
  }
  std::map<std::string, std::string> metadata = {
      {"microscale.scheme", std::string(scheme_name(options.scheme))},
      {"microscale.scale_layout", a.swizzle ? "swizzled" : "compact"},
  };
  metadata["microscale.tile"] = std::string(tile_name(options.tile, options.scheme));
  if (is_mx(options.scheme)) {
    metadata["microscale.scale_mode"] = std::string(scale_mode_name(options.scale_mode));
  } else {
    metadata["microscale.rht"] = options.rht && options.columnwise ? "true" : "false";  // as applied
    if (options.stochastic_rounding)
      metadata["microscale.sr_seed"] = std::to_string(options.stochastic_rounding->seed);
    // Readers need the bound: the amaxes' S_enc is 6 * nvfp4_e4m3_max / amax.
    metadata["microscale.nvfp4_e4m3_max"] = std::to_string(options.nvfp4_e4m3_max);
    if (options.row_scaled) metadata["microscale.row_scaled"] = "true";
    if (options.four_over_six != FourOverSix::Off) {
      metadata["microscale.four_over_six"] = std::string(four_over_six_name(options.four_over_six));
      metadata["microscale.four_over_six_scaled_error"] =
          options.four_over_six_scaled_error ? "true" : "false";
    }
  }
  write_safetensors(a.output, out, metadata);
  std::printf("wrote %zu tensors to %s\n", out.size(), a.output.c_str());
}

}  // namespace

void add_quantize_tensors_command(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "quantize-tensors",
      "Quantize every floating tensor (F32/BF16/F16) of a safetensors file; other tensors are copied.\n"
      "For a tensor x it writes x.rowwise_data, x.rowwise_scale, x.columnwise_data, x.columnwise_scale\n"
      "(U8) and, for nvfp4, x.rowwise_amax / x.columnwise_amax (F32, [1]; per row with --row-scaled),\n"
      "and prints each usage's error.");
  cmd->add_option("input", args->input, "input .safetensors file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", args->output, "output .safetensors file")->required();
  cmd->add_option("--scheme", args->scheme,
                  "nvfp4 | mxfp8_e4m3 | mxfp8_e5m2 | mxfp6_e2m3 | mxfp6_e3m2 | mxfp4")
      ->required();
  cmd->add_option("--scale-mode", args->scale_mode,
                  "MX scale rule: floor | rceil | ceil | even (default rceil)");
  cmd->add_option(
      "--tile", args->tile,
      "scale block: nvfp4 1x16 (default) or 16x16 (weights); MX 1x32 (default) or 32x32 (weights)");
  cmd->add_flag("--rht", args->rht, "nvfp4: random Hadamard transform on the columnwise output (bf16 input)");
  cmd->add_flag("--rowwise", args->rowwise, "write the rowwise output (default: both usages)");
  cmd->add_flag("--columnwise", args->columnwise, "write the columnwise output (default: both usages)");
  cmd->add_flag("--swizzle", args->swizzle,
                "write scales in the cuBLAS 128x4 swizzled layout (default compact)");
  cmd->add_option("--sr-seed", args->sr_seed,
                  "nvfp4: stochastic rounding with this Philox seed (0 to 2^64 - 1)");
  add_four_over_six_options(cmd, args->four_over_six);
  cmd->add_flag("--row-scaled", args->row_scaled,
                "nvfp4 1x16: a global scale per row (x.rowwise_amax is F32 [M], x.columnwise_amax F32 [K]; "
                "TransformerEngine's row_scaled_nvfp4)");
  add_threads_option(cmd, args->threads);
  cmd->callback([args] { run(*args); });
}

}  // namespace microscale::tools
