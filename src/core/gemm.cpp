// gemm(): operand construction, shape/dtype/layout checks, global scales and the epilogue.
// The accumulation itself is backend work (src/cpu/gemm_cpu.cpp).
#include "microscale/gemm.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/float_store.hpp"
#include "core/fp_environment.hpp"
#include "core/operand_access.hpp"
#include "core/quantize_checks.hpp"
#include "core/require.hpp"
#include "core/scale_math.hpp"
#include "core/view_extent.hpp"
#include "cpu/gemm_kernels.hpp"
#include "microscale/error.hpp"

namespace microscale {
namespace {

std::string describe(const GemmOperand& op, const char* name) {
  return std::string("operand ") + name + " (" +
         (op.quantized ? std::string(scheme_name(op.scheme)) : "dense") + ")";
}

void check_view(const TensorView& v, const std::string& what) {
  require(v.device == Device::CPU, what + " must be CPU memory for the CPU backend");
  require(v.data != nullptr || v.numel() == 0, what + " has a null data pointer");
  require(v.ndim() == 2 || v.ndim() == 3,
          what + " must be 2-D or 3-D (batched), got " + shape_string(v.shape));
  for (int64_t s : v.effective_strides()) require(s > 0, what + " must have positive strides");
}

// An output must reach no further than int64 offsets and give each element its own address
// (view_extent.hpp). (Positive strides: check_view.)
void require_no_overlap(const TensorView& v, const std::string& what) {
  const std::string strides = shape_string(v.effective_strides());
  require(last_element_offset(v).has_value(), what + " has strides " + strides + " out of range");
  require(elements_distinct(v),
          what + " has strides " + strides + " that make elements of " + shape_string(v.shape) + " overlap");
}

// Checks one operand's internal consistency; returns {rows, K, L}.
std::array<int64_t, 3> check_operand(const GemmOperand& op, const char* name) {
  const std::string who = describe(op, name);
  if (!op.quantized) {
    check_view(op.dense, who);
    require(op.dense.dtype == DType::F32 || op.dense.dtype == DType::BF16 || op.dense.dtype == DType::F16,
            who + " must be f32, bf16 or f16, got " + std::string(dtype_name(op.dense.dtype)));
    const OperandReader r(op);
    return {r.rows(), r.k(), r.batches()};
  }
  check_view(op.data, who + " data");
  require(op.data.dtype == DType::U8, who + " data must be u8 codes");
  require(op.scales.dtype == DType::U8, who + " scales must be u8");
  require(op.scales.device == Device::CPU && (op.scales.data != nullptr || op.scales.numel() == 0),
          who + " scales must be CPU memory");
  validate_scale_layout(op.scale_layout, who);
  const OperandReader r(op);
  const int64_t rows = r.rows(), k = r.k(), batches = r.batches(), block = block_size(op.scheme);
  require(k % block == 0, who + ": K = " + std::to_string(k) + " is not a multiple of the block size " +
                              std::to_string(block));
  if (op.scale_layout == ScaleLayout::Swizzled) {
    require(op.scales.is_contiguous(), who + " swizzled scales must be contiguous");
    const int64_t need = batches * swizzled_rows(rows) * swizzled_cols(k / block);
    require(op.scales.numel() == need, who + " swizzled scales hold " + std::to_string(op.scales.numel()) +
                                           " bytes, expected " + std::to_string(need));
  } else {
    std::vector<int64_t> want =
        op.stored_transposed ? std::vector<int64_t>{k / block, rows} : std::vector<int64_t>{rows, k / block};
    if (op.scales.ndim() == 3 || batches > 1) want.push_back(batches);
    require(op.scales.shape == want, who + " compact scales are " + shape_string(op.scales.shape) +
                                         ", expected " + shape_string(want));
    for (int64_t s : op.scales.effective_strides())
      require(s > 0, who + " scales must have positive strides");
  }
  if (op.amax) {
    require(op.scheme == Scheme::NVFP4, who + ": only NVFP4 operands carry an amax");
    require(std::isfinite(*op.amax) && *op.amax >= 0.0f, who + ": amax must be finite and >= 0");
  }
  const bool row_scaled = op.row_amaxes.data != nullptr;
  if (row_scaled) {
    require(op.scheme == Scheme::NVFP4, who + ": only NVFP4 operands can be row-scaled");
    require(!op.amax, who + ": a row-scaled operand takes row_amaxes in place of amax, not both");
    require(batches == 1 && op.data.ndim() == 2, who + ": a row-scaled operand takes no batch dim");
    require(
        op.row_amaxes.dtype == DType::F32 && op.row_amaxes.device == Device::CPU &&
            op.row_amaxes.shape == std::vector<int64_t>{rows} && op.row_amaxes.is_contiguous(),
        who + ": row_amaxes must be contiguous f32 CPU memory of [rows] = [" + std::to_string(rows) + "]");
    const auto* amaxes = static_cast<const float*>(op.row_amaxes.data);
    for (int64_t r = 0; r < rows; ++r) {
      require(std::isfinite(amaxes[r]) && amaxes[r] >= 0.0f, who + ": row amaxes must be finite and >= 0");
    }
  }
  require(
      op.nvfp4_e4m3_max == 448 || ((op.amax || row_scaled) && op.nvfp4_e4m3_max == 256),
      who +
          ": nvfp4_e4m3_max must be 448, or 256 for an NVFP4 operand with an amax (its global scale); got " +
          std::to_string(op.nvfp4_e4m3_max));
  return {rows, k, batches};
}

float value_of(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(v.data)[i]);
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(v.data)[i]);
    case DType::F32: return static_cast<const float*>(v.data)[i];
    default: throw Error("epilogue tensors must be f32, bf16 or f16");
  }
}

void store(const TensorView& d, int64_t i, float v) {
  if (!store_float(d.dtype, d.data, i, v)) throw Error("gemm output must be f32, bf16 or f16");
}

// Offset of element (m, n, l) in a 2-D or 3-D view.
int64_t offset3(const std::vector<int64_t>& strides, int64_t m, int64_t n, int64_t l) {
  return m * strides[0] + n * strides[1] + (strides.size() == 3 ? l * strides[2] : 0);
}

// D from the sums of a GEMM with a row-scaled operand (m x n, no batch dim), as TE's general_gemm
// does it for row-scaled NVFP4 (gemm.hpp): the fp32 product, the outer scales, the bias, then C.
void row_scaled_epilogue(const GemmOperand& a, const GemmOperand& b, float alpha, const float* sums,
                         const GemmProblem& p, const TensorView& d) {
  const int64_t m = d.shape[0], n = d.shape[1];
  const auto* a_rows = static_cast<const float*>(a.row_amaxes.data);
  const auto* b_rows = static_cast<const float*>(b.row_amaxes.data);
  // A side's scale of output row i (A) or column j (B): its row amaxes, or its single amax (1 for
  // none: a dense operand, or scales that carry everything).
  const float a_one = a.quantized && a.amax ? *a.amax : 1.0f, b_one = b.quantized && b.amax ? *b.amax : 1.0f;
  const auto a_scale = [&](int64_t i) { return a_rows != nullptr ? a_rows[i] : a_one; };
  const auto b_scale = [&](int64_t j) { return b_rows != nullptr ? b_rows[j] : b_one; };
  // TE picks the order by count: a side of one value is multiplied into the other side's first.
  const bool a_single = a_rows == nullptr || m == 1, b_single = b_rows == nullptr || n == 1;
  const std::vector<int64_t> ds = d.effective_strides();
  const std::vector<int64_t> cs = p.c ? p.c->effective_strides() : std::vector<int64_t>{};
#pragma omp parallel
  {
    const IeeeSubnormals ieee;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float v = alpha * sums[i * n + j];
        if (b_single) {
          v = v * (a_scale(i) * b_scale(j));
        } else if (a_single) {
          v = v * (b_scale(j) * a_scale(i));
        } else {
          v = v * a_scale(i);
          v = v * b_scale(j);
        }
        if (p.bias) v = v + value_of(*p.bias, j);
        if (p.c) v = value_of(*p.c, offset3(cs, i, j, 0)) + round_to(d.dtype, v);
        store(d, offset3(ds, i, j, 0), v);
      }
    }
  }
}

}  // namespace

GemmOperand GemmOperand::from(const QuantizedTensor& q, Usage usage) {
  if (!q.has(usage)) {
    throw Error(std::string("the quantized tensor has no ") +
                (usage == Usage::Rowwise ? "rowwise" : "columnwise") + " data for this GEMM operand");
  }
  GemmOperand op;
  op.quantized = true;
  op.scheme = q.scheme;
  const Tensor& data = usage == Usage::Rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scales = usage == Usage::Rowwise ? q.rowwise_scale : q.columnwise_scale;
  op.data = data.view();
  op.scales = scales.view();
  op.scale_layout = q.scale_layout;
  if (q.scheme == Scheme::NVFP4) {
    if (q.row_scaled) {
      const Tensor& amaxes = usage == Usage::Rowwise ? q.rowwise_amaxes : q.columnwise_amaxes;
      // (check_operand checks the rest: f32, one per row, finite)
      if (!amaxes.defined())
        throw Error("a row-scaled quantized tensor without its amaxes for this GEMM operand");
      op.row_amaxes = amaxes.view();
    } else {
      op.amax = usage == Usage::Rowwise ? q.rowwise_amax : q.columnwise_amax;
    }
    op.nvfp4_e4m3_max = q.nvfp4_e4m3_max;
  }
  op.stored_transposed = usage == Usage::Columnwise && is_mx(q.scheme);
  return op;
}

GemmOperand GemmOperand::from_dense(const TensorView& x) {
  GemmOperand op;
  op.dense = x;
  return op;
}

std::pair<GemmOperand, GemmOperand> te_gemm_operands(const QuantizedTensor& a, const QuantizedTensor& b,
                                                     std::string_view layout) {
  require(
      layout.size() == 2 && (layout[0] == 'T' || layout[0] == 'N') && (layout[1] == 'T' || layout[1] == 'N'),
      "layout must be one of TN, NN, NT, TT; got '" + std::string(layout) + "'");
  const GemmOperand op_a = GemmOperand::from(a, layout[0] == 'T' ? Usage::Rowwise : Usage::Columnwise);
  const GemmOperand op_b = GemmOperand::from(b, layout[1] == 'N' ? Usage::Rowwise : Usage::Columnwise);
  return {op_b, op_a};  // D = op(B) op(A)^T
}

void gemm_into(const GemmOperand& a, const GemmOperand& b, const GemmProblem& p, const TensorView& d) {
  const IeeeSubnormals ieee;  // the dequantized operands can be subnormal (fp_environment.hpp)
  const auto [m, k, la] = check_operand(a, "A");
  const auto [n, kb, lb] = check_operand(b, "B");
  require(k == kb, "A is [" + std::to_string(m) + ", " + std::to_string(k) + "] and B is [" +
                       std::to_string(n) + ", " + std::to_string(kb) + "]: their K differ");
  require(la == lb, "A has " + std::to_string(la) + " batches and B has " + std::to_string(lb));
  require(m > 0 && n > 0 && k > 0, "empty GEMM: M, N and K must be positive");
  if (a.quantized && b.quantized) {
    require(block_size(a.scheme) == block_size(b.scheme), "A and B use different block sizes (" +
                                                              std::string(scheme_name(a.scheme)) + " x " +
                                                              std::string(scheme_name(b.scheme)) + ")");
  }
  const int64_t batches = la;
  check_view(d, "output D");
  require_no_overlap(d, "output D");
  const auto float_dtype = [](DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; };
  require(float_dtype(d.dtype), "D must be f32, bf16 or f16");
  std::vector<int64_t> want = {m, n};
  if (batches > 1 || d.ndim() == 3) want.push_back(batches);
  require(d.shape == want, "D is " + shape_string(d.shape) + ", expected " + shape_string(want));
  if (p.c) {
    check_view(*p.c, "C");
    require(p.c->shape == want, "C is " + shape_string(p.c->shape) + ", expected " + shape_string(want));
    require(float_dtype(p.c->dtype), "C must be f32, bf16 or f16");
  }
  if (p.bias) {
    require(p.bias->ndim() == 1 && p.bias->shape[0] == n, "bias must be [N] = [" + std::to_string(n) + "]");
    require(float_dtype(p.bias->dtype), "bias must be f32, bf16 or f16");
    require(p.bias->device == Device::CPU && p.bias->data != nullptr, "bias must be CPU memory");
    require(p.bias->is_contiguous(), "bias must be contiguous");
  }

  // Global scales: TE's alpha for two NVFP4 operands, amax * RN(1/2688) for one (scale_math.hpp).
  // With a row-scaled operand, every global amax is 1 in alpha and the amaxes scale D afterwards.
  const bool a_rows = a.quantized && a.row_amaxes.data != nullptr;
  const bool b_rows = b.quantized && b.row_amaxes.data != nullptr;
  const bool row_scaled = a_rows || b_rows;
  require(!row_scaled || !p.c || p.beta == 1.0f,
          "a GEMM with a row-scaled operand adds C with beta 1 only (TransformerEngine's accumulate)");
  float alpha = p.alpha;
  const bool a_global = a.quantized && (a.amax.has_value() || a_rows);
  const bool b_global = b.quantized && (b.amax.has_value() || b_rows);
  const float a_amax = row_scaled ? 1.0f : a.amax.value_or(0.0f);
  const float b_amax = row_scaled ? 1.0f : b.amax.value_or(0.0f);
  if (a_global && b_global) {
    alpha = nvfp4_gemm_alpha(alpha, a_amax, a.nvfp4_e4m3_max, b_amax, b.nvfp4_e4m3_max);
  } else if (a_global || b_global) {
    alpha = a_global ? nvfp4_gemm_alpha(alpha, a_amax, a.nvfp4_e4m3_max)
                     : nvfp4_gemm_alpha(alpha, b_amax, b.nvfp4_e4m3_max);
  }

  thread_local std::vector<float> acc;  // (L, M, N) fp32; kept across calls, every entry is overwritten
  acc.resize(std::max(acc.size(), static_cast<size_t>(batches * m * n)));
  cpu::gemm_accumulate(a, b, m, n, k, batches, acc.data());
  if (row_scaled) return row_scaled_epilogue(a, b, alpha, acc.data(), p, d);

  const std::vector<int64_t> ds = d.effective_strides();
  if (batches == 1 && !p.c && !p.bias && d.dtype == DType::F32 && d.is_contiguous()) {  // plain f32 output
    float* out = static_cast<float*>(d.data);
    for (int64_t i = 0; i < batches * m * n; ++i) out[i] = alpha * acc[i];
    return;
  }
  const std::vector<int64_t> cs = p.c ? p.c->effective_strides() : std::vector<int64_t>{};
  const float* sums = acc.data();
  // Rows in parallel (each writes its own elements of D), under IEEE subnormals in every thread.
  // Nothing in the region throws: D's, C's and the bias's dtypes were checked above.
#pragma omp parallel
  {
    const IeeeSubnormals ieee;
#pragma omp for collapse(2) schedule(static)
    for (int64_t l = 0; l < batches; ++l) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          float v = alpha * sums[(l * m + i) * n + j];
          if (p.c) v = v + p.beta * value_of(*p.c, offset3(cs, i, j, l));
          if (p.bias) v = v + value_of(*p.bias, j);
          store(d, offset3(ds, i, j, l), v);
        }
      }
    }
  }
}

Tensor gemm(const GemmOperand& a, const GemmOperand& b, const GemmProblem& p) {
  const auto [m, k, la] = check_operand(a, "A");
  const auto [n, kb, lb] = check_operand(b, "B");
  (void)k;
  (void)kb;
  (void)lb;
  std::vector<int64_t> shape = {m, n};
  if (la > 1 || (a.quantized ? a.data.ndim() : a.dense.ndim()) == 3) shape.push_back(la);
  require(p.out_dtype == DType::F32 || p.out_dtype == DType::BF16 || p.out_dtype == DType::F16,
          "out_dtype must be f32, bf16 or f16");
  Tensor d(p.out_dtype, shape);
  gemm_into(a, b, p, d.view());
  return d;
}

}  // namespace microscale
