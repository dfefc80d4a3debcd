"""microscale.torch's layers traced whole by torch.compile (fullgraph=True): the same outputs and
gradients as eager, bit for bit, for every recipe (stochastic rounding included: the traced layer
draws its seed from the same generator); the autocast scope entered around or inside the compiled
code; the weight quantized again on every call; what runs eagerly (fuse_wgrad_accumulation);
torch.export of a quantized model.
On CPU tensors here, where a traced layer is the composed one (linear_composed.py) and the eager
one the C++ layer; tests/gpu/test_frontend_cuda.py runs the traced layer on CUDA.

Needs the extension built (scripts/test.sh sets PYTHONPATH=build/release/python) and torch."""

import pytest
import torch
import torch._dynamo.testing

import microscale.torch as mst
from microscale.recipe import Format, MXFP8BlockScaling, NVFP4BlockScaling

RECIPES = {  # made in the test: recipe objects held by pytest's parametrization outlive the module
    "nvfp4": lambda: NVFP4BlockScaling(),
    "nvfp4_1d_no_rht_no_sr": lambda: NVFP4BlockScaling(disable_rht=True, disable_2d_quantization=True,
                                                       disable_stochastic_rounding=True),
    "mxfp8": lambda: MXFP8BlockScaling(),
    "mxfp8_hybrid": lambda: MXFP8BlockScaling(fp8_format=Format.HYBRID),
    "nvfp4_backward_high_precision": lambda: NVFP4BlockScaling(backward_override="high_precision"),
    "nvfp4_backward_dequantized": lambda: NVFP4BlockScaling(backward_override="dequantized"),
    "nvfp4_row_scaled": lambda: NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True),
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles anew: compiled code is kept per code object (Sequential.forward, the
    layers'), across models and tests, and dynamo stops compiling a function after 8 variants."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(mst.Linear(64, 64), torch.nn.ReLU(), mst.Linear(64, 32))


def train_step(model, forward, x, seed=5):
    """y, dx and every parameter's gradient of one step; `forward(t)` runs the model on t."""
    x = x.detach().requires_grad_()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # stochastic rounding's seed comes from torch's generator
    y = forward(x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in model.parameters()]


def assert_same_step(got, want):
    for n, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, n
        if n == 3:  # the first layer's bias gradient: float64 column sums in torch's order and in the C++ loop's
            ulp = 2.0**-23 if a.dtype == torch.float32 else 2.0**-7
            assert bool(((a.double() - b.double()).abs() <= ulp * b.double().abs()).all()), n
        else:
            assert torch.equal(a, b), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_traced_model_equals_eager_in_one_graph(recipe_name, dtype):
    recipe = RECIPES[recipe_name]()
    model = make_model()
    x = torch.randn(2, 16, 64).to(dtype)  # 3-D: folded to [M, K]
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)

    def under_scope(module):
        def forward(t):
            with mst.autocast(recipe=recipe):
                return module(t)
        return forward

    want = train_step(model, under_scope(model), x)
    assert_same_step(train_step(model, under_scope(compiled), x), want)
    assert_same_step(train_step(model, under_scope(compiled), x), want)  # the graph again: no recompilation
    assert counter.frame_count == 1
    assert all(layer.weight_quantizations == 1 for layer in (model[0], model[2]))  # eager's only: traced, uncounted


def test_inductor_gives_eager_bytes():
    x = torch.randn(32, 64)
    model = make_model()
    for recipe in (MXFP8BlockScaling(), NVFP4BlockScaling()):
        def forward(t, module):
            with mst.autocast(recipe=recipe):
                return module(t)

        want = train_step(model, lambda t: forward(t, model), x)
        compiled = torch.compile(model, fullgraph=True)
        # Inductor draws random numbers its own way unless told to call torch's: with its own, the
        # NVFP4 gradient's seed (so its stochastic rounding) differs from eager's.
        with torch._inductor.config.patch(fallback_random=True):
            assert_same_step(train_step(model, lambda t: forward(t, compiled), x), want)
        torch._dynamo.reset()


# Before torch 2.12 dynamo passes only Python constants to assume_constant_result's functions: a
# scope inside traced code is then autocast's error (test_scope_inside_needs_torch_2_12).
_SCOPES_TRACED = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 12)
needs_scopes_traced = pytest.mark.skipif(not _SCOPES_TRACED, reason="a scope inside traced code needs torch >= 2.12")


@pytest.mark.skipif(_SCOPES_TRACED, reason="torch >= 2.12 traces a scope inside compiled code")
def test_scope_inside_needs_torch_2_12():
    model = make_model()
    recipe = MXFP8BlockScaling()

    def step(t):
        with mst.autocast(recipe=recipe):
            return model(t)

    with pytest.raises(Exception, match="needs torch >= 2.12"):
        torch.compile(step, backend="aot_eager", fullgraph=True)(torch.randn(32, 64))


@needs_scopes_traced
def test_scope_inside_the_compiled_function():
    model = make_model()
    x = torch.randn(32, 64)
    recipe = MXFP8BlockScaling()  # made once: dynamo guards on the recipe object of a scope it traces
    holder = {"recipe": recipe}

    def step(t):
        with mst.autocast(recipe=holder["recipe"]):
            return model(t)

    def default_step(t):  # autocast()'s default recipe
        with mst.autocast():
            return model(t)

    want = train_step(model, step, x)
    assert_same_step(train_step(model, torch.compile(step, backend="aot_eager", fullgraph=True), x), want)
    want_default = train_step(model, default_step, x)
    compiled_default = torch.compile(default_step, backend="aot_eager", fullgraph=True)
    assert_same_step(train_step(model, compiled_default, x), want_default)
    # Another recipe object: the guard fails and the function compiles again under it.
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    compiled(x)
    holder["recipe"] = NVFP4BlockScaling()
    assert_same_step(train_step(model, compiled, x), train_step(model, step, x))


def test_scopes_around_the_compiled_model_may_make_their_recipes_anew():
    # Equal recipes share one LinearPlan, which is what the compiled code guards on: one graph.
    model = make_model()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    x = torch.randn(32, 64)
    for _ in range(10):
        with torch.no_grad(), mst.autocast(recipe=MXFP8BlockScaling()):
            assert torch.equal(compiled(x), model(x))
    assert counter.frame_count == 1


def test_each_call_follows_the_scope_it_runs_in():
    model = make_model()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(32, 64)
    with torch.no_grad():
        high = compiled(x)  # outside any scope: high precision, as eager
        assert torch.equal(high, model(x))
        for recipe in (MXFP8BlockScaling(), NVFP4BlockScaling(), MXFP8BlockScaling()):
            with mst.autocast(recipe=recipe):
                got, want = compiled(x), model(x)
            assert torch.equal(got, want) and not torch.equal(got, high)
            with mst.autocast(enabled=False):
                assert torch.equal(compiled(x), high)


def test_traced_layer_quantizes_the_weight_on_every_call():
    model = make_model()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(32, 64)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        for _ in range(2):  # the optimizer's in-place step changes what the graph quantizes
            before = compiled(x)
            before.square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            after = compiled(x)
            assert torch.equal(after, model(x)) and not torch.equal(after, before)
        # A write through .data: eager and traced layers both quantize what the weight holds (the
        # eager one keeps nothing unless is_first_microbatch asks).
        stale = compiled(x)
        model[0].weight.data.mul_(0.5)
        got = compiled(x)
        assert torch.equal(got, model(x))
        assert not torch.equal(got, stale)


def test_frozen_weight_and_layernorm_modules_trace_whole():
    torch.manual_seed(1)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    modules = [
        mst.LayerNormLinear(64, 64, params_dtype=torch.bfloat16, return_bias=True),
        mst.LayerNormMLP(64, 128, normalization="RMSNorm", activation="swiglu", params_dtype=torch.bfloat16),
    ]
    frozen = mst.Linear(64, 32, params_dtype=torch.bfloat16)
    frozen.weight.requires_grad_(False)
    for module in modules + [frozen]:
        def forward(t, m):
            with mst.autocast(recipe=NVFP4BlockScaling()):
                out = m(t)
            return out[0] + out[1] if isinstance(out, tuple) else out

        compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
        want = train_step(module, lambda t: forward(t, module), x)
        got = train_step(module, lambda t: forward(t, compiled), x)
        assert len(got) == len(want)
        assert all(torch.equal(a, b) for a, b in zip(got[:2], want[:2])), type(module).__name__
        for a, b in zip(got[2:], want[2:]):  # the parameters' gradients (None for a frozen weight)
            assert (a is None and b is None) or torch.equal(a, b), type(module).__name__
    assert frozen.weight.grad is None


def test_fuse_wgrad_accumulation_runs_eagerly_inside_compiled_code():
    # Its backward adds into weight.main_grad in place: the layer runs eagerly there (a graph break
    # on each side), with eager's results; fullgraph=True says so.
    def make():
        torch.manual_seed(2)
        layer = mst.Linear(64, 32, fuse_wgrad_accumulation=True)
        layer.weight.main_grad = torch.zeros(32, 64)
        return layer

    x = torch.randn(32, 64)
    results = []
    for wrap in (lambda m: m, lambda m: torch.compile(m, backend="aot_eager")):
        layer = make()
        with mst.autocast(recipe=MXFP8BlockScaling()):
            for _ in range(2):  # main_grad accumulates
                y = wrap(layer)(x)
                y.square().sum().backward()
        results.append((y.detach(), layer.weight.main_grad.clone(), layer.weight_quantizations))
        torch._dynamo.reset()
    assert results[0][2] == 2  # eager, is_first_microbatch None: quantized on each call
    for got in results[1:]:
        assert torch.equal(got[0], results[0][0]) and torch.equal(got[1], results[0][1]) and got[2] == 2
    layer = make()
    with mst.autocast(recipe=MXFP8BlockScaling()), pytest.raises(Exception, match="torch.compiler.disable"):
        torch.compile(layer, backend="aot_eager", fullgraph=True)(x)


def test_traced_layer_takes_the_gradient_of_a_sum():
    # dy is one value broadcast (strides of zero): traced, dynamo makes it contiguous (eagerly on
    # the CPU the C++ layer copies it; the composed layer's own copy is tested in
    # test_frontend_linear_composed.py and on CUDA).
    model = make_model()
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    results = []
    for forward in (model, torch.compile(model, backend="aot_eager", fullgraph=True)):
        xg = x.clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        with mst.autocast(recipe=MXFP8BlockScaling()):
            forward(xg).sum().backward()
        results.append([xg.grad, model[0].weight.grad, model[2].weight.grad])
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("strict", [pytest.param(True, marks=needs_scopes_traced), False])
def test_torch_export_takes_a_quantized_model(strict):
    # torch.export (dynamo's tracing with strict=True, torch's own without): the exported program
    # runs the quantized layers' ops and gives eager's outputs.
    model = make_model().eval()
    recipe = NVFP4BlockScaling()

    class UnderScope(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, t):
            with mst.autocast(recipe=recipe):
                return self.inner(t)

    x = torch.randn(32, 64)
    wrapped = UnderScope(model)
    with torch.no_grad():
        want = wrapped(x)
    program = torch.export.export(wrapped, (x,), strict=strict)
    assert torch.equal(program.module()(x), want)
    assert not torch.equal(program.module()(x), model(x))  # not the high-precision layers
    if not strict:  # dynamo's export wraps the layers in higher-order ops; torch's lists the ops
        ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        assert {"microscale.quantize.default", "microscale.gemm.default"} <= ops


def test_checkpoint_inside_compiled_code():
    # mst.checkpoint traced: the region is part of the graph (its recomputation the traced
    # operations), with eager's results.
    model = make_model()
    x = torch.randn(32, 64)
    recipe = MXFP8BlockScaling()

    def forward(t):
        return mst.checkpoint(model, t)

    want = train_step(model, lambda t: _under(recipe, forward, t), x)
    compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)
    assert_same_step(train_step(model, lambda t: _under(recipe, compiled, t), x), want)


def _under(recipe, fn, t):
    with mst.autocast(recipe=recipe):
        return fn(t)
