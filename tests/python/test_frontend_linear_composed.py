"""The Linear composed from the torch-level ops (what CUDA tensors run, linear_composed.py) and
gemm's exact emulation (what CUDA runs where the NVFP4 kernel does not), checked on CPU tensors:
the composition must give the C++ linear_forward / linear_backward's results bit for bit, and the
emulation the CPU GEMM's within the fp32 accumulation bound. tests/gpu/test_frontend_cuda.py
runs both on CUDA."""

import contextlib

import pytest
import torch

import microscale as ms
import microscale.torch as mst
from microscale.recipe import Format, MXFP8BlockScaling, NVFP4BlockScaling
from microscale.torch.gemm import _emulated_operand, _gemm_emulated
from microscale.torch.quantized_linear import _LinearFunction
from microscale.torch import linear_composed
from microscale.torch.linear_composed import ComposedLinearFunction, quantize_for
from microscale.torch.linear_plan import linear_plan

RECIPES = {  # made in the test: recipe objects held by pytest's parametrization outlive the module
    "nvfp4": lambda: NVFP4BlockScaling(),
    "nvfp4_1d_no_rht": lambda: NVFP4BlockScaling(disable_rht=True, disable_2d_quantization=True),
    "nvfp4_4over6": lambda: NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="all"),
    "nvfp4_row_scaled": lambda: NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True),
    "nvfp4_row_scaled_4over6_dequantized": lambda: NVFP4BlockScaling(
        disable_rht=True, row_scaled_activation=True, nvfp4_4over6="activations", backward_override="dequantized"),
    "mxfp8": lambda: MXFP8BlockScaling(),
    "mxfp8_hybrid": lambda: MXFP8BlockScaling(fp8_format=Format.HYBRID),
    "mxfp8_2d": lambda: MXFP8BlockScaling(enable_2d_quantization=True),  # weights in 32x32 tiles
    # TransformerEngine's backward_override: the backward's GEMMs unquantized (dense, the library's GEMM)
    "nvfp4_backward_high_precision": lambda: NVFP4BlockScaling(backward_override="high_precision"),
    "nvfp4_backward_dequantized": lambda: NVFP4BlockScaling(backward_override="dequantized"),
    "mxfp8_backward_dequantized": lambda: MXFP8BlockScaling(backward_override="dequantized"),
}


def run_layer(function, cached_weight, recipe, x, weight, bias, dy, seed):
    """One forward and backward through `function`; returns y and the three gradients."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    bias = bias.detach().requires_grad_()
    y = function.apply(x, weight, bias, linear_plan(recipe), cached_weight, True, False)
    torch.manual_seed(seed)  # the stochastic rounding's seed comes from torch's generator
    y.backward(dy)
    return y.detach(), x.grad, weight.grad, bias.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_composed_linear_equals_the_cpp_linear_bit_for_bit(recipe_name, dtype):
    """y, dx and dW bit for bit; db within the rounding of two float64 summation orders."""
    recipe = RECIPES[recipe_name]()
    g = torch.Generator().manual_seed(3)
    m, k, n = 64, 96, 64  # MX's columnwise blocks of 32 need N % 32 == 0 for W^T
    x = torch.randn(2, m // 2, k, generator=g).to(dtype)  # 3-D: folded to [M, K]
    weight = torch.randn(n, k, generator=g) * 0.1
    bias = torch.randn(n, generator=g)
    dy = torch.randn(2, m // 2, n, generator=g).to(dtype)
    options = ms._C.quantize_options(recipe, "weight")
    want = run_layer(_LinearFunction, ms._C.quantize(weight, options, False), recipe, x, weight, bias, dy, 9)
    got = run_layer(ComposedLinearFunction, quantize_for(weight, options), recipe, x, weight, bias, dy, 9)
    for name, a, b in zip(("y", "dx", "dW"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
    # db: float64 sums in torch's order and in the C++ loop's, each rounded to fp32 and dy's dtype
    # (equal unless a rounding tie falls between them: one ulp of dy's dtype apart at most).
    db, want_db = got[3], want[3]
    assert db.dtype == want_db.dtype and db.shape == want_db.shape
    ulp = 2.0**-23 if dtype == torch.float32 else 2.0**-7
    assert bool(((db.double() - want_db.double()).abs() <= ulp * want_db.double().abs()).all())


@pytest.mark.parametrize("recipe_name", ["mxfp8", "nvfp4"])
def test_composed_linear_takes_broadcast_inputs_and_gradients(recipe_name):
    # A broadcast x (strides of zero) and the gradient of a mean (one value broadcast): the kernels
    # refuse zero strides, so the composed layer copies such tensors; the C++ layer's results.
    recipe = RECIPES[recipe_name]()
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    options = ms._C.quantize_options(recipe, "weight")
    results = []
    for function, cached in ((_LinearFunction, ms._C.quantize(weight, options, False)),
                             (ComposedLinearFunction, quantize_for(weight, options))):
        x = torch.linspace(-2, 2, 64).to(torch.bfloat16).expand(32, 64).requires_grad_()
        w = weight.clone().requires_grad_()
        y = function.apply(x, w, None, linear_plan(recipe), cached, True, False)
        torch.manual_seed(8)
        y.mean().backward()
        results.append((y.detach(), x.grad, w.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_composed_linear_skips_what_no_one_asked_for_and_runs_once(monkeypatch):
    recipe = NVFP4BlockScaling()
    x = torch.randn(32, 64, requires_grad=True)
    weight = torch.randn(16, 64)  # frozen: no X^T quantized, no wgrad GEMM
    wq = quantize_for(weight, ms._C.quantize_options(recipe, "weight"))
    calls = []
    real_gemm = linear_composed.gemm
    monkeypatch.setattr(linear_composed, "gemm", lambda *a, **k: calls.append(k) or real_gemm(*a, **k))
    y = ComposedLinearFunction.apply(x, weight, None, linear_plan(recipe), wq, True, False)
    (dx,) = torch.autograd.grad(y.sum(), x, retain_graph=True)
    assert dx.shape == x.shape
    assert len(calls) == 2  # fprop and dgrad
    assert not any(k.get("a_usage") == "columnwise" for k in calls)
    with pytest.raises(RuntimeError, match="kept no context"):
        torch.autograd.grad(y.sum(), x)
    with pytest.raises(ms.Error, match="K = 32"):
        ComposedLinearFunction.apply(torch.randn(32, 32), weight, None, linear_plan(recipe), wq, False, False)


def quantized(scheme, rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    return mst.quantize(torch.randn(rows, cols, generator=g).to(torch.bfloat16), scheme, columnwise=True)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp4"])
@pytest.mark.parametrize("layout", ["TN", "NT"])
def test_emulated_gemm_within_the_fp32_bound_of_the_cpu_gemm(scheme, layout):
    if layout == "TN":  # fprop: x [64, 128] rowwise, W [96, 128] rowwise
        a, b, usage, k = quantized(scheme, 64, 128, 1), quantized(scheme, 96, 128, 2), "rowwise", 128
    else:  # wgrad: dy [64, 96] and x [64, 128] columnwise, contracted over M = 64
        a, b, usage, k = quantized(scheme, 64, 96, 3), quantized(scheme, 64, 128, 4), "columnwise", 64
    want = mst.gemm(a, b, a_usage=usage, b_usage=usage)
    c, bias = torch.randn(want.shape), torch.randn(want.shape[1])
    want = mst.gemm(a, b, a_usage=usage, b_usage=usage, alpha=0.5, beta=2.0, c=c, bias=bias)
    got = _gemm_emulated(a, b, usage, usage, 0.5, 2.0, c, bias, torch.float32)
    assert got.dtype == torch.float32 and got.shape == want.shape
    # The CPU GEMM's fp32 sums are within K * 2^-23 of the sum of |products| (the emulation's float64
    # sums far closer; NVFP4's per-element global scale adds 2^-23), and each result rounds once.
    A, B = _emulated_operand(a, usage), _emulated_operand(b, usage)
    magnitude = 0.5 * (A.abs() @ B.abs().T) + 2.0 * c.abs().double() + bias.abs().double()
    bound = (k + 4) * 2.0**-23 * magnitude + 2.0**-23 * want.abs().double()
    assert bool(((got.double() - want.double()).abs() <= bound).all())


def test_emulated_gemm_exact_where_the_sums_are_and_its_errors():
    x = torch.tensor([[1.0, -2.0, 0.5, 4.0] * 8] * 2)  # [2, 32]: every product and sum exact in fp32
    q = mst.quantize(x, "mxfp8_e4m3")
    got = _gemm_emulated(q, x, "rowwise", "rowwise", 1.0, 0.0, None, None, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, (x @ x.T).to(torch.bfloat16))
    with pytest.raises(ms.Error, match="no columnwise"):
        _gemm_emulated(q, x, "columnwise", "rowwise", 1.0, 0.0, None, None, torch.float32)
    with pytest.raises(ms.Error, match="K differ"):
        _gemm_emulated(q, torch.ones(2, 16), "rowwise", "rowwise", 1.0, 0.0, None, None, torch.float32)
    with pytest.raises(ms.Error, match="must be 2-D"):
        _gemm_emulated(q, torch.ones(2, 2, 16), "rowwise", "rowwise", 1.0, 0.0, None, None, torch.float32)


def _layer_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 96, generator=g)
    weight = torch.randn(64, 96, generator=g) * 0.1
    bias = torch.randn(64, generator=g)
    dy = torch.randn(64, 64, generator=g)
    return x, weight, bias, dy


@pytest.mark.parametrize("function", [_LinearFunction, ComposedLinearFunction], ids=["cpp", "composed"])
@pytest.mark.parametrize("recipe_name", ["nvfp4", "mxfp8"])
def test_a_frozen_weight_gets_no_gradient_and_the_same_dx(function, recipe_name):
    recipe = RECIPES[recipe_name]()
    x, weight, bias, dy = _layer_inputs(5)
    options = ms._C.quantize_options(recipe, "weight")
    cached = ms._C.quantize(weight, options, False) if function is _LinearFunction else quantize_for(weight, options)
    want = run_layer(function, cached, recipe, x, weight, bias, dy, 9)
    xg, bg = x.clone().requires_grad_(), bias.clone().requires_grad_()
    # the weight does not require grad
    y = function.apply(xg, weight.clone(), bg, linear_plan(recipe), cached, True, False)
    torch.manual_seed(9)
    y.backward(dy)
    assert torch.equal(y.detach(), want[0]) and torch.equal(xg.grad, want[1]) and torch.equal(bg.grad, want[3])


def test_a_frozen_weight_quantizes_no_x_columnwise(monkeypatch):
    # dx keeps its bytes either way: what shows the skip is the forward's own call.
    recipe = RECIPES["nvfp4"]()
    x, weight, bias, dy = _layer_inputs(7)
    seen = []
    real_forward = ms._C.linear_forward
    monkeypatch.setattr(ms._C, "linear_forward", lambda *a, **k: seen.append(k.get("weight_grad")) or real_forward(*a, **k))
    real_quantize_for = linear_composed.quantize_for
    monkeypatch.setattr(linear_composed, "quantize_for",
                        lambda t, o, **k: seen.append(k.get("columnwise")) or real_quantize_for(t, o, **k))
    options = ms._C.quantize_options(recipe, "weight")
    for function, cached in ((_LinearFunction, ms._C.quantize(weight, options, False)),
                             (ComposedLinearFunction, quantize_for(weight, options))):
        seen.clear()
        function.apply(x.clone().requires_grad_(), weight, bias, linear_plan(recipe), cached, True, False)
        assert seen == [False], function.__name__  # weight_grad=False / columnwise=False for x


@pytest.mark.parametrize("function", [_LinearFunction, ComposedLinearFunction], ids=["cpp", "composed"])
def test_fuse_wgrad_accumulation_adds_into_main_grad(function):
    """Two micro-batches into weight.main_grad: the sum of the two returned dWs (fp32, from zero:
    each addition rounds as the unfused sum does), TransformerEngine's placeholder as weight.grad."""
    recipe = RECIPES["nvfp4"]()
    x, weight, bias, dy = _layer_inputs(6)
    options = ms._C.quantize_options(recipe, "weight")
    cached = ms._C.quantize(weight, options, False) if function is _LinearFunction else quantize_for(weight, options)
    dws = [run_layer(function, cached, recipe, x * s, weight, bias, dy, 9 + s)[2] for s in (1, 2)]
    w = weight.clone().requires_grad_()
    w.main_grad = torch.zeros_like(weight)
    for s in (1, 2):
        y = function.apply(x * s, w, None, linear_plan(recipe), cached, True, True)
        torch.manual_seed(9 + s)
        y.backward(dy)
    assert torch.equal(w.main_grad, dws[0] + dws[1]) and w.grad is None
    # Megatron-LM's attributes: the flag is set and weight.grad is a placeholder (zeros if asked).
    w.grad_added_to_main_grad, w.zero_out_wgrad = False, True
    function.apply(x, w, None, linear_plan(recipe), cached, True, True).backward(dy)
    assert w.grad_added_to_main_grad and torch.equal(w.grad, torch.zeros_like(weight))
    for main_grad, match in ((None, "does not have"), (torch.zeros(64, 96, dtype=torch.bfloat16), "must be float32")):
        w2 = weight.clone().requires_grad_()
        if main_grad is not None:
            w2.main_grad = main_grad
        with pytest.raises(ms.Error, match=match):
            function.apply(x, w2, None, linear_plan(recipe), cached, True, True).backward(dy)


def test_linear_module_frozen_and_fused():
    torch.manual_seed(4)
    layer = mst.Linear(96, 64, fuse_wgrad_accumulation=True)
    assert "fuse_wgrad_accumulation=True" in repr(layer)
    layer.weight.main_grad = torch.zeros(64, 96)
    x = torch.randn(32, 96)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        layer(x).sum().backward()
    assert layer.weight.grad is None and bool(layer.weight.main_grad.abs().sum() > 0)
    layer.weight.requires_grad_(False)
    before = layer.weight.main_grad.clone()
    xg = x.clone().requires_grad_()
    with mst.autocast(recipe=MXFP8BlockScaling()):
        layer(xg).sum().backward()
    assert xg.grad is not None and torch.equal(layer.weight.main_grad, before)


# CPU, and CUDA where there is a GPU (tests/gpu/run.sh runs the CUDA cases of the two tests below)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and ms._C.cuda_built()), reason="needs a GPU and the CUDA backend"))]


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("device", DEVICES)
def test_fuse_wgrad_accumulation_outside_a_scope_adds_into_main_grad(dims, device):
    """In high precision too (TE's BF16 wgrad GEMM accumulates into main_grad): two micro-batches'
    dW added in fp32 into weight.main_grad, exact here (values on a coarse grid: every product and
    sum is exact in fp32), weight.grad None; y, dx and db torch's nn.Linear's, bit for bit. (The
    CUDA case runs in tests/gpu/run.sh.)"""
    g = torch.Generator().manual_seed(12)
    shape = (32, 96) if dims == 2 else (4, 8, 96)
    grid = lambda *size: (torch.randint(-8, 9, size, generator=g) / 8).bfloat16().to(device)  # noqa: E731
    xs, dy = [grid(*shape) * s for s in (1, 2)], grid(*shape[:-1], 64)
    layer = mst.Linear(96, 64, fuse_wgrad_accumulation=True, params_dtype=torch.bfloat16, device=device)
    plain = torch.nn.Linear(96, 64, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        layer.weight.copy_(grid(64, 96))
        layer.bias.copy_(grid(64))
    plain.load_state_dict(layer.state_dict())
    layer.weight.main_grad = torch.zeros(64, 96, device=device)
    want = torch.zeros(64, 96, dtype=torch.float64, device=device)
    for x in xs:
        xg, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
        y, y_plain = layer(xg), plain(xp)
        y.backward(dy)
        y_plain.backward(dy)
        assert torch.equal(y, y_plain) and torch.equal(xg.grad, xp.grad)
        want += dy.double().reshape(-1, 64).t() @ x.double().reshape(-1, 96)
    assert torch.equal(layer.weight.main_grad, want.float()) and layer.weight.grad is None
    assert torch.equal(layer.bias.grad, plain.bias.grad)
    layer.weight.grad_added_to_main_grad = False  # Megatron-LM's attribute: a placeholder weight.grad
    layer(xs[0]).sum().backward()
    assert layer.weight.grad_added_to_main_grad and layer.weight.grad.shape == layer.weight.shape


@pytest.mark.parametrize("layout", ["2-D", "3-D", "column-major", "broadcast", "torch.autocast"])
@pytest.mark.parametrize("device", DEVICES)
def test_high_precision_linear_with_main_grad_is_torchs_linear(layout, device):
    """The high-precision layer with main_grad against torch's nn.Linear on random data (sums that
    round): y, dx and db bit for bit, for the layouts whose gradients torch computes as the
    layer does (a column-major x takes the other form of dx; on this CPU both forms give the same
    bits, on CUDA they may not), and under torch.autocast (the operands cast to bf16, the
    gradients cast back)."""
    torch.manual_seed(13)
    layer = mst.Linear(96, 64, fuse_wgrad_accumulation=True, device=device)
    plain = torch.nn.Linear(96, 64, device=device)
    plain.load_state_dict(layer.state_dict())
    layer.weight.main_grad = torch.zeros(64, 96, device=device)
    x = {"2-D": lambda: torch.randn(32, 96), "3-D": lambda: torch.randn(4, 8, 96),
         "column-major": lambda: torch.randn(96, 32).t(), "broadcast": lambda: torch.randn(1, 96).expand(32, 96),
         "torch.autocast": lambda: torch.randn(32, 96)}[layout]().to(device)
    dy = torch.randn(*x.shape[:-1], 64).to(device)
    scope = torch.autocast(device, dtype=torch.bfloat16) if layout == "torch.autocast" else contextlib.nullcontext()
    results = []
    for run in (layer, plain):
        xg = x.detach().clone() if layout != "column-major" else x.detach().t().clone().t()
        xg = x if layout == "broadcast" else xg.requires_grad_()
        with scope:
            y = run(xg)
        y.backward(dy.to(y.dtype))
        results.append((y, xg.grad, run.bias.grad))
    for name, got, want in zip(("y", "dx", "db"), *results):
        assert (got is None and want is None) or torch.equal(got, want), name
    want_dw = dy.reshape(-1, 64).t().double() @ x.reshape(-1, 96).double()
    tolerance = 2.0**-6 if layout == "torch.autocast" else 1e-5  # bf16 operands under autocast
    assert torch.allclose(layer.weight.main_grad.double(), want_dw, atol=tolerance * want_dw.abs().max())


@pytest.mark.parametrize("recipe_name", ["nvfp4", "mxfp8", "nvfp4_backward_high_precision"])
def test_composed_linear_keeps_its_operands_where_checkpointing_and_offloading_see_them(recipe_name, monkeypatch):
    """The saved operands go through ctx.save_for_backward: torch.utils.checkpoint (non-reentrant)
    drops them and recomputes the forward, save_on_cpu packs them; the gradients stay the same."""
    recipe = RECIPES[recipe_name]()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 96, generator=g).to(torch.bfloat16)
    weight, bias = torch.randn(64, 96, generator=g) * 0.1, torch.randn(64, generator=g)
    dy = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    wq = quantize_for(weight, ms._C.quantize_options(recipe, "weight"))
    forwards = []
    real_quantize_for = linear_composed.quantize_for
    monkeypatch.setattr(linear_composed, "quantize_for",
                        lambda t, *a, **k: forwards.append(t.shape) or real_quantize_for(t, *a, **k))

    def grads(wrap):
        xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
        y = wrap(lambda t: ComposedLinearFunction.apply(t, wg, bg, linear_plan(recipe), wq, True, False), xg)
        torch.manual_seed(9)  # the gradient's stochastic rounding
        y.backward(dy)
        return [y.detach(), xg.grad, wg.grad, bg.grad]

    want = grads(lambda f, t: f(t))
    plain_calls = len(forwards)
    forwards.clear()
    got = grads(lambda f, t: torch.utils.checkpoint.checkpoint(f, t, use_reentrant=False))
    assert len(forwards) == plain_calls + 1  # x quantized again: the forward ran again in backward
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    packed = []

    def pack(t):
        packed.append(t)
        return t.clone()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got = grads(lambda f, t: f(t))
    assert any(t is not None and t.dtype == torch.uint8 for t in packed) or recipe_name.endswith("high_precision")
    assert len(packed) >= 2
    for a, b in zip(got, want):
        assert torch.equal(a, b)
