// oneDNN's matmul as the CPU GEMM's bf16 route (gemm_bf16.hpp). Its bf16 instructions
// (vdpbf16ps, AMX's tdpbf16ps) treat subnormal inputs and results as zero whatever MXCSR says;
// gemm_cpu.cpp sends a panel here only when no value, product or partial sum can be subnormal:
// exact products added in fp32, in oneDNN's order, within the fp32 accumulation bound.
#include "cpu/gemm_bf16.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "microscale/error.hpp"

#ifdef MICROSCALE_HAVE_ONEDNN
#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#endif

namespace microscale::cpu {

#ifdef MICROSCALE_HAVE_ONEDNN
namespace {

bool native_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool forced_sgemm() {
  const char* route = std::getenv("MICROSCALE_CPU_GEMM");
  return route != nullptr && std::strcmp(route, "sgemm") == 0;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A panel product's primitive and the descriptors of its three operands.
struct PanelMatmul {
  dnnl::memory::desc a, b, d;
  dnnl::matmul product;
};

// One per panel shape, accumulation and thread count, kept per thread (oneDNN's own cache would
// find the primitive too, at the cost of building the descriptors on every call). A primitive
// runs on the OpenMP thread count it was made with: torch.set_num_threads changes that count.
const PanelMatmul& matmul_for(int64_t m, int64_t n, int64_t width, bool accumulate) {
  using dt = dnnl::memory::data_type;
  thread_local std::map<std::tuple<int64_t, int64_t, int64_t, bool, int>, PanelMatmul> cache;
  const auto key = std::make_tuple(m, n, width, accumulate, omp_get_max_threads());
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  if (cache.size() >= 64) cache.clear();  // shapes that vary (M per step): a bound, not an LRU
  const dnnl::memory::desc a({m, width}, dt::bf16, {width, 1});  // [M, width], row-major
  const dnnl::memory::desc b({width, n}, dt::bf16, {1, width});  // B^T: B [N, width] row-major
  const dnnl::memory::desc d({m, n}, dt::f32, {n, 1});           // [M, N], row-major
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);  // out = A B^T + out
    attr.set_post_ops(sum);
  }
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::matmul::primitive_desc pd(cpu_engine(), a, b, d, attr);
#else
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, d), attr, cpu_engine());
#endif
  return cache.emplace(key, PanelMatmul{a, b, d, dnnl::matmul(pd)}).first->second;
}

}  // namespace

bool bf16_gemm_available() {
  static const bool available = native_bf16() && !forced_sgemm();
  // Inside an OpenMP parallel region oneDNN runs one thread, which its matmul does not expect of
  // a primitive made for more: the sgemm route there.
  return available && !omp_in_parallel();
}

void bf16_panel_product(const uint16_t* a, const uint16_t* b, int64_t m, int64_t n, int64_t width,
                        bool accumulate, float* out) {
  try {
    const PanelMatmul& panel = matmul_for(m, n, width, accumulate);
    dnnl::engine& engine = cpu_engine();
    dnnl::memory ma(panel.a, engine, const_cast<uint16_t*>(a));
    dnnl::memory mb(panel.b, engine, const_cast<uint16_t*>(b));
    dnnl::memory md(panel.d, engine, out);
    dnnl::stream stream(engine);
    panel.product.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, md}});
    stream.wait();
  } catch (const dnnl::error& e) {
    throw Error(std::string("gemm: oneDNN's bf16 matmul failed: ") + e.what());
  }
}

#else  // built without oneDNN: the sgemm route only

bool bf16_gemm_available() { return false; }

void bf16_panel_product(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, bool, float*) {
  throw Error("gemm: this build has no bf16 route (oneDNN was not found)");
}

#endif

}  // namespace microscale::cpu
