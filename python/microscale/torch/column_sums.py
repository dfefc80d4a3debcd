"""The quantized Linear's bias gradient: dy [M, N]'s sums over its rows in float64, rounded to
fp32 [N]. An op (microscale::column_sums, op_library.py), so that a Linear traced by torch.compile
records the library's CUDA kernel, the eager layer's, and gets its bytes; eager calls run the
body without the op's dispatch."""

import torch

from .. import _C
from .op_library import define_op
from .ops import _capsule, _on_device, _stream


def _column_sums_body(dy):
    """On CUDA the library's kernel (no float64 copy of dy, which torch's reduction makes first:
    ~120 us of a 4096^3 step); on the CPU torch's float64 sum (the composed layer's CPU run,
    checked against the C++ layer)."""
    if dy.device.type != "cuda":
        return dy.sum(0, dtype=torch.float64).float()
    sums = torch.empty(dy.shape[1], dtype=torch.float32, device=dy.device)
    # Scratch from torch's allocator: the library's own (the stream-ordered pool) cost ~100-150 us
    # of host time per step on an H200 host (perf.md, forty-first session).
    workspace = torch.empty(_C.column_sums_workspace_bytes(dy.shape[0], dy.shape[1]), dtype=torch.uint8,
                            device=dy.device)
    with _on_device(dy.device):
        _C.column_sums_cuda(_capsule(dy), _capsule(sums), _stream(dy.device), _capsule(workspace))
    return sums


def _column_sums_fake(dy):
    return dy.new_empty(dy.shape[1], dtype=torch.float32)


_column_sums_op = define_op("column_sums(Tensor dy) -> Tensor", _column_sums_body, _column_sums_fake)


def column_sums(dy):
    """dy [M, N] (float32, bfloat16 or float16) summed over its rows in float64: float32 [N]."""
    if torch.compiler.is_compiling():
        return _column_sums_op(dy)
    return _column_sums_body(dy)
