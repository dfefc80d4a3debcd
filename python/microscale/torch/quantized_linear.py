"""The quantized Linear as a function of its tensors, for every layer of this package that holds
one (Linear, LayerNormLinear, LayerNormMLP, GroupedLinear): y = x W^T (+ b) under the autocast
scope's recipe, the weight's quantization kept in a WeightCache when is_first_microbatch says so,
forward and backward through the C++ layer (CPU tensors) or linear_composed.py (CUDA tensors, and
CPU tensors under saved-tensor hooks: activation checkpointing, offloading).

Traced by torch.compile, the layer is linear_composed.py's autograd function on either device,
its quantize, gemm and column-sum calls the library's ops, so that dynamo records the layer whole
in the model's graph (fullgraph=True works). There the weight is quantized inside the graph on
every call, whatever is_first_microbatch says (the kept quantization is Python state, which a
graph does not read), and fuse_wgrad_accumulation, whose backward writes weight.main_grad
in place, runs the layer eagerly (a graph break on each side)."""

import math

import torch

from .. import _C
from .autocast import current_plan
from .linear_composed import NO_CONTEXT, ComposedLinearFunction, main_grad_of, quantize_for, wgrad_result
from .linear_high_precision import HighPrecisionLinearFunction
from .tensor_parallel import initialise

# Read once: under torch.compile a call into the C++ module would be a graph break.
_CUDA_BUILT = _C.cuda_built()


def _tensor(array):
    return None if array is None else torch.from_dlpack(array)


class _LinearFunction(torch.autograd.Function):
    """The layer on CPU tensors: the C++ linear_forward / linear_backward (docs/training.md)."""

    @staticmethod
    def forward(ctx, x, weight, bias, plan, cached_weight, training, fuse_wgrad_accumulation):
        # contiguous: the library folds x to [M, K] in place only where its strides allow
        y, context = _C.linear_forward(x.detach().contiguous(), weight.detach(),
                                       None if bias is None else bias.detach(), plan.recipe, training, cached_weight,
                                       weight_grad=weight.requires_grad)
        ctx.context = context
        # Only a quantized backward rounds stochastically (a backward_override's backward does not).
        ctx.draws_seed = plan.grad_output.sr_seed is not None and plan.backward_override is None
        ctx.weight = weight if fuse_wgrad_accumulation else None  # its main_grad, read in backward
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _tensor(y)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        if ctx.context is None:
            raise RuntimeError(NO_CONTEXT)
        # Only stochastic rounding draws from torch's generator (other recipes leave its stream alone).
        sr_seed = int(torch.randint(0, 2**62, (1,)).item()) if ctx.draws_seed else 0
        main_grad = main_grad_of(ctx.weight) if ctx.weight is not None and ctx.needs_input_grad[1] else None
        dx, dw, db = _C.linear_backward(
            grad_output.detach().contiguous(), ctx.context,
            compute_grad_input=ctx.needs_input_grad[0],
            compute_grad_weight=ctx.needs_input_grad[1],
            compute_grad_bias=ctx.bias_dtype is not None and ctx.needs_input_grad[2],
            main_grad=main_grad, sr_seed=sr_seed)
        # Frees the saved quantized operands, as autograd frees saved tensors (so a second backward,
        # even with retain_graph=True, is the error above).
        ctx.context = None
        grad_input = _tensor(dx) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = wgrad_result(ctx.weight) if main_grad is not None else _tensor(dw).to(ctx.weight_dtype)
        grad_bias = _tensor(db).to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias, None, None, None, None


class WeightCache:
    """A weight's quantization under a recipe, kept when the caller says so, as TransformerEngine
    decides (its forward's is_first_microbatch): None quantizes the weight on every call and keeps
    nothing; True quantizes it and keeps the result; False reuses what was kept (and quantizes and
    keeps it when nothing usable was: none yet, or another shape, dtype, device or recipe, or the
    other form of the layer: a CPU layer run under saved-tensor hooks is the composed one, whose
    quantization is a torch-level QuantizedTensor, and outside them the C++ one).

    Nothing is kept unasked because no check of the weight can be trusted to see every change:
    FSDP2 writes the gathered weight into the same storage without moving its version counter,
    and a write through .data moves nothing either."""

    def __init__(self):
        self.key = None
        self.quantized = None  # a torch-level QuantizedTensor (CUDA) or the C++ one (CPU)
        self.quantizations = 0  # how many times the weight was quantized (the cache's tests)

    def get(self, weight, plan, is_first_microbatch, composed):
        """The weight quantized under `plan` (a LinearPlan; both usages): a torch-level
        QuantizedTensor for the composed layer (`composed`; every CUDA layer), the C++ one for the
        C++ layer. is_first_microbatch: see the class."""
        if weight.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Captured into a CUDA graph: the weight is quantized inside the graph, so that each replay
            # quantizes what the weight holds then (an optimizer step between replays writes it in
            # place, unseen by any check made at capture). Not kept: the graph owns that memory, and
            # a kept quantization captured as a constant would be stale, or freed, later.
            self.forget_unless_reused(is_first_microbatch)
            self.quantizations += 1
            return quantize_for(weight.detach(), plan.weight)
        key = (tuple(weight.shape), weight.dtype, weight.device, plan, composed)
        if _reuses(is_first_microbatch) and key == self.key:
            return self.quantized
        if composed:  # a torch-level QuantizedTensor on the weight's device
            quantized = quantize_for(weight.detach(), plan.weight)
        else:  # the C++ QuantizedTensor that _C.linear_forward takes
            quantized = _C.quantize(weight.detach(), _C.quantize_options(plan.recipe, "weight"), False)
        self.quantizations += 1
        # None keeps nothing, and lets go of what an earlier call kept (its memory, and a stale value).
        self.key, self.quantized = (None, None) if is_first_microbatch is None else (key, quantized)
        return quantized

    def forget_unless_reused(self, is_first_microbatch):
        """Lets go of the kept quantization, for a call that does not quantize the weight into the
        cache (high precision, an expert given no rows, a CUDA-graph capture) where the caller did
        not ask to reuse it: a later call asking to reuse it must not get an older weight."""
        if not _reuses(is_first_microbatch):
            self.key = self.quantized = None


def _reuses(is_first_microbatch):
    """TransformerEngine's reading of is_first_microbatch: False (or another falsy value but None)
    reuses the kept quantization."""
    return is_first_microbatch is not None and not is_first_microbatch


def quantized_linear(x, weight, bias, cache, *, is_first_microbatch=None, fuse_wgrad_accumulation=False,
                     rows_gathered_over=None):
    """x W^T (+ bias) under the autocast scope's recipe: torch.nn.functional.linear outside an
    enabled scope (with main_grad or a share of a gathered x for backward:
    linear_high_precision.py), else the quantized layer's forward (and its backward through autograd), the
    weight's quantization from `cache` (a WeightCache); traced by torch.compile, the composed
    layer with the weight quantized in the graph (the module's docstring). rows_gathered_over: the
    group whose ranks' rows x stacks (TensorParallel.gathered_rows_group), or None; the layer then
    keeps a tp_size-th of x for backward, in the composed layer on either device (the C++ layer
    keeps its operands whole)."""
    plan = current_plan()
    if plan is None:  # no enabled scope, or HighPrecision
        if not torch.compiler.is_compiling():
            cache.forget_unless_reused(is_first_microbatch)
        # main_grad, or a share of a gathered x, for backward (linear_high_precision.py); traced
        # with main_grad, eagerly (its in-place addition), as the quantized layer
        special = fuse_wgrad_accumulation or rows_gathered_over is not None
        if special and torch.is_grad_enabled() and weight.requires_grad:
            run = _untraced_high_precision if fuse_wgrad_accumulation and torch.compiler.is_compiling() else \
                HighPrecisionLinearFunction.apply
            return run(x, weight, bias, fuse_wgrad_accumulation, rows_gathered_over)
        return torch.nn.functional.linear(x, weight, bias)
    devices = {x.device.type, weight.device.type}
    if devices not in ({"cpu"}, {"cuda"}):
        raise _C.Error(f"microscale.torch.Linear: x is on {x.device} and the weight on {weight.device}; "
                       "the quantized Linear runs on CPU or CUDA tensors, both on one device")
    if devices == {"cuda"} and not _CUDA_BUILT:
        raise _C.Error("microscale.torch.Linear: this build has no CUDA backend")
    training = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if torch.compiler.is_compiling():
        if fuse_wgrad_accumulation:
            return _untraced_linear(x, weight, bias, plan, cache, is_first_microbatch, training, True,
                                    rows_gathered_over)
        return ComposedLinearFunction.apply(x, weight, bias, plan, None, training, False, rows_gathered_over)
    return _eager_linear(x, weight, bias, plan, cache, is_first_microbatch, training, fuse_wgrad_accumulation,
                         rows_gathered_over)


def _eager_linear(x, weight, bias, plan, cache, is_first_microbatch, training, fuse_wgrad_accumulation,
                  rows_gathered_over):
    """The layer run eagerly: the C++ layer on CPU tensors, the composed one on CUDA tensors, where
    a share of a gathered x is kept (rows_gathered_over) and where saved-tensor hooks would miss
    the C++ layer's context (a training step under them), the weight's quantization from the
    cache."""
    composed = x.device.type == "cuda" or rows_gathered_over is not None or (training and saved_tensor_hooks_active())
    quantized_weight = cache.get(weight, plan, is_first_microbatch, composed=composed)
    if composed:
        return ComposedLinearFunction.apply(x, weight, bias, plan, quantized_weight, training,
                                            fuse_wgrad_accumulation, rows_gathered_over)
    return _LinearFunction.apply(x, weight, bias, plan, quantized_weight, training, fuse_wgrad_accumulation)


def saved_tensor_hooks_active():
    """Whether torch's saved-tensor hooks are in force (torch.utils.checkpoint's non-reentrant form,
    torch.autograd.graph.save_on_cpu, saved_tensors_hooks of one's own). They see only what
    ctx.save_for_backward saves, so a CPU layer then runs composed, its quantized operands saved
    tensors (the C++ layer keeps them in a context object no hook sees: nothing would be dropped
    or moved). The composed layer's results are the C++ layer's, bit for bit. NOTE: torch has no
    public query for the hooks in force; this is the one torch.compile's tracer uses, and without
    it the C++ layer runs, as before."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return False
    try:
        return top(False) is not None  # ignore_is_tracing=False: eager calls only reach here
    except TypeError:  # a torch whose form takes no argument
        return top() is not None


# What a traced layer calls for what it cannot trace: a graph break on each side. (Eager calls
# take _eager_linear itself: the wrapper costs host time.)
_untraced_linear = torch.compiler.disable(_eager_linear)
_untraced_high_precision = torch.compiler.disable(HighPrecisionLinearFunction.apply)


def returned_bias(bias, x):
    """The bias a layer with TransformerEngine's return_bias returns beside y: in x's dtype, or an
    empty tensor for a layer without one (as TransformerEngine returns)."""
    if bias is None:
        return torch.empty(0, dtype=x.dtype, device=x.device)
    return bias.to(x.dtype)


def init_linear_parameters(weight, bias, init_method=None, *, fan_in=None, get_rng_state_tracker=None,
                           rng_tracker_name=None, bias_split=False):
    """A layer's weight [out, in] and bias [out] (or None) initialised as torch.nn.Linear's
    (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) both, fan_in the weight's columns unless given: a
    row-parallel shard's is the whole layer's in_features), or, with TransformerEngine's
    init_method, the weight by init_method(weight) and the bias to zeros, as TransformerEngine
    does. The weight's random draws run under TransformerEngine's RNG tracker when one is given
    (tensor_parallel.initialise: each tensor-parallel rank draws its own shard), and so does the
    bias's where it is split over the ranks too (`bias_split`); a bias whole on every rank is
    drawn from torch's generator, alike on every rank."""
    if init_method is not None:
        with torch.no_grad():
            initialise(weight, init_method, get_rng_state_tracker, rng_tracker_name)
            if bias is not None:
                bias.zero_()
        return
    fan_in = weight.shape[1] if fan_in is None else fan_in

    def uniform(bound):  # U(-bound, bound), in place
        def draw(tensor):
            with torch.no_grad():
                tensor.uniform_(-bound, bound)
        return draw

    # torch.nn.init.kaiming_uniform_(weight, a=sqrt(5))'s bound for this fan-in, in its order of
    # operations: 1/sqrt(fan_in)
    std = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5)) / math.sqrt(fan_in) if fan_in > 0 else 0.0
    initialise(weight, uniform(math.sqrt(3.0) * std), get_rng_state_tracker, rng_tracker_name)
    if bias is not None:
        bias_bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        tracker = get_rng_state_tracker if bias_split else None
        initialise(bias, uniform(bias_bound), tracker, rng_tracker_name)


def te_outputs(y, x, bias, ln_out, return_bias, return_layernorm_output):
    """A layer's outputs in TransformerEngine's order: y; then, with return_bias, the bias left out
    of y (returned_bias); then, with return_layernorm_output, the normalization's output. y alone
    when neither is asked for."""
    outputs = (y,) + ((returned_bias(bias, x),) if return_bias else ()) + ((ln_out,) if return_layernorm_output else ())
    return outputs if len(outputs) > 1 else y


class QuantizedModule(torch.nn.Module):
    """The base of this package's layers: a TransformerEngine module's state dict loads into them
    strictly, its `_extra_state` entry (TE's FP8 metadata; nothing here reads it) dropped. Each
    layer has its tensor-parallel setup as `self.tp` (tensor_parallel.attach)."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.pop(prefix + "_extra_state", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_tensor_parallel_group(self, tp_group):
        """TransformerEngine's: the group the layer's tensor-parallel collectives run on (None:
        torch.distributed's default group)."""
        self.tp.set_group(tp_group)

    @property
    def tp_group(self):
        """TransformerEngine's attribute: the tensor-parallel group (None: none given, or the default)."""
        return self.tp.group
