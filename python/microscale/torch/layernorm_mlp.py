"""TransformerEngine's LayerNormMLP: y = FC2(act(FC1(norm(x)))), the normalization and the
activation in high precision (normalization.py, activations.py), both Linears quantized under
the autocast scope's recipe (quantized_linear.py). Parameter names as TransformerEngine's
(layer_norm_weight, layer_norm_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias), so its state
dicts load."""

import torch

from .. import _C
from .activations import activate, is_gated
from .normalization import norm_parameters, normalize, reset_norm_parameters
from .quantized_linear import QuantizedModule, WeightCache, init_linear_parameters, quantized_linear, te_outputs
from .tensor_parallel import attach, mark_linear_parameters


class LayerNormMLP(QuantizedModule):
    """LayerNorm or RMSNorm over the last dim of x [..., hidden_size], FC1 [hidden_size ->
    ffn_hidden_size, twice that for a gated activation], the activation, FC2 [ffn_hidden_size ->
    hidden_size]. FC1's weight is initialised by ``init_method``, FC2's by
    ``output_layer_init_method`` (each torch.nn.Linear's initialisation when None). Outputs in
    TransformerEngine's order: y, then FC2's bias (with return_bias, which leaves it out of y),
    then the normalization's output (with return_layernorm_output).

    Tensor parallelism (TransformerEngine's arguments; tensor_parallel.py): with a ``tp_group`` or
    ``tp_size`` above 1 each rank holds ffn_hidden_size / tp_size of the hidden features (FC1's
    rows, both halves of a gated FC1 for its share, FC2's columns); ``set_parallel_mode`` runs FC1
    column-parallel and FC2 row-parallel, with their collectives, and adds FC2's bias after the
    ranks' partial products are summed (outside the GEMM, as TransformerEngine does). With
    ``sequence_parallel`` (which needs set_parallel_mode) x holds this rank's rows: the
    normalization's output is gathered for FC1, FC2's output reduce-scattered back to these
    rows, and ``return_layernorm_output_gathered`` returns the gathered normalization output."""

    # Keyword arguments after eps: TransformerEngine's positions there hold other arguments.
    def __init__(self, hidden_size, ffn_hidden_size, eps=1e-5, *, bias=True, normalization="LayerNorm",
                 activation="gelu", return_layernorm_output=False, return_layernorm_output_gathered=False,
                 zero_centered_gamma=False, init_method=None, output_layer_init_method=None, return_bias=False,
                 params_dtype=None, device=None, fuse_wgrad_accumulation=False, tp_group=None, tp_size=1,
                 set_parallel_mode=False, sequence_parallel=False, get_rng_state_tracker=None, rng_tracker_name=None):
        super().__init__()
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        attach(self, "LayerNormMLP", tp_group, tp_size, None, sequence_parallel, get_rng_state_tracker,
               rng_tracker_name)
        if self.sequence_parallel and not set_parallel_mode:
            raise _C.Error("microscale.torch.LayerNormMLP: sequence_parallel needs set_parallel_mode (the collectives "
                           "that gather x's rows and scatter them back)")
        self.set_parallel_mode = set_parallel_mode
        self.return_layernorm_output_gathered = return_layernorm_output and return_layernorm_output_gathered
        self.size_per_partition = self.tp.split(ffn_hidden_size, "ffn_hidden_size")
        fc1_features = self.size_per_partition * (2 if is_gated(activation) else 1)
        self.hidden_size, self.ffn_hidden_size, self.eps = hidden_size, ffn_hidden_size, eps
        self.normalization, self.activation, self.zero_centered_gamma = normalization, activation, zero_centered_gamma
        self.return_layernorm_output, self.return_bias = return_layernorm_output, return_bias
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.init_method, self.output_layer_init_method = init_method, output_layer_init_method
        norm_parameters(self, hidden_size, normalization, params_dtype, device)

        def parameter(*shape):
            return torch.nn.Parameter(torch.empty(*shape, dtype=params_dtype, device=device))

        self.fc1_weight = parameter(fc1_features, hidden_size)
        self.fc1_bias = parameter(fc1_features) if bias else None
        self.fc2_weight = parameter(hidden_size, self.size_per_partition)
        self.fc2_bias = parameter(hidden_size) if bias else None
        self._fc1_cache, self._fc2_cache = WeightCache(), WeightCache()
        self.reset_parameters()

    def reset_parameters(self):
        reset_norm_parameters(self.layer_norm_weight, self.layer_norm_bias, self.zero_centered_gamma,
                              self.sequence_parallel)
        tracker = dict(get_rng_state_tracker=self.get_rng_state_tracker, rng_tracker_name=self.rng_tracker_name)
        init_linear_parameters(self.fc1_weight, self.fc1_bias, self.init_method, bias_split=True, **tracker)
        init_linear_parameters(self.fc2_weight, self.fc2_bias, self.output_layer_init_method,
                               fan_in=self.ffn_hidden_size, **tracker)
        mark_linear_parameters(self.fc1_weight, self.fc1_bias, "column", self.sequence_parallel)
        # FC2's bias is flagged only where FC2 runs row-parallel (TE's rule)
        mark_linear_parameters(self.fc2_weight, self.fc2_bias if self.set_parallel_mode else None, "row",
                               self.sequence_parallel)

    @property
    def weight_quantizations(self):
        """How many times FC1's and FC2's weights were quantized, together."""
        return self._fc1_cache.quantizations + self._fc2_cache.quantizations

    def forward(self, x, is_first_microbatch=None):
        ln_out = normalize(x, self.normalization, self.layer_norm_weight, self.layer_norm_bias, self.eps,
                           self.zero_centered_gamma)
        options = dict(is_first_microbatch=is_first_microbatch, fuse_wgrad_accumulation=self.fuse_wgrad_accumulation)
        ln_total = self.tp.column_input(ln_out) if self.set_parallel_mode else ln_out
        rows_group = self.tp.gathered_rows_group() if self.set_parallel_mode else None
        hidden = activate(quantized_linear(ln_total, self.fc1_weight, self.fc1_bias, self._fc1_cache,
                                           rows_gathered_over=rows_group, **options), self.activation)
        unfused_bias = self.set_parallel_mode  # added after the row-parallel sum, as TransformerEngine adds it
        y = quantized_linear(hidden, self.fc2_weight, None if self.return_bias or unfused_bias else self.fc2_bias,
                             self._fc2_cache, **options)
        if self.set_parallel_mode:
            y = self.tp.row_output(y)
            if self.fc2_bias is not None and not self.return_bias:
                y = y + self.fc2_bias.to(y.dtype)
        ln_returned = ln_total if self.return_layernorm_output_gathered and self.sequence_parallel else ln_out
        return te_outputs(y, x, self.fc2_bias, ln_returned, self.return_bias, self.return_layernorm_output)

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"bias={self.fc1_bias is not None}, normalization={self.normalization}, activation={self.activation}, "
                f"eps={self.eps}")
