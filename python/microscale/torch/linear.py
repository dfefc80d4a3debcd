"""The quantized Linear layer for PyTorch: y = x W^T + b under the autocast scope's recipe.

On the CPU, forward and backward are the C++ library's linear_forward / linear_backward
(docs/training.md); on CUDA, linear_composed.py composes the same three GEMMs from the CUDA ops:
fprop x.rowwise x W.rowwise; dgrad dy.rowwise x W.columnwise; wgrad dy.columnwise x x.columnwise;
each GEMM accumulates in fp32 over exactly dequantized blocks and rounds once to its output dtype
(y to x's dtype, dx and db to dy's, dW to x's and then, here, to the weight's). Stochastic rounding of NVFP4 gradients
draws its seed from torch's default generator, so torch.manual_seed makes a run repeatable (under
CUDA-graph capture, from torch's CUDA generator inside the graph: a new seed per replay).

The weight's quantization is cached until the weight changes (its version counter or storage),
so micro-batches between optimizer steps quantize it once; forward's is_first_microbatch
(TransformerEngine's argument) forces or skips the check; under CUDA-graph capture the weight is
quantized inside the graph, on every replay. A frozen weight (requires_grad False)
skips the wgrad GEMM and what only it needs (x's and dy's columnwise quantizations). With
fuse_wgrad_accumulation (TransformerEngine's argument) dW is added into weight.main_grad.
"""

import math

import torch

from .. import _C
from ..recipe import HighPrecision, NVFP4BlockScaling
from .autocast import autocast_enabled, current_recipe
from .linear_composed import NO_CONTEXT, ComposedLinearFunction, main_grad_of, quantize_for, wgrad_result


def _tensor(array):
    return None if array is None else torch.from_dlpack(array)


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe, cached_weight, training, fuse_wgrad_accumulation):
        # contiguous: the library folds x to [M, K] in place only where its strides allow
        y, context = _C.linear_forward(x.detach().contiguous(), weight.detach(),
                                       None if bias is None else bias.detach(), recipe, training, cached_weight,
                                       weight_grad=weight.requires_grad)
        ctx.context = context
        ctx.draws_seed = isinstance(recipe, NVFP4BlockScaling) and not recipe.disable_stochastic_rounding
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


class Linear(torch.nn.Module):
    """y = x W^T + b, quantized under microscale.torch.autocast (x float32, bfloat16 or float16
    [..., in_features], on the CPU or, with the CUDA backend, on the parameters' CUDA device).
    Parameters shaped and initialised as torch.nn.Linear's: weight [out_features, in_features],
    bias [out_features], of params_dtype (default: torch's default dtype). ``init_method``
    (TransformerEngine's argument) initialises the weight as ``init_method(weight)`` instead, and
    the bias to zeros, as TransformerEngine does.

    return_bias (TransformerEngine's argument): forward leaves the bias out of y and returns
    ``(y, bias)``, the bias in x's dtype, for the caller to add where it fuses the addition with
    what follows (Megatron-LM's bias-dropout-add); an empty tensor for a layer without one.

    fuse_wgrad_accumulation (TransformerEngine's argument, for Megatron-style training): the
    weight gradient is added in fp32 into ``weight.main_grad`` (float32 [out_features,
    in_features] on the weight's device, which the caller allocates) instead of being returned;
    weight.grad stays None, or, for a weight with Megatron-LM's grad_added_to_main_grad attribute,
    gets TransformerEngine's placeholder (docs/python.md)."""

    def __init__(self, in_features, out_features, bias=True, *, init_method=None, return_bias=False,
                 params_dtype=None, device=None, fuse_wgrad_accumulation=False):
        super().__init__()
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.init_method = init_method
        self.return_bias = return_bias
        if params_dtype is None:  # as TransformerEngine's modules
            params_dtype = torch.get_default_dtype()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype, device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=params_dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self._cache_key = None
        self._cached_weight = None
        self.weight_quantizations = 0  # how many times the weight was quantized (the cache's tests)
        self.reset_parameters()

    def reset_parameters(self):
        if self.init_method is not None:  # TransformerEngine's: init_method(weight), a zero bias
            with torch.no_grad():
                self.init_method(self.weight)
                if self.bias is not None:
                    self.bias.zero_()
            return
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # U(-1/sqrt(K), 1/sqrt(K))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def _quantized_weight(self, recipe, is_first_microbatch):
        if self.weight.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Captured into a CUDA graph: the weight is quantized inside the graph, so that each replay
            # quantizes what the weight holds then (an optimizer step between replays writes it in
            # place, unseen by any check made at capture). Not cached: the graph owns that memory, and
            # a cached quantization captured as a constant would be stale, or freed, later.
            self.weight_quantizations += 1
            return quantize_for(self.weight.detach(), _C.quantize_options(recipe, "weight"))
        key = (self.weight._version, self.weight.data_ptr(), tuple(self.weight.shape), self.weight.dtype,
               self.weight.device, repr(recipe))
        # Another shape, dtype, device or recipe needs a new quantization whatever the caller says.
        unusable = self._cache_key is None or self._cache_key[2:] != key[2:]
        if is_first_microbatch or unusable or (is_first_microbatch is None and key != self._cache_key):
            options = _C.quantize_options(recipe, "weight")
            if self.weight.device.type == "cuda":  # a torch-level QuantizedTensor on the weight's device
                self._cached_weight = quantize_for(self.weight.detach(), options)
            else:  # the C++ QuantizedTensor that _C.linear_forward takes
                self._cached_weight = _C.quantize(self.weight.detach(), options, False)
            self._cache_key = key
            self.weight_quantizations += 1
        return self._cached_weight

    # torch.compile runs the layer eagerly (a graph break on each side), as TransformerEngine's
    # modules do (its no_torch_dynamo): the recipe comes from thread-local autocast state and the
    # weight cache from Python attributes, neither of which dynamo can guard, and the recipe and
    # the CPU path's context are C++ objects it cannot trace (tracing them failed with a
    # RecursionError). The model's other modules are still compiled.
    @torch.compiler.disable
    def forward(self, x, is_first_microbatch=None):
        """``is_first_microbatch`` (TransformerEngine's argument): None finds out from the weight's
        version counter and storage whether to quantize it again; True quantizes it (say so after
        writing the weight through ``.data``, which its version counter does not see); False reuses
        the cached quantization (of the same recipe) even if the weight changed. Under CUDA-graph
        capture (CUDA tensors) the weight is quantized inside the graph whatever it says."""
        y = self._output(x, None if self.return_bias else self.bias, is_first_microbatch)
        if not self.return_bias:
            return y
        if self.bias is None:  # TransformerEngine returns an empty tensor there
            return y, torch.empty(0, dtype=x.dtype, device=x.device)
        return y, self.bias.to(x.dtype)

    def _output(self, x, bias, is_first_microbatch):
        """x W^T (+ bias) under the autocast scope's recipe."""
        recipe = current_recipe() if autocast_enabled() else HighPrecision()
        if isinstance(recipe, HighPrecision):
            return torch.nn.functional.linear(x, self.weight, bias)
        devices = {x.device.type, self.weight.device.type}
        if devices not in ({"cpu"}, {"cuda"}):
            raise _C.Error(f"microscale.torch.Linear: x is on {x.device} and the weight on {self.weight.device}; "
                           "the quantized Linear runs on CPU or CUDA tensors, both on one device")
        if devices == {"cuda"} and not _C.cuda_built():
            raise _C.Error("microscale.torch.Linear: this build has no CUDA backend")
        training = torch.is_grad_enabled() and (
            x.requires_grad or self.weight.requires_grad or (bias is not None and bias.requires_grad))
        cached = self._quantized_weight(recipe, is_first_microbatch)
        function = ComposedLinearFunction if devices == {"cuda"} else _LinearFunction
        return function.apply(x, self.weight, bias, recipe, cached, training, self.fuse_wgrad_accumulation)

    def extra_repr(self):
        extra = "".join(f", {name}=True" for name in ("return_bias", "fuse_wgrad_accumulation") if getattr(self, name))
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{extra}"
