"""The quantized Linear layer for PyTorch: y = x W^T + b under the autocast scope's recipe.

On the CPU, forward and backward are the C++ library's linear_forward / linear_backward
(docs/training.md; under saved-tensor hooks, such as activation checkpointing, the composed form
below with the same bytes); on CUDA, linear_composed.py composes the same three GEMMs from the CUDA ops:
fprop x.rowwise x W.rowwise; dgrad dy.rowwise x W.columnwise; wgrad dy.columnwise x x.columnwise;
each GEMM accumulates in fp32 over exactly dequantized blocks and rounds once to its output dtype
(y to x's dtype, dx and db to dy's, dW to x's and then, here, to the weight's). Stochastic rounding of NVFP4 gradients
draws its seed from torch's default generator, so torch.manual_seed makes a run repeatable (under
CUDA-graph capture, from torch's CUDA generator inside the graph: a new seed per replay).

The weight is quantized on every forward unless forward's is_first_microbatch
(TransformerEngine's argument) says to keep its quantization (True) or to reuse the kept one
(False), as TransformerEngine does: micro-batches between optimizer steps then quantize it once
(WeightCache); under CUDA-graph capture the weight is quantized inside the graph, on every replay. A frozen weight (requires_grad False)
skips the wgrad GEMM and what only it needs (x's and dy's columnwise quantizations). With
fuse_wgrad_accumulation (TransformerEngine's argument) dW is added into weight.main_grad.
"""

import torch

from .quantized_linear import QuantizedModule, WeightCache, init_linear_parameters, quantized_linear, te_outputs
from .tensor_parallel import attach, mark_linear_parameters


class Linear(QuantizedModule):
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
    gets TransformerEngine's placeholder (docs/python.md).

    Tensor parallelism (TransformerEngine's arguments; tensor_parallel.py): ``parallel_mode``
    "column" keeps out_features / tp_size rows of the weight and bias on each rank, "row"
    in_features / tp_size columns of the weight (the bias whole, added after the ranks' partial
    products are summed, outside the GEMM as TransformerEngine adds it); ``tp_group`` (or, without
    one, ``tp_size`` on torch.distributed's default group) and ``sequence_parallel`` (x's first dim
    split over the ranks). in_features and out_features are the whole layer's; the attributes of
    those names hold this rank's. ``get_rng_state_tracker`` and ``rng_tracker_name``: the weight's
    initialisation runs under that RNG tracker's fork, as TransformerEngine's does."""

    # Keyword arguments after bias: TransformerEngine's positions there hold other arguments.
    def __init__(self, in_features, out_features, bias=True, *, init_method=None, return_bias=False,
                 params_dtype=None, device=None, fuse_wgrad_accumulation=False, tp_group=None, tp_size=1,
                 parallel_mode=None, sequence_parallel=False, get_rng_state_tracker=None, rng_tracker_name=None):
        super().__init__()
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.init_method = init_method
        self.return_bias = return_bias
        if params_dtype is None:  # as TransformerEngine's modules
            params_dtype = torch.get_default_dtype()
        attach(self, "Linear", tp_group, tp_size, parallel_mode, sequence_parallel, get_rng_state_tracker,
               rng_tracker_name)
        self.fan_in = in_features  # the whole layer's, for the default initialisation
        in_features, out_features = self.tp.local_features(in_features, out_features, parallel_mode)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype, device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=params_dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self._weight_cache = WeightCache()
        self.reset_parameters()

    def reset_parameters(self):
        init_linear_parameters(self.weight, self.bias, self.init_method, fan_in=self.fan_in,
                               get_rng_state_tracker=self.get_rng_state_tracker, rng_tracker_name=self.rng_tracker_name,
                               bias_split=self.parallel_mode == "column")
        mark_linear_parameters(self.weight, self.bias, self.parallel_mode, self.sequence_parallel)

    def forward(self, x, is_first_microbatch=None):
        """``is_first_microbatch`` (TransformerEngine's argument): None quantizes the weight and
        keeps nothing; True quantizes it and keeps its quantization; False reuses the kept one (of
        the same recipe, shape, dtype and device; else it quantizes and keeps) even if the weight
        changed since. Under CUDA-graph capture (CUDA tensors) and traced by torch.compile the
        weight is quantized inside the graph, on every call, whatever it says."""
        row = self.parallel_mode == "row"
        if self.parallel_mode == "column":
            x = self.tp.column_input(x)
        y = quantized_linear(x, self.weight, None if self.return_bias or row else self.bias, self._weight_cache,
                             is_first_microbatch=is_first_microbatch,
                             fuse_wgrad_accumulation=self.fuse_wgrad_accumulation,
                             rows_gathered_over=self.tp.gathered_rows_group() if self.parallel_mode == "column" else None)
        if row:
            y = self.tp.row_output(y)
            if self.bias is not None and not self.return_bias:
                y = y + self.bias.to(y.dtype)
        return te_outputs(y, x, self.bias, None, self.return_bias, False)

    @property
    def weight_quantizations(self):
        """How many times the weight was quantized (the cache's tests)."""
        return self._weight_cache.quantizations

    @property
    def _cached_weight(self):
        return self._weight_cache.quantized

    def extra_repr(self):
        extra = "".join(f", {name}=True" for name in ("return_bias", "fuse_wgrad_accumulation") if getattr(self, name))
        if self.parallel_mode is not None:
            extra += f", parallel_mode={self.parallel_mode}, tp_size={self.tp_size}"
            extra += ", sequence_parallel=True" if self.sequence_parallel else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{extra}"
