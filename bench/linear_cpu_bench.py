"""The quantized Linear on CPU tensors beside torch's own nn.Linear on the CPU, timed in the same run.

For each (M, K, N): x [M, K] (requires grad), parameters [N, K] and [N], dy [M, N]. A training
step is y = layer(x); y.backward(dy), timed as a user runs it (the host's per-call work included),
as the median over runs of back-to-back steps, with torch.set_num_threads(T) for T = 1 and all
cores (the library's quantizations and GEMMs share torch's OpenMP runtime and follow that count):

  torch FP32        torch.nn.Linear, fp32 x and parameters (oneDNN / MKL-style fp32 GEMMs)
  torch BF16        torch.nn.Linear, bf16 x and parameters (torch's bf16 GEMMs on this CPU)
  microscale NVFP4  microscale.torch.Linear under NVFP4BlockScaling(), bf16 x and parameters:
                    x, W and dy quantized (row + columnwise, RHT and stochastic rounding as the
                    recipe says; the weight on every step), three GEMMs of exactly dequantized
                    blocks (oneDNN's bf16 matmul where the CPU multiplies bf16, else OpenBLAS's
                    sgemm; fp32 accumulation)
  microscale MXFP8  the same under MXFP8BlockScaling()

Prints a table: step ms, GFLOP/s (3 GEMMs of 2MNK), and the ratio to each torch baseline.
Usage: PYTHONPATH=build/release/python build/venv/bin/python bench/linear_cpu_bench.py
"""

import argparse
import os
import statistics
import time

import torch

import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling

SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (2048, 1024, 4096)]


def per_step_ms(step, steps, runs):
    step()  # warm: first-touch of buffers, thread pools
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(times)


def training_step(layer, x, dy, recipe):
    def step():
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        if recipe is None:
            y = layer(x)
        else:
            with mst.autocast(recipe=recipe):
                y = layer(x)
        y.backward(dy)

    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cores = os.cpu_count()
    print(f"torch {torch.__version__}, {cores} hardware threads")
    print("| M x K x N | threads | candidate | step ms | GFLOP/s | vs torch FP32 | vs torch BF16 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m, k, n in SHAPES:
        flops = 3 * 2 * m * k * n
        g = torch.Generator().manual_seed(0)
        x32 = torch.randn(m, k, generator=g)
        dy32 = torch.randn(m, n, generator=g)
        for threads in sorted({1, cores}):
            torch.set_num_threads(threads)
            results = {}
            for name, dtype, make, recipe in (
                    ("torch FP32", torch.float32, torch.nn.Linear, None),
                    ("torch BF16", torch.bfloat16, torch.nn.Linear, None),
                    ("microscale NVFP4", torch.bfloat16, mst.Linear, NVFP4BlockScaling()),
                    ("microscale MXFP8", torch.bfloat16, mst.Linear, MXFP8BlockScaling())):
                torch.manual_seed(0)
                layer = make(k, n).to(dtype)
                x = x32.to(dtype).requires_grad_()
                results[name] = per_step_ms(training_step(layer, x, dy32.to(dtype), recipe), args.steps, args.runs)
            for name, ms in results.items():
                print(f"| {m} x {k} x {n} | {threads} | {name} | {ms:.1f} | {flops / ms / 1e6:.1f} | "
                      f"{results['torch FP32'] / ms:.2f}x | {results['torch BF16'] / ms:.2f}x |")


if __name__ == "__main__":
    main()
