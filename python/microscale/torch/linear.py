"""The quantized Linear layer for PyTorch: y = x W^T + b under the autocast scope's recipe.

Forward and backward are the C++ library's linear_forward / linear_backward (docs/training.md):
fprop x.rowwise x W.rowwise; dgrad dy.rowwise x W.columnwise; wgrad dy.columnwise x x.columnwise;
each GEMM accumulates in fp32 over exactly dequantized blocks and rounds once to its output dtype
(y to x's, dx and db to dy's; dW to the weight's here). Stochastic rounding of NVFP4 gradients
draws its seed from torch's default generator, so torch.manual_seed makes a run repeatable.

The weight's quantization is cached until the weight changes (its version counter or storage),
so micro-batches between optimizer steps quantize it once (TransformerEngine asks the caller,
is_first_microbatch; here the tensor tells).
"""

import math

import torch

from .. import _C
from ..recipe import HighPrecision
from .autocast import autocast_enabled, current_recipe


def _tensor(array):
    return None if array is None else torch.from_dlpack(array)


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe, cached_weight, training):
        y, context = _C.linear_forward(
            x.detach(), weight.detach(), None if bias is None else bias.detach(), recipe, training, cached_weight)
        ctx.context = context
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _tensor(y)

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.context is None:
            raise RuntimeError("microscale.torch.Linear: backward through a forward that kept no context "
                               "(a second backward, or a forward without inputs that need grad)")
        sr_seed = int(torch.randint(0, 2**62, (1,)).item())
        dx, dw, db = _C.linear_backward(
            grad_output.detach().contiguous(), ctx.context,
            compute_grad_input=ctx.needs_input_grad[0],
            compute_grad_bias=ctx.bias_dtype is not None and ctx.needs_input_grad[2],
            sr_seed=sr_seed)
        ctx.context = None  # frees the saved quantized operands, as autograd frees saved tensors
        grad_input = _tensor(dx) if ctx.needs_input_grad[0] else None
        grad_weight = _tensor(dw).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        grad_bias = _tensor(db).to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias, None, None, None


class Linear(torch.nn.Module):
    """y = x W^T + b, quantized under microscale.torch.autocast (CPU tensors; x float32, bfloat16 or
    float16 [..., in_features]). Parameters as torch.nn.Linear's: weight [out_features,
    in_features], bias [out_features], initialised the same way."""

    def __init__(self, in_features, out_features, bias=True, *, params_dtype=torch.float32, device=None):
        super().__init__()
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
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # U(-1/sqrt(K), 1/sqrt(K))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def _quantized_weight(self, recipe):
        key = (self.weight._version, self.weight.data_ptr(), self.weight.dtype, repr(recipe))
        if key != self._cache_key:
            options = _C.quantize_options(recipe, "weight")
            self._cached_weight = _C.quantize(self.weight.detach(), options, False)
            self._cache_key = key
            self.weight_quantizations += 1
        return self._cached_weight

    def forward(self, x):
        recipe = current_recipe() if autocast_enabled() else HighPrecision()
        if isinstance(recipe, HighPrecision):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if x.device.type != "cpu" or self.weight.device.type != "cpu":
            raise _C.Error("microscale.torch.Linear: the quantized Linear runs on CPU tensors only for now")
        training = torch.is_grad_enabled() and (
            x.requires_grad or self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad))
        return _LinearFunction.apply(x, self.weight, self.bias, recipe, self._quantized_weight(recipe), training)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
