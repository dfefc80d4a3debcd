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
- ``MXFP8BlockScaling(fp8_format=Format.E4M3)``: blocks of 32, E8M0 scales (RCEIL); HYBRID takes
  E5M2 for gradients.
- ``HighPrecision()``: no quantization.

Both quantized recipes take TransformerEngine's ``backward_override`` (None, "high_precision" or
"dequantized"): the recipe's forward, then dgrad and wgrad unquantized, on x and W as given or on
their rowwise quantizations dequantized to x's dtype, and the unquantized dy.

Recipes are immutable values (docs/training.md states their numerics).
"""

from ._C import Format, HighPrecision, MXFP8BlockScaling, NVFP4BlockScaling

__all__ = ["Format", "HighPrecision", "MXFP8BlockScaling", "NVFP4BlockScaling"]
