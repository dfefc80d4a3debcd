"""The autocast scope: which recipe the Linear layers of this thread run under.

A stack per thread: scopes nest, the inner one wins, leaving a scope (also by an exception)
restores the outer state. (TransformerEngine's ``autocast`` / ``fp8_autocast`` nest the same way.) Backward passes
use the recipe their forward ran under, whatever scope they run in.

Each scope keeps its recipe's LinearPlan (linear_plan.py), made on entering it: a Linear traced by
torch.compile reads the plan, Python values dynamo can guard on, where the recipe is a C++ object.
"""

import contextlib
import threading

from ..recipe import HighPrecision, NVFP4BlockScaling
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
def autocast(enabled=True, *, recipe=None):
    """Runs the block under ``recipe`` (default NVFP4BlockScaling()) when ``enabled``; a disabled
    scope runs its block in high precision, even inside an enabled one."""
    if recipe is None:
        recipe = _DEFAULT_RECIPE
    stack = _stack()
    stack.append((bool(enabled), recipe, linear_plan(recipe) if enabled else None))
    try:
        yield
    finally:
        stack.pop()


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
