#!/usr/bin/env bash
# The main job: set up and build, then quantize a real model on the CPU — the all-MiniLM-L6-v2
# sentence-embedding model (fetched once by scripts/fetch_minilm.sh) — to NVFP4 (ModelOpt),
# MXFP8 (ModelOpt) and MXFP4 (compressed-tensors), printing each per-tensor report and a whole-model summary.
# Usage: bash scripts/demo.sh   (the README's main-job command)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_minilm.sh
model=build/models/all-MiniLM-L6-v2
out=build/demo
rm -rf "$out" && mkdir -p "$out"
start=$SECONDS
for spec in "nvfp4 modelopt" "mxfp8 modelopt" "mxfp4 compressed-tensors"; do
  set -- $spec
  echo
  echo "== microscale quantize $model --format $1 --convention $2"
  build/release/microscale quantize "$model" -o "$out/minilm-$1" --format "$1" --convention "$2" \
    --report "$out/minilm-$1.report.json"
done
echo
echo "== inspect the NVFP4 checkpoint"
build/release/microscale inspect "$out/minilm-nvfp4" > "$out/inspect.txt"
head -12 "$out/inspect.txt"
echo
echo "== whole-model summary (all-MiniLM-L6-v2, $(nproc) CPU threads, $((SECONDS - start)) s for the three conversions)"
build/venv/bin/python - "$out" <<'PY'
import json, sys
print(f"{'format':<8} {'convention':<20} {'quantized':>10} {'mean SQNR dB':>13} {'MB before':>10} {'MB after':>9} {'smaller':>8} {'seconds':>8}")
for fmt in ("nvfp4", "mxfp8", "mxfp4"):
    r = json.load(open(f"{sys.argv[1]}/minilm-{fmt}.report.json"))
    s = r["summary"]
    print(f"{fmt:<8} {r['convention']:<20} {s['quantized']:>4} / {s['tensors']:<3} {s['mean_sqnr_db']:>13.2f} "
          f"{s['bytes_before'] / 1e6:>10.2f} {s['bytes_after'] / 1e6:>9.2f} {s['bytes_before'] / s['bytes_after']:>7.2f}x {s['seconds']:>8.2f}")
PY
