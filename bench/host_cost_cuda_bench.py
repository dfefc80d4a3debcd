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
  quantize, custom_op  the same body registered with torch.library.custom_op instead of Library
                       (how the ops were registered before the forty-second session: its autograd
                       kernel and backend wrapper run in Python on every call)
  gemm, eager / op     the same pair for microscale.torch.gemm of two quantized operands
  ... the parts        what an eager call is made of: the C++ call alone (_C.quantize_cuda /
                       _C.gemm_cuda into buffers allocated once, the DLPack capsules made in the
                       call as the frontend makes them), the options object, the output shapes,
                       the allocations
  Linear ...           a microscale.torch.Linear of [size, size] (bias, bf16): a forward under
                       torch.no_grad, and a training step (forward and backward), beside
                       torch.nn.Linear's; the step's host time is what bounds an eager step when
                       it exceeds the GPU's (bench/linear_cuda_bench.py); "compiled": the layer
                       compiled whole by torch.compile (fullgraph=True, the default mode)

Usage: python3 bench/host_cost_cuda_bench.py [--size 4096] [--calls 200]
"""

import argparse
import statistics
import time
from typing import List, Optional

import torch

import microscale.torch as mst
from microscale import _C
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling
from microscale.torch.gemm import _gemm_op, _op_operand
from microscale.torch.ops import _PARTS, _capsule, _options, _quantize_body, _quantize_op, _stream


@torch.library.custom_op("microscale_bench::quantize", mutates_args=())
def _quantize_custom_op(x: torch.Tensor, scheme: str, rowwise: bool, columnwise: bool, scale_mode: str, tile: str,
                        rht: bool, sr_seed: Optional[int], sr_offset: int, amax_rowwise: Optional[float],
                        amax_columnwise: Optional[float], swizzle: bool,
                        sr_seed_tensor: Optional[torch.Tensor]) -> List[torch.Tensor]:
    return _quantize_body(x, scheme, rowwise, columnwise, scale_mode, tile, rht, sr_seed, sr_offset, amax_rowwise,
                          amax_columnwise, swizzle, sr_seed_tensor)


def host_us(fn, calls, drain_every=2):
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


def quantize_parts_rows(x, scheme, kw):
    """The pieces of an eager quantize call, each timed alone."""
    options = _options(scheme, True, kw["columnwise"], "rceil", "1x16", kw.get("rht", False), None, 0, None, None,
                       False, num_threads=torch.get_num_threads())
    shapes = _C.quantized_shapes(list(x.shape), options)
    outs = [torch.empty(shapes[n], dtype=torch.uint8, device=x.device) for n in _PARTS]
    amax = torch.empty(2, dtype=torch.float32, device=x.device)
    nvfp4 = scheme == "nvfp4"
    stream = _stream(x.device)

    def call():
        _C.quantize_cuda(_capsule(x), options, *[_capsule(o) for o in outs], _capsule(amax) if nvfp4 else None,
                         stream)

    return [
        (f"{scheme} quantize: C++ call", call),
        (f"{scheme} quantize: options", lambda: _options(scheme, True, kw["columnwise"], "rceil", "1x16",
                                                         kw.get("rht", False), None, 0, None, None, False,
                                                         num_threads=torch.get_num_threads())),
        (f"{scheme} quantize: shapes", lambda: _C.quantized_shapes(list(x.shape), options)),
        (f"{scheme} quantize: 5 allocs", lambda: [torch.empty(shapes[n], dtype=torch.uint8, device=x.device)
                                                  for n in _PARTS] + [torch.empty(2, device=x.device)]),
    ]


def gemm_parts_rows(qx, qw, scheme, bias):
    """The pieces of an eager gemm call (with a bias: the Linear's fprop), each timed alone."""
    m, n, k = qx.shape[0], qw.shape[0], qx.shape[1]
    ws_bytes = _C.gemm_workspace_bytes(m, n, k, 1, "auto", scheme)
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    stream = _stream(d.device)

    def call():
        _C.gemm_cuda(_capsule(qx.rowwise_data), _capsule(qx.rowwise_scale),
                     _capsule(None if qx.amax is None else qx.amax[0:1]), False, _capsule(qw.rowwise_data),
                     _capsule(qw.rowwise_scale), _capsule(None if qw.amax is None else qw.amax[0:1]), False, 1.0,
                     0.0, None, _capsule(bias), _capsule(d), stream, _capsule(workspace), "auto", scheme, False,
                     scheme, False)

    return [
        (f"{scheme} gemm+bias: C++ call", call),
        (f"{scheme} gemm: workspace", lambda: torch.empty(_C.gemm_workspace_bytes(m, n, k, 1, "auto", scheme),
                                                          dtype=torch.uint8, device="cuda")),
    ]


def linear_rows(s):
    """A Linear's forward (no grad) and training step, microscale's and torch's, bf16."""
    x = torch.randn(s, s, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    reference = torch.nn.Linear(s, s, device="cuda", dtype=torch.bfloat16)
    layer = mst.Linear(s, s, params_dtype=torch.bfloat16, device="cuda")

    def forward(module, recipe):
        def run():
            with mst.autocast(enabled=recipe is not None, recipe=recipe), torch.no_grad():
                module(x)
        return run

    def step(module, recipe):
        def run():
            module.zero_grad(set_to_none=True)
            x.grad = None
            with mst.autocast(enabled=recipe is not None, recipe=recipe):
                y = module(x)
            y.backward(dy)
        return run

    compiled_reference = torch.compile(reference, fullgraph=True)
    compiled_layer = torch.compile(layer, fullgraph=True)
    rows = [("Linear forward: torch BF16", forward(reference, None)),
            ("Linear step: torch BF16", step(reference, None)),
            ("Linear step, compiled: BF16", step(compiled_reference, None))]
    for name, recipe in (("NVFP4", NVFP4BlockScaling()), ("MXFP8", MXFP8BlockScaling())):
        rows += [(f"Linear forward: {name}", forward(layer, recipe)), (f"Linear step: {name}", step(layer, recipe)),
                 (f"Linear step, compiled: {name}", step(compiled_layer, recipe))]
    return rows


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
        op_args = (scheme, True, kw["columnwise"], "rceil", "1x16", kw.get("rht", False), None, 0, None, None, False,
                   None)
        qx, qw = mst.quantize(x, scheme), mst.quantize(w, scheme)
        gemm_args = (*_op_operand(qx), *_op_operand(qw), "rowwise", "rowwise", 1.0, 0.0, None, None, torch.bfloat16)
        rows += [
            (f"{scheme} quantize, eager", lambda scheme=scheme, kw=kw: mst.quantize(x, scheme, **kw)),
            (f"{scheme} quantize, the op", lambda op_args=op_args: _quantize_op(x, *op_args)),
            (f"{scheme} quantize, custom_op", lambda op_args=op_args: _quantize_custom_op(x, *op_args)),
            (f"{scheme} gemm, eager", lambda qx=qx, qw=qw: mst.gemm(qx, qw, out_dtype=torch.bfloat16)),
            (f"{scheme} gemm, the op", lambda gemm_args=gemm_args: _gemm_op(*gemm_args)),
        ]
        rows += quantize_parts_rows(x, scheme, kw)
        rows += gemm_parts_rows(qx, qw, scheme, torch.randn(s, device="cuda", dtype=torch.bfloat16))
    rows += linear_rows(s)
    print(f"# host time per call, {s} x {s} operands, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    base = None
    print(f"{'call':<28} {'host us':>9} {'vs torch.mm':>12}")
    for name, fn in rows:
        us = host_us(fn, args.calls)
        base = base or us
        print(f"{name:<28} {us:9.1f} {us / base:11.2f}x")


if __name__ == "__main__":
    main()
