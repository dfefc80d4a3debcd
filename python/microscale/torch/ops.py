"""quantize / dequantize on torch tensors, registered with torch.library (so torch.compile traces
them): CPU tensors run the library's fast CPU path, CUDA tensors its Hopper kernels (builds with
the CUDA backend) on the current stream, into tensors of PyTorch's allocator. Same bytes on both.
Eager calls run the ops' bodies without the dispatch, which costs ~40-85 us of host time per call
on a CUDA host (perf.md); under torch.compile the calls are the ops, which dynamo records."""

import contextlib
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch.utils.dlpack import to_dlpack

from .. import _C
from .op_library import define_op

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class QuantizeSpec:
    """What a QuantizedTensor was quantized with (the arguments of quantize that shape its bytes)."""

    scheme: str
    rowwise: bool
    columnwise: bool
    scale_mode: str
    tile: str
    rht: bool
    swizzle: bool
    four_over_six: str = "off"  # NVFP4 4over6 error mode: off, mae or mse (docs/schemes.md)
    four_over_six_scaled_error: bool = False
    nvfp4_e4m3_max: int = 448  # NVFP4: the global scale's E4M3 bound, S_enc = 6 * bound / amax
    row_scaled: bool = False  # NVFP4: a global scale per row of X (rowwise) and of X^T (columnwise)


@dataclass(frozen=True)
class QuantizedTensor:
    """A quantization's outputs as uint8 tensors (None where not asked for), in the layouts of
    docs/layouts.md. ``amax`` (NVFP4) is float32 [2]: the rowwise and the columnwise amax; a
    row-scaled tensor's is [2 + M + K]: the largest of each, then the M row amaxes of X and the K
    of X^T (zeros for a usage not asked for)."""

    rowwise_data: Optional[torch.Tensor]
    rowwise_scale: Optional[torch.Tensor]
    columnwise_data: Optional[torch.Tensor]
    columnwise_scale: Optional[torch.Tensor]
    amax: Optional[torch.Tensor]
    shape: tuple
    options: QuantizeSpec

    @property
    def rowwise_amax(self):
        return None if self.amax is None or self.rowwise_data is None else self.amax[0]

    @property
    def columnwise_amax(self):
        return None if self.amax is None or self.columnwise_data is None else self.amax[1]

    @property
    def rowwise_amaxes(self):
        """A row-scaled tensor's float32 [M] amaxes of X's rows (None otherwise)."""
        if not self.options.row_scaled or self.rowwise_data is None:
            return None
        return self.amax[2:2 + math.prod(self.shape[:-1])]

    @property
    def columnwise_amaxes(self):
        """A row-scaled tensor's float32 [K] amaxes of X^T's rows (None otherwise)."""
        if not self.options.row_scaled or self.columnwise_data is None:
            return None
        return self.amax[2 + math.prod(self.shape[:-1]):]


def _options(scheme, rowwise, columnwise, scale_mode, tile, rht, sr_seed, sr_offset, amax_rowwise,
             amax_columnwise, swizzle, four_over_six="off", four_over_six_scaled_error=False, nvfp4_e4m3_max=448,
             row_scaled=False, num_threads=0):
    """The C++ options from the op's arguments."""
    return _C.QuantizeOptions(scheme=scheme, rowwise=rowwise, columnwise=columnwise, scale_mode=scale_mode, tile=tile,
                              rht=rht, sr_seed=sr_seed, sr_offset=sr_offset, amax_rowwise=amax_rowwise,
                              amax_columnwise=amax_columnwise, swizzle=swizzle, num_threads=num_threads,
                              four_over_six=four_over_six, four_over_six_scaled_error=four_over_six_scaled_error,
                              nvfp4_e4m3_max=nvfp4_e4m3_max, row_scaled=row_scaled)


_PARTS = ["rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"]


def _capsule(t):
    """A tensor as the DLPack capsule the bindings take (None stays None). torch's C-level
    to_dlpack costs well under a microsecond; the tensor's Python-level __dlpack__, which nanobind
    calls for a tensor, ~10 us on a CUDA host, and a training step hands the library dozens."""
    return None if t is None else to_dlpack(t)


def _device_index(device):
    return device.index if device.index is not None else torch.cuda.current_device()


# torch's query of a device's current raw stream (what the code torch.compile generates calls):
# well under a microsecond, where torch.cuda.current_stream builds a Stream object (~5 us on a
# CUDA host, several times per Linear step).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device):
    """The current CUDA stream of `device` as an integer (cudaStream_t): the kernels run there."""
    if _raw_stream is not None:
        return _raw_stream(_device_index(device))
    return torch.cuda.current_stream(device).cuda_stream


def _on_device(device):
    """A context in which `device` is the current CUDA device (the library launches there); no
    device switch, and none of its ~5 us, when it already is."""
    if _device_index(device) == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _empty_u8(device):
    return torch.empty(0, dtype=torch.uint8, device=device)


def _quantize_body(x, scheme, rowwise, columnwise, scale_mode, tile, rht, sr_seed, sr_offset, amax_rowwise,
                   amax_columnwise, swizzle, four_over_six, four_over_six_scaled_error, nvfp4_e4m3_max, row_scaled,
                   sr_seed_tensor):
    """The op microscale::quantize (below)."""
    sr_seed, sr_seed_tensor = _seed_arguments(sr_seed, sr_seed_tensor, x.device)
    # CPU threads: as many as torch's intra-op pool (torch.set_num_threads), as torch's own ops use
    options = _options(scheme, rowwise, columnwise, scale_mode, tile, rht, sr_seed, sr_offset, amax_rowwise,
                       amax_columnwise, swizzle, four_over_six, four_over_six_scaled_error, nvfp4_e4m3_max,
                       row_scaled, num_threads=torch.get_num_threads())
    return quantize_parts(x.detach(), options, sr_seed_tensor)


def _seed_arguments(sr_seed, seed_tensor, device):
    """(sr_seed, seed_tensor) as quantize_parts takes them: a seed tensor (int64 [1] on x's device)
    stays a tensor on CUDA, where the kernel reads it as it runs; on the CPU its value becomes the
    int seed (its bits as an unsigned 64-bit integer, as the CUDA kernel reads them)."""
    if seed_tensor is None:
        return sr_seed, None
    if seed_tensor.dtype != torch.int64 or seed_tensor.numel() != 1 or seed_tensor.device != device:
        raise _C.Error(f"microscale.torch.quantize: a seed tensor must be int64 with one element on {device}, got "
                       f"{seed_tensor.dtype} {list(seed_tensor.shape)} on {seed_tensor.device}")
    if device.type == "cuda":
        return sr_seed, seed_tensor
    return int(seed_tensor.item()) % 2**64, None


def quantize_parts(x, options, sr_seed_tensor=None):
    """The quantize op's body, without the op's dispatch (what eager quantize() calls):
    [rowwise_data, rowwise_scale, columnwise_data, columnwise_scale, amax], empty tensors for the
    parts not asked for. sr_seed_tensor: stochastic rounding's seed read on the device as the
    kernel runs (int64 [1] on x's CUDA device; _seed_arguments), in place of the options' seed."""
    scheme = options.scheme
    seed_bytes = None if sr_seed_tensor is None else sr_seed_tensor.detach().reshape(1).view(torch.uint8)  # [8]
    if x.device.type == "cpu":
        q = _C.quantize(x, options, False)
        parts = [q.rowwise_data, q.rowwise_scale, q.columnwise_data, q.columnwise_scale]
        outs = [torch.from_dlpack(p) if p is not None else _empty_u8(x.device) for p in parts]
        amax = torch.tensor([q.rowwise_amax or 0.0, q.columnwise_amax or 0.0], dtype=torch.float32)
        if q.row_scaled:  # then the amaxes per row of X and of X^T
            rows, cols = q.rows, q.cols
            per_row = [torch.from_dlpack(a) if a is not None else torch.zeros(n, dtype=torch.float32)
                       for a, n in ((q.rowwise_amaxes, rows), (q.columnwise_amaxes, cols))]
            amax = torch.cat([amax] + per_row)
        return outs + [amax]
    if x.device.type == "cuda":
        if not _C.cuda_built():
            raise _C.Error("microscale was built without its CUDA backend: quantize takes CPU tensors only")
        shapes = _C.quantized_shapes(list(x.shape), options)
        outs = [torch.empty(shapes[n], dtype=torch.uint8, device=x.device) if shapes[n] else _empty_u8(x.device)
                for n in _PARTS]
        # NVFP4: the kernels write both amaxes (given or measured), row-scaled also those per row of X
        # and of X^T (QuantizedTensor.amax); MX has none (zeros returned).
        floats = 2 + math.prod(x.shape[:-1]) + x.shape[-1] if options.row_scaled else 2
        amax = (torch.empty if scheme == "nvfp4" else torch.zeros)(floats, dtype=torch.float32, device=x.device)
        given = [_capsule(o) if shapes[n] else None for o, n in zip(outs, _PARTS)]
        with _on_device(x.device):
            _C.quantize_cuda(_capsule(x), options, *given, _capsule(amax) if scheme == "nvfp4" else None,
                             _stream(x.device), _capsule(seed_bytes))
        return outs + [amax]
    raise _C.Error(f"microscale.torch.quantize: tensors on {x.device.type} are not supported (cpu, cuda)")


def _quantize_fake(x, *option_args):
    options = _options(*option_args[:-1])  # the seed tensor left out
    shapes = _C.quantized_shapes(list(x.shape), options)
    outs = [x.new_empty(shapes[n] or [0], dtype=torch.uint8) for n in _PARTS]
    amaxes = 2 + math.prod(x.shape[:-1]) + x.shape[-1] if options.row_scaled else 2
    return outs + [x.new_empty(amaxes, dtype=torch.float32)]


# [rowwise_data, rowwise_scale, columnwise_data, columnwise_scale, amax]: quantize_parts' outputs.
_quantize_op = define_op(
    "quantize(Tensor x, str scheme, bool rowwise, bool columnwise, str scale_mode, str tile, bool rht, SymInt? "
    "sr_seed, SymInt sr_offset, float? amax_rowwise, float? amax_columnwise, bool swizzle, str four_over_six, "
    "bool four_over_six_scaled_error, int nvfp4_e4m3_max, bool row_scaled, Tensor? sr_seed_tensor) -> Tensor[]",
    _quantize_body,
    _quantize_fake)


def quantize(x, scheme="nvfp4", *, rowwise=True, columnwise=False, scale_mode="rceil", tile="1x16", rht=False,
             sr_seed=None, sr_offset=0, amax_rowwise=None, amax_columnwise=None, swizzle=False, four_over_six="off",
             four_over_six_scaled_error=False, nvfp4_e4m3_max=448, row_scaled=False):
    """Quantizes a float32 / bfloat16 / float16 tensor (arguments as microscale.quantize's, but for
    num_threads, which is torch.get_num_threads(), and reference).
    Returns a QuantizedTensor of uint8 tensors on x's device (CPU, or CUDA with the CUDA backend).

    sr_seed may also be an int64 tensor of one element on x's device: on CUDA the kernel reads it as
    it runs, so a call captured into a CUDA graph takes, on each replay, the seed the graph's
    earlier work left there (e.g. ``torch.randint(..., device="cuda")``, which torch's CUDA
    generator draws anew per replay). Same bytes as the seed passed as an int (its bits as an
    unsigned 64-bit integer). Under torch.compile an int seed is a constant of the graph, the
    same on every call: a seed drawn per call must be a tensor."""
    # Quantization has no gradient (the Linear's autograd function carries them): detached, the
    # float amax output does not claim one either.
    seed_tensor = sr_seed if isinstance(sr_seed, torch.Tensor) else None
    if seed_tensor is not None:
        sr_seed = 0  # stochastic rounding on; the seed is read from seed_tensor
    if torch.compiler.is_compiling():  # the op's body reads the seed tensor as the eager call below
        parts = _quantize_op(x.detach(), scheme, rowwise, columnwise, scale_mode, tile, rht, sr_seed, sr_offset,
                             amax_rowwise, amax_columnwise, swizzle, four_over_six, four_over_six_scaled_error,
                             nvfp4_e4m3_max, row_scaled, seed_tensor)
    else:
        sr_seed, seed_tensor = _seed_arguments(sr_seed, seed_tensor, x.device)
        options = _options(scheme, rowwise, columnwise, scale_mode, tile, rht, sr_seed, sr_offset, amax_rowwise,
                           amax_columnwise, swizzle, four_over_six, four_over_six_scaled_error, nvfp4_e4m3_max,
                           row_scaled, num_threads=torch.get_num_threads())
        parts = quantize_parts(x.detach(), options, seed_tensor)
    return quantized_tensor(parts, tuple(x.shape), QuantizeSpec(scheme, rowwise, columnwise, scale_mode, tile, rht,
                                                                swizzle, four_over_six, four_over_six_scaled_error,
                                                                nvfp4_e4m3_max, row_scaled))


def quantized_tensor(parts, shape, spec):
    """A QuantizedTensor from the quantize op's five outputs (None for the parts not asked for)."""
    rd, rs, cd, cs, amax = parts
    return QuantizedTensor(
        rowwise_data=rd if spec.rowwise else None,
        rowwise_scale=rs if spec.rowwise else None,
        columnwise_data=cd if spec.columnwise else None,
        columnwise_scale=cs if spec.columnwise else None,
        amax=amax if spec.scheme == "nvfp4" else None,
        shape=shape,
        options=spec,
    )


def _dequantized_shape(shape, scheme, usage):
    """dequantize's output shape: NVFP4 columnwise is X^T [K, M]; the rest the input's shape."""
    if scheme == "nvfp4" and usage == "columnwise":
        return [shape[-1], math.prod(shape[:-1])]
    return list(shape)


def _dequantize_parts(rowwise_data, rowwise_scale, columnwise_data, columnwise_scale, amax, shape, scheme, rowwise,
                      columnwise, scale_mode, tile, rht, swizzle, nvfp4_e4m3_max, row_scaled, usage, dtype):
    """The dequantize op's body."""
    options = _options(scheme, rowwise, columnwise, scale_mode, tile, rht, None, 0, None, None, swizzle,
                       nvfp4_e4m3_max=nvfp4_e4m3_max, row_scaled=row_scaled)
    if dtype not in _DTYPE_NAMES:
        raise _C.Error(f"microscale.torch.dequantize: dtype must be float32, bfloat16 or float16, not {dtype}")
    device = rowwise_data.device if rowwise else columnwise_data.device
    if device.type == "cpu":
        amax_values = amax[:2].tolist() if amax.numel() >= 2 else [0.0, 0.0]
        # Only the usage asked for is copied into the C++ QuantizedTensor.
        row = usage == "rowwise"
        one = _options(scheme, row, not row, scale_mode, tile, rht, None, 0, None, None, swizzle,
                       nvfp4_e4m3_max=nvfp4_e4m3_max, row_scaled=row_scaled)
        rows = math.prod(shape[:-1])
        per_row = amax[2:2 + rows] if row else amax[2 + rows:]  # a row-scaled tensor's amaxes of this usage
        q = _C.quantized_tensor(
            list(shape), one,
            rowwise_data.contiguous() if row else None, rowwise_scale.contiguous() if row else None,
            None if row else columnwise_data.contiguous(), None if row else columnwise_scale.contiguous(),
            amax_values[0], amax_values[1], per_row.contiguous() if row_scaled and row else None,
            per_row.contiguous() if row_scaled and not row else None)
        return torch.from_dlpack(_C.dequantize(q, usage, _DTYPE_NAMES[dtype])).reshape(
            _dequantized_shape(shape, scheme, usage))
    if device.type == "cuda":
        if not _C.cuda_built():
            raise _C.Error("microscale was built without its CUDA backend: dequantize takes CPU tensors only")
        rows = math.prod(shape[:-1])
        transposed = scheme == "nvfp4" and usage == "columnwise"
        out = torch.empty([shape[-1], rows] if transposed else [rows, shape[-1]], dtype=dtype, device=device)
        with _on_device(device):
            _C.dequantize_cuda(
                rowwise_data if rowwise else None, rowwise_scale if rowwise else None,
                columnwise_data if columnwise else None, columnwise_scale if columnwise else None,
                amax if scheme == "nvfp4" else None, list(shape), options, usage, out, _stream(device))
        return out.reshape(_dequantized_shape(shape, scheme, usage))
    raise _C.Error(f"microscale.torch.dequantize: tensors on {device.type} are not supported (cpu, cuda)")


def _dequantize_fake(rowwise_data, rowwise_scale, columnwise_data, columnwise_scale, amax, shape, scheme, rowwise,
                     columnwise, scale_mode, tile, rht, swizzle, nvfp4_e4m3_max, row_scaled, usage, dtype):
    like = rowwise_data if rowwise else columnwise_data
    return like.new_empty(_dequantized_shape(shape, scheme, usage), dtype=dtype)


_dequantize_op = define_op(
    "dequantize(Tensor rowwise_data, Tensor rowwise_scale, Tensor columnwise_data, Tensor columnwise_scale, "
    "Tensor amax, SymInt[] shape, str scheme, bool rowwise, bool columnwise, str scale_mode, str tile, bool rht, "
    "bool swizzle, int nvfp4_e4m3_max, bool row_scaled, str usage, ScalarType dtype) -> Tensor", _dequantize_parts,
    _dequantize_fake)


def dequantize(q, usage="rowwise", dtype=torch.float32):
    """One usage of a QuantizedTensor back to ``dtype`` (float32, bfloat16, float16): rowwise in
    the input's shape; NVFP4 columnwise X^T [K, M] (RHT(X^T) with the RHT); MX columnwise in the
    input's shape."""
    o = q.options
    if usage not in ("rowwise", "columnwise"):
        raise _C.Error(f"unknown usage '{usage}' (rowwise, columnwise)")
    if (usage == "rowwise" and not o.rowwise) or (usage == "columnwise" and not o.columnwise):
        raise _C.Error(f"microscale.torch.dequantize: the tensor has no {usage} output")
    like = q.rowwise_data if o.rowwise else q.columnwise_data
    empty = _empty_u8(like.device)
    amax = q.amax if q.amax is not None else torch.zeros(2, dtype=torch.float32, device=like.device)
    run = _dequantize_op if torch.compiler.is_compiling() else _dequantize_parts
    return run(
        q.rowwise_data if o.rowwise else empty, q.rowwise_scale if o.rowwise else empty,
        q.columnwise_data if o.columnwise else empty, q.columnwise_scale if o.columnwise else empty,
        amax, list(q.shape), o.scheme, o.rowwise, o.columnwise, o.scale_mode, o.tile, o.rht, o.swizzle,
        o.nvfp4_e4m3_max, o.row_scaled, usage, dtype)

