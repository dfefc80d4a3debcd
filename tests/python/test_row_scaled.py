"""Row-scaled NVFP4 (TransformerEngine's row_scaled_nvfp4 / row_scaled_activation; docs/schemes.md,
"Row-scaled NVFP4") against an independent torch form of TE's reference formulas with one global
scale per row: the library's bytes and amaxes must equal it in both directions and every dtype,
through the numpy and the torch frontends, and the recipe must quantize the Linear's input so."""

import numpy as np
import pytest
import torch

import microscale
import microscale.torch as mst
from microscale.recipe import NVFP4BlockScaling
from test_four_over_six import FLT_MAX, e2m1_codes, f32


def row_scaled_reference(x):
    """Codes [R, C], scale bytes [R, C/16] and amaxes [R] of fp32 x [R, C], each row r with
    S_enc = 2688 / max|x[r, :]| (as TE's reference_nvfp4.py computes a row-scaled tensor's)."""
    rows, cols = x.shape
    amax = x.abs().amax(dim=1)
    s_enc = torch.minimum(f32(2688.0) / amax, f32(FLT_MAX))
    s_enc = torch.where(s_enc == 0, f32(1.0), s_enc)
    s_dec = f32(1.0) / s_enc
    multiplier = s_enc * torch.reciprocal(f32(6.0))
    blocks = x.view(rows, cols // 16, 16)
    block_amax = blocks.abs().amax(dim=-1)
    scale = torch.clamp(torch.minimum(block_amax * multiplier[:, None], f32(FLT_MAX)), max=448.0)
    scale = scale.to(torch.float8_e4m3fn)
    enc = torch.minimum(f32(1.0) / (scale.to(torch.float32) * s_dec[:, None]), f32(FLT_MAX))
    codes = e2m1_codes(torch.clamp(blocks * enc[..., None], -6.0, 6.0)).view(rows, cols)
    return codes, scale.view(torch.uint8), amax


def packed(codes):
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def varied_rows(rows, cols, dtype, seed):
    """Rows of very different magnitudes (2^-20 to 2^20), a row of zeros, and zeros inside rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-20, 21, (rows, 1), generator=g).float())
    x = x * (torch.rand(rows, cols, generator=g) > 0.2)
    x[3] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_bytes_equal_te_reference_formulas(dtype):
    x = varied_rows(48, 64, dtype, 1)
    if dtype == torch.float16:
        x = (x.float() / 2**10).to(dtype)  # keep f16 rows finite
    q = microscale.quantize(x, "nvfp4", rowwise=True, columnwise=True, row_scaled=True)
    assert q.row_scaled
    for source, data, scale, amaxes in ((x.float(), q.rowwise_data, q.rowwise_scale, q.rowwise_amaxes),
                                        (x.float().T.contiguous(), q.columnwise_data, q.columnwise_scale,
                                         q.columnwise_amaxes)):
        codes, scale_bytes, amax = row_scaled_reference(source)
        assert torch.equal(torch.from_numpy(np.asarray(data).copy()), packed(codes))
        assert torch.equal(torch.from_numpy(np.asarray(scale).copy()), scale_bytes)
        assert torch.equal(torch.from_numpy(np.asarray(amaxes).copy()), amax)
    assert q.rowwise_amax == float(x.float().abs().max())  # the largest row amax
    reference = microscale.quantize(x, "nvfp4", rowwise=True, columnwise=True, row_scaled=True, reference=True)
    assert np.array_equal(np.asarray(reference.rowwise_data), np.asarray(q.rowwise_data))
    assert np.array_equal(np.asarray(reference.columnwise_scale), np.asarray(q.columnwise_scale))


def test_rows_of_different_magnitudes_keep_their_precision():
    """Why TE has it: with one scale per tensor, rows far below the largest lose their blocks'
    scales to E4M3's range (2^-20 of the amax is below its smallest subnormal); per row they do not."""
    x = varied_rows(64, 128, torch.float32, 2)
    want = x.double()
    errors = {}
    for row_scaled in (False, True):
        q = microscale.quantize(x, "nvfp4", row_scaled=row_scaled)
        got = torch.from_numpy(microscale.dequantize(q)).double()
        per_row = ((got - want).pow(2).sum(1) / want.pow(2).sum(1).clamp(min=1e-300)).sqrt()
        errors[row_scaled] = per_row[want.abs().sum(1) > 0]
    assert errors[True].max() < 0.2
    assert errors[False].max() > 0.9  # some row lost entirely
    assert errors[True].mean() < 0.5 * errors[False].mean()  # row for row it may go either way


def test_torch_frontend_amaxes_dequantize_and_gemm():
    x = varied_rows(32, 64, torch.bfloat16, 3)
    q = mst.quantize(x, "nvfp4", columnwise=True, row_scaled=True)
    ref = microscale.quantize(x, "nvfp4", rowwise=True, columnwise=True, row_scaled=True)
    assert q.options.row_scaled and q.amax.shape == (2 + 32 + 64,)
    assert torch.equal(q.rowwise_amaxes, torch.from_numpy(np.asarray(ref.rowwise_amaxes).copy()))
    assert torch.equal(q.columnwise_amaxes, torch.from_numpy(np.asarray(ref.columnwise_amaxes).copy()))
    assert float(q.amax[0]) == ref.rowwise_amax and float(q.amax[1]) == ref.columnwise_amax
    for usage in ("rowwise", "columnwise"):
        got = mst.dequantize(q, usage, torch.float32)
        want = torch.from_numpy(microscale.dequantize(ref, usage))
        assert torch.equal(got.reshape(want.shape), want), usage
    # The GEMM with a per-tensor weight: within fp32 accumulation of the dequantized product.
    w = torch.randn(16, 64)
    qw = mst.quantize(w, "nvfp4")
    y = mst.gemm(q, qw)
    xd, wd = mst.dequantize(q, "rowwise").double(), mst.dequantize(qw, "rowwise").double()
    bound = 64 * 2.0**-23 * (xd.abs() @ wd.abs().T) + (xd @ wd.T).abs() * 2.0**-22
    assert bool(((y.double() - xd @ wd.T).abs() <= bound).all())
    # Compiled, the ops carry the amaxes through (fullgraph).
    compiled = torch.compile(lambda t: mst.dequantize(mst.quantize(t, "nvfp4", row_scaled=True)), backend="aot_eager",
                             fullgraph=True)
    assert torch.equal(compiled(x), mst.dequantize(mst.quantize(x, "nvfp4", row_scaled=True)))


def test_recipe_makes_the_input_row_scaled():
    recipe = NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True)
    assert recipe.row_scaled_activation and "row_scaled_activation=True" in repr(recipe)
    assert microscale._C.quantize_options(recipe, "input").row_scaled
    assert not microscale._C.quantize_options(recipe, "weight").row_scaled
    assert not microscale._C.quantize_options(recipe, "grad_output").row_scaled
    assert not NVFP4BlockScaling().row_scaled_activation
    with pytest.raises(microscale.Error, match="pass disable_rht=True too"):
        NVFP4BlockScaling(row_scaled_activation=True)


def test_row_scaled_four_over_six_input_trains_with_a_backward_override_only():
    """Row-scaled 4over6 is rowwise only (TE's rule): inference and a backward_override run; a
    quantized backward, which needs the input's columnwise output, is refused when it asks for it."""
    layer = mst.Linear(64, 32)
    x = torch.randn(32, 64)
    make = lambda **kw: NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True,  # noqa: E731
                                          nvfp4_4over6="activations", **kw)
    with torch.no_grad(), mst.autocast(recipe=make()):
        assert torch.isfinite(layer(x)).all()
    with mst.autocast(recipe=make(backward_override="dequantized")):
        layer(x.clone().requires_grad_()).sum().backward()
    with pytest.raises(microscale.Error, match="pass the recipe a backward_override"):
        with mst.autocast(recipe=make()):
            layer(x.clone().requires_grad_())


@pytest.mark.parametrize("override", [None, "high_precision", "dequantized"])
def test_linear_forward_is_the_row_scaled_gemm(override):
    """The layer's y is gemm(x row-scaled, W) + bias, bit for bit; its backward runs."""
    torch.manual_seed(4)
    recipe = NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True, backward_override=override)
    layer = mst.Linear(64, 32)
    x = varied_rows(48, 64, torch.float32, 5).requires_grad_()
    with mst.autocast(recipe=recipe):
        y = layer(x)
    xq = mst.quantize(x.detach(), "nvfp4", row_scaled=True)
    wq = mst.quantize(layer.weight.detach(), "nvfp4", tile="16x16")
    assert torch.equal(y.detach(), mst.gemm(xq, wq, bias=layer.bias.detach()))
    y.backward(torch.randn_like(y))
    assert x.grad is not None and torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()


def test_options_it_does_not_take():
    x = torch.randn(32, 32)
    for kwargs, message in ((dict(tile="16x16"), "1x16 blocks only"), (dict(rht=True), "does not take the RHT"),
                            (dict(sr_seed=1), "stochastic rounding"), (dict(amax_rowwise=1.0), "no amax override"),
                            (dict(columnwise=True, four_over_six="mae"), "rowwise only"),
                            (dict(rowwise=False, columnwise=True), "needs the rowwise output")):
        with pytest.raises(microscale.Error, match=message):
            microscale.quantize(x.to(torch.bfloat16) if "rht" in kwargs else x, "nvfp4", row_scaled=True, **kwargs)
    with pytest.raises(microscale.Error, match="nvfp4 only"):
        microscale.quantize(x, "mxfp8_e4m3", row_scaled=True)
