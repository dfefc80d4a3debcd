"""TransformerEngine's GroupedLinear (the experts of a mixture-of-experts layer): num_gemms
Linears of one shape, each applied to its own consecutive rows of the input, y_i = x_i W_i^T + b_i,
x split by m_splits. Each expert is this package's quantized Linear (quantized_linear.py), with its
own weight cache: its x_i, W_i and dy_i are quantized on their own (their own amaxes), as
TransformerEngine's split quantization does. Parameter names as TransformerEngine's (weight0, ...,
bias0, ...), so its state dicts load."""

import operator

import torch

from .. import _C
from .linear_composed import wgrad_result
from .quantized_linear import QuantizedModule, WeightCache, init_linear_parameters, quantized_linear
from .tensor_parallel import attach, mark_linear_parameters


def _row_counts(m_splits):
    """m_splits (a list of ints, or an integer tensor of them) as a list of ints."""
    if isinstance(m_splits, torch.Tensor):
        if m_splits.dtype.is_floating_point or m_splits.dtype.is_complex or m_splits.dim() != 1:
            raise _C.Error(f"microscale.torch.GroupedLinear: m_splits must be one dim of integers, not "
                           f"{m_splits.dtype} {list(m_splits.shape)}")
        return m_splits.tolist()
    try:
        return [operator.index(m) for m in m_splits]
    except TypeError:
        raise _C.Error(f"microscale.torch.GroupedLinear: m_splits must be integers, not {m_splits}") from None


class _EmptyExpert(torch.autograd.Function):
    """An expert given no rows: y [0, N] in x's dtype. Its parameters stay in the graph and get a
    zero gradient, or, with fuse_wgrad_accumulation, nothing added to main_grad and the weight's
    gradient as the Linear returns it then (wgrad_result: Megatron-LM's hooks see every weight)."""

    @staticmethod
    def forward(ctx, x, weight, bias, fuse_wgrad_accumulation):
        ctx.weight, ctx.fused = weight, fuse_wgrad_accumulation
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return x.new_empty((0, weight.shape[0]))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        weight = ctx.weight
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = wgrad_result(weight) if ctx.fused else torch.zeros_like(weight)
        grad_bias = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = torch.zeros(weight.shape[0], dtype=ctx.bias_dtype, device=weight.device)
        return grad_output.new_empty(ctx.x_shape, dtype=ctx.x_dtype), grad_weight, grad_bias, None


# With fuse_wgrad_accumulation the empty expert's backward sets Megatron-LM's attribute on the
# weight, which traced code cannot: it runs eagerly (a graph break), as the experts with rows do.
_untraced_empty_expert = torch.compiler.disable(_EmptyExpert.apply)


class GroupedLinear(QuantizedModule):
    """num_gemms experts of [out_features, in_features] (weight{i}, and bias{i} with ``bias``),
    parameters of params_dtype (default: torch's default dtype), initialised as
    microscale.torch.Linear's (``init_method``: TransformerEngine's argument, as there).

    forward(inp, m_splits, is_first_microbatch=None): inp [..., in_features] is read as [M,
    in_features] (its leading dims flattened) and split into consecutive row blocks of m_splits
    (a list of num_gemms ints, or an int64 tensor of them, summing to M); block i goes through
    expert i; y [..., out_features] keeps inp's leading dims. Under a quantized recipe each
    non-empty block's row count must be what the recipe blocks (NVFP4: a multiple of 16, MXFP8: of
    32), as TransformerEngine requires (its Fp8Padding pads the splits); an empty block gives no
    rows and a zero gradient for its expert's parameters (with fuse_wgrad_accumulation: nothing
    added to main_grad). ``return_bias``: the biases are left out
    of y and returned as a list, each in inp's dtype. ``fuse_wgrad_accumulation``: each weight's
    gradient is added into its own ``main_grad`` (microscale.torch.Linear's rule).

    ``parallel_mode``, ``tp_size`` and ``tp_group`` (TransformerEngine's arguments) split each
    expert's weight as microscale.torch.Linear's are split, and that is all they do: as in
    TransformerEngine, the mixture-of-experts layer's dispatch and combine steps move the tokens
    between ranks, not this layer, and a bias is refused with tp_size above 1.
    ``get_rng_state_tracker`` / ``rng_tracker_name``: as Linear's."""

    # Keyword arguments after out_features: TransformerEngine's positions there hold other arguments.
    def __init__(self, num_gemms, in_features, out_features, *, bias=True, init_method=None, return_bias=False,
                 params_dtype=None, device=None, fuse_wgrad_accumulation=False, tp_group=None, tp_size=1,
                 parallel_mode=None, sequence_parallel=False, get_rng_state_tracker=None, rng_tracker_name=None):
        super().__init__()
        if num_gemms < 1:
            raise _C.Error(f"microscale.torch.GroupedLinear: num_gemms must be at least 1, not {num_gemms}")
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        attach(self, "GroupedLinear", tp_group, tp_size, parallel_mode, sequence_parallel, get_rng_state_tracker,
               rng_tracker_name)
        if self.tp_size > 1 and bias:  # the ranks' partial products are summed outside: each would add it
            raise _C.Error("microscale.torch.GroupedLinear: bias is not supported with tp_size > 1 (the mixture-of-"
                           "experts layer sums the ranks' outputs outside this layer), as in TransformerEngine")
        self.fan_in = in_features  # the whole layer's, for the default initialisation
        in_features, out_features = self.tp.local_features(in_features, out_features, parallel_mode)
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.init_method, self.fuse_wgrad_accumulation = init_method, fuse_wgrad_accumulation
        for i in range(num_gemms):
            self.register_parameter(f"weight{i}", torch.nn.Parameter(
                torch.empty(out_features, in_features, dtype=params_dtype, device=device)))
            self.register_parameter(f"bias{i}", torch.nn.Parameter(
                torch.empty(out_features, dtype=params_dtype, device=device)) if bias else None)
        self._weight_caches = [WeightCache() for _ in range(num_gemms)]
        self.reset_parameters()

    def reset_parameters(self):
        for weight, bias in zip(self.weights, self.biases):
            init_linear_parameters(weight, bias, self.init_method, fan_in=self.fan_in,
                                   get_rng_state_tracker=self.get_rng_state_tracker,
                                   rng_tracker_name=self.rng_tracker_name, bias_split=self.parallel_mode == "column")
            mark_linear_parameters(weight, bias, self.parallel_mode, self.sequence_parallel)

    @property
    def weights(self):
        return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]

    @property
    def biases(self):
        return [getattr(self, f"bias{i}") for i in range(self.num_gemms)]

    @property
    def weight_quantizations(self):
        """How many times the experts' weights were quantized, all together (the caches' tests)."""
        return sum(cache.quantizations for cache in self._weight_caches)

    def forward(self, inp, m_splits, is_first_microbatch=None):
        """See the class. is_first_microbatch: microscale.torch.Linear's, for every expert."""
        splits = _row_counts(m_splits)
        if inp.shape[-1] != self.in_features:
            raise _C.Error(f"microscale.torch.GroupedLinear: inp has {inp.shape[-1]} features, the experts take "
                           f"{self.in_features}")
        x = inp.reshape(-1, self.in_features)  # [M, K]
        if len(splits) != self.num_gemms or any(m < 0 for m in splits) or sum(splits) != x.shape[0]:
            raise _C.Error(f"microscale.torch.GroupedLinear: m_splits {splits} must be {self.num_gemms} row counts "
                           f"(none negative) that add up to inp's {x.shape[0]} rows")
        outputs = []
        for i, x_i in enumerate(torch.split(x, splits)):
            weight, bias = getattr(self, f"weight{i}"), getattr(self, f"bias{i}")
            bias = None if self.return_bias else bias
            if x_i.shape[0] == 0:  # no rows for this expert: nothing to quantize
                if not torch.compiler.is_compiling():
                    self._weight_caches[i].forget_unless_reused(is_first_microbatch)
                empty = _untraced_empty_expert if self.fuse_wgrad_accumulation else _EmptyExpert.apply
                outputs.append(empty(x_i, weight, bias, self.fuse_wgrad_accumulation))
                continue
            outputs.append(quantized_linear(x_i, weight, bias, self._weight_caches[i],
                                            is_first_microbatch=is_first_microbatch,
                                            fuse_wgrad_accumulation=self.fuse_wgrad_accumulation))
        y = torch.cat(outputs).reshape(*inp.shape[:-1], self.out_features)
        if self.return_bias:
            return y, [torch.empty(0, dtype=inp.dtype, device=inp.device) if b is None else b.to(inp.dtype)
                       for b in self.biases]
        return y

    def extra_repr(self):
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}")
