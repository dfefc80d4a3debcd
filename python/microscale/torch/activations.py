"""The activations of TransformerEngine's LayerNormMLP, by its names, as its CUDA kernels compute
them: in fp32 from the input's values, by its formulas (transformer_engine/common/util/math.h, the
same constants and order of operations), rounded once to the input's dtype, forward and backward.

A gated one ("geglu", "swiglu", ...) splits its input's last dim in two halves, a and b, and gives
act(a) * b, the product in fp32 before the one rounding, as TransformerEngine's gated kernels
(FC1 then has twice ffn_hidden_size outputs). Computing op by op in bf16 instead would round
act(a) before the product: a second rounding that TransformerEngine does not make.

The relu family (relu, srelu, reglu, sreglu) is exact arithmetic before the rounding, so it gives
TransformerEngine's bytes; the others call tanh and exp, whose last fp32 bit may differ between
torch's implementations and the CUDA math library that TransformerEngine's kernels use."""

import torch

from .. import _C


# The functions of a float32 tensor and their derivatives, TransformerEngine's formulas.
def _gelu(x):  # the tanh approximation
    return x * (0.5 + 0.5 * torch.tanh(x * (0.79788456 + 0.03567741 * x * x)))


def _dgelu(x):
    t = torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x))
    return 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)


def _sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def _dsigmoid(x):
    s = _sigmoid(x)
    return s * (1.0 - s)


def _qgelu(x):
    return x * _sigmoid(1.702 * x)


def _dqgelu(x):
    return 1.702 * x * _dsigmoid(1.702 * x) + _sigmoid(1.702 * x)


def _silu(x):
    return x * _sigmoid(x)


def _dsilu(x):
    return x * _dsigmoid(x) + _sigmoid(x)


def _relu(x):  # fmaxf(x, 0): 0 for NaN too
    return torch.where(x > 0, x, 0.0)


def _drelu(x):
    return (x > 0).to(x.dtype)


def _srelu(x):
    return torch.where(x > 0, x * x, 0.0)


def _dsrelu(x):  # fmaxf(2x, 0)
    return torch.where(2.0 * x > 0, 2.0 * x, 0.0)


# name -> (the function of a (or of the whole input), its derivative, gated)
ACTIVATIONS = {
    "gelu": (_gelu, _dgelu, False),
    "geglu": (_gelu, _dgelu, True),
    "qgelu": (_qgelu, _dqgelu, False),
    "qgeglu": (_qgelu, _dqgelu, True),
    "relu": (_relu, _drelu, False),
    "reglu": (_relu, _drelu, True),
    "srelu": (_srelu, _dsrelu, False),
    "sreglu": (_srelu, _dsrelu, True),
    "silu": (_silu, _dsilu, False),
    "swiglu": (_silu, _dsilu, True),
    "glu": (_sigmoid, _dsigmoid, True),
}


def is_gated(name):
    """Whether `name` is a gated activation (FC1 makes twice the features); an error for an unknown one."""
    if name not in ACTIVATIONS:
        raise _C.Error(f"microscale.torch: unknown activation '{name}' ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name][2]


class _Activation(torch.autograd.Function):
    """y = act(x) (gated: act(a) * b) in fp32, rounded once to x's dtype; backward from the saved
    input, in fp32 by the derivative's formula, rounded once: dx = dy * act'(x) (gated: da =
    act'(a) * dy * b, db = act(a) * dy, TransformerEngine's order of the products)."""

    @staticmethod
    def forward(ctx, x, name):
        function, _, gated = ACTIVATIONS[name]
        ctx.save_for_backward(x)
        ctx.name = name
        x32 = x.detach().float()
        if not gated:
            return function(x32).to(x.dtype)
        a, b = x32.chunk(2, dim=-1)
        return (function(a) * b).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        function, derivative, gated = ACTIVATIONS[ctx.name]
        x32, dy32 = x.float(), dy.float()
        if not gated:
            return (dy32 * derivative(x32)).to(x.dtype), None
        a, b = x32.chunk(2, dim=-1)
        da = derivative(a) * dy32 * b
        db = function(a) * dy32
        return torch.cat([da, db], dim=-1).to(x.dtype), None


def activate(x, name):
    """The activation `name` of x [..., features] (gated: of its two halves), in x's dtype."""
    is_gated(name)
    return _Activation.apply(x, name)
