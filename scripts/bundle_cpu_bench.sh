#!/usr/bin/env bash
# Packs the built CPU quantize benchmark and the CLI with the dynamic loader and every shared library
# they link against, so that they run unchanged on a machine that has neither Google Benchmark nor this
# machine's glibc (docs/perf.md, eleventh session: the lent GPU machine's host CPU).
# Usage: bash scripts/bundle_cpu_bench.sh [BUILD_DIR] [OUT_DIR]   (defaults: build/release, .gpu/cpubench)
# Then, on the other machine:
#   OMP_WAIT_POLICY=passive OUT_DIR/bench_quantize_cpu.sh   (OUT_DIR/microscale.sh: the CLI)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
out="${2:-.gpu/cpubench}"
mkdir -p "$out/lib"
# The benchmark and the CLI (bench/torchao_cpu_baseline.py runs both), each with a wrapper that
# starts it through the bundled loader.
for binary in "$build/bench/bench_quantize_cpu" "$build/microscale"; do
  [ -x "$binary" ] || { echo "no $binary: build it first (cmake --build $build)" >&2; exit 1; }
  name="$(basename "$binary")"
  cp "$binary" "$out/"
  # ldd lists "name => path (address)" for libraries and "path (address)" for the loader.
  ldd "$binary" | awk '/=>/ && $3 ~ /^\// {print $3} /ld-linux/ && $1 ~ /^\// {print $1}' |
    while read -r lib; do cp -L "$lib" "$out/lib/"; done
  printf '#!/bin/sh\nd="$(dirname "$0")"\nexec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/%s" "$@"\n' \
    "$name" > "$out/$name.sh"
  chmod +x "$out/$name.sh"
done
echo "bundled in $out ($(du -sh "$out" | cut -f1)); run on the other machine:"
echo "  OMP_WAIT_POLICY=passive $out/bench_quantize_cpu.sh"
