// `microscale inspect FILE|DIR`: the tensors of a checkpoint, its detected convention, and the
// statistics of every quantized weight after dequantization.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"
#include "quantize_checkpoint.hpp"

namespace microscale::tools {
namespace {

std::string declared_method(const Checkpoint& c) {
  if (c.config_json().empty()) return "";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(c.config_json());
  } catch (const nlohmann::json::exception&) {
    throw Error("config.json of '" + c.directory() + "' is not valid JSON");
  }
  if (!j.is_object() || !j.contains("quantization_config")) return "";
  const nlohmann::json& q = j["quantization_config"];
  if (!q.is_object() || !q.contains("quant_method")) return "";
  if (!q["quant_method"].is_string()) {
    throw Error("config.json of '" + c.directory() + "': quantization_config.quant_method is not a string");
  }
  return q["quant_method"].get<std::string>();
}

void run_inspect(const std::string& path, bool all) {
  const Checkpoint c = Checkpoint::open(path);
  uint64_t bytes = 0;
  for (const Checkpoint::Entry& e : c.tensors()) bytes += e.tensor->nbytes;
  std::printf("%s: %zu tensors in %zu file(s), %.2f MB\n", path.c_str(), c.tensors().size(),
              c.shard_names().size(), static_cast<double>(bytes) / 1e6);
  const std::string method = declared_method(c);
  if (!method.empty()) std::printf("config.json quant_method: %s\n", method.c_str());

  const std::vector<DetectedWeight> weights = read_quantized_weights(c);
  std::set<std::string> conventions;
  for (const DetectedWeight& w : weights) {
    conventions.insert(std::string(convention_name(w.convention)) + " " + checkpoint_format_name(w.format));
  }
  std::printf("detected:%s\n", weights.empty() ? " no quantized weights (high precision)" : "");
  for (const std::string& s : conventions) std::printf("  %s\n", s.c_str());

  if (all || weights.empty()) {
    std::printf("\n%-60s %-8s %s\n", "tensor", "dtype", "shape");
    for (const Checkpoint::Entry& e : c.tensors()) {
      std::printf("%-60s %-8s %s\n", e.tensor->name.c_str(), e.tensor->dtype.c_str(),
                  shape_string(e.tensor->shape).c_str());
    }
  }
  if (!weights.empty()) {
    std::printf("\n%-56s %-8s %-14s %10s %10s %10s %10s\n", "quantized weight (dequantized)", "format",
                "shape", "mean", "std", "amax", "NaN");
    for (const DetectedWeight& w : weights) {
      const float* v = w.values.data_as<float>();
      double sum = 0, sq = 0, amax = 0;
      int64_t nan = 0, n = w.values.numel();
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(v[i])) {
          ++nan;
          continue;
        }
        sum += v[i];
        sq += static_cast<double>(v[i]) * v[i];
        amax = std::max(amax, std::fabs(static_cast<double>(v[i])));
      }
      const double count = static_cast<double>(n - nan), mean = count > 0 ? sum / count : 0;
      const double sd = count > 0 ? std::sqrt(std::max(0.0, sq / count - mean * mean)) : 0;
      std::printf("%-56s %-8s %-14s %10.4g %10.4g %10.4g %10lld\n", w.name.c_str(),
                  checkpoint_format_name(w.format), shape_string(w.values.shape()).c_str(), mean, sd, amax,
                  static_cast<long long>(nan));
    }
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  CLI::App* cmd =
      app.add_subcommand("inspect",
                         "Show a checkpoint's tensors, its detected quantization convention, and the\n"
                         "statistics of every quantized weight after dequantization.");
  cmd->add_option("path", *path, "checkpoint file or directory")->required();
  cmd->add_flag("--all", *all, "list every tensor even when quantized weights were found");
  cmd->callback([path, all] { run_inspect(*path, *all); });
}

}  // namespace microscale::tools
