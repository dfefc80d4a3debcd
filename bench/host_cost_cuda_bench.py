"""Host time per call of microscale.torch's CUDA calls beside torch.mm's, in one run.

The GPU time of these calls is measured by bench/gemm_cuda_bench.py (CUDA graphs, no host cost);
this program measures the other half: how long the Python call takes on the host before it
returns (argument checks, the torch.library dispatch, DLPack capsules, the launches). A training
step of small layers is bound by it (perf.md, the thirty-eighth session).

Each call is timed on its own (time.perf_counter around the call, no synchronization inside);
the stream is drained every few calls, outside the timed region, so that a full launch queue
never blocks a timed call. Medians of --calls calls, microseconds.

  torch.mm             the baseline: torch's own op on the bf16 tensors (one cuBLAS launch)
  quantize, eager      microscale.torch.quantize as a user calls it (the op's body, no dispatch)
  quantize, the op     the torch.library op microscale::quantize (what torch.compile records), eagerly
  gemm, eager / op     the same pair for microscale.torch.gemm of two quantized operands

Usage: python3 bench/host_cost_cuda_bench.py [--size 4096] [--calls 200]
"""

import argparse
import statistics
import time

import torch

import microscale.torch as mst
from microscale.torch.gemm import _gemm_op, _op_operand
from microscale.torch.ops import _quantize_op


def host_us(fn, calls, drain_every=8):
    """Median host microseconds of one call of fn."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if i % drain_every == drain_every - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=4096, help="M = N = K")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    s = args.size
    x = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    rows = [("torch.mm (bf16)", lambda: torch.mm(x, w.t()))]
    for scheme, kw in (("nvfp4", dict(columnwise=True, rht=True)), ("mxfp8_e4m3", dict(columnwise=True))):
        op_args = (scheme, True, kw["columnwise"], "rceil", "1x16", kw.get("rht", False), None, 0, None, None, False)
        qx, qw = mst.quantize(x, scheme), mst.quantize(w, scheme)
        gemm_args = (*_op_operand(qx), *_op_operand(qw), "rowwise", "rowwise", 1.0, 0.0, None, None, torch.bfloat16)
        rows += [
            (f"{scheme} quantize, eager", lambda scheme=scheme, kw=kw: mst.quantize(x, scheme, **kw)),
            (f"{scheme} quantize, the op", lambda op_args=op_args: _quantize_op(x, *op_args)),
            (f"{scheme} gemm, eager", lambda qx=qx, qw=qw: mst.gemm(qx, qw, out_dtype=torch.bfloat16)),
            (f"{scheme} gemm, the op", lambda gemm_args=gemm_args: _gemm_op(*gemm_args)),
        ]
    print(f"# host time per call, {s} x {s} operands, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    base = None
    print(f"{'call':<28} {'host us':>9} {'vs torch.mm':>12}")
    for name, fn in rows:
        us = host_us(fn, args.calls)
        base = base or us
        print(f"{name:<28} {us:9.1f} {us / base:11.2f}x")


if __name__ == "__main__":
    main()
