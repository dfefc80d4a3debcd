#!/usr/bin/env bash
# Sets everything up and runs every test: the C++ suite (ctest, incl. all golden cases) on the
# release build, on an AVX2-only build (x86-64 CPUs with AVX2: the portable kernels' x86-64-v3
# code, which the release build's tests would not run on an AVX-512 machine) and under
# AddressSanitizer + UBSan, then the Python cross-checks.
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

echo "== pytest (ml_dtypes and safetensors as independent oracles)"
MICROSCALE_CLI=build/release/microscale build/venv/bin/python -m pytest -q tests/python
