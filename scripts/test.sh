#!/usr/bin/env bash
# Sets everything up and runs every test: the C++ suite (ctest, incl. all golden cases) on the
# release build, on an AVX2-only build (x86-64 CPUs with AVX2: the portable kernels' x86-64-v3
# code, which the release build's tests would not run on an AVX-512 machine) and under
# AddressSanitizer + UBSan, then the Python tests (cross-checks and the Python package), and
# `pip install .` into a fresh venv.
# Usage: bash scripts/test.sh   (the README's test command; .ci/run calls it)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

echo "== ctest (release)"
ctest --preset release -j "$(nproc)"

# The CPU must run x86-64-v3 code (AVX2, FMA, BMI1/2, F16C, ...): the dynamic loader knows.
if [ "$(uname -m)" = x86_64 ] && /lib64/ld-linux-x86-64.so.2 --help 2>/dev/null | grep -q 'x86-64-v3 (supported'; then
  echo "== ctest (AVX2 only: the portable kernels as CPUs without AVX-512 run them)"
  cmake --preset avx2 >/dev/null
  cmake --build --preset avx2 -j "$(nproc)"
  ctest --preset avx2 -j "$(nproc)"
fi

echo "== ctest (AddressSanitizer + UBSan)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$(nproc)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan -j "$(nproc)"

echo "== pytest (ml_dtypes and safetensors as independent oracles; the Python package on numpy and torch)"
# torch for microscale.torch's tests: PyTorch's CPU wheels where download.pytorch.org answers,
# else PyPI's (which pull in the CUDA libraries, ~3 GB).
if ! build/venv/bin/python -c "import torch" 2>/dev/null; then
  torch_pip=(build/venv/bin/python -m pip install -q --disable-pip-version-check torch)
  "${torch_pip[@]}" --retries 1 --timeout 20 --index-url https://download.pytorch.org/whl/cpu 2>/dev/null ||
    "${torch_pip[@]}"
fi
PYTHONPATH=build/release/python MICROSCALE_CLI=build/release/microscale \
  build/venv/bin/python -m pytest -q tests/python

echo "== pip install . (the package as a user installs it; CPU only, to keep CI short)"
rm -rf build/pip-venv && python3 -m venv build/pip-venv
# --config-settings, not -C: Debian 12's venv pip (23.0) has no short form.
build/pip-venv/bin/python -m pip install -q --disable-pip-version-check . \
  --config-settings=cmake.define.MICROSCALE_CUDA=OFF
(cd build && pip-venv/bin/python -c "import microscale, numpy as np; q = microscale.quantize(np.ones((16, 32), np.float32)); assert np.asarray(microscale.dequantize(q)).min() == 1.0; print('pip-installed microscale', microscale.__file__)")
