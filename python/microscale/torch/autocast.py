"""The autocast scope: which recipe the Linear layers of this thread run under.

A stack per thread: scopes nest, the inner one wins, leaving a scope (also by an exception)
restores the outer state. (TransformerEngine's ``autocast`` / ``fp8_autocast`` nest the same way.) Backward passes
use the recipe their forward ran under, whatever scope they run in.

Each scope keeps its recipe's LinearPlan (linear_plan.py), made on entering it: a Linear traced by
torch.compile reads the plan, Python values dynamo can guard on, where the recipe is a C++ object.
"""

import contextlib
import threading

import torch
import torch.distributed as dist

from .. import _C
from ..recipe import HighPrecision, NVFP4BlockScaling
from .linear_plan import linear_plan

_state = threading.local()

# autocast()'s recipe when none is given: one object (recipes are immutable values), so that a scope
# entered inside code torch.compile traces makes no C++ object there, which dynamo cannot trace.
_DEFAULT_RECIPE = NVFP4BlockScaling()

# From torch 2.12 on, dynamo passes an object (the recipe) to linear_plan, a function of
# torch.compiler.assume_constant_result, guarding on its identity; older versions take only
# Python constants there, so a scope cannot be entered inside the code dynamo traces.
_PLANS_TRACED = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 12)


def _stack():
    """The thread's scopes, innermost last: (enabled, recipe)."""
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _plans():
    """The LinearPlan of each scope of _stack(), None for a disabled one. Kept apart from the
    recipes: a traced Linear reads only this list, and had it read a tuple holding the recipe too,
    dynamo (torch 2.11) would guard that the recipe is its plan's, so that equal recipes made anew
    per scope would each compile again."""
    if not hasattr(_state, "plans"):
        _state.plans = []
    return _state.plans


@contextlib.contextmanager
def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
    """Runs the block under ``recipe`` (default NVFP4BlockScaling()) when ``enabled``; a disabled
    scope runs its block in high precision, even inside an enabled one.

    The arguments are TransformerEngine's (``transformer_engine.pytorch.autocast``), in its order.
    ``calibrating`` (its statistics collection for delayed scaling) is not supported: setting it
    is an error. ``_graph`` (TransformerEngine's flag for CUDA-graph capture) has no effect: the layers find out
    themselves whether the stream is being captured. ``amax_reduction_group`` (TransformerEngine's
    group for reducing delayed scaling's amaxes at the end of a step; Megatron-LM passes it) is
    taken and needs nothing here: these recipes scale each tensor from its own amax, and a
    sequence-parallel layer quantizes its gathered input whole, with the tensor-parallel group's
    amax, as TransformerEngine's modules reduce it over tp_group."""
    if recipe is None:
        recipe = _DEFAULT_RECIPE
    # (the C++ classes: microscale.recipe's are their subclasses, which only pick the defaults)
    if not isinstance(recipe, (_C.NVFP4BlockScaling, _C.MXFP8BlockScaling, HighPrecision)):
        raise _C.Error(f"microscale.torch.autocast: recipe must be NVFP4BlockScaling, MXFP8BlockScaling or "
                       f"HighPrecision (microscale.recipe), not {type(recipe).__name__}")
    if calibrating:
        raise _C.Error("microscale.torch.autocast: calibrating is not supported (TransformerEngine collects amaxes "
                       "for delayed scaling with it; these recipes scale each tensor from its own amax)")
    if amax_reduction_group is not None and not _is_process_group(amax_reduction_group):
        raise _C.Error(f"microscale.torch.autocast: amax_reduction_group must be a torch.distributed process group "
                       f"or None, not {type(amax_reduction_group).__name__}")
    if enabled and not _PLANS_TRACED and torch.compiler.is_dynamo_compiling():
        raise _C.Error(f"microscale.torch.autocast: a scope entered inside code torch.compile traces needs torch >= "
                       f"2.12 (this is {torch.__version__}): enter it around the compiled function")
    stack, plans = _stack(), _plans()
    plan = linear_plan(recipe) if enabled else None
    stack.append((bool(enabled), recipe))
    plans.append(plan)
    try:
        yield
    finally:
        stack.pop()
        plans.pop()


def _is_process_group(group):
    return dist.is_available() and isinstance(group, dist.ProcessGroup)


def fp8_autocast(enabled=True, calibrating=False, fp8_recipe=None, fp8_group=None, _graph=False):
    """TransformerEngine's older name for autocast, with its older argument names: fp8_recipe is
    autocast's recipe, fp8_group its amax_reduction_group."""
    return autocast(enabled, calibrating, fp8_recipe, fp8_group, _graph)


def autocast_enabled():
    """Whether the innermost autocast scope of this thread is enabled."""
    stack = _stack()
    return bool(stack) and stack[-1][0]


def current_recipe():
    """The innermost enabled scope's recipe, else HighPrecision()."""
    stack = _stack()
    if stack and stack[-1][0]:
        return stack[-1][1]
    return HighPrecision()


def current_plan():
    """The innermost enabled scope's LinearPlan; None where the Linear runs in high precision (no
    enabled scope, or a HighPrecision recipe)."""
    plans = _plans()
    return plans[-1] if plans else None
