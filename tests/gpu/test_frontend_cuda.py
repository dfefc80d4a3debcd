"""microscale.torch on CUDA tensors (run by tests/gpu/run.sh on a GPU machine): the Hopper kernels
through the torch ops give the CPU path's bytes, amaxes and dequantized values, on the current
stream, also under torch.compile. Needs a GPU and microscale built with its CUDA backend."""

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
