"""The Linear outside a quantized scope (high precision, as TransformerEngine's modules run outside
theirs) where torch's own autograd of torch.nn.functional.linear cannot do what TE's modules do:

- fuse_wgrad_accumulation: dW is added in fp32 into weight.main_grad (TE's BF16 wgrad GEMM
  accumulates there too), and weight.grad gets TE's placeholder;
- sequence parallelism: a column-parallel layer keeps a tp_size-th of its gathered input for
  backward (tensor_parallel.own_share), gathered again there, as TE keeps the rank's rows.

Its forward is torch.nn.functional.linear, and its gradients are the operations torch's autograd
runs for it (its addmm's: dx = dy W, or (W^T dy^T)^T for a column-major x; dW = dy^T x, or
(x^T dy)^T for a weight not row-major; db = the column sums of dy), so the results are the same
bits as the plain layer's for 2-D x and for contiguous N-D x (torch folds those to one addmm;
other layouts go through its matmul, whose kernels may add in another order). Under
torch.autocast the operands are cast to its dtype first, as autocast casts them for linear (the
gradients then come back in it, and autograd casts them to the inputs' dtypes). Everywhere else
the layer is torch.nn.functional.linear itself."""

import torch

from .linear_composed import dense_product, main_grad_of, wgrad_result
from .tensor_parallel import gather_shares, own_share


class HighPrecisionLinearFunction(torch.autograd.Function):
    """y = x W^T + b (torch.nn.functional.linear). fuse_wgrad_accumulation: dW goes into
    weight.main_grad. rows_gathered_over: the group whose ranks' rows x stacks, or None."""

    @staticmethod
    def forward(ctx, x, weight, bias, fuse_wgrad_accumulation, rows_gathered_over):
        ctx.weight = weight if fuse_wgrad_accumulation else None  # its main_grad, read in backward
        x, weight, bias = _autocast(x, weight, bias)
        y = torch.nn.functional.linear(x, weight, bias)
        x2 = x.detach().reshape(-1, x.shape[-1])  # [M, K]
        ctx.rows_group, ctx.share_shapes = rows_gathered_over, None
        ctx.x_column_major = x2.dim() == 2 and x2.shape[0] > 1 and x2.stride() == (1, x2.shape[0])
        if not ctx.needs_input_grad[1]:  # only dW reads x
            x2 = None
        elif rows_gathered_over is not None:
            x2, ctx.share_shapes = own_share(x2, rows_gathered_over)
        ctx.save_for_backward(x2, weight)
        ctx.x_shape = x.shape
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        x2, weight = ctx.saved_tensors
        dy = grad_output.reshape(-1, grad_output.shape[-1])  # [M, N]
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # torch's mm_mat1_backward, x's layout read in forward
            grad_input = (weight.t().mm(dy.t()).t() if ctx.x_column_major else dy.mm(weight)).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            if ctx.share_shapes is not None:
                x2 = gather_shares(x2, ctx.share_shapes, ctx.rows_group)
            if ctx.weight is not None:  # added into main_grad in fp32
                dense_product(dy.t(), x2, torch.float32, accumulate_into=main_grad_of(ctx.weight))
                grad_weight = wgrad_result(ctx.weight)
            elif _row_major(weight):  # torch's mm_mat2_backward for W^T, then its transpose's
                grad_weight = dy.t().mm(x2)
            else:
                grad_weight = x2.t().mm(dy).t()
        if ctx.needs_input_grad[2]:
            grad_bias = dy.sum(0)
        return grad_input, grad_weight, grad_bias, None, None


def _row_major(t):
    """Whether the 2-D t is laid out row after row (torch's test in its mm gradients)."""
    return t.stride(1) == 1 and t.stride(0) == t.shape[1]


def _autocast(x, weight, bias):
    """x, weight and bias as torch.autocast hands them to linear where it is on for x's device
    (cast to its dtype), else as they are."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return x, weight, bias
    dtype = torch.get_autocast_dtype(device)
    cast = lambda t: t.to(dtype) if t is not None and t.is_floating_point() else t  # noqa: E731
    return cast(x), cast(weight), cast(bias)
