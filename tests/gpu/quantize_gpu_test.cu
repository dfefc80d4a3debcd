// GPU tests of the CUDA backend (plain main; run by tests/gpu/run.sh on a GPU machine).
//
// Every byte the device writes (data, scales incl. swizzled padding, amaxes) is compared with the
// CPU oracle microscale::quantize_ref, on random shapes (ragged, tiny, strided), every scheme,
// scale mode, tile, RHT, SR, layout and input dtype; then dequantize and the standalone swizzle
// against their CPU twins; then the golden set's quantizer cases byte for byte (its NaN/Inf-block
// cases are left to the random suite, whose inputs hold NaN and Inf, against the CPU; the NaN
// pattern suite adds every bf16/f16 NaN pattern, signalling ones included). Outputs are
// poisoned before each run so an unwritten byte shows. Exit status = number of failures (capped).
//
// Usage: quantize_gpu_test [--quick] [GOLDEN_DIR]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "device_buffer.hpp"
#include "microscale/cuda.hpp"
#include "microscale/error.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"
#include "microscale/quantize.hpp"
#include "microscale/safetensors.hpp"

using namespace microscale;

namespace {

int g_failures = 0, g_checks = 0;

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<uint8_t> to_host(const void* p, size_t n) {
  std::vector<uint8_t> h(n);
  if (n) CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}

bool same_bytes(const std::string& what, const std::vector<uint8_t>& got, const void* want, size_t n) {
  ++g_checks;
  if (got.size() != n) {
    std::printf("FAIL %s: size %zu vs %zu\n", what.c_str(), got.size(), n);
    ++g_failures;
    return false;
  }
  const auto* w = static_cast<const uint8_t*>(want);
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != w[i]) {
      size_t bad = 0;
      for (size_t j = i; j < n; ++j) bad += got[j] != w[j];
      std::printf("FAIL %s: %zu of %zu bytes differ, first at %zu (gpu 0x%02x, cpu 0x%02x)\n", what.c_str(),
                  bad, n, i, got[i], w[i]);
      ++g_failures;
      return false;
    }
  }
  return true;
}

std::string describe(const QuantizeOptions& o, const std::vector<int64_t>& shape, DType dtype,
                     const char* tag) {
  char buf[400];
  std::snprintf(
      buf, sizeof buf,
      "%s %s %s %s row=%d col=%d mode=%s tile=%s rht=%d sr=%d ovr=%d layout=%s 4over6=%d row_scaled=%d", tag,
      std::string(scheme_name(o.scheme)).c_str(), shape_string(shape).c_str(),
      std::string(dtype_name(dtype)).c_str(), o.rowwise, o.columnwise,
      std::string(scale_mode_name(o.scale_mode)).c_str(), o.tile == Tile::k16x16 ? "16x16" : "1x16", o.rht,
      o.stochastic_rounding.has_value(), o.amax_rowwise.has_value() || o.amax_columnwise.has_value(),
      o.scale_layout == ScaleLayout::Swizzled ? "swizzled" : "compact", static_cast<int>(o.four_over_six),
      o.row_scaled);
  return buf;
}

// Random input values: mostly normal-ish with varied block magnitudes, some zeros/-0, and optional
// specials (NaN, Inf) and wide exponent spreads (the RHT's exact fallback path).
std::vector<float> random_values(int64_t n, std::mt19937_64& rng, bool specials, bool wide) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  float block_scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 16 == 0) block_scale = std::ldexp(1.0f, static_cast<int>(uni(rng) * 16) - 8);
    float x = normal(rng) * block_scale;
    const float u = uni(rng);
    if (u < 0.01f)
      x = 0.0f;
    else if (u < 0.015f)
      x = -0.0f;
    if (wide && uni(rng) < 0.05f) x = std::ldexp(normal(rng), static_cast<int>(uni(rng) * 120) - 60);
    if (specials) {
      const float s = uni(rng);
      if (s < 0.002f)
        x = NAN;
      else if (s < 0.004f)
        x = INFINITY;
      else if (s < 0.006f)
        x = -INFINITY;
      else if (s < 0.008f)
        x = -NAN;  // a NaN keeps its sign in FP8 codes (mx_scaled_element)
    }
    v[static_cast<size_t>(i)] = x;
  }
  return v;
}

// Host storage of `values` in `dtype` (rounded once; the CPU and the GPU read the same bytes).
std::vector<uint8_t> encode_input(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::F32)
      std::memcpy(&out[i * 4], &v[i], 4);
    else {
      const uint16_t h = dtype == DType::BF16 ? float_to_bf16(v[i]) : float_to_half(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

struct DeviceQuantized {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  cuda::QuantizedViews views;
  QuantizedShapes shapes;
};

TensorView device_view(DeviceQuantized& q, const std::vector<int64_t>& shape) {
  q.buffers.push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(numel(shape))));
  CK(cudaMemset(q.buffers.back()->p, 0xAB, q.buffers.back()->n));  // poison
  TensorView t;
  t.data = q.buffers.back()->p;
  t.dtype = DType::U8;
  t.shape = shape;
  t.device = Device::CUDA;
  return t;
}

DeviceQuantized run_device(const TensorView& input, const QuantizeOptions& o) {
  DeviceQuantized q;
  q.shapes = quantized_shapes(input.shape, o);
  if (o.rowwise) {
    q.views.rowwise_data = device_view(q, q.shapes.rowwise_data);
    q.views.rowwise_scale = device_view(q, q.shapes.rowwise_scale);
  }
  if (o.columnwise) {
    q.views.columnwise_data = device_view(q, q.shapes.columnwise_data);
    q.views.columnwise_scale = device_view(q, q.shapes.columnwise_scale);
  }
  // amax: 2 floats, a row-scaled tensor's 2 + M + K (cuda::QuantizedViews::amax)
  const size_t amax_bytes = 4 * static_cast<size_t>(o.row_scaled ? 2 + q.shapes.rows + q.shapes.cols : 2);
  q.buffers.push_back(std::make_unique<DeviceBuffer>(amax_bytes));
  CK(cudaMemset(q.buffers.back()->p, 0xAB, amax_bytes));
  q.views.amax = static_cast<float*>(q.buffers.back()->p);
  cuda::quantize(input, o, q.views, nullptr);
  CK(cudaDeviceSynchronize());
  return q;
}

// compare_case on input bytes (`host`: the storage in dtype) rather than values.
bool compare_stored(const std::vector<uint8_t>& host, const std::vector<int64_t>& shape,
                    const std::vector<int64_t>& strides, DType dtype, const QuantizeOptions& o,
                    bool check_dequant) {
  const std::string what = describe(o, shape, dtype, strides.empty() ? "" : "strided");
  TensorView cpu_in;
  cpu_in.data = const_cast<uint8_t*>(host.data());
  cpu_in.dtype = dtype;
  cpu_in.shape = shape;
  cpu_in.strides = strides;
  QuantizedTensor ref;
  try {
    ref = quantize_ref(cpu_in, o);
  } catch (const Error& e) {
    std::printf("skip (invalid for the CPU too): %s: %s\n", what.c_str(), e.what());
    return false;
  }
  DeviceBuffer din(host.size());
  CK(cudaMemcpy(din.p, host.data(), host.size(), cudaMemcpyHostToDevice));
  TensorView gpu_in = cpu_in;
  gpu_in.data = din.p;
  gpu_in.device = Device::CUDA;
  DeviceQuantized q;
  try {
    q = run_device(gpu_in, o);
  } catch (const Error& e) {
    std::printf("FAIL %s: threw %s\n", what.c_str(), e.what());
    ++g_failures;
    return true;
  }
  bool ok = true;
  if (o.rowwise) {
    ok &= same_bytes(what + " rowwise_data", to_host(q.views.rowwise_data.data, ref.rowwise_data.nbytes()),
                     ref.rowwise_data.data(), ref.rowwise_data.nbytes());
    ok &= same_bytes(what + " rowwise_scale",
                     to_host(q.views.rowwise_scale.data, static_cast<size_t>(numel(q.shapes.rowwise_scale))),
                     ref.rowwise_scale.data(), ref.rowwise_scale.nbytes());
  }
  if (o.columnwise) {
    ok &= same_bytes(what + " columnwise_data",
                     to_host(q.views.columnwise_data.data, ref.columnwise_data.nbytes()),
                     ref.columnwise_data.data(), ref.columnwise_data.nbytes());
    ok &= same_bytes(
        what + " columnwise_scale",
        to_host(q.views.columnwise_scale.data, static_cast<size_t>(numel(q.shapes.columnwise_scale))),
        ref.columnwise_scale.data(), ref.columnwise_scale.nbytes());
  }
  if (o.scheme == Scheme::NVFP4) {
    const std::vector<uint8_t> amax = to_host(q.views.amax, 8);
    float a[2];
    std::memcpy(a, amax.data(), 8);
    if (o.rowwise)
      ok &= same_bytes(what + " rowwise_amax", {amax.begin(), amax.begin() + 4}, &ref.rowwise_amax, 4);
    if (o.columnwise)
      ok &= same_bytes(what + " columnwise_amax", {amax.begin() + 4, amax.end()}, &ref.columnwise_amax, 4);
    if (o.row_scaled) {  // then the amaxes of X's rows and of X^T's
      const std::vector<uint8_t> all =
          to_host(q.views.amax, 4 * static_cast<size_t>(2 + ref.rows + ref.cols));
      if (o.rowwise)
        ok &= same_bytes(what + " rowwise_amaxes", {all.begin() + 8, all.begin() + 8 + 4 * ref.rows},
                         ref.rowwise_amaxes.data(), ref.rowwise_amaxes.nbytes());
      if (o.columnwise)
        ok &= same_bytes(what + " columnwise_amaxes", {all.begin() + 8 + 4 * ref.rows, all.end()},
                         ref.columnwise_amaxes.data(), ref.columnwise_amaxes.nbytes());
    }
  }
  if (!ok || !check_dequant) return true;
  for (Usage usage : {Usage::Rowwise, Usage::Columnwise}) {
    if (!ref.has(usage)) continue;
    for (DType out_dtype : {DType::F32, DType::BF16}) {
      const Tensor want = dequantize(ref, usage, out_dtype);
      DeviceBuffer dout(want.nbytes());
      TensorView out;
      out.data = dout.p;
      out.dtype = out_dtype;
      const bool transposed = o.scheme == Scheme::NVFP4 && usage == Usage::Columnwise;
      out.shape = transposed ? std::vector<int64_t>{q.shapes.cols, q.shapes.rows}
                             : std::vector<int64_t>{q.shapes.rows, q.shapes.cols};
      out.device = Device::CUDA;
      cuda::dequantize(q.views, shape, o, usage, out, nullptr);
      CK(cudaDeviceSynchronize());
      std::vector<uint8_t> got = to_host(dout.p, want.nbytes());
      // NaN payloads may differ (the GPU's canonical NaN); compare NaN as NaN.
      const size_t es = dtype_size(out_dtype);
      std::vector<uint8_t> expect(static_cast<const uint8_t*>(want.data()),
                                  static_cast<const uint8_t*>(want.data()) + want.nbytes());
      for (size_t i = 0; i < got.size() / es; ++i) {
        float g, w;
        if (out_dtype == DType::F32) {
          std::memcpy(&g, &got[i * 4], 4);
          std::memcpy(&w, &expect[i * 4], 4);
        } else {
          uint16_t gh, wh;
          std::memcpy(&gh, &got[i * 2], 2);
          std::memcpy(&wh, &expect[i * 2], 2);
          g = bf16_to_float(gh);
          w = bf16_to_float(wh);
        }
        if (std::isnan(g) && std::isnan(w)) std::memcpy(&got[i * es], &expect[i * es], es);
      }
      same_bytes(what + (usage == Usage::Rowwise ? " dequant rowwise " : " dequant columnwise ") +
                     std::string(dtype_name(out_dtype)),
                 got, expect.data(), expect.size());
    }
  }
  return true;
}

// Quantizes `values` (stored as dtype, viewed with `strides` over a buffer of `storage` elements)
// on both backends and compares every output byte; optionally dequantize too. False when the CPU
// rejects the case (then nothing is compared).
bool compare_case(const std::vector<float>& storage_values, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& strides, DType dtype, const QuantizeOptions& o,
                  bool check_dequant) {
  return compare_stored(encode_input(storage_values, dtype), shape, strides, dtype, o, check_dequant);
}

void random_suite(bool quick) {
  std::mt19937_64 rng(12345);
  const std::vector<std::vector<int64_t>> shapes = {
      {32, 32},   {16, 16},     {32, 64},   {64, 128},   {128, 128},
      {96, 160},  {160, 96},    {224, 352}, {2, 48, 64},  // 3-D input
      {320, 544}, {1024, 1056}, {33, 64},   {48, 96},    {16, 2048},
      {2048, 32}, {64, 40},     {96, 300},  // last dims no block divides: columnwise only
      {80, 272}};  // whole NVFP4 tiles whose output rows are 8 mod 16 bytes apart (lane-by-lane stores)
  const std::vector<std::vector<int64_t>> big = {{1024, 1056}, {2048, 32}, {16, 2048}, {320, 544}};
  int cases = 0;
  for (const auto& shape : shapes) {
    const bool is_big = std::find(big.begin(), big.end(), shape) != big.end();
    const int64_t n = numel(shape);
    const int64_t m = n / shape.back(), k = shape.back();
    for (DType dtype : {DType::BF16, DType::F32, DType::F16}) {
      if (quick && dtype == DType::F16) continue;
      const bool specials = (cases % 3) == 1;
      const std::vector<float> values = random_values(n, rng, specials, (cases % 4) == 2);
      // NVFP4
      // Variants 10-13: 4over6 (both error modes and domains, both bounds, both tiles); 14-16
      // row-scaled (both directions; rowwise swizzled; rowwise 4over6).
      for (int variant = 0; variant < 17; ++variant) {
        QuantizeOptions o;
        o.scheme = Scheme::NVFP4;
        o.rowwise = variant != 7;
        o.columnwise = variant != 6;
        // 4over6 variants: 10 MAE 1x16, 11 MSE 16x16, 12 MAE 16x16, 13 MSE 1x16 (12-13 the scaled error)
        o.tile =
            (variant == 1 || variant == 5 || variant == 11 || variant == 12) ? Tile::k16x16 : Tile::k1x16;
        if (variant >= 10 && variant < 14) {
          o.four_over_six = variant % 2 == 0 ? FourOverSix::MinMae : FourOverSix::MinMse;
          o.four_over_six_scaled_error = variant >= 12;
          o.nvfp4_e4m3_max = variant == 12 ? 448 : 256;
        }
        o.rht = (variant == 2 || variant == 4 || variant == 7 || variant == 8) && dtype == DType::BF16;
        if (variant == 3 || variant == 4 || variant == 5)
          o.stochastic_rounding = StochasticRounding{0x1234567890ABCDEFull + variant, 77};
        if (variant == 8 || variant == 13) {
          o.amax_rowwise = 3.5f;
          o.amax_columnwise = 11.0f;
        }
        o.scale_layout = (variant % 2 == 1 || variant == 8) ? ScaleLayout::Swizzled : ScaleLayout::Compact;
        if (variant >= 14) {
          o.row_scaled = true;
          o.columnwise = variant == 14;
          if (variant == 16) o.four_over_six = FourOverSix::MinMse;
        }
        if (o.tile == Tile::k16x16 && (m % 16 || k % 16)) continue;
        if (o.rowwise && k % 16) continue;
        if (o.columnwise && m % 16) continue;
        if (quick && is_big) continue;
        compare_case(values, shape, {}, dtype, o,
                     variant == 0 || variant == 2 || variant == 5 || variant == 10 || variant >= 14);
        ++cases;
      }
      // MX
      for (Scheme scheme :
           {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2, Scheme::MXFP4}) {
        for (ScaleMode mode : {ScaleMode::RCeil, ScaleMode::Floor, ScaleMode::Ceil, ScaleMode::Even}) {
          for (Tile tile : {Tile::k1x16, Tile::k32x32}) {  // 1-D blocks, and 32x32 scale tiles
            if (quick && mode != ScaleMode::RCeil && mode != ScaleMode::Floor) continue;
            QuantizeOptions o;
            o.scheme = scheme;
            o.scale_mode = mode;
            o.tile = tile;
            o.rowwise = k % 32 == 0;
            o.columnwise = m % 32 == 0;
            if (!o.rowwise && !o.columnwise) continue;
            if (scheme == Scheme::MXFP4 && k % 2) continue;
            o.scale_layout = (static_cast<int>(mode) + static_cast<int>(scheme)) % 2 ? ScaleLayout::Swizzled
                                                                                     : ScaleLayout::Compact;
            if (quick && is_big) continue;
            compare_case(values, shape, {}, dtype, o, mode == ScaleMode::RCeil);
            ++cases;
          }
        }
      }
    }
  }
  // Ragged single-direction cases (the other dim not a block multiple) and a strided view.
  {
    const std::vector<float> v = random_values(64 * 80, rng, false, false);
    QuantizeOptions o;
    o.scheme = Scheme::NVFP4;
    o.rowwise = false;
    o.columnwise = true;  // K = 75 ragged
    compare_case(std::vector<float>(v.begin(), v.begin() + 48 * 75), {48, 75}, {}, DType::BF16, o, true);
    o.rht = true;
    compare_case(std::vector<float>(v.begin(), v.begin() + 48 * 75), {48, 75}, {}, DType::BF16, o, false);
    QuantizeOptions r;
    r.scheme = Scheme::NVFP4;  // M = 37 ragged, rowwise only
    compare_case(std::vector<float>(v.begin(), v.begin() + 37 * 80), {37, 80}, {}, DType::F32, r, true);
    r.scale_layout = ScaleLayout::Swizzled;
    r.stochastic_rounding = StochasticRounding{5, 6};
    compare_case(std::vector<float>(v.begin(), v.begin() + 37 * 80), {37, 80}, {}, DType::BF16, r, false);
    QuantizeOptions mx;
    mx.scheme = Scheme::MXFP8_E4M3;
    mx.rowwise = false;
    mx.columnwise = true;  // K = 70 ragged
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 50), {64, 50}, {}, DType::BF16, mx, true);
    mx.rowwise = true;
    mx.columnwise = false;  // M = 37 ragged
    mx.scale_layout = ScaleLayout::Swizzled;
    compare_case(std::vector<float>(v.begin(), v.begin() + 37 * 64), {37, 64}, {}, DType::F16, mx, true);
    mx.tile = Tile::k32x32;  // the same with 32x32 scale tiles: a short tile at each ragged edge
    compare_case(std::vector<float>(v.begin(), v.begin() + 37 * 64), {37, 64}, {}, DType::F16, mx, true);
    mx.rowwise = false;
    mx.columnwise = true;
    mx.scale_layout = ScaleLayout::Compact;
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 50), {64, 50}, {}, DType::BF16, mx, true);
    // transposed view: storage [K, M] read as [M, K] with strides {1, M}
    QuantizeOptions t;
    t.scheme = Scheme::NVFP4;
    t.columnwise = true;
    t.rht = true;
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 48), {64, 48}, {1, 64}, DType::BF16, t,
                 false);
    QuantizeOptions tm;
    tm.scheme = Scheme::MXFP4;
    tm.columnwise = true;
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 64), {64, 64}, {1, 64}, DType::F32, tm,
                 false);
    tm.tile = Tile::k32x32;
    tm.rowwise = true;
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 64), {64, 64}, {1, 64}, DType::F32, tm,
                 false);
    // 4over6: rowwise only with M = 37 (1x16 blocks along the rows), columnwise only with K = 75,
    // and transposed views (no 16-byte loads), in both tiles
    QuantizeOptions f;
    f.scheme = Scheme::NVFP4;
    f.four_over_six = FourOverSix::MinMae;
    f.nvfp4_e4m3_max = 256;
    compare_case(std::vector<float>(v.begin(), v.begin() + 37 * 80), {37, 80}, {}, DType::BF16, f, true);
    f.rowwise = false;
    f.columnwise = true;
    f.four_over_six = FourOverSix::MinMse;
    compare_case(std::vector<float>(v.begin(), v.begin() + 48 * 75), {48, 75}, {}, DType::F32, f, true);
    f.rowwise = true;
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 48), {64, 48}, {1, 64}, DType::BF16, f,
                 false);
    f.tile = Tile::k16x16;
    f.four_over_six = FourOverSix::MinMae;
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 48), {64, 48}, {1, 64}, DType::F16, f, false);
    // Row-scaled: rowwise only with M = 37, both directions in fp32, a transposed view.
    QuantizeOptions rs;
    rs.scheme = Scheme::NVFP4;
    rs.row_scaled = true;
    compare_case(std::vector<float>(v.begin(), v.begin() + 37 * 80), {37, 80}, {}, DType::BF16, rs, true);
    rs.columnwise = true;
    compare_case(std::vector<float>(v.begin(), v.begin() + 48 * 80), {48, 80}, {}, DType::F32, rs, true);
    compare_case(std::vector<float>(v.begin(), v.begin() + 64 * 48), {64, 48}, {1, 64}, DType::BF16, rs,
                 true);
    cases += 15;
  }
  std::printf("random suite: %d cases\n", cases);
}

// The fp32 RHT (cuda/rht.cuh, rht16_fp32) of the amax pass and of the quantize kernel against its
// exactness check. (1) Columns summed inexactly in fp32 yet within 16 binades, so the check must
// send them to the double form (the construction of the CPU test
// Quantize.FastEqualsReferenceNvfp4RhtSumNotExactInFp32: an fp32 sum moves output 0, the columnwise
// amax, off a bf16 tie); with the amax computed, these fail without the amax pass's check. With
// the amax given, some of the same columns (7 checks in the last run) fail without the quantize
// kernel's: there the fp32 sum would move an output onto another E2M1 code. (2) Gaussian columns with values
// 4-22 binades below the rest, near both sides of the check's limit. (3) What the CPU's fp32 form leaves out
// and the device's takes: subnormal inputs, and inputs so large that the limit passes every finite max
// (2^122) or the fp32 sums overflow (2^126, back to the double form).
void rht_exactness_suite() {
  const float row_sign[8] = {1, 1, 1, -1, 1, -1, -1, -1};  // the sign mask 0xD7E8's rows 0-7
  int cases = 0;
  for (float a : {1.0f, 1.015625f, 1.25f, 1.5f}) {
    for (int b : {0, 5}) {
      for (int column : {0, 1, 6}) {
        std::vector<float> v(16 * 32, 0.0f);
        for (int i = 0; i < 8; ++i) v[i * 32 + column] = row_sign[i] * a;
        v[8 * 32 + column] = -0x1p-5f;
        v[9 * 32 + column] = -0x1p-15f * (1.0f + (b + 3) / 128.0f);
        v[10 * 32 + column] = 0x1p-15f * (1.0f + b / 128.0f);
        QuantizeOptions o;
        o.scheme = Scheme::NVFP4;
        o.rowwise = o.columnwise = true;
        o.rht = true;
        compare_case(v, {16, 32}, {}, DType::BF16, o, false);
        o.amax_columnwise = 2688.0f * 128.0f;
        compare_case(v, {16, 32}, {}, DType::BF16, o, false);
        cases += 2;
      }
    }
  }
  std::mt19937_64 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (int round = 0; round < 4; ++round) {
    std::vector<float> v(256 * 512);
    for (float& x : v) {
      x = normal(rng);
      if (uni(rng) < 0.02f) x = std::ldexp(x, -4 - static_cast<int>(uni(rng) * 19));
    }
    QuantizeOptions o;
    o.scheme = Scheme::NVFP4;
    o.rowwise = round % 2 == 0;
    o.columnwise = true;
    o.rht = true;
    compare_case(v, {256, 512}, {}, DType::BF16, o, round == 0);
    ++cases;
  }
  for (int binade : {-133, -128, -120, 122, 126}) {
    std::vector<float> v(64 * 64);
    for (size_t i = 0; i < v.size(); ++i) {
      // binade -120: subnormals among normal values; the others: all near 2^binade
      const int e = binade == -120 && i % 3 == 0 ? -130 : binade;
      v[i] = std::ldexp(normal(rng), e);
    }
    QuantizeOptions o;
    o.scheme = Scheme::NVFP4;
    o.rowwise = o.columnwise = true;
    o.rht = true;
    compare_case(v, {64, 64}, {}, DType::BF16, o, false);
    ++cases;
  }
  std::printf("rht exactness suite: %d cases\n", cases);
}

// E2M1 codes at the edges the random suite seldom meets: in every 16-element block (both
// directions) one huge value of either sign next to tiny ones, so that products underflow to -0.0
// (code 0 for NVFP4, 0x8 for MX) or stay tiny and negative (0x8), beside +-0.0; then the same with
// NaN, -NaN and +-Inf among them (NaN codes carry no sign; every MX block then holds a special, so
// its scale is 0xFF and all its codes 0x7, the one MX path with NaN). f16 stores the huge value as
// Inf. Every case must be compared (none rejected by the CPU).
void e2m1_edge_suite() {
  const std::vector<int64_t> shape = {64, 256};  // whole NVFP4 (64 x 128) and MX (32 x 128) tiles
  const std::vector<float> tiny = {-0x1p-100f, -0.0f,      0.0f,       -0x1p-20f,
                                   0x1p-100f,  -0x1p-126f, -0x1p-149f, -1.0f};
  const std::vector<float> specials = {NAN, -NAN, -INFINITY, INFINITY};
  int cases = 0;
  for (bool with_specials : {false, true}) {
    std::vector<float> v(static_cast<size_t>(shape[0] * shape[1]));
    for (int64_t i = 0; i < shape[0]; ++i) {
      for (int64_t j = 0; j < shape[1]; ++j) {
        float x = tiny[static_cast<size_t>((i * 7 + j * 3) % static_cast<int64_t>(tiny.size()))];
        if (i % 16 == j % 16) x = (i / 16 + j / 16) % 2 ? 0x1p100f : -0x1p100f;  // one per block, both ways
        if (with_specials && (i * 5 + j) % 11 == 0) x = specials[static_cast<size_t>((i + j) % 4)];
        v[static_cast<size_t>(i * shape[1] + j)] = x;
      }
    }
    for (DType dtype : {DType::BF16, DType::F32, DType::F16}) {
      for (int variant = 0; variant < 4; ++variant) {
        QuantizeOptions o;
        o.scheme = variant == 3 ? Scheme::MXFP4 : Scheme::NVFP4;
        o.rowwise = o.columnwise = true;
        o.tile = variant == 1 ? Tile::k16x16 : Tile::k1x16;
        o.rht = variant == 2;
        if (o.rht && dtype != DType::BF16) continue;
        if (!compare_case(v, shape, {}, dtype, o, variant == 0)) {
          std::printf("FAIL e2m1 edge suite: a case was not compared\n");
          ++g_failures;
        }
        ++cases;
      }
    }
  }
  std::printf("e2m1 edge suite: %d cases\n", cases);
}

// NaN patterns of both signs and kinds between Gaussian values, with +-Inf: every one of bf16 and
// f16, the edges of fp32's (least and largest signalling and quiet payloads). The kernels tell
// NaN, Inf and the sign apart by pattern ranges, and an amax must skip a signalling NaN as it
// skips a quiet one (the CPU's max_abs_skipping_nan, CUDA's fmaxf). Every case must be compared.
void nan_pattern_suite() {
  std::mt19937_64 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int cases = 0;
  for (DType dtype : {DType::BF16, DType::F32, DType::F16}) {
    std::vector<uint32_t> specials;
    for (uint32_t sign : {0x0u, 0x80000000u}) {
      if (dtype == DType::F32) {
        for (uint32_t a :
             {0x7F800000u, 0x7F800001u, 0x7F800002u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FC00001u, 0x7FFFFFFFu})
          specials.push_back(sign | a);
      } else {
        const uint32_t inf = dtype == DType::BF16 ? 0x7F80u : 0x7C00u;
        for (uint32_t a = inf; a <= 0x7FFFu; ++a) specials.push_back((sign >> 16) | a);
      }
    }
    const int64_t cols = 128;
    const int64_t rows = (static_cast<int64_t>(2 * specials.size()) / cols / 64 + 1) * 64;
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (float& v : values) v = normal(rng);
    std::vector<uint8_t> host = encode_input(values, dtype);
    const size_t es = dtype_size(dtype);
    for (size_t i = 0; i < specials.size(); ++i)
      std::memcpy(&host[(2 * i + 1) * es], &specials[i], es);  // little-endian
    for (int variant = 0; variant < 8; ++variant) {
      QuantizeOptions o;
      o.rowwise = o.columnwise = true;
      if (variant < 3) {
        o.scheme = Scheme::NVFP4;
        o.tile = variant == 1 ? Tile::k16x16 : Tile::k1x16;
        o.rht = variant == 2;
        if (o.rht && dtype != DType::BF16) continue;
      } else {
        const Scheme mx[] = {Scheme::MXFP8_E4M3, Scheme::MXFP8_E5M2, Scheme::MXFP6_E2M3, Scheme::MXFP6_E3M2,
                             Scheme::MXFP4};
        o.scheme = mx[variant - 3];
      }
      if (!compare_stored(host, {rows, cols}, {}, dtype, o, variant == 0)) {
        std::printf("FAIL NaN pattern suite: a case was not compared\n");
        ++g_failures;
      }
      ++cases;
    }
  }
  std::printf("NaN pattern suite: %d cases\n", cases);
}

void swizzle_suite() {
  std::mt19937_64 rng(7);
  for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {130, 7}, {256, 8}, {33, 300}}) {
    Tensor compact(DType::U8, {r, c});
    for (int64_t i = 0; i < r * c; ++i) compact.data_as<uint8_t>()[i] = static_cast<uint8_t>(rng());
    const Tensor want = swizzle_scales(compact.view());
    DeviceBuffer din(compact.nbytes()), dout(want.nbytes());
    CK(cudaMemcpy(din.p, compact.data(), compact.nbytes(), cudaMemcpyHostToDevice));
    CK(cudaMemset(dout.p, 0xAB, want.nbytes()));
    TensorView a = compact.view(), b;
    a.data = din.p;
    a.device = Device::CUDA;
    b.data = dout.p;
    b.dtype = DType::U8;
    b.shape = want.shape();
    b.device = Device::CUDA;
    cuda::swizzle_scales(a, b, nullptr);
    CK(cudaDeviceSynchronize());
    same_bytes("swizzle " + shape_string({r, c}), to_host(dout.p, want.nbytes()), want.data(), want.nbytes());
  }
}

void error_suite() {
  std::vector<float> host(64 * 64, 1.0f);
  TensorView cpu = TensorView::from_buffer(host.data(), host.size() * 4, DType::F32, {64, 64});
  cuda::QuantizedViews v;
  QuantizeOptions o;
  ++g_checks;
  try {
    cuda::quantize(cpu, o, v, nullptr);
    std::printf("FAIL errors: a CPU tensor was accepted\n");
    ++g_failures;
  } catch (const Error& e) {
    if (std::string(e.what()).find("the CUDA backend needs a CUDA tensor") == std::string::npos) {
      std::printf("FAIL errors: unexpected message %s\n", e.what());
      ++g_failures;
    }
  }
  // Same validation as the CPU: a ragged K for NVFP4 rowwise.
  DeviceBuffer d(64 * 63 * 4);
  TensorView g;
  g.data = d.p;
  g.shape = {64, 63};
  g.device = Device::CUDA;
  ++g_checks;
  try {
    cuda::quantize(g, o, v, nullptr);
    std::printf("FAIL errors: ragged K accepted\n");
    ++g_failures;
  } catch (const Error& e) {
    if (std::string(e.what()).find("divisible by 16") == std::string::npos) {
      std::printf("FAIL errors: unexpected message %s\n", e.what());
      ++g_failures;
    }
  }
}

// Stochastic rounding with the seed in device memory (StochasticRounding::device_seed, for CUDA
// graphs): the same bytes as the seed by value, read when the kernel runs (a new value at the same
// address gives that seed's bytes), on both directions and through the RHT.
void device_seed_suite() {
  std::mt19937_64 rng(11);
  const std::vector<int64_t> shape = {128, 256};
  const std::vector<uint8_t> host = encode_input(random_values(128 * 256, rng, false, false), DType::BF16);
  DeviceBuffer din(host.data(), host.size());
  TensorView in;
  in.data = din.p;
  in.dtype = DType::BF16;
  in.shape = shape;
  in.device = Device::CUDA;
  QuantizeOptions by_value;
  by_value.columnwise = true;
  by_value.rht = true;
  DeviceBuffer seed(sizeof(uint64_t));
  for (const uint64_t s : {uint64_t{3}, uint64_t{0xFEDCBA9876543210ull}}) {
    by_value.stochastic_rounding = StochasticRounding{s, 5};
    const DeviceQuantized want = run_device(in, by_value);
    CK(cudaMemcpy(seed.p, &s, sizeof s, cudaMemcpyHostToDevice));
    QuantizeOptions on_device = by_value;
    on_device.stochastic_rounding = StochasticRounding{0, 5, static_cast<const uint64_t*>(seed.p)};
    const DeviceQuantized got = run_device(in, on_device);
    const std::string what = "device seed " + std::to_string(s);
    same_bytes(what + " rowwise_data", to_host(got.views.rowwise_data.data, got.views.rowwise_data.numel()),
               to_host(want.views.rowwise_data.data, want.views.rowwise_data.numel()).data(),
               static_cast<size_t>(want.views.rowwise_data.numel()));
    same_bytes(what + " columnwise_data",
               to_host(got.views.columnwise_data.data, got.views.columnwise_data.numel()),
               to_host(want.views.columnwise_data.data, want.views.columnwise_data.numel()).data(),
               static_cast<size_t>(want.views.columnwise_data.numel()));
  }
  // And the CPU backend refuses a device seed (it takes the seed by value).
  std::vector<float> values(16 * 16, 1.0f);
  QuantizeOptions cpu_options;
  uint64_t host_seed = 1;
  cpu_options.stochastic_rounding = StochasticRounding{0, 0, &host_seed};
  ++g_checks;
  try {
    quantize(TensorView::from_buffer(values.data(), values.size() * 4, DType::F32, {16, 16}), cpu_options);
    std::printf("FAIL device seed: the CPU backend took a device seed\n");
    ++g_failures;
  } catch (const Error& e) {
    if (std::string(e.what()).find("device_seed") == std::string::npos) {
      std::printf("FAIL device seed: unexpected message %s\n", e.what());
      ++g_failures;
    }
  }
}

void golden_suite(const std::string& dir) {
  std::ifstream in(dir + "/INDEX.json");
  if (!in) {
    std::printf("golden: no %s/INDEX.json, skipped\n", dir.c_str());
    return;
  }
  const nlohmann::json index = nlohmann::json::parse(in);
  int cases = 0;
  for (const auto& meta : index) {
    // The quantizer cases run here; the element-table, swizzle, GEMM and NaN/Inf-block cases
    // (see the file comment) are the CPU suite's. A kind this list does not know is a failure, so
    // a new kind in INDEX.json cannot pass unseen.
    const std::string kind = meta["kind"].get<std::string>();
    if (kind == "element_cast_table" || kind == "scale_swizzle" || kind == "gemm_nvfp4" ||
        kind == "gemm_mxfp8" || kind == "mx_quantize_specials")
      continue;
    if (kind != "nvfp4_quantize" && kind != "mx_quantize") {
      ++g_checks;
      ++g_failures;
      std::printf("FAIL golden %s: unknown case kind %s\n", meta["file"].get<std::string>().c_str(),
                  kind.c_str());
      continue;
    }
    const std::string file = meta["file"].get<std::string>();
    const SafetensorsFile f = SafetensorsFile::open(dir + "/" + file);
    const TensorView host_in = f.view("input");
    const size_t bytes = static_cast<size_t>(host_in.numel()) * dtype_size(host_in.dtype);
    DeviceBuffer din(bytes);
    CK(cudaMemcpy(din.p, host_in.data, bytes, cudaMemcpyHostToDevice));
    TensorView gin = host_in;
    gin.data = din.p;
    gin.device = Device::CUDA;
    QuantizeOptions o;
    if (meta["kind"] == "nvfp4_quantize") {
      o.scheme = Scheme::NVFP4;
      o.rowwise = o.columnwise = true;
      o.tile = meta["tile"] == "[16, 16]" ? Tile::k16x16 : Tile::k1x16;
      o.rht = meta["rht"] == "true";
      if (o.rht)
        o.rht_sign_mask =
            static_cast<uint16_t>(std::stoul(meta["rht_sign_mask"].get<std::string>(), nullptr, 16));
      DeviceQuantized q = run_device(gin, o);
      same_bytes("golden " + file + " rowwise_data",
                 to_host(q.views.rowwise_data.data, numel(q.shapes.rowwise_data)), f.at("rowwise_data").data,
                 f.at("rowwise_data").nbytes);
      same_bytes("golden " + file + " rowwise_scale",
                 to_host(q.views.rowwise_scale.data, numel(q.shapes.rowwise_scale)),
                 f.at("rowwise_scale").data, f.at("rowwise_scale").nbytes);
      same_bytes("golden " + file + " columnwise_data",
                 to_host(q.views.columnwise_data.data, numel(q.shapes.columnwise_data)),
                 f.at("columnwise_data").data, f.at("columnwise_data").nbytes);
      same_bytes("golden " + file + " columnwise_scale",
                 to_host(q.views.columnwise_scale.data, numel(q.shapes.columnwise_scale)),
                 f.at("columnwise_scale").data, f.at("columnwise_scale").nbytes);
      const std::vector<uint8_t> amax = to_host(q.views.amax, 8);
      same_bytes("golden " + file + " rowwise_amax", {amax.begin(), amax.begin() + 4},
                 f.at("rowwise_amax").data, 4);
      same_bytes("golden " + file + " columnwise_amax", {amax.begin() + 4, amax.end()},
                 f.at("columnwise_amax").data, 4);
    } else if (meta["kind"] == "mx_quantize") {
      const std::string el = meta["element"].get<std::string>();
      o.scheme = parse_scheme(el == "e4m3"   ? "mxfp8_e4m3"
                              : el == "e5m2" ? "mxfp8_e5m2"
                              : el == "e2m3" ? "mxfp6_e2m3"
                              : el == "e3m2" ? "mxfp6_e3m2"
                                             : "mxfp4");
      o.scale_mode = parse_scale_mode(meta["scale_mode"].get<std::string>());
      DeviceQuantized q = run_device(gin, o);
      same_bytes("golden " + file + " data", to_host(q.views.rowwise_data.data, numel(q.shapes.rowwise_data)),
                 f.at("data").data, f.at("data").nbytes);
      same_bytes("golden " + file + " scale",
                 to_host(q.views.rowwise_scale.data, numel(q.shapes.rowwise_scale)), f.at("scale").data,
                 f.at("scale").nbytes);
    }
    ++cases;
  }
  std::printf("golden suite: %d cases\n", cases);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string golden;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick")
      quick = true;
    else
      golden = argv[i];
  }
  if (cuda::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 2;
  }
  try {
    error_suite();
    swizzle_suite();
    rht_exactness_suite();
    e2m1_edge_suite();
    nan_pattern_suite();
    device_seed_suite();
    random_suite(quick);
    if (!golden.empty()) golden_suite(golden);
  } catch (const std::exception& e) {
    std::printf("FAIL: exception %s\n", e.what());
    ++g_failures;
  }
  std::printf("gpu test: %d checks, %d failures%s\n", g_checks, g_failures, quick ? " (quick)" : "");
  return g_failures == 0 ? 0 : (g_failures > 100 ? 100 : g_failures);
}
