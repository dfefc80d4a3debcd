// Trains a small MLP on the CPU three times from the same seed — NVFP4, MXFP8 and high precision —
// and prints the loss curves side by side.
//
// Task: regress the output of a fixed random "teacher" MLP (64 -> 256 -> 32, tanh) from Gaussian
// inputs. Student: Linear(64, 256) -> ReLU -> Linear(256, 32), MSE loss, plain SGD, batch 128.
// Both Linear layers run under microscale::autocast with the recipe; the ReLU and the loss are fp32.
//
// Usage: train_mlp [steps] [max_relative_gap]   (defaults 300, none)
// With max_relative_gap, exits 1 when NVFP4's or MXFP8's final loss is above high precision's by
// more than that fraction (ctest runs `train_mlp 300 0.10`; measured: MXFP8 +0.7%, NVFP4 +5.6%).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "microscale/error.hpp"
#include "microscale/linear.hpp"
#include "microscale/recipe.hpp"

namespace ms = microscale;

namespace {

constexpr int64_t kIn = 64, kHidden = 256, kOut = 32, kBatch = 128;

// Teacher weights and a stream of batches, identical for every recipe (seeded).
struct Task {
  std::vector<float> w1, w2;  // (kHidden, kIn), (kOut, kHidden)
  explicit Task(uint64_t seed) : w1(kHidden * kIn), w2(kOut * kHidden) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    for (float& v : w1) v = normal(rng) / std::sqrt(static_cast<float>(kIn));
    for (float& v : w2) v = normal(rng) / std::sqrt(static_cast<float>(kHidden));
  }
  void batch(uint64_t step, ms::Tensor& x, ms::Tensor& y) const {
    std::mt19937_64 rng(1000 + step);
    std::normal_distribution<float> normal;
    x = ms::Tensor(ms::DType::F32, {kBatch, kIn});
    y = ms::Tensor(ms::DType::F32, {kBatch, kOut});
    float* px = x.data_as<float>();
    for (int64_t i = 0; i < x.numel(); ++i) px[i] = normal(rng);
    for (int64_t b = 0; b < kBatch; ++b) {
      std::vector<float> h(kHidden);
      for (int64_t j = 0; j < kHidden; ++j) {
        double s = 0;
        for (int64_t i = 0; i < kIn; ++i) s += w1[j * kIn + i] * px[b * kIn + i];
        h[j] = std::tanh(static_cast<float>(s));
      }
      for (int64_t o = 0; o < kOut; ++o) {
        double s = 0;
        for (int64_t j = 0; j < kHidden; ++j) s += w2[o * kHidden + j] * h[j];
        y.data_as<float>()[b * kOut + o] = static_cast<float>(s);
      }
    }
  }
};

std::vector<double> train(const ms::Recipe& recipe, const Task& task, int steps, float lr) {
  ms::Linear fc1(kIn, kHidden, true, 42), fc2(kHidden, kOut, true, 43);  // same init for every recipe
  std::vector<double> losses;
  ms::autocast scope(recipe);
  for (int step = 0; step < steps; ++step) {
    ms::Tensor x, target;
    task.batch(static_cast<uint64_t>(step), x, target);
    ms::Tensor h = fc1.forward(x.view());
    ms::Tensor relu(ms::DType::F32, h.shape());
    for (int64_t i = 0; i < h.numel(); ++i) relu.data_as<float>()[i] = std::max(h.data_as<float>()[i], 0.0f);
    const ms::Tensor out = fc2.forward(relu.view());
    // MSE loss and its gradient.
    ms::Tensor grad(ms::DType::F32, out.shape());
    double loss = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const float d = out.data_as<float>()[i] - target.data_as<float>()[i];
      loss += static_cast<double>(d) * d;
      grad.data_as<float>()[i] = 2.0f * d / static_cast<float>(out.numel());
    }
    losses.push_back(loss / static_cast<double>(out.numel()));
    ms::Tensor grad_relu = fc2.backward(grad.view());
    for (int64_t i = 0; i < h.numel(); ++i) {
      if (h.data_as<float>()[i] <= 0.0f) grad_relu.data_as<float>()[i] = 0.0f;
    }
    fc1.backward(grad_relu.view());
    fc1.sgd_step(lr);
    fc2.sgd_step(lr);
  }
  return losses;
}

double mean_tail(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  const double max_gap = argc > 2 ? std::atof(argv[2]) : -1.0;
  if (steps < 20) {
    std::fprintf(stderr, "usage: %s [steps >= 20]\n", argv[0]);
    return 2;
  }
  try {
    const Task task(7);
    const float lr = 0.1f;
    const std::vector<double> hp = train(ms::HighPrecision{}, task, steps, lr);
    const std::vector<double> mx = train(ms::MXFP8BlockScaling{}, task, steps, lr);
    const std::vector<double> nv = train(ms::NVFP4BlockScaling{}, task, steps, lr);
    std::printf("%6s %14s %14s %14s\n", "step", "high_precision", "mxfp8", "nvfp4");
    for (int s = 0; s < steps; s += std::max(1, steps / 15)) {
      std::printf("%6d %14.5f %14.5f %14.5f\n", s, hp[s], mx[s], nv[s]);
    }
    const size_t tail = 20;
    const double hp_end = mean_tail(hp, tail), mx_end = mean_tail(mx, tail), nv_end = mean_tail(nv, tail);
    std::printf(
        "\nmean loss over the last %zu steps: high_precision %.5f, mxfp8 %.5f (%+.1f%%), nvfp4 %.5f "
        "(%+.1f%%)\n",
        tail, hp_end, mx_end, 100 * (mx_end / hp_end - 1), nv_end, 100 * (nv_end / hp_end - 1));
    if (max_gap >= 0 && (mx_end > hp_end * (1 + max_gap) || nv_end > hp_end * (1 + max_gap))) {
      std::printf("FAILED: a quantized recipe ended more than %.0f%% above high precision\n", 100 * max_gap);
      return 1;
    }
  } catch (const ms::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
