"""The activations of TransformerEngine's LayerNormMLP, by its names, as its own PyTorch reference
computes them (in the input's dtype). A gated one ("geglu", "swiglu", ...) splits its input's last
dim in two halves, a and b, and gives act(a) * b: FC1 then has twice ffn_hidden_size outputs."""

import torch

from .. import _C


def _quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def _squared_relu(x):
    return torch.nn.functional.relu(x).square()


def _gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


# name -> (the function of a (or of the whole input), gated)
ACTIVATIONS = {
    "gelu": (_gelu_tanh, False),
    "geglu": (_gelu_tanh, True),
    "qgelu": (_quick_gelu, False),
    "qgeglu": (_quick_gelu, True),
    "relu": (torch.nn.functional.relu, False),
    "reglu": (torch.nn.functional.relu, True),
    "srelu": (_squared_relu, False),
    "sreglu": (_squared_relu, True),
    "silu": (torch.nn.functional.silu, False),
    "swiglu": (torch.nn.functional.silu, True),
    "glu": (torch.sigmoid, True),
}


def is_gated(name):
    """Whether `name` is a gated activation (FC1 makes twice the features); an error for an unknown one."""
    if name not in ACTIVATIONS:
        raise _C.Error(f"microscale.torch: unknown activation '{name}' ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name][1]


def activate(x, name):
    """The activation `name` of x [..., features] (gated: of its two halves)."""
    function, gated = ACTIVATIONS[name]
    if not gated:
        return function(x)
    a, b = x.chunk(2, dim=-1)
    return function(a) * b
