"""microscale.gemm for torch tensors (CPU): operands from this package's QuantizedTensor or dense
tensors, the result as a tensor of any float dtype."""

import torch

from .. import _C
from .ops import _DTYPE_NAMES, QuantizedTensor


def _gemm_operand(x, usage):
    if isinstance(x, torch.Tensor):
        return _C.GemmOperand.dense(x.detach())
    if not isinstance(x, QuantizedTensor):
        raise _C.Error(f"microscale.torch.gemm: operands are microscale.torch.QuantizedTensor or tensors, not "
                       f"{type(x).__name__}")
    o = x.options
    if usage not in ("rowwise", "columnwise") or not getattr(o, usage):
        raise _C.Error(f"microscale.torch.gemm: the quantized operand has no {usage} output")
    data, scales = (x.rowwise_data, x.rowwise_scale) if usage == "rowwise" else (x.columnwise_data, x.columnwise_scale)
    amax = None
    if x.amax is not None:
        amax = float(x.amax[0 if usage == "rowwise" else 1])
    return _C.GemmOperand.quantized(o.scheme, data, scales, swizzle=o.swizzle, amax=amax,
                                    stored_transposed=usage == "columnwise" and o.scheme != "nvfp4")


def gemm(a, b, *, a_usage="rowwise", b_usage="rowwise", alpha=1.0, beta=0.0, c=None, bias=None,
         out_dtype=torch.float32):
    """microscale.gemm on CPU tensors: a and b each a QuantizedTensor of this module (its a_usage /
    b_usage output) or a float tensor (dense). Returns a tensor of out_dtype (float32, bfloat16,
    float16). Not a torch.library op (not traced by torch.compile) and not on CUDA tensors (the
    Hopper GEMMs are not written)."""
    if out_dtype not in _DTYPE_NAMES:
        raise _C.Error(f"microscale.torch.gemm: out_dtype must be float32, bfloat16 or float16, not {out_dtype}")
    d = _C.gemm(_gemm_operand(a, a_usage), _gemm_operand(b, b_usage), alpha, beta,
                None if c is None else c.detach(), None if bias is None else bias.detach(), _DTYPE_NAMES[out_dtype])
    return torch.from_dlpack(d)
