"""The normalizations of LayerNormLinear and LayerNormMLP, as TransformerEngine defines them
(its modules' `normalization`, `eps` and `zero_centered_gamma`): computed in fp32 from the input
and fp32 copies of the parameters, the result rounded once to the input's dtype. The quantized
GEMM after it quantizes that result, as TransformerEngine does (its normalization kernels write
the input's dtype, and its fused NVFP4 path takes the amax of those rounded values). Also its
standalone LayerNorm and RMSNorm modules, in high precision as its are."""

import torch

from .. import _C
from .tensor_parallel import mark_sequence_parallel

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


def reset_norm_parameters(weight, bias, zero_centered_gamma, sequence_parallel=False):
    """gamma = 1 (stored as 0 when zero_centered_gamma, which stores gamma - 1), beta = 0 (bias
    None for RMSNorm); both flagged with Megatron-LM's sequence_parallel
    (tensor_parallel.mark_sequence_parallel), as TransformerEngine flags them."""
    with torch.no_grad():
        weight.fill_(0.0 if zero_centered_gamma else 1.0)
        if bias is not None:
            bias.zero_()
    mark_sequence_parallel(weight, sequence_parallel)
    mark_sequence_parallel(bias, sequence_parallel)


def normalize(x, normalization, weight, bias, eps, zero_centered_gamma):
    """LayerNorm or RMSNorm of x [..., features] over its last dim: in fp32, then in x's dtype."""
    gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
    features = (x.shape[-1],)
    if normalization == "LayerNorm":
        out = torch.nn.functional.layer_norm(x.float(), features, gamma, bias.float(), eps)
    else:
        out = torch.nn.functional.rms_norm(x.float(), features, gamma, eps)
    return out.to(x.dtype)


class _Norm(torch.nn.Module):
    """TransformerEngine's standalone normalization modules: parameters `weight` (gamma; gamma - 1
    with zero_centered_gamma) and, for LayerNorm, `bias`, of params_dtype (default: torch's
    default dtype), gamma 1 and beta 0 to begin with; forward in fp32, rounded once to x's dtype.
    ``sequence_parallel`` marks the parameters for Megatron-LM's gradient sum over the
    tensor-parallel group (tensor_parallel.mark_sequence_parallel), as TransformerEngine does."""

    normalization = None  # "LayerNorm" or "RMSNorm"

    # Keyword arguments after eps: TransformerEngine's third position holds sequence_parallel.
    def __init__(self, hidden_size, eps=1e-5, *, sequence_parallel=False, params_dtype=None, zero_centered_gamma=False,
                 device=None):
        super().__init__()
        self.sequence_parallel = sequence_parallel
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        self.hidden_size, self.eps, self.zero_centered_gamma = hidden_size, eps, zero_centered_gamma
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        if self.normalization == "LayerNorm":
            self.bias = torch.nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        reset_norm_parameters(self.weight, self.bias, self.zero_centered_gamma, self.sequence_parallel)

    def forward(self, x):
        return normalize(x, self.normalization, self.weight, self.bias, self.eps, self.zero_centered_gamma)

    def extra_repr(self):
        return f"{self.hidden_size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"


class LayerNorm(_Norm):
    """TransformerEngine's LayerNorm(hidden_size, eps): (x - mean) / sqrt(var + eps) * gamma + beta
    over the last dim."""

    normalization = "LayerNorm"


class RMSNorm(_Norm):
    """TransformerEngine's RMSNorm(hidden_size, eps): x / sqrt(mean(x^2) + eps) * gamma over the last
    dim."""

    normalization = "RMSNorm"
