"""The microscale::* torch.library ops: each defined by its schema, with one Python body for CPU
and CUDA tensors and a fake implementation (the outputs' shapes, for torch.compile's tracing).

Defined with torch.library.Library rather than torch.library.custom_op: custom_op adds an
autograd kernel and a backend wrapper in Python around every call, which cost ~10-20 us of host
time per call on the development machine (perf.md). These ops need neither: their outputs carry
no gradient (the Linear's autograd function holds the gradients; its traced forward and backward
call the ops on detached tensors)."""

import torch

# The namespace, defined once; the Library object must outlive the ops.
_LIBRARY = torch.library.Library("microscale", "DEF")


def define_op(schema, body, fake):
    """Defines microscale::<name> from ``schema`` ("name(args) -> outputs"): ``body`` runs it on
    CPU and CUDA tensors, ``fake`` gives its outputs' metadata. Returns the op (an OpOverload)."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    for dispatch_key in ("CPU", "CUDA"):
        _LIBRARY.impl(name, body, dispatch_key)
    torch.library.register_fake(f"microscale::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.microscale, name).default
