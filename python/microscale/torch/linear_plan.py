"""A recipe as the quantized Linear reads it: quantize's arguments for each of its three operands
(x, W, dy) and the backward override, as plain Python values.

Recipes are C++ objects (microscale._C), which torch.compile cannot look into. The autocast scope
keeps each recipe's plan beside it, made eagerly when the scope is entered, so that a Linear
traced by torch.compile reads only Python values: dynamo guards on the plan, and a compiled model
runs again under another recipe's scope by compiling again. The plan's values come from the C++
`quantize_options` (the one place that says what a recipe quantizes, and how), never restated
here.
"""

import collections
import threading
from dataclasses import dataclass, field
from typing import Optional

import torch

from .. import _C
from ..recipe import HighPrecision
from .ops import QuantizeSpec


@dataclass(frozen=True)
class OperandOptions(QuantizeSpec):
    """quantize's arguments for one operand of the Linear (a QuantizeSpec's, and whether it rounds
    stochastically), under the attribute names of _C.QuantizeOptions (quantize_for takes either).
    sr_seed: None, or 0 where the recipe rounds this operand stochastically (the seed itself is
    drawn per call)."""

    sr_seed: Optional[int] = None


@dataclass(frozen=True)
class LinearPlan:
    """What a quantized recipe makes of the Linear's operands. ``recipe`` is the C++ recipe (the
    CPU layer and the weight cache take it); it takes no part in comparisons: two plans of equal
    recipes are equal."""

    input: OperandOptions
    weight: OperandOptions
    grad_output: OperandOptions
    backward_override: Optional[str]  # None, "high_precision" or "dequantized" (TransformerEngine's)
    recipe: object = field(compare=False, repr=False)


def _operand_options(recipe, role):
    o = _C.quantize_options(recipe, role)
    return OperandOptions(o.scheme, o.rowwise, o.columnwise, o.scale_mode, o.tile, o.rht, o.swizzle, o.four_over_six,
                          o.four_over_six_scaled_error, o.nvfp4_e4m3_max, o.row_scaled,
                          sr_seed=None if o.sr_seed is None else 0)


# Plans by their recipe's repr (recipes are immutable values: equal reprs, equal recipes), the
# most recent _PLANS_KEPT: equal recipes made anew (a scope per step) share one plan, made once.
_PLANS_KEPT = 64
_plans = collections.OrderedDict()
_plans_lock = threading.Lock()


def _plan_of(recipe):
    key = repr(recipe)
    with _plans_lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
            return plan
    plan = LinearPlan(_operand_options(recipe, "input"), _operand_options(recipe, "weight"),
                      _operand_options(recipe, "grad_output"), recipe.backward_override, recipe)
    with _plans_lock:
        plan = _plans.setdefault(key, plan)  # another thread's, if it got there first
        if len(_plans) > _PLANS_KEPT:
            _plans.popitem(last=False)
    return plan


# A scope entered inside traced code makes its plan here: dynamo calls this eagerly and keeps the
# result as a constant of the graph, guarded on the recipe object's identity (it cannot trace into
# the C++ recipe). A recipe made anew on every call there compiles anew: make it once.
@torch.compiler.assume_constant_result
def linear_plan(recipe):
    """The plan of a quantized recipe; None for HighPrecision (the Linear is then
    torch.nn.functional.linear). Equal recipes (equal reprs) give the same plan object, so a
    compiled model's guard on the plan of a scope entered outside it holds across scopes that each
    make their recipe anew. The plan's `recipe` is the first of them (an equal value)."""
    if isinstance(recipe, HighPrecision):
        return None
    return _plan_of(recipe)
