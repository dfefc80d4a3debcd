#!/usr/bin/env bash
# microscale's CPU quantizers beside torchao's (eager and torch.compile'd) and memcpy, in one run,
# and a check that microscale's MXFP8 bytes are torchao's (bench/torchao_cpu_baseline.py).
# Sets up as scripts/setup.sh does, plus torch and torchao in build/bench-venv: PyTorch's CPU
# wheels where download.pytorch.org answers, else PyPI's (which pull in the CUDA libraries, ~3 GB).
# Takes ~5 minutes on 2 cores (torch.compile compiles each case per thread count).
# Usage: bash scripts/bench_torchao_cpu.sh [--no-compile] [--repeats N]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

venv=build/bench-venv
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check -r bench/requirements.txt)
if ! "$venv/bin/python" -c "import torch, torchao, safetensors, numpy" 2>/dev/null; then
  "${pip[@]}" --retries 1 --timeout 20 --index-url https://download.pytorch.org/whl/cpu \
    --extra-index-url https://pypi.org/simple 2>/dev/null || "${pip[@]}"
fi
OMP_WAIT_POLICY=passive "$venv/bin/python" bench/torchao_cpu_baseline.py \
  --bench build/release/bench/bench_quantize_cpu --cli build/release/microscale "$@"
