"""microscale.torch on CUDA tensors (run by tests/gpu/run.sh on a GPU machine): the Hopper kernels
through the torch ops give the CPU path's bytes, amaxes and dequantized values, on the current
stream, also under torch.compile. Needs a GPU and microscale built with its CUDA backend."""

import contextlib
import dataclasses

import pytest
import torch

import microscale as ms
import microscale.torch as mst
from microscale.recipe import Format, MXFP8BlockScaling, NVFP4BlockScaling
from microscale.torch.activations import activate

assert torch.cuda.is_available(), "needs a CUDA device"
assert ms._C.cuda_built(), "microscale was built without its CUDA backend"

CASES = [
    ("nvfp4", dict(columnwise=True)),
    ("nvfp4", dict(columnwise=True, rht=True)),
    ("nvfp4", dict(columnwise=True, tile="16x16")),
    ("nvfp4", dict(columnwise=True, sr_seed=11, sr_offset=3)),
    ("nvfp4", dict(columnwise=True, swizzle=True, amax_rowwise=3.0, amax_columnwise=5.0)),
    ("nvfp4", dict(columnwise=True, four_over_six="mae", nvfp4_e4m3_max=256)),
    ("nvfp4", dict(columnwise=True, tile="16x16", four_over_six="mae", nvfp4_e4m3_max=256)),
    ("nvfp4", dict(columnwise=True, four_over_six="mse", four_over_six_scaled_error=True)),
    ("nvfp4", dict(columnwise=True, tile="16x16", four_over_six="mse", four_over_six_scaled_error=True, swizzle=True)),
    ("nvfp4", dict(columnwise=True, row_scaled=True)),
    ("nvfp4", dict(swizzle=True, row_scaled=True, four_over_six="mae", nvfp4_e4m3_max=256)),
    ("mxfp8_e4m3", dict(columnwise=True)),
    ("mxfp8_e5m2", dict(columnwise=True, scale_mode="floor", swizzle=True)),
    ("mxfp6_e2m3", dict(columnwise=True, scale_mode="even")),
    ("mxfp6_e3m2", dict(rowwise=False, columnwise=True, scale_mode="ceil")),
    ("mxfp4", dict(columnwise=True, swizzle=True)),
    ("mxfp8_e4m3", dict(columnwise=True, tile="32x32")),
    ("mxfp4", dict(columnwise=True, tile="32x32", scale_mode="floor", swizzle=True)),
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


@pytest.mark.parametrize("both", [False, True])
def test_row_scaled_gemm_on_cuda_matches_the_cpu_gemm(both):
    """TE's general_gemm for row-scaled operands: the library's GEMM with unit amaxes, then the
    outer scales, bias and C as the CPU GEMM applies them."""
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(192, 256, generator=g) * torch.exp2(torch.randint(-8, 8, (192, 1), generator=g).float()))
    w = torch.randn(320, 256, generator=g) * 0.05
    a = mst.quantize(x.to(torch.bfloat16).cuda(), "nvfp4", row_scaled=True)
    b = mst.quantize(w.to(torch.bfloat16).cuda(), "nvfp4", row_scaled=both)
    bias, c = torch.randn(320, generator=g), torch.randn(192, 320, generator=g).to(torch.bfloat16)
    for kwargs in (dict(), dict(bias=bias, c=c, beta=1.0, out_dtype=torch.bfloat16)):
        got = mst.gemm(a, b, alpha=0.5, **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        want = mst.gemm(_to_cpu(a), _to_cpu(b), alpha=0.5, **kwargs)
        assert got.device.type == "cuda" and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=1e-5 if not kwargs else 2**-7, atol=1e-5)
    with pytest.raises(ms.Error, match="beta 1 only"):
        mst.gemm(a, b, c=c.cuda(), beta=0.5)


@pytest.mark.parametrize("m, n", [(64, 48), (1, 48), (64, 1)])
def test_row_scaled_gemm_on_cuda_applies_te_outer_scales_bit_for_bit(m, n):
    """The CUDA route's epilogue: the same library GEMM with unit amaxes, then TE's arithmetic
    written out here (a side of one value multiplied into the other first), the bias in fp32, C."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m, 128, generator=g) * torch.exp2(torch.randint(-6, 6, (m, 1), generator=g).float())
    a = mst.quantize(x.cuda(), "nvfp4", row_scaled=True)
    b = mst.quantize(torch.randn(n, 128, generator=g).cuda(), "nvfp4", row_scaled=True)

    def unit(q):
        return dataclasses.replace(q, amax=torch.ones(2, device="cuda"),
                                   options=dataclasses.replace(q.options, row_scaled=False))

    d = mst.gemm(unit(a), unit(b), alpha=0.5)
    ra, rb = a.rowwise_amaxes.view(-1, 1), b.rowwise_amaxes.view(1, -1)
    want = d * (ra * rb) if n == 1 else d * (rb * ra) if m == 1 else (d * ra) * rb
    assert torch.equal(mst.gemm(a, b, alpha=0.5), want)
    bias = torch.randn(n, generator=g).cuda()
    c = torch.randn(m, n, generator=g).to(torch.bfloat16).cuda()
    got = mst.gemm(a, b, alpha=0.5, bias=bias, c=c, beta=1.0, out_dtype=torch.bfloat16)
    assert torch.equal(got, (c.float() + (want + bias).to(torch.bfloat16).float()).to(torch.bfloat16))
    for bad in (dict(bias=bias[:1]) if n > 1 else dict(bias=torch.randn(2, device="cuda")),
                dict(c=c.reshape(-1)), dict(c=c.cpu())):
        with pytest.raises(ms.Error, match="expected"):
            mst.gemm(a, b, beta=1.0, **bad)


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
    with pytest.raises(ms.Error, match="no columnwise"):
        mst.gemm(q, q, a_usage="columnwise")
    with pytest.raises(ms.Error, match="no columnwise"):
        mst.gemm(mst.quantize(x, "mxfp8_e4m3"), q, a_usage="columnwise")  # the emulation's check
    with pytest.raises(ms.Error, match="B is on cpu"):
        mst.gemm(mst.quantize(x, "mxfp8_e4m3"), torch.ones(4, 128))


@pytest.mark.parametrize("scheme, k", [("mxfp8_e4m3", 128), ("mxfp8_e5m2", 64), ("mxfp6_e2m3", 64),
                                       ("mxfp6_e3m2", 96), ("mxfp4", 96), ("nvfp4", 80), ("dense", 64)])
def test_gemm_on_cuda_takes_every_scheme_and_k(scheme, k):
    # MX and NVFP4 with K % 64 != 0 run the library's expanded path; a dense pair is dequantized
    # exactly and summed in float64 by torch: both within the fp32 accumulation bound of the CPU
    # GEMM (relative to the outputs' size here).
    g = torch.Generator().manual_seed(7)
    x = torch.randn(96, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(64, k, generator=g) * 0.05).to(torch.bfloat16)
    c, bias = torch.randn(96, 64, generator=g), torch.randn(64, generator=g)
    if scheme == "dense":
        a_cpu, b_cpu, a, b = x, w, x.cuda(), w.cuda()
    else:
        a, b = mst.quantize(x.cuda(), scheme), mst.quantize(w.cuda(), scheme)
        a_cpu, b_cpu = _to_cpu(a), _to_cpu(b)
    for out_dtype in (torch.float32, torch.bfloat16):
        got = mst.gemm(a, b, alpha=0.5, beta=2.0, c=c.cuda(), bias=bias.cuda(), out_dtype=out_dtype)
        want = mst.gemm(a_cpu, b_cpu, alpha=0.5, beta=2.0, c=c, bias=bias, out_dtype=out_dtype)
        assert got.is_cuda and got.dtype == out_dtype
        ulp = 2.0**-23 if out_dtype == torch.float32 else 2.0**-7  # one rounding of the output apart
        assert ((got.cpu().double() - want.double()).abs() <= 1e-5 * want.abs().max() + ulp * want.abs().double()).all()


@pytest.mark.parametrize("scheme_dy, scheme_x", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxfp8_e4m3"),
                                                 ("mxfp4", "mxfp4")])
def test_gemm_on_cuda_mx_columnwise_operands(scheme_dy, scheme_x):
    # wgrad dW = dy^T x from MX columnwise outputs (stored untransposed, blocks down the columns)
    # and dgrad dx = dy W from W's columnwise output, E5M2 beside E4M3 as the HYBRID recipe has it.
    g = torch.Generator().manual_seed(11)
    x = torch.randn(256, 192, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(160, 192, generator=g) * 0.05).to(torch.bfloat16).cuda()
    dy = torch.randn(256, 160, generator=g).to(torch.bfloat16).cuda()
    qx = mst.quantize(x, scheme_x, columnwise=True, swizzle=True)
    qw = mst.quantize(w, scheme_x, columnwise=True)
    qdy = mst.quantize(dy, scheme_dy, columnwise=True)
    for a, b, ua, ub in ((qdy, qx, "columnwise", "columnwise"), (qdy, qw, "rowwise", "columnwise")):
        got = mst.gemm(a, b, a_usage=ua, b_usage=ub, out_dtype=torch.bfloat16)
        want = mst.gemm(_to_cpu(a), _to_cpu(b), a_usage=ua, b_usage=ub, out_dtype=torch.bfloat16)
        assert got.is_cuda and got.shape == want.shape
        _assert_near(got.cpu(), want, f"{scheme_dy} x {scheme_x} {ua} x {ub}", 2.0**-7)
    with pytest.raises(ms.Error, match="different block sizes"):
        mst.gemm(qx, mst.quantize(x, "nvfp4"))


@pytest.mark.parametrize("path", ["fused", "skinny", "expanded"])
@pytest.mark.parametrize("m", [512, 5])
def test_gemm_paths_agree_with_the_cpu_gemm(path, m):
    # Each path of cuda::gemm through the binding, beside the CPU GEMM; with a bias (the expanded
    # path's epilogue kernel) and without (cuBLAS writes D); many rows of A and few (decode).
    g = torch.Generator().manual_seed(9)
    x = torch.randn(m, 512, generator=g).to(torch.bfloat16)
    w = (torch.randn(640, 512, generator=g) * 0.05).to(torch.bfloat16)
    a, b = mst.quantize(x.cuda(), "nvfp4"), mst.quantize(w.cuda(), "nvfp4", swizzle=True)
    bias = torch.randn(640, generator=g)
    for with_bias in (False, True):
        d = torch.empty(m, 640, device="cuda", dtype=torch.bfloat16)
        workspace = torch.empty(ms._C.gemm_workspace_bytes(m, 640, 512, 1, path), dtype=torch.uint8, device="cuda")
        ms._C.gemm_cuda(a.rowwise_data, a.rowwise_scale, a.amax[0:1], False, b.rowwise_data, b.rowwise_scale,
                        b.amax[0:1], True, 1.0, 0.0, None, bias.cuda() if with_bias else None, d,
                        torch.cuda.current_stream().cuda_stream, workspace, path)
        want = mst.gemm(_to_cpu(a), _to_cpu(b), bias=bias if with_bias else None, out_dtype=torch.bfloat16)
        _assert_near(d.cpu(), want, f"{path} bias={with_bias}", 2.0**-7)
    with pytest.raises(ms.Error, match="unknown GEMM path"):
        ms._C.gemm_workspace_bytes(512, 640, 512, 1, "fast")


@pytest.mark.parametrize("path", ["skinny", "expanded", "auto"])
@pytest.mark.parametrize("m", [512, 5])
@pytest.mark.parametrize("scheme_x, scheme_w", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxfp8_e4m3")])
def test_mx_gemm_paths_agree_with_the_cpu_gemm(path, m, scheme_x, scheme_w):
    # MXFP8 pairs on the skinny kernel and the expanded path through the binding, beside the CPU
    # GEMM; Auto takes the skinny kernel at M = 5. A long K splits it (the workspace from torch).
    g = torch.Generator().manual_seed(11)
    x = torch.randn(m, 2048, generator=g).to(torch.bfloat16)
    w = (torch.randn(320, 2048, generator=g) * 0.05).to(torch.bfloat16)
    a, b = mst.quantize(x.cuda(), scheme_x), mst.quantize(w.cuda(), scheme_w, swizzle=True)
    bias = torch.randn(320, generator=g)
    for with_bias in (False, True):
        d = torch.empty(m, 320, device="cuda", dtype=torch.bfloat16)
        workspace_bytes = ms._C.gemm_workspace_bytes(m, 320, 2048, 1, path, scheme_x)
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda")
        ms._C.gemm_cuda(a.rowwise_data, a.rowwise_scale, None, False, b.rowwise_data, b.rowwise_scale, None, True,
                        1.0, 0.0, None, bias.cuda() if with_bias else None, d, torch.cuda.current_stream().cuda_stream,
                        workspace, path, scheme_x, False, scheme_w, False)
        want = mst.gemm(_to_cpu(a), _to_cpu(b), bias=bias if with_bias else None, out_dtype=torch.bfloat16)
        _assert_near(d.cpu(), want, f"{path} {scheme_x} x {scheme_w} bias={with_bias}", 2.0**-7)
    # mst.gemm takes the same route (Auto) and agrees too.
    _assert_near(mst.gemm(a, b, out_dtype=torch.bfloat16).cpu(), mst.gemm(_to_cpu(a), _to_cpu(b), out_dtype=torch.bfloat16),
                 f"mst.gemm {scheme_x} x {scheme_w}", 2.0**-7)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, cols", [(1, 1), (33, 300), (5000, 257)])
def test_column_sums_on_cuda(dtype, rows, cols):
    # The bias gradient's kernel: float64 sums rounded once to fp32, within one fp32 ulp of torch's
    # float64 sum (another order); a transposed view too (any strides).
    g = torch.Generator().manual_seed(rows + cols)
    x = (torch.randn(rows, cols, generator=g) * 100).to(dtype)
    # The scratch from the stream-ordered pool, a workspace of the bytes asked for, and one too small
    # (then the pool's again).
    workspace_bytes = ms._C.column_sums_workspace_bytes(rows, cols)
    for view in (x, x.t().contiguous().t()):
        for workspace in (None, torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda"),
                          torch.empty(workspace_bytes // 2, dtype=torch.uint8, device="cuda")):
            out = torch.empty(cols, dtype=torch.float32, device="cuda")
            ms._C.column_sums_cuda(view.cuda(), out, torch.cuda.current_stream().cuda_stream, workspace)
            want = x.double().sum(0)
            err = (out.cpu().double() - want).abs()
            order = x.double().abs().sum(0) * rows * 2.0**-52  # float64 sums in two orders
            assert bool((err <= want.abs() * 2.0**-23 + order).all())
    # The op a traced Linear records (microscale::column_sums): the kernel's bytes.
    from microscale.torch.column_sums import _column_sums_op, column_sums
    torch.library.opcheck(_column_sums_op, (x.cuda(),))
    assert torch.equal(torch.compile(column_sums, backend="aot_eager", fullgraph=True)(x.cuda()), column_sums(x.cuda()))
    with pytest.raises(ms.Error):
        ms._C.column_sums_cuda(x.cuda(), torch.empty(cols, device="cuda", dtype=torch.float16), 0)
    with pytest.raises(ms.Error, match="columns"):
        ms._C.column_sums_cuda(x.cuda(), torch.empty(cols + 1, device="cuda"), 0)


# The quantized Linear on CUDA tensors (linear_composed.py): the CPU layer's quantized operands,
# bytes and seeds alike, so the outputs differ only by the order of the fp32 sums (the library's GEMM,
# for every recipe).
LINEAR_RECIPES = {
    "nvfp4": lambda: NVFP4BlockScaling(),
    "nvfp4_1d_no_rht": lambda: NVFP4BlockScaling(disable_rht=True, disable_2d_quantization=True),
    "nvfp4_4over6": lambda: NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="all", nvfp4_4over6_err_mode="MSE"),
    "nvfp4_row_scaled": lambda: NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True),
    "mxfp8": lambda: MXFP8BlockScaling(),
    "mxfp8_hybrid": lambda: MXFP8BlockScaling(fp8_format=Format.HYBRID),
    "mxfp8_2d": lambda: MXFP8BlockScaling(enable_2d_quantization=True),  # weights in 32x32 tiles
    # backward_override: the backward's GEMMs unquantized (torch's cuBLAS GEMM, fp32 accumulation)
    "nvfp4_backward_high_precision": lambda: NVFP4BlockScaling(backward_override="high_precision"),
    "nvfp4_backward_dequantized": lambda: NVFP4BlockScaling(backward_override="dequantized"),
    "mxfp8_backward_dequantized": lambda: MXFP8BlockScaling(backward_override="dequantized"),
}


def _linear_step(layer, x, dy, recipe, seed):
    x = x.detach().clone().requires_grad_()
    with mst.autocast(recipe=recipe):
        y = layer(x)
    torch.manual_seed(seed)  # the gradient's stochastic rounding draws its seed here
    y.backward(dy)
    return [t.detach().cpu() for t in (y, x.grad, layer.weight.grad, layer.bias.grad)]


def _assert_near(got, want, what, ulp):
    """Apart by fp32 sums in another order (far below 1e-5 of the outputs' size) and one rounding of
    the output dtype."""
    err = (got.double() - want.double()).abs()
    bound = 1e-5 * want.double().abs().max() + ulp * want.double().abs()
    assert bool((err <= bound).all()), f"{what}: max excess {(err - bound).max().item()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
# (64, 96, 128): NVFP4's fprop on the expanded path (K = 96); (512, 512, 512): the NVFP4 GEMMs
# with both sides >= 512 take the expanded path (fprop and dgrad; wgrad's A is dy^T [512, 512]
# too). MX recipes always do.
@pytest.mark.parametrize("m, k, n", [(128, 256, 192), (64, 96, 128), (512, 512, 512)])
@pytest.mark.parametrize("recipe_name", sorted(LINEAR_RECIPES))
def test_linear_on_cuda_matches_the_cpu_linear(recipe_name, m, k, n, dtype):
    recipe = LINEAR_RECIPES[recipe_name]()
    torch.manual_seed(0)
    cpu = mst.Linear(k, n)
    gpu = mst.Linear(k, n, device="cuda")
    gpu.load_state_dict(cpu.state_dict())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, m // 2, k, generator=g).to(dtype)
    dy = torch.randn(2, m // 2, n, generator=g).to(dtype)
    want = _linear_step(cpu, x, dy, recipe, 5)
    got = _linear_step(gpu, x.cuda(), dy.cuda(), recipe, 5)
    ulp = 2.0**-23 if dtype == torch.float32 else 2.0**-7  # bf16: 8 significant bits
    for name, a, b in zip(("y", "dx", "dW", "db"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        _assert_near(a, b, name, ulp)  # dW too: rounded to x's dtype before the weight's f32


def test_linear_on_cuda_keeps_the_weight_when_asked_and_repeats_with_the_seed():
    torch.manual_seed(2)
    layer = mst.Linear(128, 64, device="cuda")
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    grads = []
    for _ in range(2):
        layer.zero_grad()
        grads.append(_linear_step(layer, x, torch.ones(64, 64, device="cuda", dtype=torch.bfloat16),
                                  NVFP4BlockScaling(), 8))
    assert layer.weight_quantizations == 2 and layer._cached_weight is None  # None: on every call
    for a, b in zip(*grads):
        assert torch.equal(a, b)  # one seed, one result
    with mst.autocast(recipe=NVFP4BlockScaling()), torch.no_grad():
        kept = layer(x, is_first_microbatch=True)
        assert layer._cached_weight.rowwise_data.is_cuda
        layer.weight.add_(1.0)
        assert torch.equal(layer(x, is_first_microbatch=False), kept)  # reused, as asked
        assert not torch.equal(layer(x), kept)
    assert layer.weight_quantizations == 4


def test_linear_on_cuda_errors():
    layer = mst.Linear(64, 32, device="cuda")
    with mst.autocast(recipe=NVFP4BlockScaling()):
        with pytest.raises(ms.Error, match="both on one device"):
            layer(torch.randn(16, 64))
        with pytest.raises(ms.Error, match="divisible by 16"):
            layer(torch.randn(8, 64, device="cuda", requires_grad=True))  # NVFP4 X^T needs M % 16 == 0


def test_gemm_op_on_cuda_passes_opcheck_and_compiles_in_one_graph():
    from microscale.torch.gemm import _gemm_op, _op_operand

    g = torch.Generator().manual_seed(12)
    x = torch.randn(256, 512, generator=g).to(torch.bfloat16).cuda()
    w = torch.randn(384, 512, generator=g).to(torch.bfloat16).cuda()
    bias = torch.randn(384, generator=g).cuda()
    for scheme in ("nvfp4", "mxfp8_e4m3"):
        qx, qw = mst.quantize(x, scheme), mst.quantize(w, scheme)
        torch.library.opcheck(_gemm_op, (*_op_operand(qx), *_op_operand(qw), "rowwise", "rowwise", 1.0, 0.0, None,
                                         bias, torch.bfloat16))

        def forward(t, weight, b, s=scheme):
            return torch.relu(mst.gemm(mst.quantize(t, s), mst.quantize(weight, s), bias=b, out_dtype=torch.bfloat16))

        want = forward(x, w, bias)
        for backend in ("aot_eager", "inductor"):
            assert torch.equal(torch.compile(forward, backend=backend, fullgraph=True)(x, w, bias), want), (scheme,
                                                                                                           backend)


@pytest.mark.parametrize("recipe_name", ["mxfp8", "nvfp4"])
def test_linear_on_cuda_takes_broadcast_inputs_and_gradients(recipe_name):
    # A broadcast x and the gradient of a mean (strides of zero, which the kernels refuse): the
    # layer copies them, and gives what the same values laid out densely give.
    recipe = LINEAR_RECIPES[recipe_name]()
    torch.manual_seed(15)
    layer = mst.Linear(64, 32, device="cuda", params_dtype=torch.bfloat16)
    row = torch.linspace(-2, 2, 64, device="cuda").to(torch.bfloat16)
    results = []
    for x in (row.expand(32, 64), row.expand(32, 64).contiguous()):
        x = x.detach().requires_grad_()
        layer.zero_grad(set_to_none=True)
        with mst.autocast(recipe=recipe):
            y = layer(x)
        torch.manual_seed(8)
        if x.is_contiguous():
            y.backward(torch.full_like(y, 1.0 / y.numel()))
        else:
            y.mean().backward()
        results.append((y.detach(), x.grad, layer.weight.grad, layer.bias.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def _compiled_step_outputs(model, x, dy, recipe, forward):
    """y, dx and every parameter's gradient of one step through forward(t) (the model, eager or
    compiled) under recipe's scope."""
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    with mst.autocast(recipe=recipe):
        y = forward(x)
    y.backward(dy)
    return [y.detach().clone(), x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("recipe_name", sorted(LINEAR_RECIPES))
def test_linear_on_cuda_traced_whole_by_torch_compile(recipe_name, monkeypatch):
    # fullgraph=True: the layers are in the model's graph (one graph; the weight quantized in it).
    # One known seed for the gradient's stochastic rounding on both sides, a CUDA tensor (under
    # torch.compile the layer draws it on the device, inside the graph).
    recipe = LINEAR_RECIPES[recipe_name]()
    import microscale.torch.linear_composed as composed
    monkeypatch.setattr(composed, "_gradient_seed",
                        lambda device: torch.full((1,), 31, dtype=torch.int64, device=device))
    torch.manual_seed(13)
    model = torch.nn.Sequential(mst.Linear(256, 256), torch.nn.ReLU(), mst.Linear(256, 128)).cuda().to(torch.bfloat16)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    want = _compiled_step_outputs(model, x, dy, recipe, model)
    for options in (dict(backend="aot_eager"), dict(backend="inductor"), dict(mode="reduce-overhead")):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, **options)
        for _ in range(3):  # reduce-overhead: records, then replays its CUDA graphs
            torch.compiler.cudagraph_mark_step_begin()
            got = _compiled_step_outputs(model, x, dy, recipe, compiled)
            for n, (a, b) in enumerate(zip(got, want)):
                assert torch.equal(a, b), (options, n)
    torch._dynamo.reset()


def test_traced_nvfp4_step_draws_its_seed_from_the_cuda_generator():
    torch.manual_seed(14)
    model = mst.Linear(256, 128, device="cuda", params_dtype=torch.bfloat16)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    runs = []
    for cuda_seed in (3, None, 3):  # None: the generator goes on
        if cuda_seed is not None:
            torch.cuda.manual_seed(cuda_seed)
        runs.append(_compiled_step_outputs(model, x, dy, NVFP4BlockScaling(), compiled))
    assert torch.equal(runs[0][0], runs[1][0])  # y: no stochastic rounding in the forward
    assert not torch.equal(runs[0][1], runs[1][1]) and not torch.equal(runs[0][2], runs[1][2])  # dx, dW
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))  # torch.cuda.manual_seed repeats a step
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe_name", ["nvfp4", "mxfp8", "nvfp4_backward_high_precision", "mxfp8_backward_dequantized"])
@pytest.mark.parametrize("m", [64, 512])  # NVFP4's wgrad on the fused path, then on the expanded one
def test_linear_on_cuda_frozen_weight_and_fused_wgrad_accumulation(recipe_name, m):
    recipe = LINEAR_RECIPES[recipe_name]()

    def step(layer, x, dy):  # (dx, weight.grad) of one micro-batch
        layer.weight.grad = None
        x = x.detach().clone().requires_grad_()
        with mst.autocast(recipe=recipe):
            y = layer(x)
        torch.manual_seed(6)  # the gradient's stochastic rounding draws its seed here
        y.backward(dy)
        return x.grad, layer.weight.grad

    torch.manual_seed(3)
    layer = mst.Linear(256, 512, device="cuda")
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(m, 256, generator=g).cuda() for _ in range(2)]
    dy = torch.randn(m, 512, generator=g).cuda()
    want = [step(layer, x, dy) for x in xs]
    fused = mst.Linear(256, 512, device="cuda", fuse_wgrad_accumulation=True)
    fused.load_state_dict(layer.state_dict())
    fused.weight.main_grad = torch.zeros(512, 256, device="cuda")
    for x in xs:
        assert step(fused, x, dy)[1] is None
    # D = dW + main_grad in fp32, in place: the sum of the returned dWs, but for the order of the
    # kernels' fp32 sums (cuBLAS's product with and without C may come from different kernels).
    _assert_near(fused.weight.main_grad, want[0][1] + want[1][1], "main_grad", 2.0**-23)
    fused.weight.requires_grad_(False)  # frozen: no wgrad, main_grad untouched, dx as before
    before = fused.weight.main_grad.clone()
    dx, dw = step(fused, xs[0], dy)
    assert dw is None and torch.equal(dx, want[0][0]) and torch.equal(fused.weight.main_grad, before)
    # x without a gradient (a first layer): dy quantized columnwise only, dW as in the full step
    layer.weight.grad = None
    with mst.autocast(recipe=recipe):
        y = layer(xs[0])
    torch.manual_seed(6)
    y.backward(dy)
    assert torch.equal(layer.weight.grad, want[0][1])


# CUDA graphs: a quantize call with a seed tensor reads it as the kernel runs, and the Linear's
# training step can be captured whole (its weight quantized inside the graph, its gradient's
# stochastic rounding seeded inside it), as torch.cuda.graph and make_graphed_callables capture.
def _parts_equal(a, b):
    for name in PARTS:
        pa, pb = getattr(a, name), getattr(b, name)
        assert (pa is None) == (pb is None), name
        if pa is not None:
            assert torch.equal(pa.cpu(), pb.cpu()), name


def _captured(fn):
    """fn() captured into a CUDA graph after two warm-up calls on a side stream (torch's recipe);
    returns the graph and what the captured call returned (the graph's static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def test_quantize_reads_a_seed_tensor_as_the_kernel_runs():
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16).cuda()
    kwargs = dict(columnwise=True, rht=True, sr_offset=2)
    seed = torch.tensor([5], dtype=torch.int64, device="cuda")
    eager = mst.quantize(x, sr_seed=seed, **kwargs)
    _parts_equal(eager, mst.quantize(x, sr_seed=5, **kwargs))
    _parts_equal(eager, mst.quantize(x.cpu(), sr_seed=5, **kwargs))
    static_seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    graph, captured = _captured(lambda: mst.quantize(x, sr_seed=static_seed, **kwargs))
    for value in (5, -(2**63) + 9):  # the tensor's bits as an unsigned seed
        static_seed.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        _parts_equal(captured, mst.quantize(x, sr_seed=value % 2**64, **kwargs))
    with pytest.raises(ms.Error, match="int64 with one element"):
        mst.quantize(x, sr_seed=torch.tensor([5], dtype=torch.int32, device="cuda"))
    with pytest.raises(ms.Error, match="int64 with one element"):
        mst.quantize(x, sr_seed=torch.tensor([5]))  # on the CPU, x on CUDA
    with pytest.raises(ms.Error, match="stochastic rounding applies to nvfp4"):
        mst.quantize(x, "mxfp8_e4m3", sr_seed=seed)


def _graph_step(layer, x, dy, recipe):
    """A training step as torch.cuda.graph captures it: gradients set to None before, so that the
    backward allocates them in the graph's pool (each replay writes them anew)."""
    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with mst.autocast(recipe=recipe):
            y = layer(x)
        y.backward(dy)
        return y
    return step


def _step_outputs(layer, x, y):
    return [t.detach().clone() for t in (y, x.grad, layer.weight.grad, layer.bias.grad)]


def _layers(k, n):
    torch.manual_seed(12)
    layer = mst.Linear(k, n, params_dtype=torch.bfloat16, device="cuda")
    twin = mst.Linear(k, n, params_dtype=torch.bfloat16, device="cuda")
    twin.load_state_dict(layer.state_dict())
    g = torch.Generator().manual_seed(13)
    x = torch.randn(256, k, generator=g).to(torch.bfloat16).cuda().requires_grad_()
    dy = torch.randn(256, n, generator=g).to(torch.bfloat16).cuda()
    return layer, twin, x, dy


@pytest.mark.parametrize("recipe_name", ["mxfp8", "nvfp4"])
def test_linear_step_in_a_cuda_graph_equals_the_eager_step(recipe_name, monkeypatch):
    recipe = LINEAR_RECIPES[recipe_name]()
    # One known seed for the gradient's stochastic rounding, on both sides: a tensor under capture
    # (which the graph reads as it replays), the same value as an int eagerly.
    import microscale.torch.linear_composed as composed
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    monkeypatch.setattr(composed, "_gradient_seed",
                        lambda device: seed if torch.cuda.is_current_stream_capturing() else int(seed.item()))
    layer, twin, x, dy = _layers(512, 384)
    graph, y = _captured(_graph_step(layer, x, dy, recipe))
    x_eager = x.detach().clone().requires_grad_()
    eager_step = _graph_step(twin, x_eager, dy, recipe)
    for value in (21, 22):
        seed.fill_(value)
        graph.replay()
        want = _step_outputs(twin, x_eager, eager_step())
        for name, a, b in zip(("y", "dx", "dW", "db"), _step_outputs(layer, x, y), want):
            assert torch.equal(a, b), (value, name)
        # The optimizer's step writes the weight in place between replays: the graph quantizes it anew.
        with torch.no_grad():
            layer.weight.mul_(0.5)
            twin.weight.mul_(0.5)


def test_nvfp4_step_in_a_cuda_graph_draws_a_new_seed_per_replay():
    layer, _, x, dy = _layers(512, 384)
    graph, y = _captured(_graph_step(layer, x, dy, NVFP4BlockScaling()))
    runs = []
    for cuda_seed in (3, None, 3):  # None: the generator goes on from where the last replay left it
        if cuda_seed is not None:
            torch.cuda.manual_seed(cuda_seed)
        graph.replay()
        runs.append(_step_outputs(layer, x, y))
    assert torch.equal(runs[0][0], runs[1][0])  # y: no stochastic rounding in the forward
    assert not torch.equal(runs[0][1], runs[1][1]) and not torch.equal(runs[0][2], runs[1][2])  # dx, dW
    for a, b in zip(runs[0], runs[2]):
        assert torch.equal(a, b)  # torch.cuda.manual_seed repeats a replay


def test_make_graphed_callables_takes_the_layer():
    layer, twin, x, dy = _layers(256, 128)
    recipe = LINEAR_RECIPES["mxfp8"]()
    with mst.autocast(recipe=recipe):  # the recipe in force at capture is the graph's
        graphed = torch.cuda.make_graphed_callables(layer, (x,))
    for _ in range(2):
        for module in (layer, twin):
            module.zero_grad(set_to_none=True)
        xa, xb = (x.detach().clone().requires_grad_() for _ in range(2))
        ya = graphed(xa)
        ya.backward(dy)
        with mst.autocast(recipe=recipe):
            yb = twin(xb)
        yb.backward(dy)
        for name, a, b in zip(("y", "dx", "dW", "db"), _step_outputs(layer, xa, ya), _step_outputs(twin, xb, yb)):
            assert torch.equal(a, b), name
        with torch.no_grad():
            layer.weight.add_(0.25)
            twin.weight.add_(0.25)


@pytest.mark.parametrize("recipe_name", ["nvfp4", "mxfp8"])
def test_linear_on_cuda_under_checkpointing_and_cpu_offload(recipe_name, monkeypatch):
    """The layer keeps its operands through ctx.save_for_backward: mst.checkpoint drops and
    recomputes them (under the call's recipe), save_on_cpu moves them to host memory; the step's
    outputs stay bit for bit."""
    recipe = LINEAR_RECIPES[recipe_name]()
    layer, _, x, dy = _layers(256, 128)

    def step(run, offload=False):
        layer.zero_grad(set_to_none=True)
        xg = x.detach().clone().requires_grad_()
        hooks = torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else contextlib.nullcontext()
        with hooks, mst.autocast(recipe=recipe):
            y = run(xg)
        torch.manual_seed(3)  # the gradient's stochastic rounding
        y.backward(dy)
        return _step_outputs(layer, xg, y)

    import microscale.torch.linear_composed as composed
    real_quantize_for, calls = composed.quantize_for, []
    monkeypatch.setattr(composed, "quantize_for", lambda *a, **k: calls.append(1) or real_quantize_for(*a, **k))
    want = step(layer)
    plain_calls, quantizations = len(calls), layer.weight_quantizations
    for offload in (False, True):
        calls.clear()
        got = step(layer, offload=True) if offload else step(lambda t: mst.checkpoint(layer, t))
        assert len(calls) == plain_calls + (0 if offload else 1)  # checkpointing quantized x again
        for name, a, b in zip(("y", "dx", "dW", "db"), got, want):
            assert torch.equal(a, b), name
    # Every forward quantized the weight (is_first_microbatch None), the checkpoint's recomputation
    # too: 2 for the checkpointed step, 1 for the offloaded one, the same bytes each time.
    assert layer.weight_quantizations == quantizations + 3


def test_layernorm_mlp_on_cuda_is_its_pieces():
    """TransformerEngine's LayerNormMLP (NVFP4, swiglu) on CUDA tensors: the norm, FC1, the
    activation and FC2 of the same parameters, forward bit for bit; backward reaches every parameter."""
    torch.manual_seed(5)
    module = mst.LayerNormMLP(256, 128, activation="swiglu", params_dtype=torch.bfloat16, device="cuda")
    fc1 = mst.Linear(256, 256, params_dtype=torch.bfloat16, device="cuda")
    fc2 = mst.Linear(128, 256, params_dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for linear, w, b in ((fc1, module.fc1_weight, module.fc1_bias), (fc2, module.fc2_weight, module.fc2_bias)):
            linear.weight.copy_(w)
            linear.bias.copy_(b)
    x = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
    with mst.autocast(recipe=NVFP4BlockScaling()):
        y = module(x.clone().requires_grad_())
        ln = torch.nn.functional.layer_norm(x.float(), (256,), eps=module.eps).to(torch.bfloat16)
        h = fc1(ln)
        want = fc2(activate(h, "swiglu"))  # TE's formula in fp32, one rounding (checked on the CPU)
    assert torch.equal(y, want)
    y.float().sum().backward()
    assert all(p.grad is not None for p in module.parameters())


@pytest.mark.parametrize("recipe_name", ["nvfp4", "mxfp8"])
def test_grouped_linear_on_cuda_is_one_linear_per_expert(recipe_name):
    """TransformerEngine's GroupedLinear on CUDA: each expert the CUDA Linear on its rows (one of
    them empty), bit for bit against the same composition of microscale.torch.Linear layers."""
    recipe = LINEAR_RECIPES[recipe_name]()
    torch.manual_seed(16)
    grouped = mst.GroupedLinear(3, 256, 128, params_dtype=torch.bfloat16, device="cuda")
    linears = []
    for weight, bias in zip(grouped.weights, grouped.biases):
        linear = mst.Linear(256, 128, params_dtype=torch.bfloat16, device="cuda")
        linear.load_state_dict({"weight": weight.detach(), "bias": bias.detach()})
        linears.append(linear)
    splits = [256, 0, 256]
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    results = []
    for forward, params in ((lambda t: grouped(t, splits), list(grouped.parameters())),
                            (lambda t: torch.cat([linears[0](t[:256]), linears[2](t[256:])]),
                             [p for i in (0, 2) for p in linears[i].parameters()])):
        xg = x.clone().requires_grad_()
        with mst.autocast(recipe=recipe):
            y = forward(xg)
        torch.manual_seed(17)
        y.backward(dy)
        results.append([y.detach(), xg.grad] + [p.grad for p in params if p.grad is not None])
    got, want = results
    assert len(got) == len(want) + 2  # the empty expert's zero gradients
    assert not grouped.weight1.grad.any() and not grouped.bias1.grad.any()
    got = got[:2] + [g for i, g in enumerate(got[2:]) if i not in (2, 3)]
    for n, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), n
