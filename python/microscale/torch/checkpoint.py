"""Activation checkpointing under the autocast scope, as TransformerEngine's ``te.checkpoint``.

torch.utils.checkpoint recomputes a region's forward during backward, outside the autocast
scope the forward ran in: a quantized Linear recomputed there would run in high precision and
save other tensors than its forward did (torch's checkpoint then fails on their metadata, or the
gradients come from another computation). ``checkpoint`` re-enters, for the recomputation, the
scope in force when the region ran, through torch's non-reentrant checkpoint and its context_fn.
"""

import contextlib

import torch.utils.checkpoint

from .autocast import autocast, autocast_enabled, current_recipe


def checkpoint(function, *args, **kwargs):
    """torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs), the
    recomputation under the autocast scope of this call (recipe and enabled state). The tensors
    the region's Linear layers save (their quantized operands; a CPU layer under the hooks runs
    composed, quantized_linear.saved_tensor_hooks_active) are dropped after the forward and made
    again in backward, with the same bytes and gradients. ``kwargs`` go to torch's checkpoint, but
    use_reentrant (False here: the reentrant form has no context_fn) and context_fn (this one's)."""
    for name in ("use_reentrant", "context_fn"):
        if name in kwargs:
            raise TypeError(f"microscale.torch.checkpoint sets {name} itself")
    if torch.compiler.is_compiling():
        # Traced, the region becomes part of the graph and its recomputation is the traced
        # operations, made under the scope in force when they were traced: no scope to re-enter
        # (and dynamo takes no context_fn of this kind).
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)
    enabled, recipe = autocast_enabled(), current_recipe()

    def contexts():
        # The forward runs in the caller's scope already; the recomputation re-enters it.
        return contextlib.nullcontext(), autocast(enabled=enabled, recipe=recipe if enabled else None)

    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, context_fn=contexts, **kwargs)
