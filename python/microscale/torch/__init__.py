"""microscale for PyTorch: the quantized Linear, the autocast scope and quantize / dequantize ops.

    import microscale.torch as mst
    from microscale.recipe import NVFP4BlockScaling

    layer = mst.Linear(1024, 1024)
    with mst.autocast(recipe=NVFP4BlockScaling()):
        y = layer(x)          # fprop in NVFP4; backward follows the recipe too
    y.sum().backward()

mst.checkpoint(fn, *args) is torch's activation checkpointing with the recomputation under the
autocast scope of the call, as TransformerEngine's te.checkpoint. mst.convert_linears(model)
swaps a model's torch.nn.Linear layers for this Linear, in place. LayerNormLinear and
LayerNormMLP are TransformerEngine's modules of those names (the norm and activation in high
precision, the Linears quantized), with its parameter names; GroupedLinear is its mixture-of-experts
Linear (one quantized Linear per expert, the input split by rows); LayerNorm and RMSNorm its
standalone normalizations (in high precision, as its).
Outside an enabled autocast scope a Linear runs in high precision, as TransformerEngine's modules
do outside theirs. With microscale's CUDA backend, the Linear, quantize / dequantize and gemm also
take CUDA tensors (the Hopper kernels: the same bytes; gemm runs the library's GEMM for NVFP4 and
MX pairs and emulates exactly a pair with a dense operand).
"""

from .autocast import autocast, autocast_enabled, current_recipe, fp8_autocast
from .checkpoint import checkpoint
from .convert import convert_linears
from .gemm import gemm
from .grouped_linear import GroupedLinear
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .normalization import LayerNorm, RMSNorm
from .ops import QuantizedTensor, dequantize, quantize

__all__ = [
    "GroupedLinear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "QuantizedTensor",
    "RMSNorm",
    "autocast",
    "autocast_enabled",
    "checkpoint",
    "convert_linears",
    "current_recipe",
    "dequantize",
    "fp8_autocast",
    "gemm",
    "quantize",
]
