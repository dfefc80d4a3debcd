"""microscale.torch: the quantize / dequantize ops (eager and traced by torch.compile), the
quantized Linear against a float64 computation on the same dequantized operands, the autocast
scope, the weight cache and stochastic rounding's seed.

Needs the extension built (scripts/test.sh sets PYTHONPATH=build/release/python) and torch."""

import numpy as np
import pytest
import torch

import microscale as ms
import microscale.torch as mst
from microscale.recipe import Format, HighPrecision, MXFP8BlockScaling, NVFP4BlockScaling


def test_ops_match_the_numpy_level_bytes_and_values():
    x = torch.randn(64, 128, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    q = mst.quantize(x, "nvfp4", columnwise=True, rht=True)
    ref = ms.quantize(x, "nvfp4", columnwise=True, rht=True, reference=True)
    for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        ours = getattr(q, name)
        assert ours.dtype == torch.uint8
        assert np.array_equal(ours.numpy(), np.asarray(getattr(ref, name))), name
    assert q.rowwise_amax.item() == ref.rowwise_amax and q.columnwise_amax.item() == ref.columnwise_amax
    for usage in ("rowwise", "columnwise"):
        want = np.asarray(ms.dequantize(ref, usage))
        got = mst.dequantize(q, usage, torch.float32)
        assert got.shape == want.shape and np.array_equal(got.numpy(), want), usage
        assert mst.dequantize(q, usage, torch.bfloat16).dtype == torch.bfloat16
    assert mst.dequantize(q, "columnwise").shape == (128, 64)  # NVFP4 columnwise: RHT(X^T)


def test_mx_ops_keep_the_input_shape():
    x = torch.randn(2, 32, 64)
    q = mst.quantize(x, "mxfp8_e4m3", columnwise=True, scale_mode="floor")
    assert q.amax is None and q.rowwise_data.shape == (64, 64) and q.columnwise_scale.shape == (2, 64)
    for usage in ("rowwise", "columnwise"):
        y = mst.dequantize(q, usage)
        sqnr = 10 * torch.log10(x.pow(2).sum() / (y - x).pow(2).sum())
        assert y.shape == x.shape and sqnr > 25, (usage, sqnr)


def test_torch_compile_traces_the_ops():
    x = torch.randn(32, 64, dtype=torch.bfloat16)

    def round_trip(t):
        return mst.dequantize(mst.quantize(t, "nvfp4", columnwise=True, rht=True), "columnwise")

    compiled = torch.compile(round_trip, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), round_trip(x))


def test_quantizing_a_parameter_gives_tensors_without_grad():
    w = torch.nn.Parameter(torch.randn(32, 64))
    q = mst.quantize(w, columnwise=True)
    assert not q.amax.requires_grad and not mst.dequantize(q).requires_grad


def test_op_errors_are_microscale_errors():
    with pytest.raises(ms.Error, match="unsupported dtype"):
        mst.quantize(torch.ones(16, 16, dtype=torch.int32))
    q = mst.quantize(torch.ones(16, 16))
    with pytest.raises(ms.Error, match="no columnwise output"):
        mst.dequantize(q, "columnwise")


def test_a_seed_tensor_gives_the_bytes_of_its_value_eagerly_and_traced():
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    parts = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale")

    def quantized(seed):
        q = mst.quantize(x, columnwise=True, rht=True, sr_seed=seed)
        return [getattr(q, name) for name in parts]

    # Bits as an unsigned 64-bit integer: -1 is 2^64 - 1.
    for value, as_int in ((7, 7), (-1, 2**64 - 1)):
        want = quantized(as_int)
        assert all(torch.equal(a, b) for a, b in zip(quantized(torch.tensor([value], dtype=torch.int64)), want))
    # Traced, a seed tensor is an input of the graph: each call reads what it holds then.
    compiled = torch.compile(quantized, backend="aot_eager", fullgraph=True)
    for value in (7, 8):
        got = compiled(torch.tensor([value], dtype=torch.int64))
        assert all(torch.equal(a, b) for a, b in zip(got, quantized(value))), value
    assert not torch.equal(quantized(7)[0], quantized(8)[0])  # the seeds give other bytes
    for bad in (torch.tensor([7], dtype=torch.int32), torch.tensor([7, 8]), torch.tensor(7.0)):
        with pytest.raises(ms.Error, match="a seed tensor must be int64 with one element"):
            quantized(bad)


def dequantized(x, options, usage):
    return torch.from_numpy(ms.dequantize(ms.quantize(x, **options), usage)).double()


def option_args(options):
    return dict(scheme=options.scheme, columnwise=True, scale_mode=options.scale_mode, tile=options.tile,
                rht=options.rht, four_over_six=options.four_over_six, nvfp4_e4m3_max=options.nvfp4_e4m3_max,
                row_scaled=options.row_scaled)


def assert_close_by_fp32_accumulation(got, want, bound):
    """|got - want| within fp32 accumulation error: K * 2^-23 of the sum of |products|, plus the
    output's own rounding."""
    err = (got.double() - want).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item()}"


RECIPES = {  # made in the test: recipe objects held by pytest's parametrization outlive the module
    "nvfp4_sr_off": lambda: NVFP4BlockScaling(disable_stochastic_rounding=True),
    # 4over6 on x and W (the bound 256 on W only), the gradient plain NVFP4
    "nvfp4_4over6": lambda: NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True,
                                              nvfp4_4over6="all", nvfp4_4over6_e4m3_use_256="weights",
                                              nvfp4_4over6_err_mode="MSE"),
    # TE's row_scaled_activation: x with a global scale per row (rowwise) and per column (the wgrad's X^T)
    "nvfp4_row_scaled": lambda: NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True,
                                                  row_scaled_activation=True),
    "mxfp8": lambda: MXFP8BlockScaling(),
    "mxfp8_hybrid": lambda: MXFP8BlockScaling(fp8_format=Format.HYBRID),
}


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_linear_matches_float64_on_the_dequantized_operands(recipe_name):
    recipe = RECIPES[recipe_name]()
    torch.manual_seed(0)
    m, k, n = 64, 96, 32
    layer = mst.Linear(k, n)
    x = torch.randn(m, k, requires_grad=True)
    with mst.autocast(recipe=recipe):
        y = layer(x)
    dy = torch.randn(m, n)
    y.backward(dy)

    xo = option_args(ms._C.quantize_options(recipe, "input"))
    wo = option_args(ms._C.quantize_options(recipe, "weight"))
    go = option_args(ms._C.quantize_options(recipe, "grad_output"))
    # RHT recipes round f32 x and dy to bf16 first (linear.hpp); the quantizers see those values.
    to_q = (lambda t: t.detach().to(torch.bfloat16)) if xo["rht"] else (lambda t: t.detach())
    xq, wq, dyq = to_q(x), layer.weight.detach(), to_q(dy)
    x_row, w_row = dequantized(xq, xo, "rowwise"), dequantized(wq, wo, "rowwise")
    w_col, dy_row = dequantized(wq, wo, "columnwise"), dequantized(dyq, go, "rowwise")
    x_col, dy_col = dequantized(xq, xo, "columnwise"), dequantized(dyq, go, "columnwise")
    if go["scheme"].startswith("mx"):  # MX columnwise is stored untransposed: [M, K] blocks along M
        x_col, dy_col, w_col = x_col.T, dy_col.T, w_col.T

    eps = k * 2.0**-23
    want_y = x_row @ w_row.T + layer.bias.detach().double()
    assert_close_by_fp32_accumulation(y, want_y, eps * (x_row.abs() @ w_row.abs().T) + want_y.abs() * 2.0**-23)
    want_dx = dy_row @ w_col.T  # W columnwise is W^T [K, N]
    assert_close_by_fp32_accumulation(x.grad, want_dx, n * 2.0**-23 * (dy_row.abs() @ w_col.abs().T) +
                                      want_dx.abs() * 2.0**-23)
    want_dw = dy_col @ x_col.T  # [N, M] x [M, K]
    assert_close_by_fp32_accumulation(layer.weight.grad, want_dw, m * 2.0**-23 * (dy_col.abs() @ x_col.abs().T) +
                                      want_dw.abs() * 2.0**-23)
    assert torch.allclose(layer.bias.grad.double(), dy.double().sum(0), rtol=2.0**-22, atol=0)


def test_linear_mxfp8_output_close_to_unquantized():
    torch.manual_seed(1)
    layer = mst.Linear(256, 128)
    x = torch.randn(64, 256)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        y = layer(x)
    want = torch.nn.functional.linear(x, layer.weight, layer.bias).detach()
    sqnr = 10 * torch.log10(want.pow(2).sum() / (y.detach() - want).pow(2).sum())
    assert sqnr >= 27  # torchao's MXFP8 floor for the output


def test_outside_autocast_and_high_precision_are_torch_linear():
    torch.manual_seed(2)
    layer = mst.Linear(32, 16)
    x = torch.randn(16, 32)
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert torch.equal(layer(x), want)
    with mst.autocast(recipe=NVFP4BlockScaling()), mst.autocast(enabled=False):
        assert torch.equal(layer(x), want)
    with mst.autocast(recipe=HighPrecision()):
        assert torch.equal(layer(x), want)


def test_autocast_takes_transformer_engines_arguments():
    # TransformerEngine's autocast(enabled, calibrating, recipe, amax_reduction_group, _graph) and
    # its older fp8_autocast(enabled, calibrating, fp8_recipe, fp8_group, _graph).
    for scope in (mst.autocast(True, False, MXFP8BlockScaling(), None, True),
                  mst.fp8_autocast(enabled=True, fp8_recipe=MXFP8BlockScaling(), _graph=True)):
        with scope:
            assert mst.autocast_enabled() and isinstance(mst.current_recipe(), MXFP8BlockScaling)
    with mst.fp8_autocast():  # TransformerEngine's default is its own; here NVFP4BlockScaling()
        assert isinstance(mst.current_recipe(), NVFP4BlockScaling)
    for scope, message in ((mst.autocast(calibrating=True), "calibrating is not supported"),
                           (mst.autocast(amax_reduction_group=object()), "amax_reduction_group must be a torch"),
                           (mst.fp8_autocast(fp8_group=object()), "amax_reduction_group must be a torch"),
                           (mst.autocast(recipe="nvfp4"), "recipe must be NVFP4BlockScaling")):
        with pytest.raises(ms.Error, match=message), scope:
            pass
        assert not mst.autocast_enabled()  # nothing entered


def test_autocast_nests_and_restores_on_exceptions():
    assert not mst.autocast_enabled() and isinstance(mst.current_recipe(), HighPrecision)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        with mst.autocast(recipe=NVFP4BlockScaling(disable_rht=True)):
            assert mst.current_recipe().disable_rht
        assert isinstance(mst.current_recipe(), MXFP8BlockScaling)
        with pytest.raises(KeyError):
            with mst.autocast(enabled=False):
                assert not mst.autocast_enabled()
                raise KeyError("inside")
        assert mst.autocast_enabled() and isinstance(mst.current_recipe(), MXFP8BlockScaling)
    assert not mst.autocast_enabled()


def test_weight_kept_as_is_first_microbatch_says():
    # TransformerEngine's rule: None quantizes on every call and keeps nothing; True quantizes and
    # keeps; False reuses what was kept (for this recipe), even after the weight changed.
    torch.manual_seed(3)
    layer = mst.Linear(32, 32, bias=False)  # the optimizer changes only what is quantized
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(32, 32)
    with mst.autocast(recipe=NVFP4BlockScaling()):
        first = layer(x)
        layer(x).sum().backward()
        assert layer.weight_quantizations == 2 and layer._cached_weight is None
        kept = layer(x, is_first_microbatch=True)
        assert torch.equal(kept, first) and layer.weight_quantizations == 3
        opt.step()  # updates the weight in place
        assert torch.equal(layer(x, is_first_microbatch=False), kept)  # reused as asked: the old weight
        assert layer.weight_quantizations == 3
        fresh = layer(x)
        assert layer.weight_quantizations == 4 and not torch.equal(fresh, first)
        assert layer._cached_weight is None  # None let go of what was kept
        layer(x, is_first_microbatch=True)
        with mst.autocast(recipe=MXFP8BlockScaling()):  # another recipe: quantizes (and keeps) anew
            layer(x, is_first_microbatch=False)
        assert layer.weight_quantizations == 6


def test_is_first_microbatch_and_writes_through_data():
    torch.manual_seed(7)
    layer = mst.Linear(32, 32)
    x = torch.randn(32, 32)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        first = layer(x, is_first_microbatch=False)  # nothing kept yet: quantizes and keeps
        with torch.no_grad():
            layer.weight.data.mul_(2)  # the version counter does not see this; None quantizes anyway
        assert torch.equal(layer(x, is_first_microbatch=False), first) and layer.weight_quantizations == 1
        second = layer(x)
        assert layer.weight_quantizations == 2 and not torch.equal(second, first)
        assert torch.equal(layer(x, is_first_microbatch=True), second)
    # A call in high precision (outside a scope) with is_first_microbatch True lets go of what was
    # kept: a later False quantizes the weight as it is then.
    with torch.no_grad():
        layer.weight.mul_(2)
    layer(x, is_first_microbatch=True)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        assert torch.equal(layer(x, is_first_microbatch=False), layer(x))


def test_backward_is_once_differentiable_and_takes_strided_inputs():
    torch.manual_seed(8)
    layer = mst.Linear(64, 32)
    x = torch.randn(16, 2, 64).transpose(0, 1).requires_grad_()  # strides that do not fold to [32, 64]
    with mst.autocast(recipe=MXFP8BlockScaling()):
        y = layer(x)
    assert y.shape == (2, 16, 32)
    (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    assert gx.shape == x.shape
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate"):
        gx.sum().backward()


def test_stochastic_rounding_follows_torch_manual_seed():
    def grads(seed):
        torch.manual_seed(seed)
        layer = mst.Linear(64, 32, bias=False)
        x = torch.randn(32, 64, requires_grad=True)
        with mst.autocast(recipe=NVFP4BlockScaling()):
            layer(x).square().sum().backward()
        return x.grad.clone(), layer.weight.grad.clone()

    a, b = grads(4), grads(4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    torch.manual_seed(4)
    layer = mst.Linear(64, 32, bias=False)
    x = torch.randn(32, 64, requires_grad=True)
    with mst.autocast(recipe=NVFP4BlockScaling()):
        y = layer(x).square().sum()
    torch.manual_seed(5)  # another stream for the backward's draws
    y.backward()
    assert not torch.equal(x.grad, a[0])


def test_linear_bf16_activations_and_errors():
    torch.manual_seed(6)
    layer = mst.Linear(64, 32)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    with mst.autocast(recipe=NVFP4BlockScaling()):
        y = layer(x)
        assert y.dtype == torch.bfloat16 and y.shape == (2, 16, 32)
        y.float().sum().backward()
        assert x.grad.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.float32
        with pytest.raises(ms.Error, match="divisible by 16"):
            layer(torch.randn(8, 64))  # NVFP4's columnwise blocks need M % 16 == 0
        with torch.no_grad():
            assert layer(torch.randn(16, 64)).shape == (16, 32)  # inference keeps no context


def test_the_ops_pass_opcheck():
    # torch.library's own checks of the registrations: schema, fake tensors against the real
    # outputs, AOT dispatch with dynamic shapes.
    from microscale.torch.column_sums import _column_sums_op
    from microscale.torch.ops import _dequantize_op, _quantize_op

    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(_column_sums_op, (torch.randn(48, 40).to(dtype),))

    x = torch.randn(32, 64, dtype=torch.bfloat16)
    plain = ("off", False, 448, False)  # no 4over6, not row-scaled
    torch.library.opcheck(_quantize_op, (x, "nvfp4", True, True, "rceil", "1x16", True, None, 0, None, None, False,
                                         *plain, None))
    torch.library.opcheck(_quantize_op, (x, "mxfp8_e4m3", True, True, "floor", "1x16", False, None, 0, None, None,
                                         True, *plain, None))
    seed = torch.tensor([7], dtype=torch.int64)  # stochastic rounding's seed as a tensor
    torch.library.opcheck(_quantize_op, (x, "nvfp4", True, True, "rceil", "1x16", True, 0, 0, None, None, False,
                                         *plain, seed))
    torch.library.opcheck(_quantize_op, (x, "nvfp4", True, True, "rceil", "16x16", False, None, 0, None, None, False,
                                         "mse", True, 256, False, None))
    torch.library.opcheck(_quantize_op, (x, "nvfp4", True, True, "rceil", "1x16", False, None, 0, None, None, False,
                                         "off", False, 448, True, None))  # row-scaled: amax [2 + M + K]
    for q in (mst.quantize(x, "nvfp4", columnwise=True),
              mst.quantize(x, "nvfp4", columnwise=True, four_over_six="mae", nvfp4_e4m3_max=256),
              mst.quantize(x, "nvfp4", columnwise=True, row_scaled=True)):
        o = q.options
        for usage in ("rowwise", "columnwise"):
            torch.library.opcheck(_dequantize_op, (q.rowwise_data, q.rowwise_scale, q.columnwise_data,
                                                   q.columnwise_scale, q.amax, list(q.shape), o.scheme, o.rowwise,
                                                   o.columnwise, o.scale_mode, o.tile, o.rht, o.swizzle,
                                                   o.nvfp4_e4m3_max, o.row_scaled, usage, torch.bfloat16))


def test_convert_linears_swaps_in_place_over_the_same_parameters():
    torch.manual_seed(10)

    class Subclass(torch.nn.Linear):  # left alone: its forward may do more than a Linear's
        pass

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), Subclass(32, 32)),
                                torch.nn.Linear(32, 32))
    params = list(model.parameters())
    x = torch.randn(32, 64)
    plain = model(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before the swap: still updates the layers
    assert mst.convert_linears(model, lambda m, fqn: fqn != "3") is model
    assert [type(model[i]) for i in (0, 3)] == [mst.Linear, torch.nn.Linear]
    assert type(model[2][0]) is mst.Linear and type(model[2][1]) is Subclass
    assert all(a is b for a, b in zip(model.parameters(), params)) and model[2][0].bias is None
    assert torch.equal(model(x), plain)  # outside autocast: what the model computed before
    reference = mst.Linear(64, 64)
    reference.load_state_dict(model[0].state_dict())
    with mst.autocast(recipe=MXFP8BlockScaling()):
        assert torch.equal(model[0](x), reference(x))
        model(x).sum().backward()
    before = model[0].weight.detach().clone()
    opt.step()
    assert not torch.equal(model[0].weight, before)
    assert mst.convert_linears(torch.nn.Linear(8, 8)).__class__ is mst.Linear  # the module itself
    fused = mst.convert_linears(torch.nn.Sequential(torch.nn.Linear(8, 8)), fuse_wgrad_accumulation=True)
    assert fused[0].fuse_wgrad_accumulation
    shared = torch.nn.Linear(8, 8)  # tied: one layer at two places stays one layer
    tied = mst.convert_linears(torch.nn.Sequential(shared, torch.nn.ReLU(), shared))
    assert tied[0] is tied[2] and type(tied[0]) is mst.Linear


def test_recipes_take_transformer_engines_environment_variables(monkeypatch):
    """TE's recipe fields default to its NVTE_* variables; an argument given (None too) wins."""
    env = {"NVTE_NVFP4_DISABLE_RHT": "1", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "1",
           "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": "1", "NVTE_NVFP4_ROW_SCALED_ACTIVATION": "1",
           "NVTE_NVFP4_4OVER6": "weights", "NVTE_NVFP4_4OVER6_E4M3_USE_256": "none",
           "NVTE_NVFP4_4OVER6_ERR_MODE": "mse", "NVTE_BACKWARD_OVERRIDE": "dequantized"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    r = NVFP4BlockScaling()
    assert (r.disable_rht, r.disable_stochastic_rounding, r.disable_2d_quantization, r.row_scaled_activation) == (
        True, True, True, True)
    assert (r.nvfp4_4over6, r.nvfp4_4over6_e4m3_use_256, r.nvfp4_4over6_err_mode, r.backward_override) == (
        "weights", "none", "MSE", "dequantized")
    assert MXFP8BlockScaling().backward_override == "dequantized"
    given = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=False, row_scaled_activation=False,
                              backward_override=None, nvfp4_4over6="none")
    assert not given.disable_stochastic_rounding and not given.row_scaled_activation
    assert given.backward_override is None and given.nvfp4_4over6 == "none"
    assert MXFP8BlockScaling(backward_override=None).backward_override is None
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "true")  # TE reads "1" only
    monkeypatch.setenv("NVTE_NVFP4_ROW_SCALED_ACTIVATION", "0")
    assert not NVFP4BlockScaling(disable_rht=True).row_scaled_activation
    with pytest.raises(ms.Error, match="pass disable_rht=True too"):
        NVFP4BlockScaling(row_scaled_activation=True)
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "fp32")
    with pytest.raises(ms.Error, match="unknown backward_override"):
        MXFP8BlockScaling()


def test_backward_override_recipes():
    """TransformerEngine's backward_override: the recipe's forward, the backward's GEMMs unquantized
    (dense, fp32 accumulation) on x and W as given or on their dequantized rowwise quantizations."""
    for make in (NVFP4BlockScaling, MXFP8BlockScaling):
        assert make().backward_override is None
        for override in ("high_precision", "dequantized"):
            recipe = make(backward_override=override)
            assert recipe.backward_override == override and f"backward_override='{override}'" in repr(recipe)
        for bad in ("none", "HIGH_PRECISION", "fp32"):
            with pytest.raises(ms.Error, match="unknown backward_override"):
                make(backward_override=bad)
    assert repr(MXFP8BlockScaling()) == ("MXFP8BlockScaling(fp8_format=Format.E4M3, backward_override=None, "
                                         "enable_2d_quantization=False)")

    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(64, 96, generator=g).to(torch.bfloat16)
    dy = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    layer = mst.Linear(96, 32, params_dtype=torch.bfloat16)

    def step(recipe):
        layer.zero_grad()
        x = x0.clone().requires_grad_()
        with mst.autocast(recipe=recipe):
            y = layer(x)
        torch.manual_seed(1)
        y.backward(dy)
        return y, x.grad, layer.weight.grad

    y_quantized = step(NVFP4BlockScaling())[0]
    y, dx, dw = step(NVFP4BlockScaling(backward_override="high_precision"))
    assert torch.equal(y, y_quantized)  # the recipe's forward
    # dx = dy W and dW = dy^T x from the unquantized operands: fp32 sums, rounded once to bf16.
    want_dx = dy.double() @ layer.weight.double()
    want_dw = dy.double().T @ x0.double()
    for got, want in ((dx, want_dx), (dw, want_dw)):
        assert got.dtype == torch.bfloat16
        assert bool(((got.double() - want).abs() <= 2.0**-8 * want.abs() + 1e-5 * want.abs().max()).all())


def test_checkpoint_recomputes_under_the_scope_of_the_call():
    """torch's checkpoint recomputes outside the caller's autocast scope; mst.checkpoint re-enters it."""
    seen = []

    def region(t):
        seen.append((mst.autocast_enabled(), repr(mst.current_recipe())))
        return t * t  # saves t: backward unpacks it, which recomputes the region

    x = torch.randn(8, 8, requires_grad=True)
    recipe = MXFP8BlockScaling()
    for enabled in (True, False):
        seen.clear()
        with mst.autocast(enabled=enabled, recipe=recipe):
            y = mst.checkpoint(region, x)
        y.sum().backward()
        assert len(seen) == 2 and seen[0] == seen[1] and seen[0][0] == enabled
    seen.clear()
    with mst.autocast(recipe=recipe):
        y = torch.utils.checkpoint.checkpoint(region, x, use_reentrant=False)
    y.sum().backward()
    assert seen == [(True, repr(recipe)), (False, "HighPrecision()")]  # what mst.checkpoint is for
    with pytest.raises(TypeError, match="use_reentrant"):
        mst.checkpoint(region, x, use_reentrant=True)
    # The CPU Linear under it: the gradients of the plain step.
    layer = mst.Linear(64, 32)
    xs = torch.randn(32, 64)

    def step(run):
        layer.zero_grad()
        xg = xs.clone().requires_grad_()
        with mst.autocast(recipe=NVFP4BlockScaling()):
            y = run(xg)
        torch.manual_seed(2)
        y.sum().backward()
        return [y.detach(), xg.grad, layer.weight.grad, layer.bias.grad]

    for a, b in zip(step(lambda t: mst.checkpoint(layer, t)), step(layer)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", [NVFP4BlockScaling(), MXFP8BlockScaling(),
                                    NVFP4BlockScaling(backward_override="dequantized")], ids=repr)
def test_cpu_layers_saved_operands_are_seen_by_saved_tensor_hooks(recipe, monkeypatch):
    """Under saved-tensor hooks a CPU layer saves its quantized operands as tensors (its composed
    form): torch's checkpoint drops them and runs the forward again in backward, a pack hook sees
    them (save_on_cpu's kind); the outputs and gradients are the plain C++ layer's, bit for bit."""
    from microscale.torch import linear_composed

    if getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None) is None:
        pytest.skip("this torch has no query for the saved-tensor hooks in force")
    layer = mst.LayerNormLinear(64, 96)  # W [96, 64]: not x's shape (MXFP8 needs N % 32 == 0)
    xs = torch.randn(32, 64, dtype=torch.bfloat16)
    quantized = []
    real_quantize_for = linear_composed.quantize_for
    monkeypatch.setattr(linear_composed, "quantize_for",
                        lambda t, *a, **k: quantized.append(t.shape) or real_quantize_for(t, *a, **k))

    def step(run):
        layer.zero_grad()
        xg = xs.clone().requires_grad_()
        with mst.autocast(recipe=recipe):
            torch.manual_seed(5)
            y = run(xg)
        torch.manual_seed(2)  # the gradient's stochastic rounding
        y.float().square().sum().backward()
        return [y.detach(), xg.grad, layer.weight.grad, layer.bias.grad, layer.layer_norm_weight.grad]

    want = step(layer)
    assert not quantized  # no hooks: the C++ layer
    got = step(lambda t: mst.checkpoint(layer, t))
    assert quantized.count(xs.shape) == 2  # x quantized again: the forward ran again in backward
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    packed = []

    def pack(t):
        packed.append(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got = step(layer)
    assert torch.uint8 in packed  # the quantized operands, saved as tensors
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with torch.autograd.graph.save_on_cpu():
        got = step(layer)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_return_bias_and_init_method_as_transformer_engine():
    torch.manual_seed(0)
    layer = mst.Linear(64, 32, return_bias=True, params_dtype=torch.bfloat16)
    plain = mst.Linear(64, 32, bias=False, params_dtype=torch.bfloat16)
    with torch.no_grad():
        plain.weight.copy_(layer.weight)
    x = torch.randn(32, 64).to(torch.bfloat16).requires_grad_()  # MXFP8's X^T: M % 32 == 0
    assert "return_bias=True" in repr(layer)
    for recipe in (MXFP8BlockScaling(), None):  # quantized, and in high precision outside a scope
        layer.zero_grad()
        with mst.autocast(enabled=recipe is not None, recipe=recipe):
            y, b = layer(x)
            want = plain(x)
        assert torch.equal(y, want)  # the bias left out of y
        assert b.dtype == torch.bfloat16 and torch.equal(b, layer.bias)
        (y + b).float().sum().backward()  # added by the caller: its gradient reaches the parameter
        assert torch.equal(layer.bias.grad, torch.full((32,), 32.0, dtype=torch.bfloat16))
    y, b = mst.Linear(64, 32, bias=False, return_bias=True)(torch.randn(16, 64))
    assert y.shape == (16, 32) and b.numel() == 0
    initialised = mst.Linear(64, 32, init_method=lambda w: torch.nn.init.constant_(w, 0.5))
    assert bool((initialised.weight == 0.5).all()) and bool((initialised.bias == 0).all())
