"""microscale.torch on CUDA tensors (run by tests/gpu/run.sh on a GPU machine): the Hopper kernels
through the torch ops give the CPU path's bytes, amaxes and dequantized values, on the current
stream, also under torch.compile. Needs a GPU and microscale built with its CUDA backend."""

import dataclasses

import pytest
import torch

import microscale as ms
import microscale.torch as mst

assert torch.cuda.is_available(), "needs a CUDA device"
assert ms._C.cuda_built(), "microscale was built without its CUDA backend"

CASES = [
    ("nvfp4", dict(columnwise=True)),
    ("nvfp4", dict(columnwise=True, rht=True)),
    ("nvfp4", dict(columnwise=True, tile="16x16")),
    ("nvfp4", dict(columnwise=True, sr_seed=11, sr_offset=3)),
    ("nvfp4", dict(columnwise=True, swizzle=True, amax_rowwise=3.0, amax_columnwise=5.0)),
    ("mxfp8_e4m3", dict(columnwise=True)),
    ("mxfp8_e5m2", dict(columnwise=True, scale_mode="floor", swizzle=True)),
    ("mxfp6_e2m3", dict(columnwise=True, scale_mode="even")),
    ("mxfp6_e3m2", dict(rowwise=False, columnwise=True, scale_mode="ceil")),
    ("mxfp4", dict(columnwise=True, swizzle=True)),
]
PARTS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale")


def usages(kwargs):
    return [u for u, on in (("rowwise", kwargs.get("rowwise", True)), ("columnwise", kwargs.get("columnwise"))) if on]


# Every case in bf16, f32 and f16, but the RHT, which takes bf16 only (test_errors).
DTYPED = [(scheme, kwargs, dtype) for scheme, kwargs in CASES
          for dtype in (torch.bfloat16, torch.float32, torch.float16) if dtype == torch.bfloat16 or not kwargs.get("rht")]


@pytest.mark.parametrize("scheme, kwargs, dtype", DTYPED, ids=str)
def test_cuda_equals_cpu(scheme, kwargs, dtype):
    x = (torch.randn(3, 128, 256, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    cpu = mst.quantize(x, scheme, **kwargs)
    gpu = mst.quantize(x.cuda(), scheme, **kwargs)
    for name in PARTS:
        a, b = getattr(cpu, name), getattr(gpu, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert b.is_cuda and torch.equal(a, b.cpu()), name
    if scheme == "nvfp4":
        assert torch.equal(cpu.amax, gpu.amax.cpu())
    for usage in usages(kwargs):
        for out in (torch.float32, torch.bfloat16):
            want = mst.dequantize(cpu, usage, out)
            got = mst.dequantize(gpu, usage, out)
            assert got.is_cuda and got.dtype == out and torch.equal(want, got.cpu()), (usage, out)


def test_runs_on_the_current_stream_and_strided_inputs():
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)[:, ::2]  # strided: [256, 256]
    want = mst.quantize(x.cpu(), "nvfp4", columnwise=True, rht=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = mst.quantize(x, "nvfp4", columnwise=True, rht=True)
        values = mst.dequantize(got, "columnwise")
    side.synchronize()
    assert torch.equal(got.columnwise_data.cpu(), want.columnwise_data)
    assert torch.equal(values.cpu(), mst.dequantize(want, "columnwise"))


def test_torch_compile_traces_the_cuda_ops():
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)

    def round_trip(t):
        return mst.dequantize(mst.quantize(t, "mxfp8_e4m3", columnwise=True), "columnwise")

    compiled = torch.compile(round_trip, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), round_trip(x))


def test_errors():
    with pytest.raises(ms.Error, match="bf16"):
        mst.quantize(torch.ones(16, 16, device="cuda"), columnwise=True, rht=True)
    with pytest.raises(ms.Error, match="divisible"):
        mst.quantize(torch.ones(16, 24, device="cuda"))


def _to_cpu(q):
    return mst.QuantizedTensor(*[None if t is None else t.cpu() for t in (q.rowwise_data, q.rowwise_scale,
                                                                          q.columnwise_data, q.columnwise_scale,
                                                                          q.amax)], q.shape, q.options)


@pytest.mark.parametrize("swizzle", [False, True])
@pytest.mark.parametrize("layout", ["TN", "NT"])
def test_gemm_on_cuda_matches_the_cpu_gemm(swizzle, layout):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(192, 256, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(320, 256, generator=g) * 0.05).to(torch.bfloat16).cuda()
    dy = torch.randn(192, 320, generator=g).to(torch.bfloat16).cuda()
    opts = dict(columnwise=True, swizzle=swizzle)
    if layout == "TN":  # fprop: y = x W^T
        a, b, usage = mst.quantize(x, "nvfp4", **opts), mst.quantize(w, "nvfp4", **opts), "rowwise"
    else:  # wgrad: dW = dy^T x, from the columnwise (transposed) outputs with the RHT
        a, b, usage = mst.quantize(dy, "nvfp4", rht=True, **opts), mst.quantize(x, "nvfp4", rht=True, **opts), "columnwise"
    bias = torch.randn(b.rowwise_data.shape[0] if usage == "rowwise" else b.columnwise_data.shape[0],
                       generator=g).cuda()
    got = mst.gemm(a, b, a_usage=usage, b_usage=usage, alpha=0.5, bias=bias, out_dtype=torch.float32)
    want = mst.gemm(_to_cpu(a), _to_cpu(b), a_usage=usage, b_usage=usage, alpha=0.5, bias=bias.cpu(),
                    out_dtype=torch.float32)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_gemm_on_cuda_exact_for_exact_sums_and_runs_on_the_current_stream():
    # GPU MODE's data: any codes, scales from {0, 1, 2, 3}: every partial sum is exact in fp32.
    g = torch.Generator().manual_seed(4)
    m, n, k = 130, 200, 512
    a_codes = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8)
    b_codes = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    e4m3 = torch.tensor([0.0, 1.0, 2.0, 3.0]).to(torch.float8_e4m3fn).view(torch.uint8)
    a_scales = e4m3[torch.randint(0, 4, (m, k // 16), generator=g)]
    b_scales = e4m3[torch.randint(0, 4, (n, k // 16), generator=g)]
    want = ms.gemm(ms.GemmOperand.quantized("nvfp4", a_codes.numpy(), a_scales.numpy()),
                   ms.GemmOperand.quantized("nvfp4", b_codes.numpy(), b_scales.numpy()))
    d = torch.empty(m, n, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ms._C.gemm_cuda(a_codes.cuda(), a_scales.cuda(), None, False, b_codes.cuda(), b_scales.cuda(), None, False,
                        1.0, 0.0, None, None, d, side.cuda_stream)
    side.synchronize()
    assert torch.equal(d.cpu(), torch.from_numpy(want))


def test_gemm_on_cuda_errors():
    x = torch.randn(128, 128, device="cuda").to(torch.bfloat16)
    q = mst.quantize(x, "nvfp4")
    with pytest.raises(ms.Error, match="NVFP4"):
        mst.gemm(mst.quantize(x, "mxfp8_e4m3"), q)
    with pytest.raises(ms.Error, match="no columnwise"):
        mst.gemm(q, q, a_usage="columnwise")
    with pytest.raises(ms.Error, match="multiple of 64"):
        q80 = mst.quantize(torch.randn(128, 80, device="cuda").to(torch.bfloat16), "nvfp4")
        mst.gemm(q80, q80)


def test_gemm_on_cuda_split_k_with_torch_workspace_and_without_amax():
    # M = 128 and a long K: few output tiles, so K is split and the partial sums go to a
    # workspace from PyTorch's allocator.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(128, 4096, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(256, 4096, generator=g) * 0.05).to(torch.bfloat16).cuda()
    assert ms._C.gemm_workspace_bytes(128, 256, 4096) > 0
    a, b = mst.quantize(x, "nvfp4", swizzle=True), mst.quantize(w, "nvfp4")
    c = torch.randn(128, 256, generator=g).cuda()
    def close(got, want):  # fp32 sums in another order: errors far below the outputs' size
        assert got.device.type == "cuda"
        assert (got.cpu() - want).abs().max() <= 1e-5 * want.abs().max()

    close(mst.gemm(a, b, beta=0.5, c=c), mst.gemm(_to_cpu(a), _to_cpu(b), beta=0.5, c=c.cpu()))
    # Without amaxes the scales carry everything (GPU MODE's convention), on both devices.
    a0, b0 = dataclasses.replace(a, amax=None), dataclasses.replace(b, amax=None)
    close(mst.gemm(a0, b0), mst.gemm(_to_cpu(a0), _to_cpu(b0)))


def test_gemm_on_cuda_refuses_epilogue_tensors_elsewhere():
    q = mst.quantize(torch.randn(128, 128, device="cuda").to(torch.bfloat16), "nvfp4")
    with pytest.raises(ms.Error, match="bias is on cpu"):
        mst.gemm(q, q, bias=torch.zeros(128))
    with pytest.raises(ms.Error, match="c is on cpu"):
        mst.gemm(q, q, c=torch.zeros(128, 128))
