"""What the Python frontend costs: microscale.torch.quantize (the torch.library op) and the bare
extension call beside a copy of the same tensor into a reused one (memcpy), in one run.

CPU, bf16 input, rowwise + columnwise, on 1 thread and on all threads (the library's num_threads
and torch.set_num_threads); effective GB/s = (bytes read + bytes written) / time as
bench_quantize_cpu counts them; medians of --repeats calls. Each quantize call allocates its
outputs, as a Python caller's does (bench_quantize_cpu reuses them: quantize_into). The big shape
shows the frontend's throughput against memory copy; the small one its fixed cost per call.

Run: PYTHONPATH=build/release/python build/venv/bin/python bench/python_frontend_bench.py
"""
import argparse
import os
import statistics
import time

import torch

import microscale as ms
import microscale.torch as mst


def median_seconds(fn, repeats):
    fn()  # warm: first-touch of outputs, thread pools
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def quantized_bytes(rows, cols, scheme):
    """Input + both directions' data and scales (+ NVFP4's two amaxes), as bench_quantize_cpu counts."""
    block = 16 if scheme == "nvfp4" else 32
    data = rows * cols // 2 if scheme == "nvfp4" else rows * cols
    return rows * cols * 2 + 2 * (data + rows * cols // block) + (8 if scheme == "nvfp4" else 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    all_threads = os.cpu_count() or 1
    print(f"torch {torch.__version__}, {all_threads} hardware threads; GB/s = (read + written) / median time")
    print(f"{'case':<34} {'shape':>11} {'threads':>7} {'us':>10} {'GB/s':>8} {'vs copy':>8}")
    for rows, cols in ((4096, 4096), (32, 4096)):
        x = torch.randn(rows, cols).to(torch.bfloat16)
        destination = torch.empty_like(x)
        for threads in sorted({1, all_threads}):
            torch.set_num_threads(threads)
            copy_s = median_seconds(lambda: destination.copy_(x), args.repeats)
            copy_gbs = 2 * x.numel() * 2 / copy_s / 1e9
            shape = f"{rows}x{cols}"
            print(f"{'copy_ into a reused tensor':<34} {shape:>11} {threads:>7} {copy_s * 1e6:>10.1f} "
                  f"{copy_gbs:>8.2f} {1.0:>7.2f}x")
            for scheme, extra in (("nvfp4", {}), ("nvfp4", {"rht": True}), ("mxfp8_e4m3", {})):
                name = scheme + (" +rht" if extra else "")
                total = quantized_bytes(rows, cols, scheme)
                options = ms.QuantizeOptions(scheme=scheme, columnwise=True, num_threads=threads, **extra)
                cases = [
                    (f"_C.quantize {name}", lambda: ms._C.quantize(x, options, False)),
                    (f"mst.quantize {name}", lambda: mst.quantize(x, scheme, columnwise=True, **extra)),
                ]
                for label, fn in cases:
                    s = median_seconds(fn, args.repeats)
                    gbs = total / s / 1e9
                    print(f"{label:<34} {shape:>11} {threads:>7} {s * 1e6:>10.1f} {gbs:>8.2f} {gbs / copy_gbs:>7.2f}x")


if __name__ == "__main__":
    main()
