"""NVFP4 4over6 (docs/schemes.md, "4over6") against an independent form of its definition in torch:
fp32 tensor operations in the order the definition states, E4M3 rounding by torch's float8_e4m3fn,
E2M1 rounding by thresholds. The library's bytes must equal it for both error modes and domains,
both bounds, both tiles and both directions."""

import itertools

import numpy as np
import pytest
import torch

import microscale

FLT_MAX = torch.finfo(torch.float32).max
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# The midpoints between neighbouring E2M1 magnitudes; at a midpoint, nearest-even takes the even code.
E2M1_MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def f32(v):
    return torch.tensor(v, dtype=torch.float32)


def e2m1_codes(y):
    """Round to nearest even on E2M1's grid (saturating); any zero -> code 0, a negative -> sign bit."""
    a = y.abs()
    index = torch.zeros_like(a, dtype=torch.int64)
    for k, t in enumerate(E2M1_MIDPOINTS):
        index += (a > t) | ((a == t) & (k % 2 == 1))
    codes = index | ((y < 0).to(torch.int64) << 3)
    return torch.where(y == 0, torch.zeros_like(codes), codes)


def e2m1_values(codes):
    v = E2M1_VALUES[codes & 7]
    return torch.where(codes >= 8, -v, v)


def tile_sum(e):
    """[R, B] row errors -> [R/16, B] tile errors, added as TE's warp shuffles add them."""
    rows = e.view(-1, 16, e.shape[1])
    a = rows[:, 0:8] + rows[:, 8:16]
    b = a[:, 0:4] + a[:, 4:8]
    c = b[:, 0:2] + b[:, 2:4]
    return c[:, 0] + c[:, 1]


def four_over_six(x, amax, e4m3_max, squared, scaled_error, tile_2d):
    """Codes [R, C] and scale bytes [R, C/16] of one direction's source x (fp32 [R, C])."""
    rows, cols = x.shape
    s_enc = torch.minimum(f32(6 * e4m3_max) / amax, f32(FLT_MAX))
    if amax == 0 or s_enc == 0:
        s_enc = f32(1.0)
    s_dec = f32(1.0) / s_enc
    blocks = x.view(rows, cols // 16, 16)
    block_amax = blocks.abs().amax(dim=-1)
    if tile_2d:
        tiles = x.view(rows // 16, 16, cols // 16, 16).abs().amax(dim=(1, 3))
        block_amax = tiles.repeat_interleave(16, dim=0)
    base = block_amax / f32(6.0) * s_enc
    candidates = []
    for scale_f32 in (torch.clamp(base * f32(1.5), max=448.0), torch.clamp(base, max=448.0)):
        scale = scale_f32.to(torch.float8_e4m3fn)
        scale_value = scale.to(torch.float32)
        enc = torch.clamp(f32(1.0) / (scale_value * s_dec), max=FLT_MAX)
        codes = e2m1_codes(blocks * enc[..., None])
        candidate = e2m1_values(codes) * scale_value[..., None]
        if scaled_error:
            d = candidate - blocks * s_enc
        else:
            d = candidate * amax / f32(6 * e4m3_max) - blocks
        terms = d * d if squared else d.abs()
        error = torch.zeros_like(block_amax)
        for j in range(16):  # in element order
            error = error + terms[..., j]
        if tile_2d:
            error = tile_sum(error).repeat_interleave(16, dim=0)
        candidates.append((codes, scale.view(torch.uint8), error))
    (codes4, scale4, error4), (codes6, scale6, error6) = candidates
    pick4 = error4 < error6  # a tie keeps map to 6
    codes = torch.where(pick4[..., None], codes4, codes6).reshape(rows, cols)
    return codes, torch.where(pick4, scale4, scale6)


def packed(codes):
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


CASES = list(itertools.product([torch.float32, torch.bfloat16, torch.float16], ["1x16", "16x16"], ["mae", "mse"],
                               [False, True], [256, 448]))


@pytest.mark.parametrize("dtype,tile,mode,scaled_error,e4m3_max", CASES)
def test_bytes_equal_the_definition(dtype, tile, mode, scaled_error, e4m3_max):
    g = torch.Generator().manual_seed(len(tile) + e4m3_max + (7 if scaled_error else 0) + len(mode))
    shape = (48, 96)
    # Gaussian values over 16 binades, a third of them zero.
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 4, shape, generator=g).float())
    x = (x * (torch.rand(shape, generator=g) > 0.3)).to(dtype)
    q = microscale.quantize(x, "nvfp4", rowwise=True, columnwise=True, tile=tile, four_over_six=mode,
                            four_over_six_scaled_error=scaled_error, nvfp4_e4m3_max=e4m3_max)
    assert q.nvfp4_e4m3_max == e4m3_max
    xf = x.float()
    amax = xf.abs().max()
    assert q.rowwise_amax == q.columnwise_amax == amax.item()
    for source, data, scales in ((xf, q.rowwise_data, q.rowwise_scale),
                                 (xf.t().contiguous(), q.columnwise_data, q.columnwise_scale)):
        codes, scale_bytes = four_over_six(source, amax, e4m3_max, mode == "mse", scaled_error, tile == "16x16")
        assert torch.equal(torch.from_numpy(np.asarray(data)), packed(codes))
        assert torch.equal(torch.from_numpy(np.asarray(scales)), scale_bytes)


def test_both_candidates_are_picked_and_the_bound_reaches_dequantize():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
    q = microscale.quantize(x, "nvfp4", four_over_six="mse", nvfp4_e4m3_max=256)
    codes, scales = four_over_six(x, x.abs().max(), 256, True, False, False)
    plain = microscale.quantize(x, "nvfp4")
    # Both candidates were taken: against the plain encoding's scales (bound 448), map to 6's are
    # about 256 / 448 = 0.57 of them, map to 4's 1.5 times that, 0.86 (E4M3 rounding moves both).
    ratio = torch.from_numpy(np.asarray(q.rowwise_scale)).view(torch.float8_e4m3fn).float() / \
        torch.from_numpy(np.asarray(plain.rowwise_scale)).view(torch.float8_e4m3fn).float()
    assert (ratio > 0.7).any() and (ratio < 0.7).any()
    # Dequantized with S_enc = 1536 / amax: value(code) * RN(scale * RN(amax / 1536)).
    s_dec = f32(1.0) / (f32(1536.0) / x.abs().max())
    expected = (e2m1_values(codes).view(64, 4, 16) *
                (scales.view(torch.float8_e4m3fn).float() * s_dec)[..., None]).view(64, 64)
    assert torch.equal(torch.from_numpy(microscale.dequantize(q)), expected)
    # 4over6 lowers the error of the plain encoding (Gaussian data: by ~15 %).
    err_plain = ((torch.from_numpy(microscale.dequantize(plain)) - x) ** 2).sum()
    err_fos = ((torch.from_numpy(microscale.dequantize(q)) - x) ** 2).sum()
    assert err_fos < 0.95 * err_plain


def test_options_it_does_not_take():
    x = torch.randn(32, 32).to(torch.bfloat16)
    with pytest.raises(microscale.Error, match="does not take the RHT"):
        microscale.quantize(x, "nvfp4", columnwise=True, rht=True, four_over_six="mae")
    with pytest.raises(microscale.Error, match="stochastic rounding"):
        microscale.quantize(x, "nvfp4", sr_seed=1, four_over_six="mae")
    with pytest.raises(microscale.Error, match="or 256 with 4over6"):
        microscale.quantize(x, "nvfp4", nvfp4_e4m3_max=256)
    with pytest.raises(microscale.Error, match="unknown 4over6 error mode"):
        microscale.quantize(x, "nvfp4", four_over_six="l2")


def test_recipe_puts_the_tensors_of_its_scope_under_4over6():
    """TransformerEngine's NVFP4BlockScaling fields: nvfp4_4over6 picks the tensors (gradients never),
    nvfp4_4over6_e4m3_use_256 those of them with the bound 256, nvfp4_4over6_err_mode the error."""
    from microscale.recipe import NVFP4BlockScaling

    def options(recipe):
        return {role: ms_options(recipe, role) for role in ("input", "weight", "grad_output")}

    def ms_options(recipe, role):
        o = microscale._C.quantize_options(recipe, role)
        return o.four_over_six, o.nvfp4_e4m3_max

    assert options(NVFP4BlockScaling()) == {r: ("off", 448) for r in ("input", "weight", "grad_output")}
    assert options(NVFP4BlockScaling(nvfp4_4over6="weights")) == {
        "input": ("off", 448), "weight": ("mae", 256), "grad_output": ("off", 448)}
    assert options(NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="ALL", nvfp4_4over6_e4m3_use_256="activations",
                                     nvfp4_4over6_err_mode="mse")) == {
        "input": ("mse", 256), "weight": ("mse", 448), "grad_output": ("off", 448)}
    r = NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="activations", nvfp4_4over6_e4m3_use_256="none")
    assert options(r)["input"] == ("mae", 448) and options(r)["weight"] == ("off", 448)
    assert (r.nvfp4_4over6, r.nvfp4_4over6_e4m3_use_256, r.nvfp4_4over6_err_mode) == ("activations", "none", "MAE")
    assert "nvfp4_4over6='activations'" in repr(r)
    # The input under 4over6 needs the RHT off (TransformerEngine refuses the pair too).
    for scope in ("activations", "all"):
        with pytest.raises(microscale.Error, match="does not take the RHT"):
            NVFP4BlockScaling(nvfp4_4over6=scope)
    with pytest.raises(microscale.Error, match="unknown NVFP4 scope"):
        NVFP4BlockScaling(nvfp4_4over6="some")
    with pytest.raises(microscale.Error, match="MAE or MSE"):
        NVFP4BlockScaling(nvfp4_4over6="weights", nvfp4_4over6_err_mode="off")


def test_linear_under_4over6_quantizes_its_weight_with_it():
    """The layer's forward is the GEMM of x's plain NVFP4 and W's 4over6 quantization (16x16 tiles,
    the bound 256): bit for bit against the operands quantized and multiplied by hand."""
    import microscale.torch as mst
    from microscale.recipe import NVFP4BlockScaling

    torch.manual_seed(0)
    layer = mst.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    with mst.autocast(recipe=NVFP4BlockScaling(nvfp4_4over6="weights", nvfp4_4over6_err_mode="MSE")):
        y = layer(x)
    w_q = mst.quantize(layer.weight.detach(), "nvfp4", tile="16x16", four_over_six="mse", nvfp4_e4m3_max=256)
    x_q = mst.quantize(x.to(torch.bfloat16), "nvfp4")  # the RHT recipe rounds an f32 x to bf16 first
    assert w_q.options.nvfp4_e4m3_max == 256
    want = mst.gemm(x_q, w_q)
    assert torch.equal(y.detach(), want)
    # Without 4over6 the weight's bytes differ (and so does y).
    plain = mst.quantize(layer.weight.detach(), "nvfp4", tile="16x16")
    assert not torch.equal(plain.rowwise_data, w_q.rowwise_data)


def test_recipe_takes_the_scaled_error_from_te_s_variable(monkeypatch):
    """TE's NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH (4over6's error in the scaled domain): the recipe's
    nvfp4_4over6_err_use_fast_math, read from the variable when left out, for the tensors in scope
    only; the Linear's weight is then quantized with it, bit for bit."""
    import microscale.torch as mst
    from microscale.recipe import NVFP4BlockScaling

    def scaled(recipe, role):
        return microscale._C.quantize_options(recipe, role).four_over_six_scaled_error

    off = NVFP4BlockScaling(nvfp4_4over6="weights")
    assert not off.nvfp4_4over6_err_use_fast_math and "err_use_fast_math" not in repr(off)
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1")
    on = NVFP4BlockScaling(nvfp4_4over6="weights")
    assert on.nvfp4_4over6_err_use_fast_math and "nvfp4_4over6_err_use_fast_math=True" in repr(on)
    assert scaled(on, "weight") and not scaled(on, "input") and not scaled(on, "grad_output")
    assert not NVFP4BlockScaling(nvfp4_4over6="weights", nvfp4_4over6_err_use_fast_math=False).nvfp4_4over6_err_use_fast_math
    assert not scaled(NVFP4BlockScaling(), "weight")  # no 4over6: nothing to measure
    torch.manual_seed(1)
    layer = mst.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    with mst.autocast(recipe=on):
        y = layer(x)
    w_q = mst.quantize(layer.weight.detach(), "nvfp4", tile="16x16", four_over_six="mae",
                       four_over_six_scaled_error=True, nvfp4_e4m3_max=256)
    assert torch.equal(y.detach(), mst.gemm(mst.quantize(x.to(torch.bfloat16), "nvfp4"), w_q))
