"""microscale.gemm and microscale.torch.gemm: the golden GEMM cases through the bindings, raw
operands (the GPU MODE NVFP4 interface, batched), mixed dense x quantized, and errors."""

import json
import os
import pathlib

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import microscale as ms
import microscale.torch as mst

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = pathlib.Path(os.environ.get("MICROSCALE_GOLDEN_DIR", REPO.parent / "shared" / "golden"))
GEMM_CASES = [c for c in json.loads((GOLDEN / "INDEX.json").read_text()) if c["kind"].startswith("gemm_")]


def dequantized64(q, usage="rowwise"):
    return ms.dequantize(q, usage).astype(np.float64)


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: c["file"])
def test_golden_gemm(case):
    t = load_file(str(GOLDEN / case["file"]))
    nvfp4 = case["kind"] == "gemm_nvfp4"
    scheme = "nvfp4" if nvfp4 else "mxfp8_e4m3"
    a = ms.quantize(t["a"], scheme)
    b = ms.quantize(t["b"], scheme, tile="16x16" if nvfp4 else "1x16")  # b is a weight
    d = ms.gemm(a, b)
    want = t["out"].numpy().astype(np.float64)
    magnitude = np.abs(dequantized64(a)) @ np.abs(dequantized64(b)).T
    # fp32 accumulation over K and the fp32 rounding of the dequantized values and of the output
    k = t["a"].shape[1]
    assert d.shape == want.shape and d.dtype == np.float32
    assert np.all(np.abs(d - want) <= (k + 4) * 2.0**-24 * magnitude)


def test_raw_operands_batched_as_gpu_mode_lays_them_out():
    rng = np.random.default_rng(0)
    m, n, k, batches = 128, 64, 256, 2
    qa = [ms.quantize(rng.standard_normal((m, k)).astype(np.float32), swizzle=True) for _ in range(batches)]
    qb = [ms.quantize(rng.standard_normal((n, k)).astype(np.float32), swizzle=True) for _ in range(batches)]
    # a [M, K/2, L] packed e2m1, K-major; scales one swizzled image per batch, batches contiguous
    a_data = np.stack([np.asarray(q.rowwise_data) for q in qa], axis=-1)
    b_data = np.stack([np.asarray(q.rowwise_data) for q in qb], axis=-1)
    a_scales = np.stack([np.asarray(q.rowwise_scale) for q in qa])
    b_scales = np.stack([np.asarray(q.rowwise_scale) for q in qb])
    a = ms.GemmOperand.quantized("nvfp4", a_data, a_scales, swizzle=True)
    b = ms.GemmOperand.quantized("nvfp4", b_data, b_scales, swizzle=True)
    d = ms.gemm(a, b)
    assert d.shape == (m, n, batches) and d.dtype == np.float32 and np.all(np.isfinite(d))
    for i in range(batches):
        # no amax: the scales carry everything, so the product is S_enc_a * S_enc_b times the
        # globally scaled one, whose alpha (amax_a amax_b / 2688^2) that factor cancels up to roundings
        alpha = np.float32((2688.0 / qa[i].rowwise_amax) * (2688.0 / qb[i].rowwise_amax))
        want = ms.gemm(qa[i], qb[i], alpha=alpha)
        assert np.abs(want).max() > 1e3
        assert np.allclose(d[:, :, i], want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    half = ms.gemm(a, b, out_dtype="float16", alpha=2.0**-20)  # float16 output, within its range
    assert half.dtype == np.float16 and np.all(np.isfinite(half))
    assert np.allclose(half.astype(np.float32), d * 2.0**-20, rtol=1e-3, atol=1e-3 * np.abs(half).max())


def test_mixed_dense_activations_and_bias_and_c():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = ms.quantize(rng.standard_normal((16, 64)).astype(np.float32), "mxfp4")
    bias = rng.standard_normal(16).astype(np.float32)
    c = rng.standard_normal((32, 16)).astype(np.float32)
    d = ms.gemm(x, w, alpha=0.5, beta=2.0, c=c, bias=bias)
    want = 0.5 * (x.astype(np.float64) @ dequantized64(w).T) + 2.0 * c + bias
    bound = 70 * 2.0**-24 * (np.abs(x) @ np.abs(dequantized64(w)).T + np.abs(c) + np.abs(bias)) * 2
    assert np.all(np.abs(d - want) <= bound)


def test_torch_gemm_matches_the_numpy_level():
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    w = torch.randn(32, 128, dtype=torch.bfloat16)
    dy = torch.randn(64, 32, dtype=torch.bfloat16)
    for scheme, wk in (("nvfp4", dict(tile="16x16", columnwise=True)), ("mxfp8_e4m3", dict(columnwise=True))):
        # NVFP4 with the RHT on the columnwise outputs: their amaxes differ from the rowwise ones
        xk = dict(columnwise=True, rht=scheme == "nvfp4")
        qx, qw, qdy = mst.quantize(x, scheme, **xk), mst.quantize(w, scheme, **wk), mst.quantize(dy, scheme, **xk)
        nx, nw, ndy = ms.quantize(x, scheme, **xk), ms.quantize(w, scheme, **wk), ms.quantize(dy, scheme, **xk)
        got = mst.gemm(qx, qw, out_dtype=torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, torch.from_numpy(ms.gemm(nx, nw)).to(torch.bfloat16))
        # wgrad, TE's "NT": dW = dy^T x from both columnwise outputs (blocks along M = 64)
        got_t = mst.gemm(qdy, qx, a_usage="columnwise", b_usage="columnwise")
        want_t = ms.gemm(ndy, nx, a_usage="columnwise", b_usage="columnwise")
        assert got_t.shape == (32, 128) and torch.equal(got_t, torch.from_numpy(want_t))
    dense = mst.gemm(x, mst.quantize(w, "mxfp8_e4m3"))
    assert dense.shape == (64, 32)


def test_gemm_errors():
    a = ms.quantize(np.ones((16, 64), np.float32))
    b = ms.quantize(np.ones((16, 32), np.float32))
    with pytest.raises(ms.Error, match="K differ"):
        ms.gemm(a, b)
    with pytest.raises(ms.Error, match="columnwise"):
        ms.gemm(a, a, b_usage="columnwise")
    with pytest.raises(ms.Error, match="block sizes"):
        ms.gemm(a, ms.quantize(np.ones((32, 64), np.float32), "mxfp8_e4m3"))
    with pytest.raises(ms.Error, match="out_dtype"):
        ms.gemm(a, a, out_dtype="bfloat16")
    torch_q = mst.quantize(torch.ones(16, 64))
    with pytest.raises(ms.Error, match="microscale.torch.gemm"):
        ms.gemm(torch_q, torch_q)
    with pytest.raises(ms.Error, match="QuantizedTensor or tensors"):
        mst.gemm(a, torch_q)


def _gemm_cases():
    """(a, b, keyword arguments) for mst.gemm: quantized pairs in both usages, mixed dense x
    quantized with an epilogue, a batched dense operand."""
    g = torch.Generator().manual_seed(11)
    x, w = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
    dy = torch.randn(64, 64, generator=g)
    qx = mst.quantize(x.to(torch.bfloat16), "nvfp4", columnwise=True, rht=True)
    qdy = mst.quantize(dy.to(torch.bfloat16), "nvfp4", columnwise=True, rht=True)
    qw = mst.quantize(w, "nvfp4", tile="16x16", columnwise=True, swizzle=True)
    mw = mst.quantize(w, "mxfp8_e4m3", columnwise=True)
    return [
        (qx, qw, dict(out_dtype=torch.bfloat16)),
        (qdy, qx, dict(a_usage="columnwise", b_usage="columnwise", alpha=0.5)),
        (mst.quantize(dy, "mxfp8_e5m2", columnwise=True), mw, dict(b_usage="columnwise")),
        (x, mw, dict(beta=2.0, c=torch.randn(64, 64, generator=g), bias=torch.randn(64, generator=g),
                     out_dtype=torch.float16)),
        (x.reshape(64, 128, 1), mw, {}),
    ]


def test_gemm_op_passes_opcheck():
    from microscale.torch.gemm import _gemm_op, _op_operand

    for a, b, kw in _gemm_cases():
        torch.library.opcheck(_gemm_op, (*_op_operand(a), *_op_operand(b), kw.get("a_usage", "rowwise"),
                                         kw.get("b_usage", "rowwise"), kw.get("alpha", 1.0), kw.get("beta", 0.0),
                                         kw.get("c"), kw.get("bias"), kw.get("out_dtype", torch.float32)))


def test_torch_compile_traces_gemm_in_one_graph():
    for a, b, kw in _gemm_cases():
        compiled = torch.compile(lambda p, q: mst.gemm(p, q, **kw) * 2, backend="aot_eager", fullgraph=True)
        want = mst.gemm(a, b, **kw) * 2
        got = compiled(a, b)
        assert got.dtype == want.dtype and torch.equal(got, want)
    # quantize and gemm in one graph, with the inductor
    x, w = torch.randn(32, 64), torch.randn(16, 64)

    def forward(t, weight):
        return torch.relu(mst.gemm(mst.quantize(t, "mxfp8_e4m3"), mst.quantize(weight, "mxfp8_e4m3")))

    assert torch.equal(torch.compile(forward, fullgraph=True)(x, w), forward(x, w))
    # out= under compile: the op's result copied into out (the op itself mutates nothing)
    a, b, _ = _gemm_cases()[1]
    main_grad = torch.randn(64, 128)
    want = main_grad + mst.gemm(a, b, a_usage="columnwise", b_usage="columnwise")

    def accumulate(p, q, t):
        return mst.gemm(p, q, a_usage="columnwise", b_usage="columnwise", beta=1.0, c=t, out=t)

    got = torch.compile(accumulate, backend="aot_eager", fullgraph=True)(a, b, main_grad)
    assert got is main_grad or torch.equal(got, main_grad)
    assert torch.allclose(main_grad, want, rtol=2**-22, atol=0)


def test_gemm_into_out_and_in_place_accumulation():
    for a, b, kw in _gemm_cases()[:3]:
        want = mst.gemm(a, b, **kw)
        out = torch.empty_like(want)
        assert mst.gemm(a, b, out=out, **kw) is out and torch.equal(out, want)
    a, b, _ = _gemm_cases()[1]  # wgrad: dW += into an fp32 main_grad, C and D one tensor
    main_grad = torch.randn(64, 128)
    want = mst.gemm(a, b, a_usage="columnwise", b_usage="columnwise", beta=1.0, c=main_grad)
    mst.gemm(a, b, a_usage="columnwise", b_usage="columnwise", beta=1.0, c=main_grad, out=main_grad)
    assert torch.equal(main_grad, want)
    with pytest.raises(ms.Error, match="out is"):
        mst.gemm(a, b, a_usage="columnwise", b_usage="columnwise", out=torch.empty(64, 128, dtype=torch.bfloat16))


def test_cuda_path_names_the_expanded_path_where_the_mx_skinny_kernel_cannot_read():
    # The CUDA frontend asks gemm_workspace_bytes for the path the call will take: Auto (which may
    # answer with the skinny kernel's split for few rows of A) only where the skinny kernel reads
    # the pair, else the expanded path and its bf16 copies.
    from microscale.torch.gemm import _cuda_gemm_path

    assert _cuda_gemm_path("nvfp4", "nvfp4", False, False, 96) == "auto"
    assert _cuda_gemm_path("mxfp8_e4m3", "mxfp8_e5m2", False, False, 128) == "auto"
    assert _cuda_gemm_path("mxfp8_e4m3", "mxfp8_e4m3", False, True, 96) == "auto"  # swizzled: any K
    assert _cuda_gemm_path("mxfp8_e4m3", "mxfp8_e4m3", False, False, 96) == "expanded"  # 3 scales a row
    assert _cuda_gemm_path("mxfp8_e4m3", "mxfp8_e4m3", True, True, 128) == "expanded"  # columnwise
    assert _cuda_gemm_path("mxfp6_e2m3", "mxfp6_e2m3", False, True, 128) == "expanded"
    assert _cuda_gemm_path("mxfp8_e4m3", "mxfp4", False, True, 128) == "expanded"
