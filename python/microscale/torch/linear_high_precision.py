"""The Linear outside a quantized scope (high precision, as TransformerEngine's modules run outside
theirs) where torch's own autograd of torch.nn.functional.linear cannot do what TE's modules do:

- fuse_wgrad_accumulation: dW is added in fp32 into weight.main_grad (TE's BF16 wgrad GEMM
  accumulates there too), and weight.grad gets TE's placeholder;
- sequence parallelism: a column-parallel layer keeps a tp_size-th of its gathered input for
  backward (tensor_parallel.own_share), gathered again there, as TE keeps the rank's rows.

Its forward is torch.nn.functional.linear, and its gradients are the operations torch's autograd
runs for it (dx = dy W, dW = dy^T x, db = the column sums of dy), so the results are the same bits
as the plain layer's. Everywhere else the layer is torch.nn.functional.linear itself."""

import torch

from .linear_composed import dense_product, main_grad_of, wgrad_result
from .tensor_parallel import gather_shares, own_share


class HighPrecisionLinearFunction(torch.autograd.Function):
    """y = x W^T + b (torch.nn.functional.linear). fuse_wgrad_accumulation: dW goes into
    weight.main_grad. rows_gathered_over: the group whose ranks' rows x stacks, or None."""

    @staticmethod
    def forward(ctx, x, weight, bias, fuse_wgrad_accumulation, rows_gathered_over):
        y = torch.nn.functional.linear(x, weight, bias)
        x2 = x.detach().reshape(-1, x.shape[-1])  # [M, K]
        ctx.rows_group, ctx.share_shapes = rows_gathered_over, None
        if not weight.requires_grad:  # only dW reads x
            x2 = None
        elif rows_gathered_over is not None:
            x2, ctx.share_shapes = own_share(x2, rows_gathered_over)
        ctx.save_for_backward(x2, weight)
        ctx.x_shape = x.shape
        ctx.weight = weight if fuse_wgrad_accumulation else None  # its main_grad, read in backward
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        x2, weight = ctx.saved_tensors
        dy = grad_output.reshape(-1, grad_output.shape[-1])  # [M, N]
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = dy.mm(weight).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            if ctx.share_shapes is not None:
                x2 = gather_shares(x2, ctx.share_shapes, ctx.rows_group)
            if ctx.weight is not None:  # added into main_grad in fp32 (the library's GEMM on the CPU,
                # which takes no zero strides: the gradient of a sum is one value broadcast)
                dy_dense = dy.contiguous() if 0 in dy.stride() else dy
                dense_product(dy_dense.t(), x2, torch.float32, accumulate_into=main_grad_of(ctx.weight))
                grad_weight = wgrad_result(ctx.weight)
            else:
                grad_weight = dy.t().mm(x2)
        if ctx.needs_input_grad[2]:
            grad_bias = dy.sum(0)
        return grad_input, grad_weight, grad_bias, None, None
