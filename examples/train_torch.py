"""Trains a small PyTorch model three times from one seed (NVFP4, MXFP8 and high precision) and
prints the loss curves side by side: the PyTorch twin of examples/train_mlp.cpp.

The model is written with plain torch.nn.Linear layers, as a user's model is;
microscale.torch.convert_linears swaps them for microscale's quantized Linear, and each training
step runs under microscale.torch.autocast with the recipe (forward and backward quantized as
TransformerEngine's recipes say; the activation, the loss and AdamW stay in fp32).

Task: regress the output of a fixed random "teacher" MLP (64 -> 256 -> 32, tanh) from Gaussian
inputs; student: Linear(64, 256) -> GELU -> Linear(256, 256) -> GELU -> Linear(256, 32).

Usage: python3 examples/train_torch.py [--steps N] [--device cpu|cuda] [--compile BACKEND]
                                       [--max-relative-gap G]
With --compile, the model is compiled whole by torch.compile (fullgraph=True: the quantized layers
are traced into the model's graph) with that backend (inductor, aot_eager, ...). With
--max-relative-gap, exits 1 when a quantized recipe's final loss (mean of the last 20 steps) is
above high precision's by more than that fraction. Needs torch and microscale
(PYTHONPATH=build/release/python, or pip install .).
"""

import argparse
import sys

import torch

import microscale.torch as mst
from microscale.recipe import HighPrecision, MXFP8BlockScaling, NVFP4BlockScaling

IN, HIDDEN, OUT, BATCH = 64, 256, 32, 128


def teacher(device):
    g = torch.Generator().manual_seed(1)
    w1 = torch.randn(HIDDEN, IN, generator=g) / IN**0.5
    w2 = torch.randn(OUT, HIDDEN, generator=g) / HIDDEN**0.5
    w1, w2 = w1.to(device), w2.to(device)
    return lambda x: torch.tanh(x @ w1.t()) @ w2.t()


def batches(steps, device, target):
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x = torch.randn(BATCH, IN, generator=g).to(device)
        yield x, target(x)


def train(recipe, steps, device, backend=None):
    torch.manual_seed(0)  # the same initial weights (and stochastic rounding draws) for every recipe
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.GELU(), torch.nn.Linear(HIDDEN, OUT)).to(device)
    mst.convert_linears(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    forward = model if backend is None else torch.compile(model, backend=backend, fullgraph=True)
    losses = []
    for x, y in batches(steps, device, teacher(device)):
        with mst.autocast(recipe=recipe):  # the scope may stay outside the compiled model
            loss = torch.nn.functional.mse_loss(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", metavar="BACKEND", default=None)
    parser.add_argument("--max-relative-gap", type=float, default=None)
    args = parser.parse_args()
    recipes = {"NVFP4": NVFP4BlockScaling(), "MXFP8": MXFP8BlockScaling(), "high precision": HighPrecision()}
    curves = {name: train(recipe, args.steps, args.device, args.compile) for name, recipe in recipes.items()}
    print(f"{'step':>6} " + " ".join(f"{name:>15}" for name in curves))
    for step in sorted({0, *range(args.steps // 10 - 1, args.steps, max(1, args.steps // 10))}):
        print(f"{step + 1:>6} " + " ".join(f"{curve[step]:15.5f}" for curve in curves.values()))
    tail = {name: sum(curve[-20:]) / len(curve[-20:]) for name, curve in curves.items()}
    base = tail["high precision"]
    print("final loss (mean of the last 20 steps): " +
          ", ".join(f"{name} {value:.5f} ({(value - base) / base:+.1%})" for name, value in tail.items()))
    if args.max_relative_gap is not None:
        worst = max((tail[name] - base) / base for name in ("NVFP4", "MXFP8"))
        if worst > args.max_relative_gap:
            print(f"a quantized recipe's final loss is {worst:.1%} above high precision's "
                  f"(allowed: {args.max_relative_gap:.1%})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
