"""The CUDA block-scaled GEMM (NVFP4 and MXFP8) beside the baselines a Hopper user has, timed in
the same run.

For each (M, N, K): A [M, K] and B [N, K] are random bf16 tensors quantized to NVFP4 by
microscale (rowwise, with their global amaxes), and to MXFP8 E4M3. Timed, each as a median of per-call times over
several replays of a CUDA graph of back-to-back calls (GPU time, without the host's per-call
cost):

  microscale   microscale.torch.gemm's call (_C.gemm_cuda): NVFP4 x NVFP4, bf16 out, along the path
               cuda::gemm picks for the shape (workspace allocated once, as PyTorch's caching
               allocator hands it back); beside it each path forced: fused (the wgmma kernel),
               skinny (the mma.sync kernel for few rows of A; M <= 128 only) and expanded (exact
               bf16 copies, cuBLAS, the epilogue)
  cuBLAS BF16  torch.mm of the bf16 tensors
  cuBLAS FP8   torch._scaled_mm of E4M3 copies with per-tensor scales (the fastest Hopper path;
               it needs M to be a multiple of 16: "-" below that)
  deq+BF16     dequantize both NVFP4 operands to bf16 (microscale's CUDA dequantize), then torch.mm:
               the emulation torchao runs on Hopper, here with microscale's (untuned) CUDA dequantize
  MXFP8        microscale's call for the MXFP8 E4M3 operands along the path cuda::gemm picks (the
               skinny kernel for few rows of A, else the expanded path: MX has no fused kernel);
               beside it each path forced (MX skinny: M <= 128 only; MX expanded)
  MX deq+BF16  the same emulation for the MXFP8 operands
  + bias       a Linear's fprop: microscale's NVFP4 call with a bf16 bias (cuBLAS writes the fp32
               product, microscale's epilogue kernel adds the bias and rounds once) beside
               torch.addmm of the bf16 tensors (cuBLAS's own bias epilogue)

Prints a table (microseconds, TFLOP/s, ratios to microscale) and writes JSON.
Usage: python3 bench/gemm_cuda_bench.py [OUT.json] [--shapes MxNxK,...] (needs torch with CUDA and
microscale built with it; --shapes times only those shapes)
"""

import json
import statistics
import sys

import torch

import microscale.torch as mst
from microscale import _C

SHAPES = [
    (1, 7168, 16384),  # decode: a few tokens against a weight (the skinny kernel)
    (16, 7168, 16384),
    (32, 7168, 16384),
    (1, 4096, 7168),
    (16, 4096, 7168),
    (128, 7168, 16384),  # GPU MODE NVFP4 GEMM shapes (decode-like: M = 128)
    (128, 4096, 7168),
    (128, 7168, 2048),
    (512, 4096, 4096),  # between: where the expanded path starts to pay (gemm_split.hpp)
    (1024, 4096, 4096),
    (2048, 2048, 2048),
    (4096, 4096, 4096),  # training-size GEMMs
    (8192, 8192, 8192),
    (8192, 14336, 4096),
]


def per_call_us(fn, calls, runs=7):
    """Median per-call time of `calls` back-to-back calls, replayed from a CUDA graph so that the
    host's cost per call (Python, argument conversion: tens of microseconds) does not hide the
    GPU's time at small shapes; every candidate is timed the same way."""
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream before capture, as PyTorch asks
        fn()
    torch.cuda.current_stream().wait_stream(side)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        run = graph.replay
    except RuntimeError as e:  # not capturable: time eager calls (host cost included)
        print(f"(no CUDA graph for {fn.__name__}: {e}; timed eagerly)")
        torch.cuda.synchronize()

        def run():
            for _ in range(calls):
                fn()
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def main():
    args = sys.argv[1:]
    shapes = SHAPES
    if "--shapes" in args:
        at = args.index("--shapes")
        shapes = [tuple(int(x) for x in s.split("x")) for s in args[at + 1].split(",")]
        del args[at:at + 2]
    out_path = args[0] if args else None
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        qa = mst.quantize(a, "nvfp4")
        qb = mst.quantize(b, "nvfp4")
        xa = mst.quantize(a, "mxfp8_e4m3")
        xb = mst.quantize(b, "mxfp8_e4m3")
        d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        def along(path):
            """microscale's call along one path (auto: the one cuda::gemm picks for the shape)."""
            workspace_bytes = _C.gemm_workspace_bytes(m, n, k, 1, path)
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=dev) if workspace_bytes else None

            def call():
                _C.gemm_cuda(qa.rowwise_data, qa.rowwise_scale, qa.amax[0:1], False, qb.rowwise_data,
                             qb.rowwise_scale, qb.amax[0:1], False, 1.0, 0.0, None, None, d,
                             torch.cuda.current_stream().cuda_stream, workspace, path)
            return call

        ours = along("auto")
        bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
        bias_workspace_bytes = _C.gemm_workspace_bytes(m, n, k, 1, "auto")
        bias_workspace = torch.empty(bias_workspace_bytes, dtype=torch.uint8, device=dev) if bias_workspace_bytes else None

        def ours_bias():
            _C.gemm_cuda(qa.rowwise_data, qa.rowwise_scale, qa.amax[0:1], False, qb.rowwise_data, qb.rowwise_scale,
                         qb.amax[0:1], False, 1.0, 0.0, None, bias, d, torch.cuda.current_stream().cuda_stream,
                         bias_workspace, "auto")

        def bf16_bias():
            torch.addmm(bias, a, b.t(), out=d)
        def mx_along(path):
            """microscale's MXFP8 call along one path (auto: the one cuda::gemm picks)."""
            workspace_bytes = _C.gemm_workspace_bytes(m, n, k, 1, path, "mxfp8_e4m3")
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=dev) if workspace_bytes else None

            def mxfp8():
                _C.gemm_cuda(xa.rowwise_data, xa.rowwise_scale, None, False, xb.rowwise_data, xb.rowwise_scale,
                             None, False, 1.0, 0.0, None, None, d, torch.cuda.current_stream().cuda_stream,
                             workspace, path, "mxfp8_e4m3", False, "mxfp8_e4m3", False)
            return mxfp8

        mxfp8 = mx_along("auto")

        def mx_dequant_bf16():
            da = mst.dequantize(xa, "rowwise", torch.bfloat16)
            db = mst.dequantize(xb, "rowwise", torch.bfloat16)
            torch.mm(da, db.t(), out=d)

        def bf16():
            torch.mm(a, b.t(), out=d)

        fa = a.to(torch.float8_e4m3fn)
        fb = b.mul(32.0).to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        inv = torch.full((), 1 / 32.0, device=dev)

        def fp8():
            return torch._scaled_mm(fa, fb.t(), scale_a=one, scale_b=inv, out_dtype=torch.bfloat16)

        def timed_if_supported(fn):
            """per_call_us, or NaN where the call refuses the shape (torch._scaled_mm below M = 16)."""
            try:
                fn()
            except RuntimeError as e:
                print(f"({fn.__name__} at {m} x {n} x {k}: {str(e).splitlines()[0]})")
                return float("nan")
            return per_call_us(fn, calls)

        def dequant_bf16():
            da = mst.dequantize(qa, "rowwise", torch.bfloat16)
            db = mst.dequantize(qb, "rowwise", torch.bfloat16)
            torch.mm(da, db.t(), out=d)

        # Sanity: microscale against the dequantized operands' float32 product.
        ours()
        want = mst.dequantize(qa, "rowwise", torch.float32) @ mst.dequantize(qb, "rowwise", torch.float32).t()
        rel = ((d.float() - want).norm() / want.norm()).item()
        mxfp8()
        want = mst.dequantize(xa, "rowwise", torch.float32) @ mst.dequantize(xb, "rowwise", torch.float32).t()
        rel = max(rel, ((d.float() - want).norm() / want.norm()).item())

        flops = 2.0 * m * n * k
        calls = max(3, min(200, int(2e12 / flops)))
        t = {"microscale": per_call_us(ours, calls), "fused": per_call_us(along("fused"), calls),
             "skinny": per_call_us(along("skinny"), calls) if m <= 128 else float("nan"),
             "expanded": per_call_us(along("expanded"), calls), "cuBLAS BF16": per_call_us(bf16, calls),
             "cuBLAS FP8": timed_if_supported(fp8), "deq+BF16": per_call_us(dequant_bf16, calls),
             "MXFP8": per_call_us(mxfp8, calls), "MX deq+BF16": per_call_us(mx_dequant_bf16, calls),
             "MX skinny": per_call_us(mx_along("skinny"), calls) if m <= 128 else float("nan"),
             "MX expanded": per_call_us(mx_along("expanded"), calls),
             "microscale + bias": per_call_us(ours_bias, calls), "BF16 + bias": per_call_us(bf16_bias, calls)}
        rows.append({"m": m, "n": n, "k": k, "us": t, "tflops": {key: flops / v / 1e6 for key, v in t.items()},
                     "rel_err_vs_fp32_of_dequantized": rel})
        del a, b, qa, qb, xa, xb, d, fa, fb, bias, bias_workspace
        torch.cuda.empty_cache()

    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    keys = ("microscale", "fused", "skinny", "expanded", "cuBLAS BF16", "cuBLAS FP8", "deq+BF16", "MXFP8", "MX deq+BF16")
    head = f"{'M x N x K':>20} | " + " | ".join(f"{key:>17}" for key in keys) + " | rel err"
    print(head)
    print("-" * len(head))
    for r in rows:
        ours_us = r["us"]["microscale"]
        cells = []
        for key in keys:
            us, tf = r["us"][key], r["tflops"][key]
            if us != us:  # NaN: not run or not supported at this shape
                cells.append("-")
            else:
                cells.append(f"{us:8.1f} us {tf:5.0f} TF" if key == "microscale" else f"{us:8.1f} ({us / ours_us:4.2f}x)")
        print(f"{r['m']:>6} x {r['n']:>5} x {r['k']:>5} | " + " | ".join(f"{c:>17}" for c in cells) +
              f" | {r['rel_err_vs_fp32_of_dequantized']:.1e}")
    print("(microscale: NVFP4 along the path cuda::gemm picks; fused, skinny, expanded: each path forced; other columns: "
          "time and time / microscale's NVFP4 time, above 1 = microscale's NVFP4 faster; rel err: the larger of "
          "NVFP4's and MXFP8's against the float32 product of the dequantized operands)")
    print("MXFP8 beside its baselines (ratio = baseline time / microscale's MXFP8 time, above 1 = microscale faster):")
    for r in rows:
        us = r["us"]
        print(f"{r['m']:>6} x {r['n']:>5} x {r['k']:>5} | MXFP8 {us['MXFP8']:8.1f} us {r['tflops']['MXFP8']:5.0f} TF | "
              f"skinny {us['MX skinny']:8.1f} us | expanded {us['MX expanded']:8.1f} us | "
              f"cuBLAS BF16 {us['cuBLAS BF16'] / us['MXFP8']:4.2f}x | cuBLAS FP8 {us['cuBLAS FP8'] / us['MXFP8']:4.2f}x | "
              f"MX deq+BF16 {us['MX deq+BF16'] / us['MXFP8']:4.2f}x")
    print("With a bias (a Linear's fprop; ratio = torch.addmm's time / microscale's, above 1 = microscale faster):")
    for r in rows:
        us = r["us"]
        print(f"{r['m']:>6} x {r['n']:>5} x {r['k']:>5} | NVFP4 + bias {us['microscale + bias']:8.1f} us "
              f"(the bias costs {us['microscale + bias'] - us['microscale']:6.1f} us) | BF16 + bias "
              f"{us['BF16 + bias']:8.1f} us, {us['BF16 + bias'] / us['microscale + bias']:4.2f}x")
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
