"""Tensor and sequence parallelism for this package's layers, as TransformerEngine's modules take
them (their tp_group, tp_size, parallel_mode and sequence_parallel arguments; Megatron-LM's
scheme). A layer's weight is split over the ranks of a tensor-parallel group, and
torch.distributed collectives move its activations between them:

- column-parallel: each rank holds out_features / tp_size rows of the weight (and of the bias).
  The input is the whole x on every rank; backward all-reduces dx. With sequence_parallel each
  rank holds x's rows [r M / tp_size, (r + 1) M / tp_size) (x's first dim split): the forward
  all-gathers them and the backward reduce-scatters dx.
- row-parallel: each rank holds in_features / tp_size columns of the weight and of x (the
  column-parallel layer before it makes those); the partial products are all-reduced (with
  sequence_parallel: reduce-scattered over x's first dim) and the bias, whole on every rank, is
  added after that sum.

The quantized GEMMs then quantize what they are given, so a gathered input is quantized whole:
where TransformerEngine quantizes each rank's rows with the amax all-reduced over the group and
gathers the quantized data, this gives the same bytes (a block never straddles two ranks' rows when
each rank's row count is a multiple of the block, which the recipes require), at the cost of
gathering 16-bit values instead of 4- or 8-bit ones. (A row-scaled input, which TransformerEngine
refuses under sequence parallelism, is quantized whole too: its column amaxes are over every
rank's rows.) What the layer keeps of that gathered input
for its backward is a tp_size-th of it (own_share), as TransformerEngine keeps its rank's rows,
gathered again when backward needs it (gather_shares): the quantized bytes, not 16-bit values."""

import dataclasses

import torch
import torch.distributed as dist

from .. import _C

try:
    import torch.distributed._functional_collectives as funcol
except ImportError:  # a torch built without torch.distributed: only groups of one rank run
    funcol = None

PARALLEL_MODES = (None, "column", "row")

# Traced by torch.compile the collectives are torch's functional ones (ops dynamo records, so that
# fullgraph=True works); eagerly torch.distributed's own, which cost less host time.
if funcol is not None:
    _all_gather_single = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    _reduce_scatter_single = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


def _world_size(group):
    """The size of `group` (None: torch.distributed's default group); 1 without torch.distributed,
    -1 on a rank outside the group."""
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def _functional_group(group):
    return dist.group.WORLD if group is None else group


def _all_reduce(t, group):
    """The sum of `t` over the group's ranks, in a new tensor (t is an autograd input: left as it is)."""
    if torch.compiler.is_compiling():
        return funcol.wait_tensor(funcol.all_reduce(t.contiguous(), "sum", _functional_group(group)))
    out = t.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group)
    return out


def _gather_first_dim(t, group):
    """The ranks' tensors stacked along their first dim, in rank order."""
    t = t.contiguous()
    if torch.compiler.is_compiling():
        return funcol.wait_tensor(_all_gather_single(t, 0, _functional_group(group)))
    out = t.new_empty((_world_size(group) * t.shape[0],) + tuple(t.shape[1:]))
    dist.all_gather_into_tensor(out, t, group=group)
    return out


def _reduce_scatter_first_dim(t, group):
    """The sum of `t` over the ranks, split along its first dim: rank r gets part r."""
    t = t.contiguous()
    if torch.compiler.is_compiling():
        return funcol.wait_tensor(_reduce_scatter_single(t, "sum", 0, _functional_group(group)))
    size = _world_size(group)
    if t.shape[0] % size != 0:
        raise _C.Error(f"microscale.torch: sequence parallelism splits dim 0 of a {list(t.shape)} tensor over {size} "
                       "ranks: it must be a multiple of the group's size")
    out = t.new_empty((t.shape[0] // size,) + tuple(t.shape[1:]))
    dist.reduce_scatter_tensor(out, t, group=group)
    return out


class _CopyToTensorParallelRegion(torch.autograd.Function):
    """Forward: x as it is (every rank has it whole). Backward: the ranks' partial dx summed."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """Forward: the ranks' partial products summed. Backward: dy as it is (every rank has it whole)."""

    @staticmethod
    def forward(ctx, y, group):
        return _all_reduce(y, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Forward: the ranks' rows of x gathered. Backward: the ranks' partial dx summed and split back."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_first_dim(grad, ctx.group), None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Forward: the ranks' partial products summed, each rank keeping its rows. Backward: dy's rows
    gathered."""

    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        return _reduce_scatter_first_dim(y, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first_dim(grad, ctx.group), None


def _require_rows(x, layer):
    if x.dim() < 2:
        raise _C.Error(f"microscale.torch.{layer}: sequence parallelism splits x's first dim, and x is "
                       f"{list(x.shape)}: it needs at least 2 dims")


def _column_input(x, group, sequence_parallel, layer):
    if sequence_parallel:
        _require_rows(x, layer)
        return _GatherFromSequenceParallelRegion.apply(x, group)
    return _CopyToTensorParallelRegion.apply(x, group)


def _row_output(y, group, sequence_parallel, layer):
    if sequence_parallel:
        _require_rows(y, layer)
        return _ReduceScatterToSequenceParallelRegion.apply(y, group)
    return _ReduceFromTensorParallelRegion.apply(y, group)


# A QuantizedTensor's (ops.py) uint8 parts.
_QUANTIZED_PARTS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale")


def _parts(operand):
    """A backward operand's tensors: itself (a tensor), or a QuantizedTensor's parts present."""
    if isinstance(operand, torch.Tensor):
        return [operand]
    return [getattr(operand, name) for name in _QUANTIZED_PARTS if getattr(operand, name) is not None]


def _with_parts(operand, parts):
    """`operand` with _parts(operand) replaced by `parts`, in their order."""
    if isinstance(operand, torch.Tensor):
        return parts[0]
    names = [name for name in _QUANTIZED_PARTS if getattr(operand, name) is not None]
    return dataclasses.replace(operand, **dict(zip(names, parts)))


def own_share(saved, group):
    """What a column-parallel layer under sequence parallelism keeps for backward of its gathered
    input x [M, K]: a tp_size-th, as TransformerEngine keeps (its rank's rows). saved is x itself or
    its quantization (ops.QuantizedTensor); each of its tensors is cut into tp_size equal pieces of
    its values in row-major order (for x, the ranks' rows) and this rank keeps its piece, in memory of
    its own (a view would keep the whole alive). The whole was quantized at once, so any equal cut
    gathers back to the same bytes, whatever the layout. Returns (kept, shapes): shapes, the whole
    tensors' shapes for gather_shares, or None where saved is kept whole (a tensor whose size does
    not split into tp_size pieces). Until gathered, a QuantizedTensor kept so holds flat pieces."""
    size, rank = _world_size(group), dist.get_rank(group)
    parts = _parts(saved)
    if any(p.numel() % size for p in parts):
        return saved, None
    pieces = [p.reshape(-1).narrow(0, rank * (p.numel() // size), p.numel() // size).clone() for p in parts]
    return _with_parts(saved, pieces), [p.shape for p in parts]


def gather_shares(kept, shapes, group):
    """own_share's pieces of every rank gathered (one all-gather for all of them), each tensor whole
    again in its shape: the same bytes as before the cut."""
    pieces = _parts(kept)
    lengths = [p.numel() for p in pieces]
    stacked = _gather_first_dim(torch.cat(pieces), group).view(_world_size(group), -1)  # [size, sum(lengths)]
    return _with_parts(kept, [ranks.reshape(shape) for ranks, shape in zip(stacked.split(lengths, dim=1), shapes)])


class TensorParallel:
    """A layer's place in a tensor-parallel group, from TransformerEngine's arguments: ``tp_group``
    (a torch.distributed group), or without one ``tp_size`` (then, as in TransformerEngine, the
    collectives wait for set_tensor_parallel_group, which may name None: torch.distributed's
    default group); ``sequence_parallel`` (on only where the size is above 1, as TE has it).
    ``layer`` names the layer in errors. A copy (copy.deepcopy) shares the group; a pickled one
    (torch.save of the module) leaves it out, to be set again with set_tensor_parallel_group."""

    def __init__(self, layer, tp_group=None, tp_size=1, sequence_parallel=False):
        self.layer = layer
        self.group = tp_group
        self.size = tp_size if tp_group is None else _world_size(tp_group)
        if tp_group is not None and self.size < 1:
            raise _C.Error(f"microscale.torch.{layer}: this rank is not in tp_group")
        if not isinstance(self.size, int) or self.size < 1:
            raise _C.Error(f"microscale.torch.{layer}: tp_size must be a positive int, not {tp_size!r}")
        self.group_set = tp_group is not None or self.size == 1
        self.sequence_parallel = self.size > 1 and bool(sequence_parallel)

    def set_group(self, tp_group):
        """TransformerEngine's set_tensor_parallel_group: the group the collectives run on (None:
        the default group)."""
        self.group, self.group_set = tp_group, True

    def __deepcopy__(self, memo):
        twin = TensorParallel.__new__(TensorParallel)  # a process group cannot be copied: the twin shares it
        twin.__dict__.update(self.__dict__)
        memo[id(self)] = twin
        return twin

    def __getstate__(self):
        state = dict(self.__dict__)
        if state["group"] is not None:  # a process group cannot be pickled
            state["group"], state["group_set"] = None, False
        return state

    def local_features(self, in_features, out_features, parallel_mode):
        """This rank's (in_features, out_features) of a Linear split as parallel_mode says."""
        if parallel_mode == "column":
            return in_features, self.split(out_features, "out_features")
        if parallel_mode == "row":
            return self.split(in_features, "in_features"), out_features
        return in_features, out_features

    def split(self, features, name):
        """A rank's share of `features` (name: the argument, for the error)."""
        if features % self.size != 0:
            raise _C.Error(f"microscale.torch.{self.layer}: {name}={features} cannot be split over {self.size} "
                           "tensor-parallel ranks")
        return features // self.size

    def _require_group(self):
        """The collectives need torch.distributed, a group, and one of the size the weight was split
        for. (Checked eagerly; traced code leaves the checks to the collectives.)"""
        if torch.compiler.is_compiling():
            return
        if not self.group_set:
            raise _C.Error(f"microscale.torch.{self.layer}: tp_size is {self.size} and no tp_group was given: pass "
                           "tp_group, or call set_tensor_parallel_group (None: torch.distributed's default group)")
        if not dist.is_available() or not dist.is_initialized():
            raise _C.Error(f"microscale.torch.{self.layer}: tp_size is {self.size}, and torch.distributed is not "
                           "initialised (torch.distributed.init_process_group)")
        if _world_size(self.group) != self.size:
            raise _C.Error(f"microscale.torch.{self.layer}: the weight is split over {self.size} ranks, and the "
                           f"tensor-parallel group has {_world_size(self.group)}")

    def column_input(self, x):
        """A column-parallel layer's input: gathered (sequence_parallel) or taken whole, dx summed
        over the ranks in backward; x itself when the group has one rank."""
        if self.size == 1:
            return x
        self._require_group()
        return _column_input(x, self.group, self.sequence_parallel, self.layer)

    def gathered_rows_group(self):
        """The group over which column_input gathers x's rows (sequence_parallel), for the Linear to
        keep a tp_size-th of x for backward (own_share); None where nothing is gathered."""
        if self.size == 1 or not self.sequence_parallel:
            return None
        return _functional_group(self.group)

    def row_output(self, y):
        """A row-parallel layer's output: the ranks' partial products summed (sequence_parallel:
        and split along the first dim); y itself when the group has one rank."""
        if self.size == 1:
            return y
        self._require_group()
        return _row_output(y, self.group, self.sequence_parallel, self.layer)


def attach(module, layer, tp_group, tp_size, parallel_mode, sequence_parallel, get_rng_state_tracker,
           rng_tracker_name):
    """Gives `module` (a layer named `layer`) its TensorParallel as `module.tp`, and
    TransformerEngine's attributes: parallel_mode, sequence_parallel (on only where the group has
    more than one rank), tp_size, get_rng_state_tracker, rng_tracker_name."""
    if parallel_mode not in PARALLEL_MODES:
        raise _C.Error(f"microscale.torch.{layer}: parallel_mode must be None, 'column' or 'row', "
                       f"not {parallel_mode!r}")
    module.tp = TensorParallel(layer, tp_group, tp_size, sequence_parallel)
    module.parallel_mode, module.sequence_parallel, module.tp_size = parallel_mode, module.tp.sequence_parallel, \
        module.tp.size
    module.get_rng_state_tracker, module.rng_tracker_name = get_rng_state_tracker, rng_tracker_name


def mark_split(parameter, dim):
    """Megatron-LM's attributes on a parameter split over the tensor-parallel ranks along `dim` (its
    checkpointing and gradient code read them), as TransformerEngine sets them."""
    parameter.tensor_model_parallel = True
    parameter.partition_dim = dim
    parameter.partition_stride = 1


def mark_linear_parameters(weight, bias, parallel_mode, sequence_parallel):
    """A Linear's weight [out, in] and bias [out] (or None) marked as TransformerEngine marks them
    for `parallel_mode`: the weight split along dim 1 (row) or 0 (column, or none: TE marks it
    so), a column-parallel bias split along dim 0, a row-parallel one (whole on every rank) flagged
    with sequence_parallel."""
    mark_split(weight, 1 if parallel_mode == "row" else 0)
    if bias is not None and parallel_mode == "column":
        mark_split(bias, 0)
    elif bias is not None and parallel_mode == "row":
        mark_sequence_parallel(bias, sequence_parallel)


def mark_sequence_parallel(parameter, sequence_parallel):
    """Megatron-LM's flag on a parameter whole on every rank whose gradient, under sequence
    parallelism, each rank computes from its own rows: the caller sums it over the group."""
    if parameter is not None:
        parameter.sequence_parallel = sequence_parallel


def initialise(parameter, init, get_rng_state_tracker, rng_tracker_name):
    """init(parameter), under TransformerEngine's RNG tracker when one is given (Megatron-LM's
    CudaRNGStatesTracker: its fork gives each tensor-parallel rank its own random stream)."""
    if get_rng_state_tracker is None:
        init(parameter)
        return
    tracker = get_rng_state_tracker()
    with tracker.fork(rng_tracker_name) if rng_tracker_name else tracker.fork():
        init(parameter)
