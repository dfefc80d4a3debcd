"""microscale.gemm for torch tensors: on the CPU, operands from this package's QuantizedTensor or
dense tensors; on CUDA, the library's Hopper GEMM for two QuantizedTensors of one block size
(NVFP4 x NVFP4, MX x MX), and an emulation for a dense operand (dequantized exactly, multiplied in
float64 by torch). The result is a tensor of any float dtype. Under torch.compile the call is the
torch.library op microscale::gemm (traced through its fake implementation); eager calls run its
body without the op's dispatch."""


import dataclasses

import torch

from .. import _C
from .op_library import define_op
from .ops import (_DTYPE_NAMES, QuantizedTensor, QuantizeSpec, _capsule, _on_device, _stream, dequantize,
                  quantized_tensor)


def _require_usage(x, usage):
    """A QuantizedTensor operand must have the usage (output) the GEMM reads."""
    if usage not in ("rowwise", "columnwise") or not getattr(x.options, usage):
        raise _C.Error(f"microscale.torch.gemm: the quantized operand has no {usage} output")


def _gemm_operand(x, usage):
    if isinstance(x, torch.Tensor):
        return _C.GemmOperand.dense(x.detach())
    if not isinstance(x, QuantizedTensor):
        raise _C.Error(f"microscale.torch.gemm: operands are microscale.torch.QuantizedTensor or tensors, not "
                       f"{type(x).__name__}")
    o = x.options
    _require_usage(x, usage)
    data, scales = (x.rowwise_data, x.rowwise_scale) if usage == "rowwise" else (x.columnwise_data, x.columnwise_scale)
    amax = row_amaxes = None
    if o.row_scaled:  # one global amax per row of the operand: X's rows, or X^T's
        row_amaxes = (x.rowwise_amaxes if usage == "rowwise" else x.columnwise_amaxes).contiguous()
    elif x.amax is not None:
        amax = float(x.amax[0 if usage == "rowwise" else 1])
    return _C.GemmOperand.quantized(o.scheme, data, scales, swizzle=o.swizzle, amax=amax,
                                    stored_transposed=usage == "columnwise" and o.scheme != "nvfp4",
                                    nvfp4_e4m3_max=o.nvfp4_e4m3_max, row_amaxes=row_amaxes)


def _device_of(x):
    if isinstance(x, torch.Tensor):
        return x.device
    if isinstance(x, QuantizedTensor):
        t = x.rowwise_data if x.rowwise_data is not None else x.columnwise_data
        return t.device
    return None


def _cuda_parts(x, usage):
    """(data, scales, amax slice or None) of one QuantizedTensor operand on CUDA."""
    _require_usage(x, usage)
    if x.options.row_scaled:  # _gemm_cuda_row_scaled takes those
        raise _C.Error("microscale.torch.gemm: a row-scaled operand's amaxes are applied after the library's GEMM")
    # The usage's device amax (a view: no copy to the host); None: the scales carry everything.
    if usage == "rowwise":
        return x.rowwise_data, x.rowwise_scale, None if x.amax is None else x.amax[0:1]
    return x.columnwise_data, x.columnwise_scale, None if x.amax is None else x.amax[1:2]


def _library_runs(a, b):
    """Whether the library's CUDA GEMM takes this pair: two QuantizedTensors (it refuses, as the
    CPU GEMM does, a pair of two block sizes: NVFP4 with MX)."""
    return all(isinstance(x, QuantizedTensor) for x in (a, b))


def _logical_rows_k(x, usage):
    """An operand's logical [rows, K]: rowwise reads the flattened input [M, K] as it is;
    columnwise reads its transpose (NVFP4 stores X^T, MX keeps X's layout with blocks down the
    columns)."""
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    return (rows, x.shape[-1]) if usage == "rowwise" else (x.shape[-1], rows)


def _emulated_operand(x, usage):
    """One operand as float64 [rows, K] on its device: a QuantizedTensor's usage dequantized (the
    blocks exactly, NVFP4's global scale in one fp32 multiply), or a 2-D float tensor."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 2:
            raise _C.Error(f"microscale.torch.gemm: a dense operand on CUDA must be 2-D, got {tuple(x.shape)}")
        return x.detach().double()
    if not isinstance(x, QuantizedTensor):
        raise _C.Error(f"microscale.torch.gemm: operands are microscale.torch.QuantizedTensor or tensors, not "
                       f"{type(x).__name__}")
    _require_usage(x, usage)
    values = dequantize(x, usage, torch.float32)
    if usage == "columnwise" and x.options.scheme == "nvfp4":
        return values.double()  # already X^T [K_in, M_in]
    values = values.reshape(-1, x.shape[-1])
    # MX columnwise keeps the input's layout (blocks down the columns): the operand is its transpose.
    return (values.t() if usage == "columnwise" else values).double()


def _gemm_emulated(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype):
    """D = alpha A B^T (+ beta C) (+ bias) from dequantized operands (the blocks exactly; NVFP4's
    global scale in one fp32 multiply per element): products exact and sums in float64 (cuBLAS
    DGEMM: no TF32 setting applies), rounded to fp32 and then to out_dtype. Within the kernel's
    fp32 accumulation bound of it, at an emulation's speed."""
    A, B = _emulated_operand(a, a_usage), _emulated_operand(b, b_usage)
    for name, t in (("B", B), ("c", c), ("bias", bias)):
        if t is not None and t.device != A.device:
            raise _C.Error(f"microscale.torch.gemm: {name} is on {t.device}, A on {A.device}")
    if A.shape[1] != B.shape[1]:
        raise _C.Error(f"microscale.torch.gemm: A is {list(A.shape)} and B is {list(B.shape)}: their K differ")
    want = (A.shape[0], B.shape[0])
    if c is not None and tuple(c.shape) != want:
        raise _C.Error(f"microscale.torch.gemm: C is {list(c.shape)}, expected {list(want)}")
    if bias is not None and tuple(bias.shape) != (B.shape[0],):
        raise _C.Error(f"microscale.torch.gemm: bias is {list(bias.shape)}, expected [{B.shape[0]}]")
    d = alpha * (A @ B.t())
    if c is not None:
        d = d + beta * c.detach().double()
    if bias is not None:
        d = d + bias.detach().double()
    # To fp32 first, the kernel's accumulator type, then once to out_dtype (as the kernel stores).
    return d.float().to(out_dtype)


def _gemm_cuda(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype, out=None):
    a_data, a_scales, a_amax = _cuda_parts(a, a_usage)
    b_data, b_scales, b_amax = _cuda_parts(b, b_usage)
    # The library sees pointers, not devices: everything must be on the operands' device.
    for name, t in (("B", b_data), ("c", c), ("bias", bias)):
        if t is not None and t.device != a_data.device:
            raise _C.Error(f"microscale.torch.gemm: {name} is on {t.device}, A on {a_data.device}")
    (m, k), (n, kb) = _logical_rows_k(a, a_usage), _logical_rows_k(b, b_usage)
    if k != kb:
        raise _C.Error(f"microscale.torch.gemm: A is [{m}, {k}] and B is [{n}, {kb}]: their K differ")
    scheme_a, scheme_b = a.options.scheme, b.options.scheme
    if out is not None:  # written in place by the kernels (it may be c itself)
        _require_out(out, (m, n), out_dtype, a_data.device)
    d = out if out is not None else torch.empty((m, n), dtype=out_dtype, device=a_data.device)
    a_transposed = a_usage == "columnwise" and scheme_a != "nvfp4"
    b_transposed = b_usage == "columnwise" and scheme_b != "nvfp4"
    path = _cuda_gemm_path(scheme_a, scheme_b, a_transposed or b_transposed,
                           a.options.swizzle and b.options.swizzle, k)
    with _on_device(a_data.device):
        # The expanded path's copies (or a split K's partial sums) go to a workspace from
        # PyTorch's allocator (fast to reuse).
        workspace_bytes = _C.gemm_workspace_bytes(m, n, k, 1, path, scheme_a) if min(m, n, k) > 0 else 0
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=a_data.device) if workspace_bytes else None
        _C.gemm_cuda(_capsule(a_data), _capsule(a_scales), _capsule(a_amax), a.options.swizzle, _capsule(b_data),
                     _capsule(b_scales), _capsule(b_amax), b.options.swizzle, alpha, beta,
                     _capsule(None if c is None else c.detach()), _capsule(None if bias is None else bias.detach()),
                     _capsule(d), _stream(a_data.device), _capsule(workspace), path,
                     scheme_a, a_transposed, scheme_b, b_transposed,
                     a.options.nvfp4_e4m3_max, b.options.nvfp4_e4m3_max)
    return d


def _cuda_gemm_path(scheme_a, scheme_b, transposed, both_swizzled, k):
    """cuda::gemm's path: "auto", or "expanded" for an MX pair the skinny kernel does not read (a
    columnwise operand, MXFP6 or MXFP4, compact scale rows of an odd number of scales), which Auto
    would send there too; named here so that gemm_workspace_bytes sizes the expanded path's copies,
    not the skinny kernel's split (Auto's answer for few rows of A)."""
    if scheme_a == "nvfp4":
        return "auto"
    mxfp8 = ("mxfp8_e4m3", "mxfp8_e5m2")
    odd_compact = (k // 32) % 2 == 1 and not both_swizzled
    if scheme_a not in mxfp8 or scheme_b not in mxfp8 or transposed or odd_compact:
        return "expanded"
    return "auto"


def _outer_scales(x, usage):
    """A row-scaled GEMM's scales from one operand: its amaxes per row of the usage's matrix, its
    single amax ([1]), or None (a dense operand)."""
    if not isinstance(x, QuantizedTensor):
        return None
    if x.options.row_scaled:
        return x.rowwise_amaxes if usage == "rowwise" else x.columnwise_amaxes
    return x.amax[0:1] if usage == "rowwise" else x.amax[1:2]


def _gemm_cuda_row_scaled(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype, out=None):
    """TransformerEngine's general_gemm for row-scaled NVFP4 operands (docs/schemes.md, the same
    arithmetic as the CPU GEMM): the library's GEMM with every amax 1 into fp32, then D times the
    amaxes (their product first when one side has a single amax), the bias in fp32, then C
    (beta 1 only, TE's accumulate) added to D rounded to out_dtype."""
    if a.options.scheme != "nvfp4" or b.options.scheme != "nvfp4":
        raise _C.Error(f"microscale.torch.gemm: a row-scaled NVFP4 operand pairs with an NVFP4 operand only, got "
                       f"{a.options.scheme} x {b.options.scheme}")
    if c is not None and beta != 1.0:
        raise _C.Error("microscale.torch.gemm: a GEMM with a row-scaled operand adds C with beta 1 only "
                       "(TransformerEngine's accumulate)")
    (m, _), (n, _) = _logical_rows_k(a, a_usage), _logical_rows_k(b, b_usage)
    device = (a.rowwise_data if a.rowwise_data is not None else a.columnwise_data).device
    for name, t, shape in (("c", c, (m, n)), ("bias", bias, (n,))):
        if t is not None and (tuple(t.shape) != shape or t.device != device or t.dtype not in _DTYPE_NAMES):
            raise _C.Error(f"microscale.torch.gemm: {name} is {t.dtype} {list(t.shape)} on {t.device}; expected "
                           f"float32, bfloat16 or float16 {list(shape)} on {device}")
    rows, cols = _outer_scales(a, a_usage), _outer_scales(b, b_usage)

    def unit(x):  # the operand with its amaxes taken as 1
        ones = torch.ones(2, dtype=torch.float32, device=x.amax.device)
        return dataclasses.replace(x, amax=ones, options=dataclasses.replace(x.options, row_scaled=False))

    d = _gemm_cuda(unit(a), unit(b), a_usage, b_usage, alpha, 0.0, None, None, torch.float32)
    if cols.numel() == 1:  # TE picks the order by count, as the CPU GEMM does
        d.mul_(rows.view(-1, 1) * cols)
    elif rows.numel() == 1:
        d.mul_(cols.view(1, -1) * rows)
    else:
        d.mul_(rows.view(-1, 1))
        d.mul_(cols.view(1, -1))
    if bias is not None:
        d.add_(bias.to(torch.float32))
    d = d.to(out_dtype)
    if c is not None:  # in fp32, rounded once (c as it is, as the CPU GEMM reads it)
        d = (c.to(torch.float32) + d.to(torch.float32)).to(out_dtype)
    return d if out is None else _copy_into(out, d)


def _require_out(out, shape, dtype, device):
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise _C.Error(f"microscale.torch.gemm: out is {out.dtype} {list(out.shape)} on {out.device}; the result is "
                       f"{dtype} {list(shape)} on {device}")


def _copy_into(out, d):
    """gemm(..., out=out) where the result was computed apart: checked, then copied into out."""
    _require_out(out, d.shape, d.dtype, d.device)
    return out.copy_(d)


def _run_gemm(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype, out=None):
    """The GEMM's body: the op's and eager gemm's. With `out`, the library's CUDA GEMM writes D
    there itself (out may be c: D = alpha A B^T + beta D in place); the other routes compute D,
    then copy it into out."""
    da, db = _device_of(a), _device_of(b)
    if (da is not None and da.type == "cuda") or (db is not None and db.type == "cuda"):
        if not _C.cuda_built():
            raise _C.Error("microscale.torch.gemm: this build has no CUDA backend")
        if _library_runs(a, b) and (a.options.row_scaled or b.options.row_scaled):
            return _gemm_cuda_row_scaled(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype, out)
        if _library_runs(a, b):
            return _gemm_cuda(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype, out)
        d = _gemm_emulated(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype)
    else:
        d = torch.from_dlpack(_C.gemm(_gemm_operand(a, a_usage), _gemm_operand(b, b_usage), alpha, beta,
                                      None if c is None else c.detach(), None if bias is None else bias.detach(),
                                      _DTYPE_NAMES[out_dtype]))
    return d if out is None else _copy_into(out, d)


# An operand crosses the op's schema as its tensors, its input shape and the QuantizeSpec's fields a
# GEMM reads (4over6's error mode, which only shaped the bytes, stays behind); a dense operand as
# [tensor], its shape and the scheme "" (then the other fields are unused).
_OPERAND_PARTS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale", "amax")


def _op_operand(x):
    """(tensors, shape, scheme, [rowwise, columnwise, rht, swizzle, row_scaled], scale_mode, tile, nvfp4_e4m3_max)
    of one operand."""
    if isinstance(x, torch.Tensor):
        return [x.detach()], list(x.shape), "", [False] * 5, "", "", 448
    if not isinstance(x, QuantizedTensor):
        raise _C.Error(f"microscale.torch.gemm: operands are microscale.torch.QuantizedTensor or tensors, not "
                       f"{type(x).__name__}")
    like = x.rowwise_data if x.rowwise_data is not None else x.columnwise_data
    # Parts not asked for cross as empty tensors (the schema has no optional list entries).
    tensors = [getattr(x, n) if getattr(x, n) is not None else like.new_empty(0) for n in _OPERAND_PARTS]
    o = x.options
    return (tensors, list(x.shape), o.scheme, [o.rowwise, o.columnwise, o.rht, o.swizzle, o.row_scaled], o.scale_mode,
            o.tile, o.nvfp4_e4m3_max)


def _operand_from_op(tensors, shape, scheme, flags, scale_mode, tile, nvfp4_e4m3_max):
    """_op_operand's inverse: the dense tensor, or a QuantizedTensor over the same tensors."""
    if scheme == "":
        return tensors[0]
    rowwise, columnwise, rht, swizzle, row_scaled = flags
    return quantized_tensor(tensors, tuple(shape), QuantizeSpec(scheme, rowwise, columnwise, scale_mode, tile, rht,
                                                                swizzle, nvfp4_e4m3_max=nvfp4_e4m3_max,
                                                                row_scaled=row_scaled))


def _gemm_body(a_tensors, a_shape, a_scheme, a_flags, a_scale_mode, a_tile, a_e4m3_max, b_tensors, b_shape, b_scheme,
               b_flags, b_scale_mode, b_tile, b_e4m3_max, a_usage, b_usage, alpha, beta, c, bias, out_dtype):
    """The op microscale::gemm (below)."""
    a = _operand_from_op(a_tensors, a_shape, a_scheme, a_flags, a_scale_mode, a_tile, a_e4m3_max)
    b = _operand_from_op(b_tensors, b_shape, b_scheme, b_flags, b_scale_mode, b_tile, b_e4m3_max)
    return _run_gemm(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype)


def _rows_and_batches(x, usage):
    """An operand's logical row count and batch count (a dense [rows, K, L] operand has L; a
    QuantizedTensor of this module is 2-D after flattening)."""
    if isinstance(x, torch.Tensor):
        return x.shape[0], (x.shape[2] if x.dim() == 3 else None)
    return _logical_rows_k(x, usage)[0], None


def _gemm_fake(a_tensors, a_shape, a_scheme, a_flags, a_scale_mode, a_tile, a_e4m3_max, b_tensors, b_shape, b_scheme,
               b_flags, b_scale_mode, b_tile, b_e4m3_max, a_usage, b_usage, alpha, beta, c, bias, out_dtype):
    a = _operand_from_op(a_tensors, a_shape, a_scheme, a_flags, a_scale_mode, a_tile, a_e4m3_max)
    b = _operand_from_op(b_tensors, b_shape, b_scheme, b_flags, b_scale_mode, b_tile, b_e4m3_max)
    m, la = _rows_and_batches(a, a_usage)
    n, lb = _rows_and_batches(b, b_usage)
    batches = la if la is not None else lb
    return a_tensors[0].new_empty([m, n] + ([batches] if batches is not None else []), dtype=out_dtype)


_gemm_op = define_op(
    "gemm(Tensor[] a_tensors, SymInt[] a_shape, str a_scheme, bool[] a_flags, str a_scale_mode, str a_tile, "
    "int a_e4m3_max, Tensor[] b_tensors, SymInt[] b_shape, str b_scheme, bool[] b_flags, str b_scale_mode, "
    "str b_tile, int b_e4m3_max, str a_usage, str b_usage, float alpha, float beta, Tensor? c, Tensor? bias, "
    "ScalarType out_dtype) -> Tensor",
    _gemm_body, _gemm_fake)


def gemm(a, b, *, a_usage="rowwise", b_usage="rowwise", alpha=1.0, beta=0.0, c=None, bias=None,
         out_dtype=torch.float32, out=None):
    """D = alpha * A B^T (+ beta C) (+ bias): a and b each a QuantizedTensor of this module (its
    a_usage / b_usage output) or a float tensor (dense). Returns a tensor of out_dtype (float32,
    bfloat16, float16) on the operands' device. On CUDA, two QuantizedTensors of one block size
    (NVFP4 x NVFP4, MX x MX) run the library's Hopper GEMM on the current stream; a pair with a
    dense operand (2-D) is emulated: dequantized exactly and multiplied in float64 by torch, then
    rounded once. C and bias must be on the operands' device. ``out`` (of the result's shape,
    out_dtype and device) receives D and is returned; it may be ``c`` itself, for D += A B^T with
    beta=1 (a weight gradient accumulated into an fp32 main_grad). Under torch.compile it is the
    torch.library op microscale::gemm (fullgraph=True traces it); the result carries no gradient."""
    if out_dtype not in _DTYPE_NAMES:
        raise _C.Error(f"microscale.torch.gemm: out_dtype must be float32, bfloat16 or float16, not {out_dtype}")
    c = None if c is None else c.detach()
    bias = None if bias is None else bias.detach()
    if torch.compiler.is_compiling():
        # The op, which dynamo records; eagerly its dispatch would cost host time for nothing
        # (25-46 us per call on an H200's host, perf.md's forty-second session).
        d = _gemm_op(*_op_operand(a), *_op_operand(b), a_usage, b_usage, float(alpha), float(beta), c, bias,
                     out_dtype)
        return d if out is None else _copy_into(out, d)
    return _run_gemm(a, b, a_usage, b_usage, alpha, beta, c, bias, out_dtype, out)
