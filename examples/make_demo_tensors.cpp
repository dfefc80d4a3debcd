// Writes a small safetensors file of bf16 tensors that look like a transformer layer's: a weight
// (normal, std 0.02), an activation with a few large outlier channels, and a gradient with a
// heavy-tailed magnitude: input for trying `microscale quantize-tensors` (docs/cli.md).
//
// Usage: make_demo_tensors OUT.safetensors
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "microscale/error.hpp"
#include "microscale/half.hpp"
#include "microscale/safetensors.hpp"

namespace {

std::vector<uint16_t> bf16_tensor(int64_t rows, int64_t cols, std::mt19937& rng, float std_dev,
                                  int outlier_every, float outlier_gain, bool heavy_tail) {
  std::normal_distribution<float> normal(0.0f, std_dev);
  std::uniform_real_distribution<float> exponent(-8.0f, 4.0f);
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng);
      if (outlier_every > 0 && c % outlier_every == 0) v *= outlier_gain;
      if (heavy_tail) v *= std::exp2(exponent(rng));
      out[r * cols + c] = microscale::float_to_bf16(v);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.safetensors\n", argv[0]);
    return 2;
  }
  std::mt19937 rng(2026);
  const auto weight = bf16_tensor(512, 1024, rng, 0.02f, 0, 1.0f, false);
  const auto activation = bf16_tensor(256, 1024, rng, 1.0f, 97, 40.0f, false);
  const auto gradient = bf16_tensor(256, 512, rng, 1e-3f, 0, 1.0f, true);
  try {
    microscale::write_safetensors(
        argv[1],
        {
            {"mlp.up_proj.weight", "BF16", {512, 1024}, weight.data(), weight.size() * 2},
            {"mlp.up_proj.input", "BF16", {256, 1024}, activation.data(), activation.size() * 2},
            {"mlp.up_proj.grad_output", "BF16", {256, 512}, gradient.data(), gradient.size() * 2},
        },
        {{"description", "microscale demo tensors"}});
  } catch (const microscale::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::printf("wrote %s\n", argv[1]);
  return 0;
}
