#!/usr/bin/env bash
# The main job: set up, build, make a demo safetensors file and quantize it with the CLI to NVFP4
# (RHT on the columnwise output), MXFP8 and MXFP4, printing each tensor's error.
# Usage: bash scripts/demo.sh   (the README's main-job command)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p build/demo
build/release/examples/make_demo_tensors build/demo/demo.safetensors
for args in "nvfp4 --rht" "nvfp4 --tile 16x16" "mxfp8_e4m3" "mxfp4 --scale-mode floor"; do
  set -- $args
  echo
  echo "== microscale quantize-tensors --scheme $*"
  build/release/microscale quantize-tensors build/demo/demo.safetensors -o "build/demo/demo.$1.safetensors" --scheme "$@"
done
