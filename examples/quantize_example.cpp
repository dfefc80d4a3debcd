// The worked example of docs/api.md, built and run by ctest (example_quantize) so it stays true.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "microscale/error.hpp"
#include "microscale/half.hpp"
#include "microscale/layout.hpp"
#include "microscale/quantize.hpp"
#include "microscale/safetensors.hpp"

namespace ms = microscale;

int main() {
  try {
    // An activation [2, 40, 512] in bf16. quantize() sees it as [M, K] = [80, 512].
    const std::vector<int64_t> shape = {2, 40, 512};
    std::vector<uint16_t> x(2 * 40 * 512);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = ms::float_to_bf16(3.0f * std::sin(0.37f * static_cast<float>(i)));
    }
    const ms::TensorView input =
        ms::TensorView::from_buffer(x.data(), x.size() * sizeof(uint16_t), ms::DType::BF16, shape);

    ms::QuantizeOptions options;
    options.scheme = ms::Scheme::NVFP4;
    options.rowwise = true;                            // X, blocks along K (fprop operand)
    options.columnwise = true;                         // X^T, blocks along M (wgrad operand)
    options.rht = true;                                // applies to columnwise; bf16 input only
    options.scale_layout = ms::ScaleLayout::Swizzled;  // the layout block-scaled GEMMs read
    // For a gradient, add stochastic rounding, with a new offset for each quantization:
    // options.stochastic_rounding = ms::StochasticRounding{.seed = 1234, .offset = step};

    const ms::QuantizedTensor q = ms::quantize(input, options);      // fast path
    const ms::QuantizedTensor r = ms::quantize_ref(input, options);  // reference loops, same bytes

    std::printf("%s, [M, K] = [%lld, %lld]\n", std::string(ms::scheme_name(q.scheme)).c_str(),
                static_cast<long long>(q.rows), static_cast<long long>(q.cols));
    std::printf("rowwise    data %s scales %s amax %g\n", ms::shape_string(q.rowwise_data.shape()).c_str(),
                ms::shape_string(q.rowwise_scale.shape()).c_str(), q.rowwise_amax);
    std::printf("columnwise data %s scales %s amax %g\n", ms::shape_string(q.columnwise_data.shape()).c_str(),
                ms::shape_string(q.columnwise_scale.shape()).c_str(), q.columnwise_amax);
    // rowwise    data [80, 256] scales [128, 32]   (compact [80, 32], padded to 128 rows)
    // columnwise data [512, 40] scales [512, 8]    (compact [512, 5], padded to 8 columns)

    const bool same = std::memcmp(q.rowwise_data.data(), r.rowwise_data.data(), q.rowwise_data.nbytes()) == 0;
    std::printf("fast == ref: %s\n", same ? "yes" : "no");

    // Element X[0][1]: the high nibble of byte 0. Its block scale is compact entry (0, 0) of the
    // [M, K/16] scale matrix, located through the swizzle.
    const uint8_t code = q.rowwise_data.data_as<uint8_t>()[0] >> 4;
    const uint8_t scale = q.rowwise_scale.data_as<uint8_t>()[ms::swizzled_offset(0, 0, q.cols / 16)];
    std::printf("X[0][1]: code 0x%X = %g, block scale %g\n", code, ms::decode(ms::Format::E2M1, code),
                ms::decode(ms::Format::E4M3, scale));

    // Dequantize. Rowwise comes back in the input's shape [2, 40, 512].
    // NVFP4 columnwise comes back as [K, M] = [512, 80]: here RHT(X^T), since rht was on.
    const ms::Tensor y = ms::dequantize(q, ms::Usage::Rowwise, ms::DType::F32);
    const ms::Tensor yt = ms::dequantize(q, ms::Usage::Columnwise);
    double err = 0.0, sig = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = ms::bf16_to_float(x[i]), got = y.data_as<float>()[i];
      err += (got - want) * (got - want);
      sig += want * want;
    }
    std::printf("rowwise SQNR %.1f dB; columnwise %s\n", 10.0 * std::log10(sig / err),
                ms::shape_string(yt.shape()).c_str());

    // Save the rowwise operand. These tensor names are our own; checkpoints.md describes the checkpoint
    // conventions that inference engines read.
    const float amax = q.rowwise_amax;
    ms::write_safetensors(
        "act_nvfp4.safetensors",
        {
            {"act.data", "U8", q.rowwise_data.shape(), q.rowwise_data.data(), q.rowwise_data.nbytes()},
            {"act.scale", "F8_E4M3", q.rowwise_scale.shape(), q.rowwise_scale.data(),
             q.rowwise_scale.nbytes()},
            {"act.amax", "F32", {1}, &amax, sizeof amax},
        },
        {{"scheme", "nvfp4"}, {"scale_layout", "swizzled"}});

    // Read it back: the file is memory-mapped, and every offset and size is checked.
    const ms::SafetensorsFile file = ms::SafetensorsFile::open("act_nvfp4.safetensors");
    for (const ms::SafetensorsEntry& e : file.tensors()) {
      std::printf("%-10s %-8s %-10s %zu bytes\n", e.name.c_str(), e.dtype.c_str(),
                  ms::shape_string(e.shape).c_str(), e.nbytes);
    }
    std::printf("scheme = %s\n", file.metadata().at("scheme").c_str());
    const ms::TensorView data = file.view("act.data");          // U8 view into the mapping
    const ms::SafetensorsEntry& scales = file.at("act.scale");  // F8_E4M3: raw bytes only
    std::printf("%s, first scale byte 0x%02X\n", ms::shape_string(data.shape).c_str(),
                static_cast<unsigned>(static_cast<uint8_t>(scales.data[0])));
  } catch (const ms::Error& e) {
    // Every rejected input lands here, with what() naming the argument and the reason, e.g.
    // "microscale: RHT is only supported for bf16 input (as in TransformerEngine)".
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
