"""Swapping a model's torch.nn.Linear layers for microscale's quantized Linear, in place, as
torchao's convert_to_float8_training does for its own layers."""

import torch

from .linear import Linear


def _quantized_twin(linear, fuse_wgrad_accumulation):
    """A microscale Linear holding `linear`'s own Parameter objects (an optimizer built before the
    swap keeps updating them); made on the meta device, so nothing is allocated or initialised."""
    twin = Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  params_dtype=linear.weight.dtype, device="meta", fuse_wgrad_accumulation=fuse_wgrad_accumulation)
    twin.weight = linear.weight
    twin.bias = linear.bias
    twin.train(linear.training)
    return twin


def convert_linears(module, module_filter_fn=None, *, fuse_wgrad_accumulation=False):
    """Replaces every torch.nn.Linear inside `module` (the module itself too) by a
    microscale.torch.Linear over the same parameters, and returns the module. Outside an autocast
    scope the new layers compute what the old ones did (torch.nn.functional.linear); inside one,
    they quantize under its recipe.

    ``module_filter_fn(submodule, fqn) -> bool`` (torchao's argument) picks the layers to swap,
    fqn being the layer's name in the model ("layers.0.mlp.fc1"); subclasses of nn.Linear are
    left alone (their forward may do more than a Linear's). A layer found at several places
    becomes one quantized layer (one weight cache); hooks on the old layers are not carried over."""
    twins = {}  # id(old layer) -> its twin

    def swap(m, fqn):
        if id(m) in twins:
            return twins[id(m)]
        if type(m) is torch.nn.Linear and (module_filter_fn is None or module_filter_fn(m, fqn)):
            twins[id(m)] = _quantized_twin(m, fuse_wgrad_accumulation)
            return twins[id(m)]
        # _modules, not named_children(), which names a module found twice only once
        for name, child in list(m._modules.items()):
            if child is None:
                continue
            new = swap(child, f"{fqn}.{name}" if fqn else name)
            if new is not child:
                setattr(m, name, new)
        return m

    return swap(module, "")
