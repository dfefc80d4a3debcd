#!/usr/bin/env bash
# Installs what microscale needs on a Debian/Ubuntu machine (apt packages, and a Python venv at
# build/venv for the Python tests), then configures and builds the release preset.
# Idempotent: installs only what is missing. Usage: bash scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

# python3-dev: Python's headers, for the extension microscale._C (python/) and for the code
# torch.compile generates on the CPU (bench/torchao_cpu_baseline.py).
APT_PACKAGES=(build-essential cmake ninja-build git pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libopenblas-openmp-dev
  libdnnl-dev ocl-icd-opencl-dev
  clang libclang-rt-dev
  python3 python3-venv python3-pip python3-dev)

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python oracles for the Python tests (numpy, ml_dtypes, safetensors, pytest) and nanobind (the
# release build makes the extension microscale._C with this venv's Python) in a venv, so a
# system Python that refuses pip installs (PEP 668) is left alone.
if [ ! -x build/venv/bin/python ]; then
  mkdir -p build
  python3 -m venv build/venv
fi
if ! build/venv/bin/python -c "import numpy, ml_dtypes, safetensors, pytest, nanobind" 2>/dev/null; then
  build/venv/bin/python -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
fi

# The CUDA toolkit, when installed, usually lives here without being on PATH.
if [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

if [ "${1:-}" != "--no-build" ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release -j "$(nproc)"
fi
