"""microscale.torch's tensor and sequence parallelism (TransformerEngine's tp_group, tp_size,
parallel_mode, sequence_parallel, set_parallel_mode), on CPU tensors in two processes (gloo).

Each rank's layer is checked bit for bit against what the same shard gives without tensor
parallelism: a plain layer of the rank's shape holding the rank's weight, fed the whole input,
its partial results summed over the ranks here by hand. With two ranks that sum is one addition,
the same whichever rank adds, so the bytes must match. LayerNormLinear and LayerNormMLP are
checked against the standalone LayerNorm and the tensor-parallel Linears they are made of.

Needs the extension built (scripts/test.sh sets PYTHONPATH=build/release/python) and torch. With
MICROSCALE_TEST_TP_DEVICE=cuda the two-process tests run on two GPUs over NCCL instead (the CUDA
layers; a build with the CUDA backend and a machine with two GPUs)."""

import contextlib
import copy
import functools
import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import microscale
import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling
from microscale.torch.activations import activate
from microscale.torch.linear_composed import quantize_for
from microscale.torch.linear_plan import linear_plan
from microscale.torch.tensor_parallel import gather_shares, own_share

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORLD = 2
DEVICE = os.environ.get("MICROSCALE_TEST_TP_DEVICE", "cpu")
M, K, N = 64, 64, 128  # x [M, K], W [N, K]: each rank's share of M, K and N is whole NVFP4 and MXFP8 blocks
RECIPES = {"nvfp4": NVFP4BlockScaling, "mxfp8": MXFP8BlockScaling, "high_precision": None,
           "nvfp4_dequantized_backward": functools.partial(NVFP4BlockScaling, backward_override="dequantized"),
           "mxfp8_high_precision_backward": functools.partial(MXFP8BlockScaling, backward_override="high_precision")}


def _scope(recipe_name):
    recipe = RECIPES[recipe_name]
    return mst.autocast(recipe=recipe()) if recipe is not None else contextlib.nullcontext()


def _sum_over_ranks(t):
    """The ranks' tensors added in rank order (with two ranks: one addition)."""
    parts = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(parts, t.contiguous())
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _rows(t, rank):
    """Rank `rank`'s share of t's first dim."""
    share = t.shape[0] // WORLD
    return t[rank * share:(rank + 1) * share]


def _columns(t, rank):
    share = t.shape[-1] // WORLD
    return t[..., rank * share:(rank + 1) * share]


def _data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(M, K, generator=g).bfloat16()
    dy = torch.randn(M, N, generator=g).bfloat16()
    return x.to(DEVICE), dy.to(DEVICE)


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _equal(name, got, expected):
    assert got.shape == expected.shape, f"{name}: {list(got.shape)} against {list(expected.shape)}"
    assert torch.equal(got, expected), f"{name}: {(got.float() - expected.float()).abs().max()} max difference"


def _step(layer, x, dy, recipe_name, seed=11):
    """y = layer(x), backward from dy, under the recipe; the gradients' stochastic rounding seeded alike."""
    torch.manual_seed(seed)
    with _scope(recipe_name):
        y = layer(x)
    y.backward(dy)
    return y.detach()


class _GroupSpy:
    """Records the group argument of every torch.distributed collective the layers call."""

    NAMES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")

    def __init__(self):
        self.groups, self.saved = [], {}

    def __enter__(self):
        for name in self.NAMES:
            self.saved[name] = original = getattr(dist, name)
            setattr(dist, name, lambda *a, _f=original, **k: (self.groups.append(k.get("group")), _f(*a, **k))[1])
        return self

    def __exit__(self, *exc):
        for name, original in self.saved.items():
            setattr(dist, name, original)


def _group_options(group_kind):
    """How the layer is given its group: "world" (tp_group=the default group), "default" (tp_size,
    then set_tensor_parallel_group(None)), "new" (a group made for it)."""
    if group_kind == "world":
        return {"tp_group": dist.group.WORLD}
    if group_kind == "new":
        return {"tp_group": dist.new_group(list(range(WORLD)))}
    return {"tp_size": WORLD}


@contextlib.contextmanager
def _saved_bytes():
    """The sizes in bytes of the tensors autograd saves inside the block (torch's saved-tensor
    hooks see the composed layer's operands; the C++ layer's context they do not)."""
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield sizes


def _kept_bytes(layer, x, recipe_name):
    """What a column-parallel layer under sequence parallelism keeps for backward, as
    TransformerEngine keeps it: its weight (or the weight's quantization, both usages) and a
    WORLD-th of what backward reads of the gathered x (x itself outside a scope or under a
    "high_precision" backward, its rowwise quantization under a "dequantized" one, else its
    columnwise one; the amaxes whole)."""
    plan = linear_plan(RECIPES[recipe_name]()) if RECIPES[recipe_name] is not None else None
    override, x2 = plan.backward_override if plan else "high_precision", x.reshape(-1, K)
    if override == "high_precision":  # or outside a scope
        return layer.weight.numel() * 2 + x2.numel() * 2 // WORLD  # bf16

    def size(q, share):
        parts = (q.rowwise_data, q.rowwise_scale, q.columnwise_data, q.columnwise_scale)
        return sum(p.numel() for p in parts if p is not None) // share + (8 if q.amax is not None else 0)

    x_kept = quantize_for(x2, plan.input, rowwise=override is not None, columnwise=override is None)
    return size(quantize_for(layer.weight.detach(), plan.weight), 1) + size(x_kept, WORLD)


def _check_linear(rank, parallel_mode, sequence_parallel, recipe_name, group_kind="world", dims=2, rows=M):
    x, dy = _data()
    x, dy = x[:rows], dy[:rows]
    if dims == 3:  # [s, b, h]: sequence parallelism splits s
        x, dy = x.reshape(M // 2, 2, K), dy.reshape(M // 2, 2, N)
    group = _group_options(group_kind)
    torch.manual_seed(100 + rank)  # each rank its own weight shard
    layer = mst.Linear(K, N, parallel_mode=parallel_mode, sequence_parallel=sequence_parallel,
                       params_dtype=torch.bfloat16, device=DEVICE, **group)
    if group_kind == "default":
        with pytest.raises(microscale.Error, match="no tp_group was given"):
            layer(x)
        layer.set_tensor_parallel_group(None)
    with torch.no_grad():  # a bias unlike 0: a column-parallel rank's own, a row-parallel one alike on all
        seed = 3 + rank if parallel_mode == "column" else 3
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=torch.Generator().manual_seed(seed)))
    with _GroupSpy() as spy:
        if parallel_mode == "column":
            assert list(layer.weight.shape) == [N // WORLD, K] and list(layer.bias.shape) == [N // WORLD]
            x_in = _leaf(_rows(x, rank) if sequence_parallel else x)
            dy_local = _columns(dy, rank)  # this rank's output features
            with _saved_bytes() as saved:
                y = _step(layer, x_in, dy_local, recipe_name)
            if sequence_parallel:
                assert sum(saved) == _kept_bytes(layer, x, recipe_name), saved
            plain = mst.Linear(K, N // WORLD, params_dtype=torch.bfloat16, device=DEVICE)
            plain.load_state_dict(layer.state_dict())
            x_ref = _leaf(x)
            y_ref = _step(plain, x_ref, dy_local, recipe_name)
            dx_ref = _sum_over_ranks(x_ref.grad)
            _equal("y", y, y_ref)
            _equal("dx", x_in.grad, _rows(dx_ref, rank) if sequence_parallel else dx_ref)
            _equal("dW", layer.weight.grad, plain.weight.grad)
            _equal("db", layer.bias.grad, plain.bias.grad)
        else:
            assert list(layer.weight.shape) == [N, K // WORLD] and list(layer.bias.shape) == [N]
            x_in = _leaf(_columns(x, rank))  # the column-parallel layer before makes this rank's features
            dy_in = _rows(dy, rank) if sequence_parallel else dy
            y = _step(layer, x_in, dy_in, recipe_name)
            plain = mst.Linear(K // WORLD, N, bias=False, params_dtype=torch.bfloat16, device=DEVICE)
            with torch.no_grad():
                plain.weight.copy_(layer.weight)
            x_ref = _leaf(x_in)
            torch.manual_seed(11)
            with _scope(recipe_name):
                partial = plain(x_ref)  # this rank's share of the product, rounded to bf16
            total = _sum_over_ranks(partial.detach())
            bias = _leaf(layer.bias)
            y_ref = (_rows(total, rank) if sequence_parallel else total) + bias
            y_ref.backward(dy_in)
            partial.backward(dy)  # the gathered dy: the whole of it
            _equal("y", y, y_ref.detach())
            _equal("dx", x_in.grad, x_ref.grad)
            _equal("dW", layer.weight.grad, plain.weight.grad)
            _equal("db", layer.bias.grad, bias.grad)
    # The layer's collectives (the reference's sums use dist.all_gather, which the spy leaves alone):
    # with sequence parallelism one in forward and one in backward, and for a column-parallel
    # layer a second in backward (its share of x gathered again); else one (column: dx's
    # all-reduce; row: y's); each on the layer's group.
    regathers = sequence_parallel and parallel_mode == "column"
    assert len(spy.groups) == (2 if sequence_parallel else 1) + regathers, spy.groups
    on_default = group.get("tp_group") is None  # None or dist.group.WORLD: the default group either way
    assert all(g is group.get("tp_group") or (on_default and g is dist.group.WORLD) for g in spy.groups), spy.groups


def _check_layernorm_linear(rank, recipe_name, sequence_parallel):
    x, dy = _data()
    options = dict(parallel_mode="column", sequence_parallel=sequence_parallel, tp_group=dist.group.WORLD,
                   params_dtype=torch.bfloat16, device=DEVICE)
    torch.manual_seed(100 + rank)
    fused = mst.LayerNormLinear(K, N, return_layernorm_output=True, return_layernorm_output_gathered=True, **options)
    norm, linear = mst.LayerNorm(K, params_dtype=torch.bfloat16, device=DEVICE), mst.Linear(K, N, **options)
    with torch.no_grad():
        torch.manual_seed(5)  # the normalization's parameters alike on every rank
        fused.layer_norm_weight.normal_(1.0, 0.1)
        fused.layer_norm_bias.normal_(0.0, 0.1)
        norm.weight.copy_(fused.layer_norm_weight)
        norm.bias.copy_(fused.layer_norm_bias)
        linear.weight.copy_(fused.weight)
        linear.bias.copy_(fused.bias)
    x_local = _rows(x, rank) if sequence_parallel else x
    x_fused, x_parts = _leaf(x_local), _leaf(x_local)
    torch.manual_seed(11)
    with _scope(recipe_name):
        y, ln_out = fused(x_fused)
    y.backward(_columns(dy, rank))
    y_parts = _step(lambda t: linear(norm(t)), x_parts, _columns(dy, rank), recipe_name)
    _equal("ln_out", ln_out.detach(), norm(x).detach())  # gathered with sequence parallelism: all M rows
    _equal("y", y.detach(), y_parts)
    _equal("dx", x_fused.grad, x_parts.grad)
    _equal("dW", fused.weight.grad, linear.weight.grad)
    _equal("db", fused.bias.grad, linear.bias.grad)
    _equal("d gamma", fused.layer_norm_weight.grad, norm.weight.grad)
    _equal("d beta", fused.layer_norm_bias.grad, norm.bias.grad)
    assert fused.layer_norm_weight.sequence_parallel == sequence_parallel and fused.weight.partition_dim == 0
    # A gradient into the returned normalization output: as TransformerEngine's LayerNormMLP treats
    # it, the gathered output's (sequence parallelism) is a rank's share, summed over the ranks and
    # scattered back to the rows as the GEMM's input gradient is; the rank's own output's is added
    # after that sum, the rank's alone.
    x_fused.grad = None
    share = torch.full_like(ln_out, 0.5 * (rank + 1))  # sums of these are exact: equal bits expected
    with _scope(recipe_name):
        _, ln_out = fused(x_fused)
    ln_out.backward(share)
    x_ref = _leaf(x_local)
    norm(x_ref).backward(_rows(_sum_over_ranks(share), rank) if sequence_parallel else share)
    _equal("dx from ln_out", x_fused.grad, x_ref.grad)


def _check_layernorm_mlp(rank, recipe_name, activation, sequence_parallel):
    x, dy = _data()
    ffn = 128
    options = dict(tp_group=dist.group.WORLD, sequence_parallel=sequence_parallel, params_dtype=torch.bfloat16,
                   device=DEVICE)
    torch.manual_seed(100 + rank)
    mlp = mst.LayerNormMLP(K, ffn, activation=activation, set_parallel_mode=True, return_bias=True,
                           return_layernorm_output=True, **options)
    gated = activation in ("swiglu", "geglu", "reglu")
    fc1 = mst.Linear(K, 2 * ffn if gated else ffn, parallel_mode="column", **options)
    fc2 = mst.Linear(ffn, K, parallel_mode="row", return_bias=True, **options)
    norm = mst.LayerNorm(K, params_dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad():
        for parameter in mlp.parameters():
            parameter.normal_(0.0, 0.1)
        torch.manual_seed(5)  # the parameters whole on every rank: alike on every rank
        for parameter in (mlp.layer_norm_weight, mlp.layer_norm_bias, mlp.fc2_bias):
            parameter.normal_(0.0, 0.1)
        norm.weight.copy_(mlp.layer_norm_weight)
        norm.bias.copy_(mlp.layer_norm_bias)
        fc1.weight.copy_(mlp.fc1_weight)
        fc1.bias.copy_(mlp.fc1_bias)
        fc2.weight.copy_(mlp.fc2_weight)
        fc2.bias.copy_(mlp.fc2_bias)
    assert list(mlp.fc2_weight.shape) == [K, ffn // WORLD] and mlp.fc2_weight.partition_dim == 1
    x_local = _rows(x, rank) if sequence_parallel else x
    dy_local = _rows(dy[:, :K], rank) if sequence_parallel else dy[:, :K]
    x_mlp, x_parts = _leaf(x_local), _leaf(x_local)
    torch.manual_seed(11)
    with _scope(recipe_name):
        y, bias, ln_out = mlp(x_mlp)
    y.backward(dy_local)

    def parts(t):
        out, out_bias = fc2(activate(fc1(norm(t)), activation))
        return out

    y_parts = _step(parts, x_parts, dy_local, recipe_name)
    _equal("y", y.detach(), y_parts)
    _equal("returned bias", bias, mlp.fc2_bias)
    _equal("ln_out", ln_out.detach(), norm(x_local).detach())  # this rank's rows (not asked gathered)
    _equal("dx", x_mlp.grad, x_parts.grad)
    _equal("fc1 dW", mlp.fc1_weight.grad, fc1.weight.grad)
    _equal("fc1 db", mlp.fc1_bias.grad, fc1.bias.grad)
    _equal("fc2 dW", mlp.fc2_weight.grad, fc2.weight.grad)


def _check_compiled(rank, recipe_name=None):
    """A column-parallel then a row-parallel Linear traced whole by torch.compile (fullgraph=True:
    the collectives are torch's functional ones in the graph), the results eager's. (MXFP8 on
    CUDA: there a compiled NVFP4 step draws its rounding seeds from the CUDA generator, an eager one
    from the CPU's.)"""
    x, dy = _data()
    torch.manual_seed(100 + rank)
    options = dict(tp_group=dist.group.WORLD, sequence_parallel=True, params_dtype=torch.bfloat16, device=DEVICE)
    model = torch.nn.Sequential(mst.Linear(K, N, parallel_mode="column", **options),
                                mst.Linear(N, K, parallel_mode="row", **options))
    with torch.no_grad():
        model[1].bias.copy_(torch.randn(K, generator=torch.Generator().manual_seed(3)))  # alike on every rank
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x_local, dy_local = _rows(x, rank), _rows(dy[:, :K], rank)
    results = []
    for run in (model, compiled):
        x_in = _leaf(x_local)
        y = _step(run, x_in, dy_local, recipe_name or ("mxfp8" if DEVICE == "cuda" else "nvfp4"))
        results.append([y, x_in.grad] + [p.grad.clone() for p in model.parameters()])
        model.zero_grad()
    for name, got, expected in zip(["y", "dx", "W1", "b1", "W2", "b2"], results[1], results[0]):
        _equal(name, got, expected)


def _check_setup(rank):
    """Errors, replicated parameters, and a layer that splits nothing."""
    layer = mst.Linear(K, N, parallel_mode="row", sequence_parallel=True, tp_group=dist.group.WORLD, device=DEVICE)
    with pytest.raises(microscale.Error, match="multiple of the group's size"):
        layer(torch.randn(3, K // WORLD, device=DEVICE))  # 3 rows do not split over 2 ranks
    layer = mst.Linear(K, N, parallel_mode="column", tp_size=4, device=DEVICE)
    layer.set_tensor_parallel_group(None)
    with pytest.raises(microscale.Error, match="split over 4 ranks, and the tensor-parallel group has 2"):
        layer(torch.randn(4, K, device=DEVICE))
    with pytest.raises(microscale.Error, match="at least 2 dims"):
        mst.Linear(K, N, parallel_mode="column", sequence_parallel=True, tp_group=dist.group.WORLD, device=DEVICE)(
            torch.randn(K, device=DEVICE))

    class Tracker:  # Megatron-LM's tracker: a random stream of each rank's own in its fork
        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            with torch.random.fork_rng(devices=[torch.cuda.current_device()] if DEVICE == "cuda" else []):
                torch.manual_seed(1000 + rank)
                yield

    torch.manual_seed(0)
    row = mst.Linear(K, N, parallel_mode="row", tp_group=dist.group.WORLD, get_rng_state_tracker=Tracker,
                     device=DEVICE)
    weights, biases = _gather_list(row.weight), _gather_list(row.bias)
    assert not torch.equal(weights[0], weights[1]), "each rank draws its own shard"
    assert torch.equal(biases[0], biases[1]), "a bias whole on every rank starts alike on every rank"
    # Megatron-LM passes its amax reduction group to the scope (TE's fp8_group): taken, and nothing
    # changes (these recipes reduce nothing at the end of a step).
    torch.manual_seed(0)
    column = mst.Linear(K, N, parallel_mode="column", sequence_parallel=True, tp_group=dist.group.WORLD,
                        device=DEVICE)
    x_local = torch.randn(16, K, device=DEVICE)
    with mst.fp8_autocast(fp8_recipe=NVFP4BlockScaling(), fp8_group=dist.group.WORLD):
        with_group = column(x_local)
    with mst.autocast(recipe=NVFP4BlockScaling()):
        _equal("y with the amax reduction group", with_group, column(x_local))
    # parallel_mode None with a group of two: nothing split, no collective
    torch.manual_seed(0)
    whole = mst.Linear(K, N, tp_group=dist.group.WORLD, device=DEVICE)
    torch.manual_seed(0)
    plain = mst.Linear(K, N, device=DEVICE)
    x = torch.randn(4, K, device=DEVICE)
    with _GroupSpy() as spy:
        _equal("y", whole(x), plain(x))
    assert spy.groups == []


def _check_shares(rank):
    """own_share and gather_shares on their own: each rank keeps its piece of every tensor's bytes
    in memory order, the gather gives the whole back, and a tensor that does not split into WORLD
    pieces is kept whole."""
    x = torch.arange(6 * 4, dtype=torch.float32, device=DEVICE).reshape(6, 4)
    kept, shapes = own_share(x, dist.group.WORLD)
    _equal("x's piece", kept, x.reshape(-1)[rank * 12:(rank + 1) * 12])
    _equal("x gathered", gather_shares(kept, shapes, dist.group.WORLD), x)
    torch.manual_seed(0)  # the same whole tensor on every rank, as a gathered input is
    q = mst.quantize(torch.randn(32, 64, device=DEVICE).bfloat16(), "nvfp4", columnwise=True, rht=True)
    kept, shapes = own_share(q, dist.group.WORLD)
    assert kept.columnwise_data.numel() * WORLD == q.columnwise_data.numel()
    whole = gather_shares(kept, shapes, dist.group.WORLD)
    for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        _equal(name, getattr(whole, name), getattr(q, name))
    odd = torch.ones(3, 5, device=DEVICE)
    kept, shapes = own_share(odd, dist.group.WORLD)
    assert kept is odd and shapes is None


def _gather_list(t):
    parts = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(parts, t.detach().contiguous())
    return parts


def _worker(rank, store, check, args):
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", init_method=f"file://{store}", world_size=WORLD,
                            rank=rank)
    torch.set_num_threads(1)
    try:
        check(rank, *args)
        dist.barrier()  # after a passing check: no rank leaves while another may still talk to it
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path, check, *args):
    mp.spawn(_worker, args=(str(tmp_path / "store"), check, args), nprocs=WORLD)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("parallel_mode", ["column", "row"])
def test_linear_equals_its_shard_without_tensor_parallelism(tmp_path, parallel_mode, sequence_parallel, recipe_name):
    _spawn(tmp_path, _check_linear, parallel_mode, sequence_parallel, recipe_name)


@pytest.mark.parametrize("recipe_name,rows", [("nvfp4_dequantized_backward", M), ("mxfp8_high_precision_backward", M),
                                              ("nvfp4", 16), ("mxfp8", 32)])
def test_column_parallel_keeps_a_share_for_backward(tmp_path, recipe_name, rows):
    """Under sequence parallelism, backward's copy of the gathered x is a WORLD-th of it, whatever
    backward reads, also where a rank's rows are not whole blocks of x's quantization."""
    _spawn(tmp_path, _check_linear, "column", True, recipe_name, "world", 2, rows)


@pytest.mark.parametrize("group_kind", ["default", "new"])
def test_linear_on_the_group_it_is_given(tmp_path, group_kind):
    _spawn(tmp_path, _check_linear, "column", True, "nvfp4", group_kind)


@pytest.mark.parametrize("parallel_mode", ["column", "row"])
def test_linear_takes_three_dim_inputs(tmp_path, parallel_mode):
    _spawn(tmp_path, _check_linear, parallel_mode, True, "mxfp8", "world", 3)


@pytest.mark.parametrize("recipe_name,sequence_parallel", [("nvfp4", True), ("mxfp8", True), ("nvfp4", False)])
def test_layernorm_linear_is_the_norm_then_the_column_parallel_linear(tmp_path, recipe_name, sequence_parallel):
    _spawn(tmp_path, _check_layernorm_linear, recipe_name, sequence_parallel)


@pytest.mark.parametrize("recipe_name,activation,sequence_parallel",
                         [("nvfp4", "gelu", True), ("mxfp8", "swiglu", True), ("nvfp4", "swiglu", False)])
def test_layernorm_mlp_is_column_then_row_parallel(tmp_path, recipe_name, activation, sequence_parallel):
    _spawn(tmp_path, _check_layernorm_mlp, recipe_name, activation, sequence_parallel)


@pytest.mark.parametrize("recipe_name", [None, "high_precision"])  # None: NVFP4 (MXFP8 on CUDA)
def test_compiled_layers_equal_eager(tmp_path, recipe_name):
    _spawn(tmp_path, _check_compiled, recipe_name)


def test_shares_of_backward_operands(tmp_path):
    _spawn(tmp_path, _check_shares)


def test_setup_errors_and_replicated_parameters(tmp_path):
    _spawn(tmp_path, _check_setup)


# In this process: construction, and what needs no collective.


@pytest.mark.parametrize("make,shape", [
    (lambda: mst.Linear(K, N, parallel_mode="column", tp_size=2), [N // 2, K]),
    (lambda: mst.Linear(K, N, parallel_mode="row", tp_size=2), [N, K // 2]),
    (lambda: mst.LayerNormLinear(K, N, parallel_mode="column", tp_size=2), [N // 2, K]),
    (lambda: mst.GroupedLinear(3, K, N, bias=False, parallel_mode="row", tp_size=2), [N, K // 2]),
])
def test_shard_shapes(make, shape):
    layer = make()
    assert list(layer.weight.shape if hasattr(layer, "weight") else layer.weight0.shape) == shape


def test_megatron_attributes():
    column = mst.Linear(K, N, parallel_mode="column", tp_size=2, sequence_parallel=True)
    assert column.weight.tensor_model_parallel and column.weight.partition_dim == 0
    assert column.bias.partition_dim == 0 and column.sequence_parallel
    row = mst.Linear(K, N, parallel_mode="row", tp_size=2, sequence_parallel=True)
    assert row.weight.partition_dim == 1 and row.bias.sequence_parallel is True
    assert mst.LayerNorm(K, sequence_parallel=True).weight.sequence_parallel
    assert mst.Linear(K, N, sequence_parallel=True).sequence_parallel is False  # one rank: nothing to split


def test_row_parallel_default_init_takes_the_whole_layers_fan_in():
    torch.manual_seed(0)
    row = mst.Linear(256, 64, parallel_mode="row", tp_size=4)  # 64 of the 256 input features here
    bound = 1 / 256**0.5
    assert row.weight.abs().max() <= bound and row.weight.abs().max() > 0.95 * bound
    torch.manual_seed(0)
    plain = mst.Linear(48, 32)
    torch.manual_seed(0)
    reference = torch.nn.Linear(48, 32)
    assert torch.equal(plain.weight, reference.weight) and torch.equal(plain.bias, reference.bias)


def test_rng_tracker_forks_around_the_initialisation():
    forks = []

    class Tracker:
        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            forks.append(name)
            yield

    mst.Linear(K, N, parallel_mode="column", tp_size=2, get_rng_state_tracker=Tracker, init_method=torch.nn.init.zeros_)
    mst.LayerNormMLP(K, 128, tp_size=2, get_rng_state_tracker=Tracker, rng_tracker_name="expert-rng")
    # the weights, and FC1's bias (split over the ranks); not FC2's bias, whole on every rank
    assert forks == ["model-parallel-rng", "expert-rng", "expert-rng", "expert-rng"]


@pytest.mark.parametrize("make,match", [
    (lambda: mst.Linear(K, N, parallel_mode="diagonal"), "parallel_mode must be None, 'column' or 'row'"),
    (lambda: mst.Linear(K, 90, parallel_mode="column", tp_size=4), "out_features=90 cannot be split over 4"),
    (lambda: mst.Linear(K, N, tp_size=0), "tp_size must be a positive int"),
    (lambda: mst.LayerNormLinear(K, N, parallel_mode="row"), "parallel_mode 'row' is not supported"),
    (lambda: mst.LayerNormMLP(K, 128, tp_size=2, sequence_parallel=True), "needs set_parallel_mode"),
    (lambda: mst.LayerNormMLP(K, 100, tp_size=3), "ffn_hidden_size=100 cannot be split over 3"),
    (lambda: mst.GroupedLinear(2, K, N, tp_size=2), "bias is not supported with tp_size > 1"),
])
def test_bad_arguments(make, match):
    with pytest.raises(microscale.Error, match=match):
        make()


def test_collectives_need_torch_distributed():
    assert not dist.is_initialized()
    layer = mst.Linear(K, N, parallel_mode="column", tp_size=2)
    layer.set_tensor_parallel_group(None)  # the default group
    with pytest.raises(microscale.Error, match="torch.distributed is not initialised"):
        layer(torch.randn(4, K))
    # A group of one rank runs no collective at all.
    assert mst.Linear(K, N, parallel_mode="row")(torch.ones(2, K)).shape == (2, N)


def test_set_tensor_parallel_group_and_copies():
    layer = mst.LayerNormMLP(K, 128, tp_size=2, set_parallel_mode=True)
    sentinel = object()  # a process group cannot be copied nor pickled: nor can this
    layer.set_tensor_parallel_group(sentinel)
    assert layer.tp_group is sentinel
    assert copy.deepcopy(layer).tp_group is sentinel  # a copy shares the group
    restored = pickle.loads(pickle.dumps(layer))  # a pickled layer leaves it out, to be set again
    assert restored.tp_group is None and not restored.tp.group_set
