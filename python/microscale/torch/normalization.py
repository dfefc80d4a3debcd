"""The normalizations of LayerNormLinear and LayerNormMLP, as TransformerEngine defines them
(its modules' `normalization`, `eps` and `zero_centered_gamma`): computed in fp32 from the input
and fp32 copies of the parameters, the result rounded once to the input's dtype. The quantized
GEMM after it quantizes that result (TransformerEngine's fused kernels may quantize the fp32
result directly; its own PyTorch reference in its tests rounds first, as here)."""

import torch

from .. import _C

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def require_normalization(name):
    if name not in NORMALIZATIONS:
        raise _C.Error(f"microscale.torch: unknown normalization '{name}' ({', '.join(NORMALIZATIONS)})")


def norm_parameters(module, features, normalization, params_dtype, device):
    """Registers TransformerEngine's parameters on `module`: layer_norm_weight [features] and, for
    LayerNorm, layer_norm_bias [features] (initialised by reset_norm_parameters)."""
    require_normalization(normalization)
    module.layer_norm_weight = torch.nn.Parameter(torch.empty(features, dtype=params_dtype, device=device))
    if normalization == "LayerNorm":
        module.layer_norm_bias = torch.nn.Parameter(torch.empty(features, dtype=params_dtype, device=device))
    else:
        module.register_parameter("layer_norm_bias", None)


def reset_norm_parameters(module, zero_centered_gamma):
    """gamma = 1 (stored as 0 when zero_centered_gamma, which stores gamma - 1), beta = 0."""
    with torch.no_grad():
        module.layer_norm_weight.fill_(0.0 if zero_centered_gamma else 1.0)
        if module.layer_norm_bias is not None:
            module.layer_norm_bias.zero_()


def normalize(x, normalization, weight, bias, eps, zero_centered_gamma):
    """LayerNorm or RMSNorm of x [..., features] over its last dim: in fp32, then in x's dtype."""
    gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
    features = (x.shape[-1],)
    if normalization == "LayerNorm":
        out = torch.nn.functional.layer_norm(x.float(), features, gamma, bias.float(), eps)
    else:
        out = torch.nn.functional.rms_norm(x.float(), features, gamma, eps)
    return out.to(x.dtype)
