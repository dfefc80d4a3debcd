"""MX 32x32 scale tiles (tile="32x32"), TransformerEngine's MXFP8 2D quantization: the bytes
against TE's reference formula in numpy with ml_dtypes' FP8 casts, the recipe field
(MXFP8BlockScaling(enable_2d_quantization=True)) and the Linear's weight under it."""

import ml_dtypes
import numpy as np
import pytest
import torch

import microscale as ms
import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling

FP8 = {"mxfp8_e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "mxfp8_e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def te_float_to_e8m0(v):
    """TE's float_to_e8m0 (finite v >= 0): the fp32 exponent, rounded up where a mantissa is left."""
    bits = np.float32(v).view(np.uint32)
    exponent, mantissa = int(bits >> 23), int(bits & 0x7FFFFF)
    if mantissa > 0 and exponent != 0xFE and not (exponent == 0 and mantissa <= 0x400000):
        exponent += 1
    return exponent


def te_tiles(x, scheme):
    """TE's compute_ref_2d_quantize: per 32x32 tile its amax, scale byte and the codes of x * 2^(127 - e)."""
    fp8, max_normal = FP8[scheme]
    m, k = x.shape
    codes = np.empty((m, k), np.uint8)
    scales = np.empty((m // 32, k // 32), np.uint8)
    for i in range(0, m, 32):
        for j in range(0, k, 32):
            tile = x[i:i + 32, j:j + 32]
            e = te_float_to_e8m0(np.float32(np.abs(tile).max()) * np.float32(1.0 / max_normal))
            scales[i // 32, j // 32] = e
            inverse = np.float32(2.0) ** np.float32(127 - e)
            codes[i:i + 32, j:j + 32] = (tile * inverse).astype(fp8).view(np.uint8)
    return codes, scales


@pytest.mark.parametrize("scheme", sorted(FP8))
@pytest.mark.parametrize("spread", [0, 12])
def test_tiles_are_transformer_engines_formula(scheme, spread):
    rng = np.random.default_rng(7 + spread)
    x = (rng.standard_normal((96, 128)) * np.exp2(rng.uniform(-spread, spread, (96, 128)))).astype(np.float32)
    x[:32, :32] = 0.0  # a tile of zeros: scale byte 0
    want_codes, want_scales = te_tiles(x, scheme)
    for reference in (False, True):
        q = ms.quantize(x, scheme, columnwise=True, tile="32x32", reference=reference)
        assert np.array_equal(np.asarray(q.rowwise_data), want_codes)
        assert np.array_equal(np.asarray(q.columnwise_data), want_codes)  # the same codes both ways
        assert np.array_equal(np.asarray(q.rowwise_scale), np.repeat(want_scales, 32, axis=0))  # [M, K/32]
        assert np.array_equal(np.asarray(q.columnwise_scale), np.repeat(want_scales, 32, axis=1))  # [M/32, K]
        assert q.tile == "32x32"


def test_torch_op_and_its_checks():
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    q = mst.quantize(x, "mxfp4", columnwise=True, tile="32x32")
    assert torch.equal(q.rowwise_data, q.columnwise_data)
    assert torch.equal(mst.dequantize(q), mst.dequantize(q, "columnwise"))
    assert mst.quantize(x, "mxfp8_e4m3", tile="1x32").rowwise_scale.shape == (64, 3)  # MX's 1-D blocks by name
    with pytest.raises(ms.Error, match="32x32 tiles are MX's"):
        mst.quantize(x, "nvfp4", tile="32x32")
    with pytest.raises(ms.Error, match="16x16 tiles are nvfp4's"):
        mst.quantize(x, "mxfp8_e4m3", tile="16x16")
    with pytest.raises(ms.Error, match="1x32 blocks are MX's"):
        mst.quantize(x, "nvfp4", tile="1x32")


def test_recipe_field():
    r = MXFP8BlockScaling(enable_2d_quantization=True)
    assert r.enable_2d_quantization and not MXFP8BlockScaling().enable_2d_quantization
    assert repr(r).endswith("enable_2d_quantization=True)")
    assert ms._C.quantize_options(r, "weight").tile == "32x32"
    assert ms._C.quantize_options(r, "input").tile == "1x32"  # MX's 1-D blocks by their own size
    assert ms._C.quantize_options(r, "grad_output").tile == "1x32"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_forward_is_the_gemm_of_tiled_weights(dtype):
    """Under the recipe the layer's y is gemm(x in 1-D blocks, W in 32x32 tiles) + bias, bit for bit,
    and its dgrad reads W's columnwise output, which holds W's rowwise codes."""
    torch.manual_seed(2)
    layer = mst.Linear(96, 64).to(dtype)
    with torch.no_grad():  # magnitudes that vary within a tile, so that tiles and blocks differ
        layer.weight.mul_(torch.exp2(torch.randint(-6, 7, layer.weight.shape)).to(dtype))
    x = torch.randn(48 + 16, 96, dtype=dtype, requires_grad=True)
    with mst.autocast(recipe=MXFP8BlockScaling(enable_2d_quantization=True)):
        y = layer(x)
    xq = mst.quantize(x.detach(), "mxfp8_e4m3")
    wq = mst.quantize(layer.weight.detach(), "mxfp8_e4m3", columnwise=True, tile="32x32")
    assert torch.equal(y.detach(), mst.gemm(xq, wq, bias=layer.bias.detach(), out_dtype=dtype))
    with mst.autocast(recipe=MXFP8BlockScaling()):
        plain = layer(x.detach())
    assert not torch.equal(plain, y.detach())  # 1-D weight blocks: another quantization
    dy = torch.randn_like(y)
    y.backward(dy)
    dyq = mst.quantize(dy, "mxfp8_e4m3", columnwise=True)
    assert torch.equal(x.grad, mst.gemm(dyq, wq, b_usage="columnwise", out_dtype=dtype))


def test_nvfp4_recipe_takes_no_enable_2d_quantization():
    with pytest.raises(TypeError):
        NVFP4BlockScaling(enable_2d_quantization=True)


def test_tile_names_read_back():
    x = np.ones((32, 64), dtype=np.float32)
    assert ms.quantize(x, "mxfp4").tile == "1x32"  # the name the CLI writes and parses for MX
    assert ms.quantize(x, "mxfp4", tile="1x32").tile == "1x32"
    assert ms.quantize(x, "nvfp4").tile == "1x16"
    assert ms.QuantizeOptions(scheme="mxfp8_e5m2", tile=ms.quantize(x, "mxfp8_e5m2").tile).tile == "1x32"
