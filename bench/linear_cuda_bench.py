"""The quantized Linear on CUDA tensors beside torch's BF16 Linear, timed in the same run.

For each (M, K, N): x [M, K] bf16 (requires grad), parameters bf16 [N, K] and [N], dy [M, N] bf16.
A training step is y = layer(x); y.backward(dy). Timed eagerly, as a user runs it (the host's
per-call cost included), as the median over several runs of back-to-back steps:

  torch BF16       torch.nn.Linear: cuBLAS BF16 for the three GEMMs
  microscale NVFP4 microscale.torch.Linear under NVFP4BlockScaling(): three CUDA quantize calls
                   per step (x and dy, each rowwise and columnwise with the RHT, dy with stochastic
                   rounding; the weight in 16x16 tiles, on every step as TransformerEngine does
                   when is_first_microbatch is None) and three NVFP4 GEMMs through mst.gemm (the
                   expanded path at these shapes: exact bf16 copies and cuBLAS)
  microscale MXFP8 the same under MXFP8BlockScaling(): MXFP8 E4M3 operands (rowwise and the
                   untransposed columnwise outputs), the GEMMs on the same expanded path

Forward-only times (under torch.no_grad) are printed beside. Then each candidate's step captured
whole into a CUDA graph (torch.cuda.graph, after warm-up steps on a side stream) and replayed: the
step without the host's per-call cost, beside torch's BF16 step captured the same way (the
baseline a user of CUDA graphs has). Then each layer compiled whole by torch.compile
(fullgraph=True), with the default mode and with mode="reduce-overhead" (inductor's CUDA graphs),
beside torch's BF16 layer compiled the same way. Every mode quantizes the weight on every step.
Writes JSON.
Usage: python3 bench/linear_cuda_bench.py [OUT.json] (torch with CUDA, microscale built with it)
"""

import json
import statistics
import sys

import torch

import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling

SHAPES = [(4096, 4096, 4096), (8192, 4096, 14336)]  # (M, K, N): a square layer, a Llama-8B MLP up-projection


def per_step_ms(step, steps=10, runs=5):
    step()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def graphed(step):
    """step captured into a CUDA graph (two warm-up steps on a side stream first, as torch asks);
    returns the graph's replay. The step sets the gradients to None before its backward, so the
    captured backward allocates them in the graph's pool and each replay writes them anew."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def candidates(m, k, n):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    reference = torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
    quantized = mst.Linear(k, n, params_dtype=torch.bfloat16, device=dev)
    quantized.load_state_dict(reference.state_dict())

    def run(layer, recipe, train, compiled=None):
        """A step of `layer`; compiled: None (eager) or torch.compile's mode ("default",
        "reduce-overhead"), the layer compiled whole."""
        module = layer if compiled is None else torch.compile(layer, fullgraph=True, mode=compiled)

        def step():
            if compiled == "reduce-overhead":  # a new step: the CUDA graphs' outputs may be reused
                torch.compiler.cudagraph_mark_step_begin()
            if train:
                layer.zero_grad(set_to_none=True)
                x.grad = None
            with mst.autocast(enabled=recipe is not None, recipe=recipe), torch.set_grad_enabled(train):
                y = module(x)
                if train:
                    y.backward(dy)
        return step

    nvfp4, mxfp8 = NVFP4BlockScaling(), MXFP8BlockScaling()  # made once: compiled code guards on them
    return {
        "torch BF16": lambda train, compiled=None: run(reference, None, train, compiled),
        "microscale NVFP4": lambda train, compiled=None: run(quantized, nvfp4, train, compiled),
        "microscale MXFP8": lambda train, compiled=None: run(quantized, mxfp8, train, compiled),
    }


def bf16_row(rows, r):
    """The torch BF16 baseline's row of r's shape (every ratio is against it)."""
    shape = (r["m"], r["k"], r["n"])
    return next(b for b in rows if (b["m"], b["k"], b["n"]) == shape and b["candidate"] == "torch BF16")


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    rows = []
    for m, k, n in SHAPES:
        for name, make in candidates(m, k, n).items():
            steps = 10
            fwd = per_step_ms(make(False), steps)
            step = per_step_ms(make(True), steps)
            replay = graphed(make(True))
            graph_step = per_step_ms(replay, steps)
            del replay  # the graph and its memory pool
            compiled = {}
            for mode in ("default", "reduce-overhead"):
                torch._dynamo.reset()
                compiled[mode] = per_step_ms(make(True, mode), steps)
            torch._dynamo.reset()
            rows.append(dict(m=m, k=k, n=n, candidate=name, forward_ms=fwd, step_ms=step,
                             step_tflops=3 * 2 * m * k * n / step / 1e9, graph_step_ms=graph_step,
                             graph_step_tflops=3 * 2 * m * k * n / graph_step / 1e9,
                             compiled_step_ms=compiled["default"],
                             compiled_reduce_overhead_step_ms=compiled["reduce-overhead"]))
        torch.cuda.empty_cache()
    print(f"{'M x K x N':>20} {'candidate':>18} {'forward ms':>11} {'step ms':>9} {'TFLOP/s':>8} {'step vs BF16':>13}"
          f" {'graph step ms':>14} {'TFLOP/s':>8} {'vs BF16 graph':>14}")
    for r in rows:
        base = bf16_row(rows, r)
        print(f"{r['m']:>6} x {r['k']:>5} x {r['n']:>5} {r['candidate']:>18} {r['forward_ms']:>11.3f} "
              f"{r['step_ms']:>9.3f} {r['step_tflops']:>8.1f} {base['step_ms'] / r['step_ms']:>12.2f}x"
              f" {r['graph_step_ms']:>14.3f} {r['graph_step_tflops']:>8.1f}"
              f" {base['graph_step_ms'] / r['graph_step_ms']:>13.2f}x")
    print()
    print(f"{'M x K x N':>20} {'candidate':>18} {'compiled ms':>12} {'vs BF16 compiled':>17}"
          f" {'reduce-overhead ms':>19} {'vs BF16 same':>13}")
    for r in rows:
        base = bf16_row(rows, r)
        print(f"{r['m']:>6} x {r['k']:>5} x {r['n']:>5} {r['candidate']:>18} {r['compiled_step_ms']:>12.3f}"
              f" {base['compiled_step_ms'] / r['compiled_step_ms']:>16.2f}x"
              f" {r['compiled_reduce_overhead_step_ms']:>19.3f}"
              f" {base['compiled_reduce_overhead_step_ms'] / r['compiled_reduce_overhead_step_ms']:>12.2f}x")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
