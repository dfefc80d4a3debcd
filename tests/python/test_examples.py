"""The PyTorch example (examples/train_torch.py) runs and trains under every recipe, eagerly and
compiled whole by torch.compile."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("compile_args", [[], ["--compile", "aot_eager"]], ids=["eager", "compiled"])
def test_train_torch_example_trains_under_every_recipe(compile_args):
    # 150 steps: the losses fall ~8x; NVFP4 ends ~20 % and MXFP8 ~2 % above high precision on this
    # small model (K = 64..256: few blocks per dot product), measured on the CPU. Compiled whole,
    # the same (traced, the layers compose the library's ops: the same bytes but for the bias
    # gradient's summation order).
    result = subprocess.run([sys.executable, str(REPO / "examples" / "train_torch.py"), "--steps", "150",
                             "--max-relative-gap", "0.4", *compile_args], capture_output=True, text=True,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    first, last = [float(v) for v in lines[1].split()[1:]], [float(v) for v in lines[-2].split()[1:]]
    assert all(b < a / 4 for a, b in zip(first, last)), (first, last)
