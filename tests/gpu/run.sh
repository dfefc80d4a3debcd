#!/usr/bin/env bash
# The one GPU script: builds the CUDA backend, its test and its benchmark with plain g++/nvcc
# commands (no gtest, CLI11 or Google Benchmark needed; nlohmann-json from .gpu/include when the
# system has none), runs the bit-exact GPU test (random shapes vs the CPU oracle + golden cases
# from .gpu/golden), compute-sanitizer memcheck and racecheck on a quick run, the benchmark and the
# torch.compile baseline; logs and JSON go to RESULTS_DIR, a short table is printed last.
# Usage: tests/gpu/run.sh RESULTS_DIR   (from anywhere; needs nvcc, g++, python3 with torch)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUTDIR="$(mkdir -p "${1:-gpu-results}" && cd "${1:-gpu-results}" && pwd)"
BUILD="${BUILD_DIR:-/tmp/microscale-gpu-build}"
JOBS="$(nproc)"
mkdir -p "$BUILD/obj"
cd "$ROOT"
GOLDEN="${MICROSCALE_GOLDEN_DIR:-$ROOT/.gpu/golden}"
INC=(-Iinclude -Isrc -I"$ROOT/.gpu/include")
CXXFLAGS=(-std=c++20 -O2 -fopenmp -ffp-contract=off -fno-fast-math "${INC[@]}")
NVFLAGS=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --fmad=false -Xcompiler=-ffp-contract=off,-fopenmp -lineinfo "${INC[@]}")
CPU_SRC=(src/core/format.cpp src/core/tensor.cpp src/core/layout.cpp src/core/input_matrix.cpp src/core/quantize.cpp
         src/core/safetensors.cpp src/core/hadamard.cpp src/cpu/quantize_nvfp4_ref.cpp src/cpu/quantize_mx_ref.cpp
         src/cpu/quantize_nvfp4.cpp src/cpu/quantize_mx.cpp src/cpu/quantize_mx16.cpp src/cpu/quantize_nvfp4_16.cpp
         src/cpu/e2m1_thresholds.cpp src/cpu/rht_band.cpp src/cpu/quantize_nvfp4_avx512.cpp
         src/cpu/quantize_mx_avx512.cpp src/cpu/row_loader.cpp src/cpu/kernel_set.cpp)
CU_SRC=(src/cuda/device.cu src/cuda/quantize.cu src/cuda/nvfp4_amax.cu src/cuda/quantize_nvfp4.cu src/cuda/quantize_mx.cu
        src/cuda/dequantize.cu src/cuda/swizzle.cu)
summary() { echo "$1" | tee -a "$OUTDIR/summary.txt"; }
: > "$OUTDIR/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUTDIR/device.txt"

echo "== build ($JOBS jobs)"
t0=$(date +%s)
pids=()
for f in "${CPU_SRC[@]}"; do g++ "${CXXFLAGS[@]}" -c "$f" -o "$BUILD/obj/$(basename "$f").o" & pids+=($!); done
for f in "${CU_SRC[@]}" tests/gpu/quantize_gpu_test.cu bench/quantize_cuda_bench.cu; do
  nvcc "${NVFLAGS[@]}" --resource-usage -c "$f" -o "$BUILD/obj/$(basename "$f").o" 2> "$BUILD/obj/$(basename "$f").log" & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
cat "$BUILD"/obj/*.log > "$OUTDIR/build.log" 2>/dev/null
if [ $fail -ne 0 ]; then grep -B2 -A5 -i error "$OUTDIR/build.log" | head -60; summary "build: FAILED"; exit 1; fi
LIBOBJ=()
for f in "${CPU_SRC[@]}" "${CU_SRC[@]}"; do LIBOBJ+=("$BUILD/obj/$(basename "$f").o"); done
nvcc -o "$BUILD/quantize_gpu_test" "$BUILD/obj/quantize_gpu_test.cu.o" "${LIBOBJ[@]}" -Xcompiler=-fopenmp || { summary "link: FAILED"; exit 1; }
nvcc -o "$BUILD/quantize_cuda_bench" "$BUILD/obj/quantize_cuda_bench.cu.o" "${LIBOBJ[@]}" -Xcompiler=-fopenmp || { summary "link: FAILED"; exit 1; }
grep -E "registers|stack frame" "$OUTDIR/build.log" | sort | uniq -c | sort -rn | head -12
summary "build: ok ($(( $(date +%s) - t0 )) s)"

echo "== GPU test (bit-exact vs quantize_ref + golden)"
"$BUILD/quantize_gpu_test" "$GOLDEN" > "$OUTDIR/test.log" 2>&1; rc=$?
grep -E "^FAIL" "$OUTDIR/test.log" | head -20
tail -3 "$OUTDIR/test.log"
summary "test: rc=$rc; $(tail -1 "$OUTDIR/test.log")"

if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool (quick run)"
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/quantize_gpu_test" --quick > "$OUTDIR/sanitizer_$tool.log" 2>&1; src=$?
    tail -4 "$OUTDIR/sanitizer_$tool.log"
    summary "sanitizer $tool: rc=$src; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/sanitizer_$tool.log" | tail -1)"
  done
fi

echo "== benchmark"
"$BUILD/quantize_cuda_bench" "$OUTDIR/bench.json" > "$OUTDIR/bench.log" 2>&1 || summary "bench: FAILED rc=$?"
echo "== microscale bench, GPU part (tools/bench_cuda.cpp)"
CUDA_INC="$(dirname "$(dirname "$(command -v nvcc)")")/include"
g++ "${CXXFLAGS[@]}" -Itools -I"$CUDA_INC" -c tools/bench_cuda.cpp -o "$BUILD/obj/bench_cuda.o" &&
  g++ "${CXXFLAGS[@]}" -Itools -c tests/gpu/bench_cli_main.cpp -o "$BUILD/obj/bench_cli_main.o" &&
  nvcc -o "$BUILD/bench_cli_gpu" "$BUILD/obj/bench_cuda.o" "$BUILD/obj/bench_cli_main.o" "${LIBOBJ[@]}" -Xcompiler=-fopenmp &&
  "$BUILD/bench_cli_gpu" > "$OUTDIR/bench_cli.log" 2>&1; rc=$?
summary "microscale bench (GPU part): rc=$rc"
echo "== torch.compile baseline"
timeout 300 python3 bench/torch_nvfp4_baseline.py "$OUTDIR/torch_baseline.json" > "$OUTDIR/torch_baseline.log" 2>&1 || summary "torch baseline: FAILED rc=$?"
tail -2 "$OUTDIR/torch_baseline.log"

echo
echo "================ summary ================"
cat "$OUTDIR/device.txt"
cat "$OUTDIR/summary.txt"
sed -n '/kernel (bf16 in)/,$p' "$OUTDIR/bench.log"
cat "$OUTDIR/bench_cli.log"
grep "torch.compile" "$OUTDIR/torch_baseline.log"
