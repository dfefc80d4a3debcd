#!/usr/bin/env bash
# Packs the built CPU quantize benchmark with the dynamic loader and every shared library it links
# against, so that it runs unchanged on a machine that has neither Google Benchmark nor this
# machine's glibc (docs/perf.md, eleventh session: the lent GPU machine's host CPU).
# Usage: bash scripts/bundle_cpu_bench.sh [BUILD_DIR] [OUT_DIR]   (defaults: build/release, .gpu/cpubench)
# Then, on the other machine:
#   OMP_WAIT_POLICY=passive OUT_DIR/lib/ld-linux-x86-64.so.2 --library-path OUT_DIR/lib OUT_DIR/bench_quantize_cpu
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
out="${2:-.gpu/cpubench}"
binary="$build/bench/bench_quantize_cpu"
[ -x "$binary" ] || { echo "no $binary: build it first (cmake --build $build)" >&2; exit 1; }
mkdir -p "$out/lib"
cp "$binary" "$out/"
# ldd lists "name => path (address)" for libraries and "path (address)" for the loader.
ldd "$binary" | awk '/=>/ && $3 ~ /^\// {print $3} /ld-linux/ && $1 ~ /^\// {print $1}' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
echo "bundled in $out ($(du -sh "$out" | cut -f1)); run on the other machine:"
echo "  OMP_WAIT_POLICY=passive $out/lib/ld-linux-x86-64.so.2 --library-path $out/lib $out/bench_quantize_cpu"
