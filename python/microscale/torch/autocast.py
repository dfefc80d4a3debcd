"""The autocast scope: which recipe the Linear layers of this thread run under.

A stack per thread: scopes nest, the inner one wins, leaving a scope (also by an exception)
restores the outer state. (TransformerEngine's ``autocast`` / ``fp8_autocast`` nest the same way.) Backward passes
use the recipe their forward ran under, whatever scope they run in.

Each scope keeps its recipe's LinearPlan (linear_plan.py), made on entering it: a Linear traced by
torch.compile reads the plan, Python values dynamo can guard on, where the recipe is a C++ object.
"""

import contextlib
import threading

from .. import _C
from ..recipe import HighPrecision, MXFP8BlockScaling, NVFP4BlockScaling
from .linear_plan import linear_plan

_state = threading.local()

# autocast()'s recipe when none is given: one object (recipes are immutable values), so that a scope
# entered inside code torch.compile traces makes no C++ object there, which dynamo cannot trace.
_DEFAULT_RECIPE = NVFP4BlockScaling()


def _stack():
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


@contextlib.contextmanager
def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
    """Runs the block under ``recipe`` (default NVFP4BlockScaling()) when ``enabled``; a disabled
    scope runs its block in high precision, even inside an enabled one.

    The arguments are TransformerEngine's (``transformer_engine.pytorch.autocast``), in its order.
    ``calibrating`` (its statistics collection for delayed scaling) and ``amax_reduction_group``
    (its tensor-parallel modules' amax reduction) are not supported: setting them is an error.
    ``_graph`` (TransformerEngine's flag for CUDA-graph capture) has no effect: the layers find out
    themselves whether the stream is being captured."""
    if recipe is None:
        recipe = _DEFAULT_RECIPE
    if not isinstance(recipe, (NVFP4BlockScaling, MXFP8BlockScaling, HighPrecision)):
        raise _C.Error(f"microscale.torch.autocast: recipe must be NVFP4BlockScaling, MXFP8BlockScaling or "
                       f"HighPrecision (microscale.recipe), not {type(recipe).__name__}")
    if calibrating:
        raise _C.Error("microscale.torch.autocast: calibrating is not supported (TransformerEngine collects amaxes "
                       "for delayed scaling with it; these recipes scale each tensor from its own amax)")
    if amax_reduction_group is not None:
        raise _C.Error("microscale.torch.autocast: amax_reduction_group is not supported (amaxes are not reduced "
                       "across processes: the layers here are not tensor-parallel)")
    stack = _stack()
    stack.append((bool(enabled), recipe, linear_plan(recipe) if enabled else None))
    try:
        yield
    finally:
        stack.pop()


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
    stack = _stack()
    return stack[-1][2] if stack else None
