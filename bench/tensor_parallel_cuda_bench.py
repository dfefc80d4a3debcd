"""The quantized layers split over two GPUs (tensor and sequence parallelism, NCCL) beside the
same layers in BF16 with the same split and the same collectives, timed in the same run.

The block is Megatron-LM's MLP without its activation: a column-parallel Linear [hidden ->
ffn] then a row-parallel Linear [ffn -> hidden], sequence-parallel (each rank holds M / 2 rows of
x: the first layer all-gathers them, the second reduce-scatters its output), bf16 x and
parameters. A training step is y = block(x); y.backward(dy), timed eagerly on each rank as a user
runs it (host cost included), as the median over runs of back-to-back steps; rank 0's figure is
printed (the ranks wait on each other in every collective).

  torch BF16        microscale.torch.Linear outside an autocast scope: torch.nn.functional.linear
                    (cuBLAS BF16), with microscale's collectives (the same as the rows below); the
                    column-parallel layer keeps half of its gathered input for backward, as TE's
                    BF16 layers keep their rank's rows (gathered again in backward)
  microscale NVFP4  the same layers under NVFP4BlockScaling() (the weight quantized every step)
  microscale MXFP8  under MXFP8BlockScaling()

Also the collectives alone (the all-gather of x's rows and the reduce-scatter of the output, each
forward and backward), so that the share of the step they take can be read, and the memory a
forward leaves allocated for its backward (with its output).
Usage: python3 bench/tensor_parallel_cuda_bench.py (two GPUs, torch with NCCL, microscale built
with its CUDA backend)
"""

import os
import statistics
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling

WORLD = 2
SHAPES = [(8192, 4096, 14336), (16384, 4096, 14336)]  # (M tokens, hidden, ffn): Llama-3-8B's MLP widths


def per_step_ms(step, steps=10, runs=5):
    step()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def block_step(fc1, fc2, x, dy, recipe):
    def step():
        for p in (*fc1.parameters(), *fc2.parameters()):
            p.grad = None
        x.grad = None
        with mst.autocast(recipe=recipe) if recipe is not None else mst.autocast(enabled=False):
            y = fc2(fc1(x))
        y.backward(dy)

    return step


def kept_for_backward_mib(fc1, fc2, x, recipe):
    """The memory a forward leaves allocated for its backward (and its output y), in MiB: what
    autograd keeps of both layers between forward and backward."""
    for p in (*fc1.parameters(), *fc2.parameters()):
        p.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with mst.autocast(recipe=recipe) if recipe is not None else mst.autocast(enabled=False):
        y = fc2(fc1(x))
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    del y
    return kept / 2**20


def collectives_step(x, y_full, dy):
    """The block's four collectives alone, on tensors of the step's sizes."""
    from microscale.torch.tensor_parallel import _gather_first_dim, _reduce_scatter_first_dim

    def step():
        _gather_first_dim(x, None)  # forward: x's rows
        _reduce_scatter_first_dim(y_full, None)  # forward: the output
        _gather_first_dim(dy, None)  # backward: dy's rows
        _reduce_scatter_first_dim(y_full, None)  # backward: dx (same size as x gathered: M x hidden)

    return step


def run(rank, store):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", world_size=WORLD, rank=rank)
    rows = []
    for m, hidden, ffn in SHAPES:
        options = dict(tp_group=dist.group.WORLD, sequence_parallel=True, params_dtype=torch.bfloat16, device="cuda")
        fc1 = mst.Linear(hidden, ffn, parallel_mode="column", **options)
        fc2 = mst.Linear(ffn, hidden, parallel_mode="row", **options)
        g = torch.Generator(device="cuda").manual_seed(rank)
        x = torch.randn(m // WORLD, hidden, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
        dy = torch.randn(m // WORLD, hidden, device="cuda", generator=g, dtype=torch.bfloat16)
        flops = 3 * 2 * 2 * m * hidden * (ffn // WORLD)  # per rank: 3 GEMMs x 2 layers
        results, kept = {}, {}
        for name, recipe in (("torch BF16", None), ("microscale NVFP4", NVFP4BlockScaling()),
                             ("microscale MXFP8", MXFP8BlockScaling())):
            results[name] = per_step_ms(block_step(fc1, fc2, x, dy, recipe))
            kept[name] = kept_for_backward_mib(fc1, fc2, x, recipe)
        y_full = torch.empty(m, hidden, device="cuda", dtype=torch.bfloat16)
        comm = per_step_ms(collectives_step(x.detach(), y_full, dy))
        base = results["torch BF16"]
        for name, ms in results.items():
            rows.append((f"{m} x {hidden} x {ffn}", name, ms, flops / ms / 1e9, base / ms, comm / ms, kept[name]))
        del fc1, fc2, x, dy, y_full
        torch.cuda.empty_cache()
    if rank == 0:
        print(f"{torch.cuda.get_device_name()} x {WORLD}, torch {torch.__version__}; per rank, eager steps")
        print("| M x hidden x ffn | candidate | step ms | TFLOP/s per GPU | vs torch BF16 | collectives' share | "
              "kept for backward MiB |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for shape, name, ms, tflops, ratio, share, mib in rows:
            print(f"| {shape} | {name} | {ms:.3f} | {tflops:.0f} | {ratio:.2f}x | {share:.0%} | {mib:.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    if torch.cuda.device_count() < WORLD:
        raise SystemExit(f"needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(os.path.join(tmp, "store"),), nprocs=WORLD)
