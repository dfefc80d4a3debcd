"""microscale: block-scaled low-precision numerics (NVFP4, MXFP8, MXFP6, MXFP4), bit-exact with
TransformerEngine and torchao, on the CPU.

Arrays go in as anything with DLPack or the buffer protocol (numpy, torch); a QuantizedTensor's
arrays come out as array objects with both, which np.asarray and torch.from_dlpack take without a
copy; dequantize returns numpy arrays. ``microscale.torch`` has the PyTorch layer: Linear,
autocast and torch.library ops.
"""

import numpy as np

from . import _C, recipe
from ._C import Error, GemmOperand, QuantizedTensor, QuantizeOptions, release_cached_host_memory

__all__ = ["Error", "GemmOperand", "QuantizedTensor", "QuantizeOptions", "convert_checkpoint", "dequantize", "gemm",
           "quantize", "read_quantized_weights", "recipe", "release_cached_host_memory"]


def quantize(
    x,
    scheme="nvfp4",
    *,
    rowwise=True,
    columnwise=False,
    scale_mode="rceil",
    tile="1x16",
    rht=False,
    sr_seed=None,
    sr_offset=0,
    amax_rowwise=None,
    amax_columnwise=None,
    swizzle=False,
    num_threads=0,
    four_over_six="off",
    four_over_six_scaled_error=False,
    nvfp4_e4m3_max=448,
    row_scaled=False,
    reference=False,
):
    """Quantizes a CPU array (float32, float16 or, through DLPack, bfloat16; N-D, any strides that
    fold to [M, K]).

    Names and defaults are the CLI's (``microscale quantize-tensors``): ``scheme`` is one of nvfp4,
    mxfp8_e4m3, mxfp8_e5m2, mxfp6_e2m3, mxfp6_e3m2, mxfp4; ``scale_mode`` (MX) floor, ceil, even or
    rceil; ``tile`` 1x16 or 16x16 (NVFP4), 1x32 or 32x32 (MX; 32x32 is TransformerEngine's MXFP8 2D
    quantization of weights: one scale per 32x32 tile, the same codes in both directions); ``rht`` (NVFP4, bf16 input) the 16-point random
    Hadamard transform on the columnwise output; ``sr_seed`` turns on NVFP4 stochastic rounding;
    ``four_over_six`` (NVFP4) ``"mae"`` or ``"mse"`` keeps, per block, the better of the usual
    encoding and one scaled by 1.5 (TransformerEngine's nvfp4_4over6, docs/formats.md), with
    ``nvfp4_e4m3_max=256`` for TE's default bound and ``four_over_six_scaled_error`` for its
    NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH error. ``row_scaled`` (NVFP4 1x16) gives each row its
    own global scale (TransformerEngine's row_scaled_nvfp4): ``rowwise_amaxes`` [M] and, for the
    columnwise X^T, ``columnwise_amaxes`` [K].
    ``reference=True`` runs the plain-loop reference path (the same bytes, slowly).
    ``scale_mode`` defaults to rceil, TransformerEngine's MXFP8 choice (torchao's to_mx defaults
    to floor). Returns a QuantizedTensor whose arrays share its memory.
    """
    options = QuantizeOptions(
        scheme=scheme,
        rowwise=rowwise,
        columnwise=columnwise,
        scale_mode=scale_mode,
        tile=tile,
        rht=rht,
        sr_seed=sr_seed,
        sr_offset=sr_offset,
        amax_rowwise=amax_rowwise,
        amax_columnwise=amax_columnwise,
        swizzle=swizzle,
        num_threads=num_threads,
        four_over_six=four_over_six,
        four_over_six_scaled_error=four_over_six_scaled_error,
        nvfp4_e4m3_max=nvfp4_e4m3_max,
        row_scaled=row_scaled,
    )
    return _C.quantize(x, options, reference)


def dequantize(q, usage="rowwise", dtype="float32"):
    """One usage of ``q`` as a numpy array of float32 or float16 (rowwise [M, K], reshaped to the
    input's shape; NVFP4 columnwise X^T [K, M]; MX columnwise [M, K]). For bfloat16 output use
    microscale.torch.dequantize (numpy has no bfloat16)."""
    if dtype not in ("float32", "float16"):
        raise Error(f"microscale.dequantize: dtype must be 'float32' or 'float16' for numpy, not {dtype!r}")
    return np.asarray(_C.dequantize(q, usage, dtype))


def _gemm_operand(x, usage):
    if isinstance(x, GemmOperand):
        return x
    if isinstance(x, QuantizedTensor):
        return GemmOperand.from_quantized(x, usage)
    if hasattr(x, "options") and hasattr(x, "amax"):  # microscale.torch's QuantizedTensor
        raise Error("microscale.gemm takes this package's QuantizedTensor; use microscale.torch.gemm for "
                    "microscale.torch.quantize's")
    return GemmOperand.dense(x)


def gemm(a, b, *, a_usage="rowwise", b_usage="rowwise", alpha=1.0, beta=0.0, c=None, bias=None,
         out_dtype="float32"):
    """D = alpha * A B^T (+ beta C) (+ bias) on the CPU, A a logical [M, K] and B an [N, K] matrix
    (a batch dim L may follow K): each a QuantizedTensor (its ``a_usage`` / ``b_usage`` output), a
    GemmOperand (raw codes and scales: GemmOperand.quantized) or a float array (dense: the mixed
    GEMMs). Blocks are dequantized exactly and accumulated in fp32 (docs/training.md); NVFP4
    operands with amaxes scale by their global scales. Returns a numpy array, float32 or float16,
    [M, N] (or [M, N, L])."""
    if out_dtype not in ("float32", "float16"):
        raise Error(f"microscale.gemm: out_dtype must be 'float32' or 'float16' for numpy, not {out_dtype!r}")
    d = _C.gemm(_gemm_operand(a, a_usage), _gemm_operand(b, b_usage), alpha, beta, c, bias, out_dtype)
    return np.asarray(d)


def convert_checkpoint(input, output_dir, *, format, convention=None, skip=(), only=(), default_skips=True,
                       scale_mode=None, calibration=None, num_threads=0, four_over_six="off",
                       four_over_six_scaled_error=False, nvfp4_e4m3_max=448, progress=None):
    """Converts a safetensors checkpoint (a file, or a model directory with shards and config.json)
    into ``output_dir`` in a serving convention, as ``microscale quantize`` does (docs/checkpoints.md):
    ``format`` nvfp4, mxfp8 or mxfp4; ``convention`` modelopt, compressed-tensors or gpt-oss (None:
    the format's default); ``skip`` / ``only`` name patterns (``*``, ``?``) added to the default
    skips (embeddings, norms, lm_head, routers...: ``default_skips=False`` drops them) or
    restricting the quantized layers; ``scale_mode`` for MX (rceil when None); ``calibration`` a
    safetensors file of input amaxes for NVFP4's input scales; ``four_over_six`` ("mae" or "mse"),
    ``four_over_six_scaled_error`` and ``nvfp4_e4m3_max`` (448, or 256) quantize NVFP4 weights by
    TransformerEngine's 4over6 (each block the better of two scales; the files stay plain NVFP4,
    which any engine reads); ``progress(done, total, report)``
    called after each tensor. Returns one dict per input tensor: name, shape, dtype, quantized,
    kept_because, sqnr_db, max_abs_error, bytes_before, bytes_after. Errors are microscale.Error;
    a failed conversion removes the files it wrote."""
    import os

    def patterns(p):  # one pattern given as a string, not its letters
        return [p] if isinstance(p, str) else list(p)

    return _C.convert_checkpoint(os.fspath(input), os.fspath(output_dir), format=format, convention=convention or "",
                                 skip=patterns(skip), only=patterns(only), default_skips=default_skips,
                                 scale_mode=scale_mode or "", calibration=os.fspath(calibration) if calibration else "",
                                 num_threads=num_threads, four_over_six=four_over_six or "off",
                                 four_over_six_scaled_error=four_over_six_scaled_error,
                                 nvfp4_e4m3_max=nvfp4_e4m3_max, progress=progress)


def read_quantized_weights(path):
    """The quantized weights of a checkpoint (a file, or a model directory) in any convention
    microscale reads (modelopt, compressed-tensors, gpt-oss; ours or another tool's), dequantized
    as ``microscale inspect`` does: a dict from each original weight's name to a float32 numpy
    array of its original shape. Tensors that are not quantized weights are left out."""
    import os

    return {w["name"]: np.asarray(w["values"]) for w in _C.read_quantized_weights(os.fspath(path))}
