// `microscale quantize IN -o OUT --format ...`: a real checkpoint into a serving convention, with
// a progress bar, a per-tensor report (table and JSON) and a whole-model summary.
#include "quantize_checkpoint.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "four_over_six_options.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"
#include "microscale/output_file.hpp"
#include "threads_option.hpp"

namespace microscale::tools {
namespace {

struct QuantizeArgs {
  std::string input, output, format, convention, report, calibration;
  std::optional<std::string> scale_mode;  // MX only; rceil when not given
  FourOverSixArgs four_over_six;          // NVFP4 only; the files stay plain NVFP4
  std::vector<std::string> skip, only;
  bool no_default_skips = false, quiet = false;
  int threads = 0;
};

// "[#####.....]  42/104 name" redrawn in place on a terminal; plain lines otherwise.
void show_progress(size_t done, size_t total, const TensorReport& r, bool terminal) {
  if (terminal) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / (total ? total : 1));
    std::fprintf(stderr, "\r[%s%s] %4zu/%zu %-48.48s", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), done, total, r.name.c_str());
    if (done == total) std::fprintf(stderr, "\n");
  } else {
    std::fprintf(stderr, "%zu/%zu %s %s\n", done, total, r.quantized ? "quantized" : "kept", r.name.c_str());
  }
  std::fflush(stderr);
}

std::string mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / 1e6);
  return buf;
}

void run_quantize(const QuantizeArgs& a) {
  if (a.scale_mode && a.scale_mode->empty())
    throw Error("--scale-mode needs a value (floor, ceil, even, rceil)");
  ConvertOptions o = convert_options(a.input, a.format, a.convention, a.scale_mode.value_or(""));
  if (a.no_default_skips) o.rules.skip.clear();
  o.rules.skip.insert(o.rules.skip.end(), a.skip.begin(), a.skip.end());
  o.rules.only = a.only;
  o.num_threads = a.threads;
  o.calibration = a.calibration;
  if (a.four_over_six.mode) o.four_over_six = parse_four_over_six(*a.four_over_six.mode);
  o.four_over_six_scaled_error = a.four_over_six.scaled_error;
  o.nvfp4_e4m3_max = a.four_over_six.e4m3_max;
  const bool terminal = isatty(fileno(stderr)) != 0;
  if (!a.quiet)
    o.progress = [terminal](size_t d, size_t t, const TensorReport& r) { show_progress(d, t, r, terminal); };

  const auto start = std::chrono::steady_clock::now();
  const std::vector<TensorReport> reports = convert_checkpoint(a.input, a.output, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("%-56s %-14s %-9s %9s %12s %10s %10s\n", "tensor", "shape", "action", "SQNR dB", "max abs err",
              "MB before", "MB after");
  uint64_t before = 0, after = 0;
  double sqnr_sum = 0;
  size_t quantized = 0;
  for (const TensorReport& r : reports) {
    before += r.bytes_before;
    after += r.bytes_after;
    if (r.quantized) {
      ++quantized;
      sqnr_sum += r.sqnr_db;
      std::printf("%-56s %-14s %-9s %9.2f %12.4g %10s %10s\n", r.name.c_str(), shape_string(r.shape).c_str(),
                  "quantized", r.sqnr_db, r.max_abs_error, mb(r.bytes_before).c_str(),
                  mb(r.bytes_after).c_str());
    } else {
      std::printf("%-56s %-14s %-9s %9s %12s %10s %10s  (%s)\n", r.name.c_str(),
                  shape_string(r.shape).c_str(), "kept", "-", "-", mb(r.bytes_before).c_str(),
                  mb(r.bytes_after).c_str(), r.kept_because.c_str());
    }
  }
  const double mean_sqnr = quantized ? sqnr_sum / static_cast<double>(quantized) : NAN;
  std::printf(
      "\nsummary: %s (%s), %zu of %zu tensors quantized, mean SQNR %.2f dB, %s MB -> %s MB (%.2fx smaller), "
      "%.1f s\n",
      checkpoint_format_name(o.format), convention_name(o.convention), quantized, reports.size(), mean_sqnr,
      mb(before).c_str(), mb(after).c_str(),
      after ? static_cast<double>(before) / static_cast<double>(after) : 0.0, seconds);
  std::printf("wrote %s\n", a.output.c_str());

  if (!a.report.empty()) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const TensorReport& r : reports) {
      nlohmann::json t = {{"name", r.name},
                          {"shape", r.shape},
                          {"dtype", r.dtype},
                          {"quantized", r.quantized},
                          {"bytes_before", r.bytes_before},
                          {"bytes_after", r.bytes_after}};
      if (r.quantized) {
        t["sqnr_db"] = std::isfinite(r.sqnr_db) ? nlohmann::json(r.sqnr_db) : nlohmann::json(nullptr);
        t["max_abs_error"] = r.max_abs_error;
      } else {
        t["kept_because"] = r.kept_because;
      }
      tensors.push_back(t);
    }
    const nlohmann::json report = {
        {"input", a.input},
        {"output", a.output},
        {"format", checkpoint_format_name(o.format)},
        {"convention", convention_name(o.convention)},
        {"tensors", tensors},
        {"summary",
         {{"tensors", reports.size()},
          {"quantized", quantized},
          {"mean_sqnr_db", std::isfinite(mean_sqnr) ? nlohmann::json(mean_sqnr) : nlohmann::json(nullptr)},
          {"bytes_before", before},
          {"bytes_after", after},
          {"seconds", seconds}}}};
    // Names from the file system need not be UTF-8: replaced, not an exception from the dump.
    write_text_file(a.report, report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Quantize a safetensors checkpoint (a file, or a directory with model.safetensors or shards) into\n"
      "NVFP4, MXFP8 or MXFP4 in a convention serving engines load; writes a model directory and\n"
      "prints a per-tensor report and a summary.");
  cmd->add_option("input", a->input, "checkpoint file or directory")->required();
  cmd->add_option("-o,--output", a->output, "output directory")->required();
  cmd->add_option("--format", a->format, "nvfp4 | mxfp8 | mxfp4")->required();
  cmd->add_option(
      "--convention", a->convention,
      "modelopt | compressed-tensors | gpt-oss (default: modelopt; for mxfp4 gpt-oss for a gpt-oss "
      "model, else compressed-tensors)");
  cmd->add_option("--skip", a->skip, "keep tensors matching this pattern (* and ?), repeatable");
  cmd->add_option("--only", a->only, "quantize only tensors matching one of these patterns, repeatable");
  cmd->add_flag("--no-default-skips", a->no_default_skips,
                "also quantize embeddings, norms, lm_head, routers and gates (kept by default)");
  cmd->add_option("--scale-mode", a->scale_mode, "MX scale rule: rceil (default) | floor | ceil | even");
  add_four_over_six_options(cmd, a->four_over_six);
  add_threads_option(cmd, a->threads);
  cmd->add_option("--report", a->report, "also write the report as JSON to this file");
  cmd->add_option(
         "--calibration", a->calibration,
         "nvfp4: safetensors file with <module>.input_amax (or .input samples) per quantized Linear;\n"
         "writes the activations' static scale (W4A4) instead of a weight-only checkpoint")
      ->check(CLI::ExistingFile);
  cmd->add_flag("-q,--quiet", a->quiet, "no progress output");
  cmd->callback([a] { run_quantize(*a); });
}

}  // namespace microscale::tools
