"""The baseline a CPU user has today, beside microscale's fast path and memcpy, in one run.

TransformerEngine does not run on a CPU; torchao's quantizers do, as PyTorch code. This program
times them on a 4096x4096 bf16 standard-normal input, rowwise + columnwise as a training step needs
them (the columnwise operand is torchao's quantization of the transposed tensor):
  - MXFP8 E4M3 with RCEIL scales: torchao's `to_mx`, on x and on x.t();
  - NVFP4 1x16 with a per-tensor scale: torchao's `nvfp4_quantize`, on x and on x.t().
Each eager and torch.compile'd, on 1 thread and on all threads (torch.set_num_threads). In the same
invocation it runs bench/quantize_cpu_bench (microscale's fast path and memcpy on the same thread
counts) and prints every figure as effective GB/s = (bytes read + bytes written) / time, counted as
bench_quantize_cpu counts them, with medians.

It also checks that microscale's MXFP8 bytes equal torchao's on this input (`microscale
quantize-tensors`, data and scales of both directions) and exits 1 when they do not. torchao's
NVFP4 formulas are not TransformerEngine's (its block scale is amax / 6 divided by the per-tensor
scale; TE multiplies by S_enc), so its NVFP4 bytes are a speed baseline only.

Run: bash scripts/bench_torchao_cpu.sh  (sets up torch and torchao in build/bench-venv)
"""
import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

# torchao registers its enums with torch.compile's pytree on import; torch 2.15 logs a deprecation
# warning for each, which says nothing about this measurement.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

from safetensors.torch import load_file, save_file  # noqa: E402
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.mx_tensor import to_mx  # noqa: E402
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale  # noqa: E402

ROWS = COLS = 4096


def mxfp8_row_col(x):
    rowwise = to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    columnwise = to_mx(x.t().contiguous(), torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    return rowwise, columnwise


def nvfp4_row_col(x):
    per_tensor_scale = per_tensor_amax_to_scale(x.abs().amax().float())
    rowwise = nvfp4_quantize(x, 16, per_tensor_scale)
    columnwise = nvfp4_quantize(x.t().contiguous(), 16, per_tensor_scale)
    return rowwise, columnwise


# name: (torchao function, bytes written for both directions: data + scales)
CASES = {
    "mxfp8_row_col": (mxfp8_row_col, 2 * (ROWS * COLS + ROWS * COLS // 32)),
    "nvfp4_row_col": (nvfp4_row_col, 2 * (ROWS * COLS // 2 + ROWS * COLS // 16)),
}


def median_seconds(fn, x, repeats):
    fn(x)  # warm-up (and, for a compiled function, its compilation)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torchao_rates(x, thread_counts, repeats, compile_too):
    """{(case, threads, 'eager' | 'compiled'): GB/s}"""
    rates = {}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for name, (fn, written) in CASES.items():
            moved = x.numel() * x.element_size() + written
            rates[(name, threads, "eager")] = moved / median_seconds(fn, x, repeats) / 1e9
            if compile_too:
                # NOTE: compiled per thread count: inductor's CPU kernels take the thread count
                # in force when they are generated.
                torch._dynamo.reset()
                try:
                    rates[(name, threads, "compiled")] = moved / median_seconds(torch.compile(fn), x, repeats) / 1e9
                except Exception as error:  # e.g. torch 2.11's inductor has no CPU type for float8_e8m0fnu
                    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
                    print(f"  torch.compile failed for {name} ({reason}); its figure is left out")
            print(f"  torchao {name:14s} {threads:2d} threads done", flush=True)
    return rates


def microscale_rates(bench, thread_counts):
    """{('memcpy' | case, threads): GB/s}, medians of bench_quantize_cpu's repetitions."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cases = "|".join(CASES)
        env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
        run = subprocess.run([bench, f"--benchmark_filter=^(memcpy|fast/({cases}))/", f"--benchmark_out={out}",
                              "--benchmark_out_format=json"], capture_output=True, text=True, env=env)
        if run.returncode != 0:
            sys.exit(f"{bench} failed ({run.returncode}):\n{run.stderr}")
        with open(out) as f:
            report = json.load(f)
    rates = {}
    for entry in report["benchmarks"]:
        if entry.get("aggregate_name") != "median":
            continue
        parts = entry["run_name"].split("/")  # memcpy/T/real_time or fast/CASE/T/real_time
        name, threads = (parts[0], parts[1]) if parts[0] == "memcpy" else (parts[1], parts[2])
        if int(threads) in thread_counts:
            rates[(name, int(threads))] = entry["bytes_per_second"] / 1e9
    return rates


def check_mxfp8_bytes(x, cli):
    """microscale's MXFP8 (RCEIL) rowwise and columnwise bytes against torchao's on x."""
    (row_scale, row_data), (col_scale, col_data) = mxfp8_row_col(x)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "x.safetensors"), os.path.join(tmp, "q.safetensors")
        save_file({"x": x}, src)
        run = subprocess.run([cli, "quantize-tensors", src, "-o", dst, "--scheme", "mxfp8_e4m3", "--scale-mode",
                              "rceil"], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{cli} quantize-tensors failed ({run.returncode}):\n{run.stderr}")
        ours = load_file(dst)
    # microscale's columnwise MX layout is TransformerEngine's: [M, K] data, [M / 32, K] scales;
    # torchao quantizes the transpose, so its columnwise outputs are the transposes of those.
    pairs = [("rowwise data", ours["x.rowwise_data"], row_data.view(torch.uint8)),
             ("rowwise scales", ours["x.rowwise_scale"], row_scale.view(torch.uint8).reshape(ROWS, -1)),
             ("columnwise data", ours["x.columnwise_data"].t(), col_data.view(torch.uint8)),
             ("columnwise scales", ours["x.columnwise_scale"].t(), col_scale.view(torch.uint8).reshape(COLS, -1))]
    equal = True
    for what, a, b in pairs:
        same = a.shape == b.shape and torch.equal(a, b)
        equal = equal and same
        if same:
            detail = ""
        elif a.shape == b.shape:
            detail = f" ({int((a != b).sum())} bytes differ)"
        else:
            detail = f" (shapes {tuple(a.shape)} / {tuple(b.shape)})"
        print(f"  MXFP8 {what:18s} equal to torchao's: {'yes' if same else 'NO'}{detail}")
    return equal


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", default="build/release/bench/bench_quantize_cpu")
    parser.add_argument("--cli", default="build/release/microscale")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd baseline")
    args = parser.parse_args()

    all_threads = os.cpu_count() or 1
    thread_counts = sorted({1, all_threads})
    torch.manual_seed(0)
    x = torch.randn(ROWS, COLS, dtype=torch.bfloat16)

    print(f"torch {torch.__version__}, {all_threads} hardware threads")
    print("bytes (same input):")
    bytes_equal = check_mxfp8_bytes(x, args.cli)
    print("timing torchao (eager" + ("" if args.no_compile else " and torch.compile") + ") ...", flush=True)
    baseline = torchao_rates(x, thread_counts, args.repeats, not args.no_compile)
    print("timing microscale and memcpy (bench_quantize_cpu) ...", flush=True)
    ours = microscale_rates(args.bench, thread_counts)

    print(f"\n{ROWS}x{COLS} bf16, rowwise + columnwise, effective GB/s = (bytes read + written) / time, medians")
    print(f"{'case':15s} {'threads':>7s} {'memcpy':>8s} {'microscale':>10s} {'torchao':>8s} {'compiled':>9s}"
          f" {'vs torchao (best)':>18s}")
    for name in CASES:
        for threads in thread_counts:
            fast = ours.get((name, threads), 0.0)
            eager = baseline[(name, threads, "eager")]
            compiled = baseline.get((name, threads, "compiled"))
            best = max(eager, compiled or 0.0)
            compiled_text = f"{compiled:9.3f}" if compiled is not None else f"{'-':>9s}"
            print(f"{name:15s} {threads:7d} {ours.get(('memcpy', threads), 0.0):8.2f} {fast:10.2f} {eager:8.3f}"
                  f" {compiled_text} {fast / best:17.0f}x")
    if len(thread_counts) > 1 and ours.get(("memcpy", all_threads), 0.0) < ours.get(("memcpy", 1), 0.0):
        print(f"note: memcpy ran slower on {all_threads} threads than on 1 (the machine's other CPUs were busy):"
              " the all-threads figures of this run are not usable")
    if not bytes_equal:
        print("MXFP8 bytes differ from torchao's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
