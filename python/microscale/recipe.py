"""Training recipes under TransformerEngine's names (transformer_engine.common.recipe).

- ``NVFP4BlockScaling(disable_rht=False, disable_stochastic_rounding=False,
  disable_2d_quantization=False, nvfp4_4over6="none", nvfp4_4over6_e4m3_use_256="all",
  nvfp4_4over6_err_mode="MAE", row_scaled_activation=False)``: inputs 1x16 blocks with the RHT on
  the columnwise (wgrad) output; weights 16x16 blocks; gradients 1x16 with the RHT and stochastic
  rounding. ``nvfp4_4over6`` ("weights", "activations", "all") quantizes those tensors with TE's
  4over6 (per block, the better of two scales; gradients never), with the global-scale bound 256
  for those in ``nvfp4_4over6_e4m3_use_256``; the input under it needs ``disable_rht=True``.
  ``row_scaled_activation`` gives the input a global scale per row of x (and per column for the
  wgrad), TE's row-scaled NVFP4; it needs ``disable_rht=True``.
- ``MXFP8BlockScaling(fp8_format=Format.E4M3, enable_2d_quantization=False)``: blocks of 32, E8M0
  scales (RCEIL); HYBRID takes E5M2 for gradients. ``enable_2d_quantization`` gives the weights
  32x32 tiles (one scale per tile, so W and W^T quantize alike), as TE's field does.
- ``HighPrecision()``: no quantization.

Both quantized recipes take TransformerEngine's ``backward_override`` (None, "high_precision" or
"dequantized"): the recipe's forward, then dgrad and wgrad unquantized, on x and W as given or on
their rowwise quantizations dequantized to x's dtype, and the unquantized dy.

Recipes are immutable values (docs/training.md states their numerics).

An argument left out takes its default from TransformerEngine's environment variable, as TE's
recipe fields do: ``NVTE_NVFP4_DISABLE_RHT``, ``NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING``,
``NVTE_NVFP4_DISABLE_2D_QUANTIZATION``, ``NVTE_NVFP4_ROW_SCALED_ACTIVATION`` ("1" turns each on),
``NVTE_NVFP4_4OVER6``, ``NVTE_NVFP4_4OVER6_E4M3_USE_256``, ``NVTE_NVFP4_4OVER6_ERR_MODE`` and
``NVTE_BACKWARD_OVERRIDE`` (both recipes). TE reads them once, when it is imported; here when a
recipe is made. An argument given, None for ``backward_override`` too, wins over its variable.
``nvfp4_4over6_err_use_fast_math`` (4over6's error in the scaled domain) is not a field of TE's
recipe: TE reads ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH`` at each 4over6 quantization; here the
recipe takes it, from that variable when left out.
"""

import os

from . import _C
from ._C import Format, HighPrecision

__all__ = ["Format", "HighPrecision", "MXFP8BlockScaling", "NVFP4BlockScaling"]

_FROM_ENVIRONMENT = object()  # an argument left out (None is a value of backward_override)


def _flag(name):
    """TE's reading of a boolean variable: on only for "1"."""
    return os.environ.get(name, "0") == "1"


def _override(value):
    return os.environ.get("NVTE_BACKWARD_OVERRIDE") if value is _FROM_ENVIRONMENT else value


class NVFP4BlockScaling(_C.NVFP4BlockScaling):
    __doc__ = _C.NVFP4BlockScaling.__doc__

    def __init__(self, *, disable_rht=None, disable_stochastic_rounding=None, disable_2d_quantization=None,
                 backward_override=_FROM_ENVIRONMENT, nvfp4_4over6=None, nvfp4_4over6_e4m3_use_256=None,
                 nvfp4_4over6_err_mode=None, row_scaled_activation=None, nvfp4_4over6_err_use_fast_math=None):
        def pick(value, default):
            return default if value is None else value

        super().__init__(
            disable_rht=pick(disable_rht, _flag("NVTE_NVFP4_DISABLE_RHT")),
            disable_stochastic_rounding=pick(disable_stochastic_rounding,
                                             _flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING")),
            disable_2d_quantization=pick(disable_2d_quantization, _flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION")),
            backward_override=_override(backward_override),
            nvfp4_4over6=pick(nvfp4_4over6, os.environ.get("NVTE_NVFP4_4OVER6", "none")),
            nvfp4_4over6_e4m3_use_256=pick(nvfp4_4over6_e4m3_use_256,
                                           os.environ.get("NVTE_NVFP4_4OVER6_E4M3_USE_256", "all")),
            nvfp4_4over6_err_mode=pick(nvfp4_4over6_err_mode, os.environ.get("NVTE_NVFP4_4OVER6_ERR_MODE", "MAE")),
            row_scaled_activation=pick(row_scaled_activation, _flag("NVTE_NVFP4_ROW_SCALED_ACTIVATION")),
            nvfp4_4over6_err_use_fast_math=pick(nvfp4_4over6_err_use_fast_math,
                                                _flag("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH")))


class MXFP8BlockScaling(_C.MXFP8BlockScaling):
    __doc__ = _C.MXFP8BlockScaling.__doc__

    def __init__(self, *, fp8_format=Format.E4M3, backward_override=_FROM_ENVIRONMENT, enable_2d_quantization=False):
        super().__init__(fp8_format=fp8_format, backward_override=_override(backward_override),
                         enable_2d_quantization=enable_2d_quantization)
