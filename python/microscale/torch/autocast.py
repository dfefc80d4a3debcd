"""The autocast scope: which recipe the Linear layers of this thread run under.

A stack per thread: scopes nest, the inner one wins, leaving a scope (also by an exception)
restores the outer state. (TransformerEngine's ``autocast`` / ``fp8_autocast`` nest the same way.) Backward passes
use the recipe their forward ran under, whatever scope they run in.
"""

import contextlib
import threading

from ..recipe import HighPrecision, NVFP4BlockScaling

_state = threading.local()


def _stack():
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


@contextlib.contextmanager
def autocast(enabled=True, *, recipe=None):
    """Runs the block under ``recipe`` (default NVFP4BlockScaling()) when ``enabled``; a disabled
    scope runs its block in high precision, even inside an enabled one."""
    if recipe is None:
        recipe = NVFP4BlockScaling()
    stack = _stack()
    stack.append((bool(enabled), recipe))
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
