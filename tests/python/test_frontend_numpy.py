"""The Python extension (microscale, numpy level): every quantize case of the golden set through
the bindings, byte for byte; the reference and fast paths equal; errors as microscale.Error.

Needs the extension built (scripts/test.sh sets PYTHONPATH=build/release/python)."""

import json
import os
import pathlib

import numpy as np
import pytest
import torch  # the golden inputs are bf16, which numpy cannot hold; torch hands them over by DLPack
from safetensors.torch import load_file

import microscale as ms

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = pathlib.Path(os.environ.get("MICROSCALE_GOLDEN_DIR", REPO.parent / "shared" / "golden"))
CASES = json.loads((GOLDEN / "INDEX.json").read_text())
MX_SCHEMES = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2", "e2m3": "mxfp6_e2m3", "e3m2": "mxfp6_e3m2", "e2m1": "mxfp4"}


def u8(array):
    return np.asarray(array).reshape(-1)


def expect_bytes(ours, golden_tensor, what):
    expected = golden_tensor.numpy().reshape(-1)
    ours = u8(ours)
    assert ours.shape == expected.shape, what
    mismatch = np.flatnonzero(ours != expected)
    assert mismatch.size == 0, f"{what}: {mismatch.size} bytes differ, first at {mismatch[0]}"


def cases(*kinds):
    return [c for c in CASES if c["kind"] in kinds]


@pytest.mark.parametrize("case", cases("nvfp4_quantize"), ids=lambda c: c["file"])
def test_nvfp4_golden(case):
    t = load_file(str(GOLDEN / case["file"]))
    for reference in (False, True):
        q = ms.quantize(t["input"], "nvfp4", columnwise=True, tile="16x16" if case["tile"] == "[16, 16]" else "1x16",
                        rht=case["rht"] == "true", reference=reference)
        for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
            expect_bytes(getattr(q, name), t[name], name)
        assert np.float32(q.rowwise_amax).tobytes() == t["rowwise_amax"].numpy().tobytes()
        assert np.float32(q.columnwise_amax).tobytes() == t["columnwise_amax"].numpy().tobytes()


@pytest.mark.parametrize("case", cases("mx_quantize", "mx_quantize_specials"), ids=lambda c: c["file"])
def test_mx_golden(case):
    t = load_file(str(GOLDEN / case["file"]))
    for reference in (False, True):
        q = ms.quantize(t["input"], MX_SCHEMES[case["element"]], scale_mode=case["scale_mode"].lower(),
                        reference=reference)
        expect_bytes(q.rowwise_scale, t["scale"], "scale")
        if case["kind"] == "mx_quantize":  # blocks with NaN/Inf: only their scale bytes are specified
            expect_bytes(q.rowwise_data, t["data"], "data")


def test_fast_equals_reference_and_dequantizes_in_shape():
    x = np.random.default_rng(1).standard_normal((2, 32, 64)).astype(np.float32)  # N-D: flattened to [64, 64]
    for scheme in ("nvfp4", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp4"):
        fast = ms.quantize(x, scheme, columnwise=True, swizzle=True)
        ref = ms.quantize(x, scheme, columnwise=True, swizzle=True, reference=True)
        for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
            assert np.array_equal(u8(getattr(fast, name)), u8(getattr(ref, name))), (scheme, name)
        assert fast.shape == [2, 32, 64] and fast.rows == 64 and fast.cols == 64 and fast.swizzle
        y = ms.dequantize(fast)
        assert y.shape == x.shape and y.dtype == np.float32
        sqnr = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((y - x).astype(np.float64) ** 2))
        assert sqnr > {"nvfp4": 18, "mxfp8_e4m3": 30, "mxfp6_e3m2": 20, "mxfp4": 15}[scheme], (scheme, sqnr)


def test_strided_input_is_read_in_place():
    base = np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32)
    view = base[:, ::2]  # [64, 64], stride 2 along the last dim
    assert np.array_equal(u8(ms.quantize(view).rowwise_data), u8(ms.quantize(np.ascontiguousarray(view)).rowwise_data))


def test_stochastic_rounding_same_seed_same_bytes():
    x = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    a = u8(ms.quantize(x, sr_seed=7, num_threads=1).rowwise_data)
    b = u8(ms.quantize(x, sr_seed=7, num_threads=2).rowwise_data)
    c = u8(ms.quantize(x, sr_seed=8).rowwise_data)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_options_and_quantized_tensor_report_what_was_asked():
    o = ms.QuantizeOptions(scheme="mxfp8_e5m2", columnwise=True, scale_mode="floor", swizzle=True)
    assert (o.scheme, o.rowwise, o.columnwise, o.scale_mode, o.swizzle) == ("mxfp8_e5m2", True, True, "floor", True)
    q = ms.quantize(np.ones((32, 32), np.float32), "mxfp4")
    assert q.columnwise_data is None and q.rowwise_amax is None  # not asked for; MX has no amax
    assert ms.quantize(np.ones((16, 16), np.float32)).rowwise_amax == 1.0


@pytest.mark.parametrize(
    "call, reason",
    [
        (lambda: ms.quantize(np.ones((16, 16), np.float32), "nvfp5"), "unknown scheme"),
        (lambda: ms.quantize(np.ones((16, 16), np.int32)), "unsupported dtype"),
        (lambda: ms.quantize(np.ones((16, 24), np.float32)), "divisible"),
        (lambda: ms.quantize(np.ones((0, 16), np.float32)), "empty"),
        (lambda: ms.quantize(np.ones((16, 16), np.float32), scale_mode="round"), "scale mode"),
        (lambda: ms.quantize(np.ones((16, 16), np.float32), rht=True, columnwise=True), "bf16"),
        (lambda: ms.dequantize(ms.quantize(np.ones((16, 16), np.float32)), "columnwise"), "columnwise"),
        (lambda: ms.dequantize(ms.quantize(np.ones((16, 16), np.float32)), dtype="int8"), "dtype"),
    ],
)
def test_bad_input_is_a_clear_error(call, reason):
    with pytest.raises(ms.Error, match=f"(?i){reason}"):
        call()


def test_release_cached_host_memory_frees_what_results_left_behind():
    ms.release_cached_host_memory()
    x = np.ones((1024, 2048), dtype=np.float32)  # 2 MiB of rowwise data in MXFP8
    q = ms.quantize(x, "mxfp8_e4m3")
    kept = ms.dequantize(q)  # alive: keeps its buffer
    del q
    assert ms.release_cached_host_memory() >= 2 << 20
    assert ms.release_cached_host_memory() == 0
    np.testing.assert_array_equal(kept, x)  # the live result is untouched
