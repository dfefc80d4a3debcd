"""TransformerEngine's LayerNormLinear: y = norm(x) W^T + b, the normalization in high precision
(normalization.py), the Linear quantized under the autocast scope's recipe (quantized_linear.py).
Parameter names as TransformerEngine's (layer_norm_weight, layer_norm_bias, weight, bias), so its
state dicts load."""

import torch

from .. import _C
from .normalization import norm_parameters, normalize, reset_norm_parameters
from .quantized_linear import QuantizedModule, WeightCache, init_linear_parameters, quantized_linear, te_outputs
from .tensor_parallel import attach, mark_linear_parameters


class LayerNormLinear(QuantizedModule):
    """LayerNorm or RMSNorm over the last dim of x [..., in_features], then the quantized Linear
    (microscale.torch.Linear's numerics, weight cache and arguments). ``return_layernorm_output``:
    forward also returns the normalization's output (x's dtype); with ``return_bias`` the bias is
    left out of y and returned. Outputs in TransformerEngine's order: y, then the bias (with
    return_bias), then the normalization's output (with return_layernorm_output).

    Tensor parallelism (microscale.torch.Linear's arguments): ``parallel_mode`` None or "column"
    (TransformerEngine has no row-parallel normalization either); with ``sequence_parallel`` the
    normalization runs on this rank's rows of x and its output is gathered for the GEMM, and
    ``return_layernorm_output_gathered`` returns that gathered output instead of this rank's."""

    # Keyword arguments after eps: TransformerEngine's positions there hold other arguments.
    def __init__(self, in_features, out_features, eps=1e-5, *, bias=True, normalization="LayerNorm",
                 return_layernorm_output=False, return_layernorm_output_gathered=False, zero_centered_gamma=False,
                 init_method=None, return_bias=False, params_dtype=None, device=None, fuse_wgrad_accumulation=False,
                 tp_group=None, tp_size=1, parallel_mode=None, sequence_parallel=False, get_rng_state_tracker=None,
                 rng_tracker_name=None):
        super().__init__()
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        attach(self, "LayerNormLinear", tp_group, tp_size, parallel_mode, sequence_parallel, get_rng_state_tracker,
               rng_tracker_name)
        if parallel_mode == "row":
            raise _C.Error("microscale.torch.LayerNormLinear: parallel_mode 'row' is not supported: the normalization "
                           "needs whole rows of x (TransformerEngine has no row-parallel LayerNormLinear either)")
        in_features, out_features = self.tp.local_features(in_features, out_features, parallel_mode)
        self.return_layernorm_output_gathered = return_layernorm_output and return_layernorm_output_gathered
        self.in_features, self.out_features, self.eps = in_features, out_features, eps
        self.normalization, self.zero_centered_gamma = normalization, zero_centered_gamma
        self.return_layernorm_output, self.return_bias = return_layernorm_output, return_bias
        self.fuse_wgrad_accumulation, self.init_method = fuse_wgrad_accumulation, init_method
        norm_parameters(self, in_features, normalization, params_dtype, device)
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype, device=device))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=params_dtype, device=device)) if bias else None
        self._weight_cache = WeightCache()
        self.reset_parameters()

    def reset_parameters(self):
        reset_norm_parameters(self.layer_norm_weight, self.layer_norm_bias, self.zero_centered_gamma,
                              self.sequence_parallel)
        init_linear_parameters(self.weight, self.bias, self.init_method,
                               get_rng_state_tracker=self.get_rng_state_tracker, rng_tracker_name=self.rng_tracker_name,
                               bias_split=self.parallel_mode == "column")
        mark_linear_parameters(self.weight, self.bias, self.parallel_mode, self.sequence_parallel)

    @property
    def weight_quantizations(self):
        return self._weight_cache.quantizations

    def forward(self, x, is_first_microbatch=None):
        ln_out = normalize(x, self.normalization, self.layer_norm_weight, self.layer_norm_bias, self.eps,
                           self.zero_centered_gamma)
        ln_total = self.tp.column_input(ln_out) if self.parallel_mode == "column" else ln_out
        y = quantized_linear(ln_total, self.weight, None if self.return_bias else self.bias, self._weight_cache,
                             is_first_microbatch=is_first_microbatch,
                             fuse_wgrad_accumulation=self.fuse_wgrad_accumulation,
                             rows_gathered_over=self.tp.gathered_rows_group() if self.parallel_mode == "column" else None)
        ln_returned = ln_total if self.return_layernorm_output_gathered and self.sequence_parallel else ln_out
        return te_outputs(y, x, self.bias, ln_returned, self.return_bias, self.return_layernorm_output)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"normalization={self.normalization}, eps={self.eps}")
