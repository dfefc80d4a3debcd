// One test per case of ../shared/golden/INDEX.json (TransformerEngine's NVFP4QuantizerRef and
// torchao's to_mx, run by their authors' code): every byte of data and scales and every amax must
// match, on both the reference and the fast CPU path.
#include "golden.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cpu/rht.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"
#include "microscale/quantize.hpp"
#include "microscale/safetensors.hpp"

namespace microscale {
namespace {

using json = nlohmann::json;

json load_index() {
  std::ifstream in(golden_dir() + "/INDEX.json");
  if (!in) return json::array();
  return json::parse(in);
}

const json& index_cases() {
  static const json cases = load_index();
  return cases;
}

std::vector<int> case_ids() {
  std::vector<int> ids(index_cases().size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  return ids;
}

std::string case_name(const testing::TestParamInfo<int>& info) {
  std::string name = index_cases()[info.param]["file"].get<std::string>();
  name = name.substr(0, name.find('.'));
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

std::vector<uint8_t> bytes_of(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry& e = file.at(name);
  const auto* p = reinterpret_cast<const uint8_t*>(e.data);
  return {p, p + e.nbytes};
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = t.data_as<uint8_t>();
  return {p, p + t.nbytes()};
}

float scalar_f32(const SafetensorsFile& file, const std::string& name) {
  float v;
  std::memcpy(&v, file.at(name).data, sizeof v);
  return v;
}

// Index of the first differing byte, or -1.
int64_t first_mismatch(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

#define EXPECT_BYTES_EQ(ours, expected, what)                                                   \
  do {                                                                                          \
    const auto ours_ = (ours);                                                                  \
    const auto expected_ = (expected);                                                          \
    ASSERT_EQ(ours_.size(), expected_.size()) << what;                                          \
    const int64_t at_ = first_mismatch(ours_, expected_);                                       \
    EXPECT_EQ(at_, -1) << what << ": first mismatch at byte " << at_ << " (ours 0x" << std::hex \
                       << int(ours_[at_ < 0 ? 0 : at_]) << ", expected 0x"                      \
                       << int(expected_[at_ < 0 ? 0 : at_]) << ")" << std::dec;                 \
  } while (0)

using QuantizeFn = QuantizedTensor (*)(const TensorView&, const QuantizeOptions&);
const std::pair<const char*, QuantizeFn> kPaths[] = {{"ref", quantize_ref}, {"fast", quantize}};

void check_nvfp4(const json& meta, const SafetensorsFile& file) {
  QuantizeOptions o;
  o.scheme = Scheme::NVFP4;
  o.rowwise = o.columnwise = true;
  o.tile = meta["tile"] == "[16, 16]" ? Tile::k16x16 : Tile::k1x16;
  o.rht = meta["rht"] == "true";
  if (o.rht)
    o.rht_sign_mask =
        static_cast<uint16_t>(std::stoul(meta["rht_sign_mask"].get<std::string>(), nullptr, 16));
  const TensorView input = file.view("input");
  for (const auto& [path, fn] : kPaths) {
    SCOPED_TRACE(path);
    const QuantizedTensor q = fn(input, o);
    EXPECT_BYTES_EQ(bytes_of(q.rowwise_data), bytes_of(file, "rowwise_data"), "rowwise_data");
    EXPECT_BYTES_EQ(bytes_of(q.rowwise_scale), bytes_of(file, "rowwise_scale"), "rowwise_scale");
    EXPECT_BYTES_EQ(bytes_of(q.columnwise_data), bytes_of(file, "columnwise_data"), "columnwise_data");
    EXPECT_BYTES_EQ(bytes_of(q.columnwise_scale), bytes_of(file, "columnwise_scale"), "columnwise_scale");
    EXPECT_EQ(float_bits(q.rowwise_amax), float_bits(scalar_f32(file, "rowwise_amax")));
    EXPECT_EQ(float_bits(q.columnwise_amax), float_bits(scalar_f32(file, "columnwise_amax")));
  }
  if (o.rht) {
    // The transform itself, before quantization: RHT(X^T) rounded to bf16, [K, M].
    const SafetensorsEntry& expected = file.at("columnwise_rht_bf16");
    const auto* want = reinterpret_cast<const uint16_t*>(expected.data);
    const auto* x = static_cast<const uint16_t*>(input.data);
    const int64_t m = input.shape[0], k = input.shape[1];
    int64_t mismatches = 0;
    for (int64_t c = 0; c < k; ++c) {
      for (int64_t b = 0; b < m / 16; ++b) {
        float in[16], out[16];
        for (int i = 0; i < 16; ++i) in[i] = bf16_to_float(x[(b * 16 + i) * k + c]);
        rht16(in, o.rht_sign_mask, out);
        for (int j = 0; j < 16; ++j) mismatches += float_to_bf16(out[j]) != want[c * m + b * 16 + j];
      }
    }
    EXPECT_EQ(mismatches, 0) << "RHT output differs from columnwise_rht_bf16";
  }
}

void check_mx(const json& meta, const SafetensorsFile& file, bool specials) {
  QuantizeOptions o;
  o.scheme = parse_scheme(meta["element"] == "e4m3"   ? "mxfp8_e4m3"
                          : meta["element"] == "e5m2" ? "mxfp8_e5m2"
                          : meta["element"] == "e2m3" ? "mxfp6_e2m3"
                          : meta["element"] == "e3m2" ? "mxfp6_e3m2"
                                                      : "mxfp4");
  o.scale_mode = parse_scale_mode(meta["scale_mode"].get<std::string>());
  const TensorView input = file.view("input");
  const std::vector<uint8_t> want_scale = bytes_of(file, "scale");
  const std::vector<uint8_t> want_data = bytes_of(file, "data");
  const bool fp8 = element_format(o.scheme) == Format::E4M3 || element_format(o.scheme) == Format::E5M2;
  for (const auto& [path, fn] : kPaths) {
    SCOPED_TRACE(path);
    const QuantizedTensor q = fn(input, o);
    EXPECT_BYTES_EQ(bytes_of(q.rowwise_scale), want_scale, "scale");
    const std::vector<uint8_t> data = bytes_of(q.rowwise_data);
    ASSERT_EQ(data.size(), want_data.size());
    if (!specials) {
      EXPECT_BYTES_EQ(data, want_data, "data");
      continue;
    }
    // NaN/Inf blocks: the scale is NaN (0xFF) and FP8 elements are NaN (torchao accepts 0x7F and
    // 0xFF alike); FP4/FP6 element bits of such blocks are unspecified. Other blocks: exact.
    const int64_t k = q.cols, bytes_per_row = static_cast<int64_t>(data.size()) / q.rows;
    for (size_t i = 0; i < data.size(); ++i) {
      const int64_t r = static_cast<int64_t>(i) / bytes_per_row;
      const int64_t col = (static_cast<int64_t>(i) % bytes_per_row) * k / bytes_per_row;
      if (want_scale[r * (k / 32) + col / 32] == 0xFF) {
        if (fp8) {
          EXPECT_TRUE(std::isnan(decode(element_format(o.scheme), data[i]))) << "byte " << i;
        }
        continue;
      }
      EXPECT_EQ(data[i], want_data[i]) << "byte " << i;
    }
  }
}

void check_element_table(const SafetensorsFile& file) {
  const auto* inputs = reinterpret_cast<const uint16_t*>(file.at("input_bf16").data);
  for (Format format : {Format::E2M1, Format::E2M3, Format::E3M2, Format::E4M3, Format::E5M2}) {
    const std::string name(format_info(format).name);
    const std::vector<uint8_t> want = bytes_of(file, name);
    int64_t mismatches = 0;
    for (int i = 0; i < 65536; ++i) {
      const float x = bf16_to_float(inputs[i]);
      // The table replaced non-finite inputs by 0 for formats without Inf/NaN; ours map NaN to +max.
      if (!std::isfinite(x) && format_info(format).specials == Specials::None) continue;
      const uint8_t ours = encode_rn(format, x);
      const bool both_nan =
          std::isnan(x) && std::isnan(decode(format, ours)) && std::isnan(decode(format, want[i]));
      if (ours != want[i] && !both_nan) {
        if (++mismatches <= 5)
          ADD_FAILURE() << name << " bf16 0x" << std::hex << i << ": ours 0x" << int(ours) << ", expected 0x"
                        << int(want[i]);
      }
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
}

void check_swizzle(const SafetensorsFile& file) {
  const TensorView scale = file.view("scale");
  const Tensor blocked = swizzle_scales(scale);
  EXPECT_BYTES_EQ(bytes_of(blocked), bytes_of(file, "blocked"), "blocked");
  const Tensor back = unswizzle_scales(blocked.view(), scale.shape[0], scale.shape[1]);
  EXPECT_BYTES_EQ(bytes_of(back), bytes_of(file, "scale"), "unswizzled");
}

// The quantized operands of the GEMM cases, and their float64 product through dequantize().
void check_gemm_operands(const json& meta, const SafetensorsFile& file) {
  const bool nvfp4 = meta["kind"] == "gemm_nvfp4";
  QuantizeOptions oa, ob;
  oa.scheme = ob.scheme = nvfp4 ? Scheme::NVFP4 : Scheme::MXFP8_E4M3;
  oa.scale_mode = ob.scale_mode = ScaleMode::RCeil;
  if (nvfp4) ob.tile = Tile::k16x16;  // b is a weight: 16x16 tiles
  const QuantizedTensor a = quantize(file.view("a"), oa);
  const QuantizedTensor b = quantize(file.view("b"), ob);
  EXPECT_BYTES_EQ(bytes_of(a.rowwise_data), bytes_of(file, "a_data"), "a_data");
  EXPECT_BYTES_EQ(bytes_of(a.rowwise_scale), bytes_of(file, "a_scale"), "a_scale");
  EXPECT_BYTES_EQ(bytes_of(b.rowwise_data), bytes_of(file, "b_data"), "b_data");
  EXPECT_BYTES_EQ(bytes_of(b.rowwise_scale), bytes_of(file, "b_scale"), "b_scale");
  if (nvfp4) {
    EXPECT_EQ(a.rowwise_amax, scalar_f32(file, "a_amax"));
    EXPECT_EQ(b.rowwise_amax, scalar_f32(file, "b_amax"));
  }
  // out = alpha * deq_code(a) . deq_code(b)^T in float64. Our dequantize() folds S_dec into the
  // block scale, so for NVFP4 undo that: deq / S_dec = code * e4m3 scale up to one fp32 rounding.
  const Tensor da = dequantize(a, Usage::Rowwise), db = dequantize(b, Usage::Rowwise);
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  const auto* out = reinterpret_cast<const float*>(file.at("out").data);
  double worst = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double t = static_cast<double>(da.data_as<float>()[i * k + p]) * db.data_as<float>()[j * k + p];
        sum += t;
        magnitude += std::fabs(t);
      }
      worst = std::max(worst, std::fabs(sum - out[i * n + j]) / (magnitude + 1e-30));
    }
  }
  // Tolerance: dequantize() rounds code*scale*S_dec to fp32 (2^-24 relative per operand) and the
  // golden output is stored in fp32: a few 2^-24 relative to sum |a*b|.
  EXPECT_LT(worst, 1e-6);
}

class Golden : public testing::TestWithParam<int> {};

TEST_P(Golden, Matches) {
  const json& meta = index_cases()[GetParam()];
  const SafetensorsFile file = SafetensorsFile::open(golden_dir() + "/" + meta["file"].get<std::string>());
  const std::string kind = meta["kind"];
  if (kind == "nvfp4_quantize") {
    check_nvfp4(meta, file);
  } else if (kind == "mx_quantize") {
    check_mx(meta, file, false);
  } else if (kind == "mx_quantize_specials") {
    check_mx(meta, file, true);
  } else if (kind == "element_cast_table") {
    check_element_table(file);
  } else if (kind == "scale_swizzle") {
    check_swizzle(file);
  } else if (kind == "gemm_nvfp4" || kind == "gemm_mxfp8") {
    check_gemm_operands(meta, file);
  } else {
    FAIL() << "unknown golden kind " << kind;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Golden, testing::ValuesIn(case_ids()), case_name);

TEST(GoldenIndex, AllCasesPresent) {
  // A missing golden directory must fail loudly, not pass with zero cases.
  ASSERT_EQ(index_cases().size(), 171u) << "golden INDEX.json not found or changed under " << golden_dir();
}

}  // namespace
}  // namespace microscale
