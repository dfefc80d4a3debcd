"""The quantized Linear's forward and backward on CUDA tensors (and on CPU tensors where
torch.compile traces the layer or saved-tensor hooks are in force), composed from this package's ops:
quantize (the Hopper kernels: the CPU path's bytes) and gemm (the library's Hopper GEMM for every
recipe: NVFP4 and MX). The three GEMMs and their operands are the C++ linear_forward /
linear_backward's (docs/training.md), so a CUDA layer quantizes x, W and dy to the same bytes as a
CPU layer with the same seed, and its outputs differ from the CPU's only by the fp32 accumulation
(its order on the tensor cores), within its bound; the bias gradient by at most one ulp.

    fprop  y  = x.rowwise  W.rowwise^T        [M, K] x [N, K] -> [M, N]
    dgrad  dx = dy.rowwise (W.columnwise)^T   [M, N] x [K, N] -> [M, K]   (NVFP4 W.columnwise is W^T)
    wgrad  dW = dy.columnwise x.columnwise^T  [N, M] x [K, M] -> [N, K]   (RHT on both for NVFP4)

Under a recipe's backward_override the backward's two GEMMs are unquantized instead
(_overridden_backward: dense operands, fp32 accumulation).
"""

import dataclasses

import torch

from .. import _C
from .column_sums import column_sums
from .gemm import gemm
from .ops import QuantizedTensor, dequantize, quantize
from .tensor_parallel import gather_shares, own_share


def quantize_for(x, options, *, rowwise=None, columnwise=None, sr_seed=None):
    """quantize() of a [rows, cols] tensor under one operand's options (a LinearPlan's
    OperandOptions, or _C.quantize_options' result);
    `rowwise` / `columnwise` override the options' (forward skips X^T when not training). The RHT is
    defined on bf16 (as in TransformerEngine and the CPU layer): under it, f32 / f16 is rounded to
    bf16 first."""
    if options.rht and x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    return quantize(x, options.scheme, rowwise=options.rowwise if rowwise is None else rowwise,
                    columnwise=options.columnwise if columnwise is None else columnwise, scale_mode=options.scale_mode,
                    tile=options.tile, rht=options.rht, sr_seed=sr_seed, swizzle=options.swizzle,
                    four_over_six=options.four_over_six, four_over_six_scaled_error=options.four_over_six_scaled_error,
                    nvfp4_e4m3_max=options.nvfp4_e4m3_max, row_scaled=options.row_scaled)


# Both Linear functions' error for a backward without a forward's context.
NO_CONTEXT = ("microscale.torch.Linear: backward through a forward that kept no context (a second backward, or a "
              "forward without inputs that need grad)")


def main_grad_of(weight):
    """weight.main_grad, checked: float32, the weight's shape and device (the caller allocates it,
    as Megatron-LM's DDP does for TransformerEngine's fuse_wgrad_accumulation)."""
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None:
        raise _C.Error("microscale.torch.Linear: fuse_wgrad_accumulation adds dW into weight.main_grad, which this "
                       "weight does not have (allocate a float32 tensor of the weight's shape)")
    if main_grad.dtype != torch.float32 or main_grad.shape != weight.shape or main_grad.device != weight.device:
        raise _C.Error(f"microscale.torch.Linear: weight.main_grad is {main_grad.dtype} {list(main_grad.shape)} on "
                       f"{main_grad.device}; it must be float32 {list(weight.shape)} on {weight.device}")
    return main_grad


def wgrad_result(weight):
    """What backward returns for a weight whose gradient went into main_grad, as TransformerEngine
    does: a weight with the attribute grad_added_to_main_grad (Megatron-LM's) gets it set and a
    placeholder gradient of its shape (zeros when weight.zero_out_wgrad is set, else
    uninitialised); any other weight gets None."""
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    return make(weight.shape, dtype=weight.dtype, device=weight.device)


def _without_zero_strides(t):
    """t itself, or a contiguous copy where a stride is zero (a broadcast view: the kernels read
    any positive strides, and refuse a zero one)."""
    return t.contiguous() if 0 in t.stride() else t


def _require_same_device(name, t, device):
    if t is not None and t.device != device:
        raise _C.Error(f"microscale.torch.Linear: {name} is on {t.device}, x on {device}")


def _gradient_seed(device):
    """The seed of dy's stochastic rounding (NVFP4). Eagerly, an int from torch's default generator,
    as the CPU layer draws it (so both give the same bytes after one torch.manual_seed). A seed
    drawn on the host would be fixed into a CUDA graph (the same on every replay) and into a graph
    torch.compile traces (a constant): under CUDA-graph capture and under torch.compile it is an
    int64 tensor on dy's device, drawn by that device's generator within the graph, anew on each
    call; the quantize kernel reads it as it runs (on the CPU, as the call starts)."""
    if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return torch.randint(0, 2**62, (1,), device=device)
    return int(torch.randint(0, 2**62, (1,)).item())


class ComposedLinearFunction(torch.autograd.Function):
    """y = x W^T + b under a quantized recipe's LinearPlan (linear_plan.py), on CUDA tensors (and
    on CPU tensors where torch.compile traces the layer or saved-tensor hooks are in force). `weight_q` is the weight already
    quantized under the plan's weight options (both usages; the Linear's cache), or None: forward
    quantizes it (a traced layer, which keeps no cache). `rows_gathered_over`: the group whose
    ranks' rows x stacks (a column-parallel layer under sequence parallelism), or None; backward's
    copy of x is then a tp_size-th of it (tensor_parallel.own_share)."""

    @staticmethod
    def forward(ctx, x, weight, bias, plan, weight_q, training, fuse_wgrad_accumulation, rows_gathered_over=None):
        for name, t in (("weight", weight), ("bias", bias)):
            _require_same_device(name, t, x.device)
        k, n = weight.shape[1], weight.shape[0]
        if x.shape[-1] != k:
            raise _C.Error(f"microscale.torch.Linear: x has K = {x.shape[-1]} but the weight {list(weight.shape)} "
                           f"has K = {k}")
        x2 = _without_zero_strides(x.detach().reshape(-1, k))  # [M, K]
        # X^T (through the RHT for NVFP4) feeds the quantized wgrad only: none for a frozen weight or
        # under a backward override.
        override = plan.backward_override
        if weight_q is None:  # traced: W^T (its columnwise output) feeds dgrad only
            weight_q = quantize_for(weight.detach(), plan.weight,
                                    columnwise=training and x.requires_grad and override is None)
        x_q = quantize_for(x2, plan.input, columnwise=training and weight.requires_grad and override is None)
        y = gemm(x_q, weight_q, bias=None if bias is None else bias.detach(), out_dtype=x.dtype)  # [M, N]
        ctx.plan, ctx.override = plan, override
        ctx.saved_kinds = None
        # What backward reads, and no more (save_on_cpu would copy the rest too): x only for a
        # weight that wants dW; as given ("high_precision"), its rowwise quantization ("dequantized")
        # or its columnwise one alone (the quantized wgrad).
        # Under sequence parallelism (x's rows gathered over `rows_gathered_over`) a tp_size-th of x
        # is kept, gathered again in backward.
        ctx.rows_group, ctx.share_shapes = rows_gathered_over, None
        if training:
            if override == "high_precision":
                x_kept, weight_kept = x2, weight.detach()
            else:
                x_kept = x_q if override == "dequantized" else dataclasses.replace(x_q, rowwise_data=None,
                                                                                    rowwise_scale=None)
                weight_kept = weight_q
            if not weight.requires_grad:
                x_kept = None
            elif rows_gathered_over is not None:
                x_kept, ctx.share_shapes = own_share(x_kept, rows_gathered_over)
            _save_operands(ctx, x_kept, weight_kept)
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.weight = weight if fuse_wgrad_accumulation else None  # its main_grad, read in backward
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        if ctx.saved_kinds is None:
            raise RuntimeError(NO_CONTEXT)
        x_q, weight_q = _saved_operands(ctx)
        if ctx.share_shapes is not None and ctx.needs_input_grad[1]:
            x_q = gather_shares(x_q, ctx.share_shapes, ctx.rows_group)
        dy = grad_output.detach().reshape(-1, grad_output.shape[-1])  # [M, N]
        # The gradient of a sum or a mean is one value broadcast (strides of zero). Traced, dy's
        # strides are unknown until the graph runs, and dynamo makes it contiguous itself.
        dy = dy.contiguous() if torch.compiler.is_compiling() else _without_zero_strides(dy)
        if ctx.override is not None:
            grad_input, grad_weight = _overridden_backward(ctx, dy, x_q, weight_q)
        else:
            grad_input, grad_weight = _quantized_backward(ctx, dy, x_q, weight_q, grad_output.dtype)
        # Used up: a second backward (retain_graph=True) is NO_CONTEXT's error. Marked last: dynamo
        # (torch 2.11) may trace a backward twice, keeping what the first attempt set on ctx.
        ctx.saved_kinds = None
        return grad_input, grad_weight, _bias_grad(ctx, dy, grad_output.dtype), None, None, None, None, None


def _quantized_backward(ctx, dy, x_q, weight_q, grad_dtype):
    """dgrad and wgrad of the quantized recipe (the module's docstring): dy [M, N] quantized,
    against the saved W and X^T. Returns (grad_input, grad_weight); grad_input in grad_dtype."""
    options = ctx.plan.grad_output
    sr_seed = _gradient_seed(dy.device) if options.sr_seed is not None else None
    want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1] and x_q is not None
    grad_input = grad_weight = None
    if want_dx or want_dw:
        # dy's rowwise output feeds dgrad, its columnwise output wgrad: each only when needed (one
        # direction's bytes do not depend on the other's, stochastic rounding included).
        dy_q = quantize_for(dy, options, rowwise=want_dx, columnwise=want_dw, sr_seed=sr_seed)
    if want_dx:  # dx in dy's dtype (TE's dgrad output)
        grad_input = gemm(dy_q, weight_q, b_usage="columnwise", out_dtype=grad_dtype).reshape(ctx.x_shape)
    if want_dw and ctx.weight is not None:  # dW += into main_grad in fp32 (the CPU layer's rule)
        main_grad = main_grad_of(ctx.weight)
        gemm(dy_q, x_q, a_usage="columnwise", b_usage="columnwise", beta=1.0, c=main_grad,
             out_dtype=torch.float32, out=main_grad)
        grad_weight = wgrad_result(ctx.weight)
    elif want_dw:  # dW in x's dtype, then the weight's
        grad_weight = gemm(dy_q, x_q, a_usage="columnwise", b_usage="columnwise",
                           out_dtype=ctx.x_dtype).to(ctx.weight_dtype)
    return grad_input, grad_weight


def _save_operands(ctx, x_saved, weight_saved):
    """Keeps backward's two operands (QuantizedTensors, tensors or None) with ctx.save_for_backward,
    as autograd functions keep tensors: torch's saved-tensor hooks then see them, so activation
    checkpointing (torch.utils.checkpoint, non-reentrant) drops them and recomputes the forward,
    and torch.autograd.graph.save_on_cpu moves them to host memory until backward."""
    tensors, kinds = [], []
    for item in (x_saved, weight_saved):
        if isinstance(item, QuantizedTensor):
            kinds.append((item.shape, item.options))
            tensors += [item.rowwise_data, item.rowwise_scale, item.columnwise_data, item.columnwise_scale,
                        item.amax]
        else:
            kinds.append(None)
            tensors.append(item)
    ctx.save_for_backward(*tensors)
    ctx.saved_kinds = kinds


def _saved_operands(ctx):
    """_save_operands' two operands, rebuilt from ctx.saved_tensors."""
    tensors = iter(ctx.saved_tensors)
    operands = []
    for kind in ctx.saved_kinds:
        if kind is None:
            operands.append(next(tensors))
        else:
            parts = [next(tensors) for _ in range(5)]
            operands.append(QuantizedTensor(*parts, shape=kind[0], options=kind[1]))
    return operands


def _bias_grad(ctx, dy, dtype):
    """The unquantized dy's column sums: in float64, rounded to fp32, then to dy's dtype (the CPU's
    rule), then the bias's; None where no bias gradient is asked for."""
    if ctx.bias_dtype is None or not ctx.needs_input_grad[2]:
        return None
    return column_sums(dy).to(dtype).to(ctx.bias_dtype)


# torch.mm(..., out_dtype=torch.float32) of 16-bit operands (fp32 outputs from the tensor cores)
# came with torch 2.8; older versions multiply fp32 copies.
_MM_TAKES_OUT_DTYPE = torch.__version__ >= "2.8"


def dense_product(a, b, out_dtype, accumulate_into=None):
    """a [M, X] @ b [X, N] as an unquantized Linear's GEMM: fp32 accumulation, one rounding to
    out_dtype (or, with accumulate_into, an fp32 [M, N] that receives += the fp32 product). On the
    CPU the library's GEMM (the C++ layer's, bit for bit); on CUDA torch's cuBLAS GEMM, on the
    tensor cores where a and b share a 16-bit dtype (their products are exact in fp32), else in fp32."""
    if a.device.type != "cuda":  # the library's GEMM takes no zero strides (a broadcast operand)
        a, b = _without_zero_strides(a), _without_zero_strides(b)
        if accumulate_into is not None:
            return gemm(a, b.t(), beta=1.0, c=accumulate_into, out=accumulate_into)
        return gemm(a, b.t(), out_dtype=out_dtype)
    if _MM_TAKES_OUT_DTYPE and a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16):
        d = torch.mm(a, b, out_dtype=torch.float32)
    else:  # under torch's float32 matmul precision: TF32 where the caller allowed it
        d = torch.mm(a.float(), b.float())
    if accumulate_into is not None:
        return accumulate_into.add_(d)
    return d.to(out_dtype)


def _overridden_backward(ctx, dy, x_saved, weight_saved):
    """dgrad and wgrad under the recipe's backward_override (TransformerEngine's): dy unquantized,
    and x and W as the forward kept them ("high_precision") or its rowwise quantizations dequantized
    to x's dtype ("dequantized"). Returns (grad_input, grad_weight)."""
    want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    grad_input = grad_weight = None
    if want_dx:  # dx = dy W, in dy's dtype
        w = dequantize(weight_saved, "rowwise", ctx.x_dtype) if ctx.override == "dequantized" else weight_saved
        grad_input = dense_product(dy, w, dy.dtype).reshape(ctx.x_shape)
    if want_dw:  # dW = dy^T x
        x = dequantize(x_saved, "rowwise", ctx.x_dtype) if ctx.override == "dequantized" else x_saved
        if ctx.weight is not None:  # added into main_grad in fp32
            dense_product(dy.t(), x, torch.float32, accumulate_into=main_grad_of(ctx.weight))
            grad_weight = wgrad_result(ctx.weight)
        else:  # in x's dtype, then the weight's
            grad_weight = dense_product(dy.t(), x, ctx.x_dtype).to(ctx.weight_dtype)
    return grad_input, grad_weight
