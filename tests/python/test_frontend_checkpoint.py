"""microscale.convert_checkpoint: the CLI's `microscale quantize` as a Python function. The same
bytes as the CLI's conversion, the per-tensor report, the progress callback, and errors."""

import os
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import microscale as ms

CLI = os.environ.get("MICROSCALE_CLI", "build/release/microscale")


def make_model(path):
    rng = np.random.default_rng(7)
    path.mkdir()
    save_file({"layers.0.mlp.up_proj.weight": (0.05 * rng.standard_normal((128, 256))).astype(ml_dtypes.bfloat16),
               "layers.0.self_attn.q_proj.weight": (0.05 * rng.standard_normal((64, 256))).astype(np.float32),
               "layers.0.norm.weight": np.ones(256, np.float32)},
              str(path / "model.safetensors"))
    (path / "config.json").write_text('{"model_type": "demo"}')
    return path


@pytest.mark.parametrize("fmt,extra,kwargs", [
    ("nvfp4", [], {}), ("mxfp8", ["--scale-mode", "floor"], {"scale_mode": "floor"}),
    ("mxfp4", ["--convention", "compressed-tensors"], {"convention": "compressed-tensors"}),
    ("nvfp4", ["--4over6", "MSE", "--e4m3-max", "256", "--4over6-scaled-error"],
     {"four_over_six": "mse", "nvfp4_e4m3_max": 256, "four_over_six_scaled_error": True})])
def test_the_same_files_as_the_cli(tmp_path, fmt, extra, kwargs):
    model = make_model(tmp_path / "model")
    cli = subprocess.run([CLI, "quantize", str(model), "-o", str(tmp_path / "cli"), "--format", fmt, "-q",
                          "--skip", "*q_proj*", *extra], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    reports = ms.convert_checkpoint(model, tmp_path / "py", format=fmt, skip=["*q_proj*"], **kwargs)
    for name in sorted(os.listdir(tmp_path / "cli")):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "py" / name).read_bytes(), name
    assert sorted(os.listdir(tmp_path / "cli")) == sorted(os.listdir(tmp_path / "py"))
    by_name = {r["name"]: r for r in reports}
    up = by_name["layers.0.mlp.up_proj.weight"]
    assert up["quantized"] and up["shape"] == [128, 256] and up["sqnr_db"] > 12
    assert up["bytes_after"] < up["bytes_before"] == 128 * 256 * 2
    for kept in ("layers.0.norm.weight", "layers.0.self_attn.q_proj.weight"):
        assert not by_name[kept]["quantized"] and by_name[kept]["kept_because"]


def test_a_pattern_given_as_a_string(tmp_path):
    model = make_model(tmp_path / "model")
    reports = {r["name"]: r for r in ms.convert_checkpoint(model, tmp_path / "out", format="mxfp8", skip="*q_proj*")}
    assert reports["layers.0.mlp.up_proj.weight"]["quantized"]
    assert not reports["layers.0.self_attn.q_proj.weight"]["quantized"]


def test_progress_and_a_failed_conversion(tmp_path):
    model = make_model(tmp_path / "model")
    seen = []
    ms.convert_checkpoint(model, tmp_path / "out", format="nvfp4", progress=lambda d, t, r: seen.append((d, t, r["name"])))
    assert [d for d, _, _ in seen] == [1, 2, 3] and all(t == 3 for _, t, _ in seen)

    def stop(done, total, report):
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        ms.convert_checkpoint(model, tmp_path / "stopped", format="nvfp4", progress=stop)
    assert not (tmp_path / "stopped").exists() or not os.listdir(tmp_path / "stopped")


def test_errors(tmp_path):
    model = make_model(tmp_path / "model")
    cases = [(dict(format="nvfp5"), "nvfp5"), (dict(format="nvfp4", scale_mode="floor"), "scale mode applies"),
             (dict(format="mxfp4", convention="modelopt"), "no mxfp4 layout"),
             (dict(format="mxfp8", scale_mode="up"), "scale mode"),
             (dict(format="mxfp8", four_over_six="mae"), "apply to nvfp4"),
             (dict(format="nvfp4", nvfp4_e4m3_max=256), "or 256 with 4over6"),
             (dict(format="nvfp4", four_over_six="best"), "4over6")]
    for kwargs, match in cases:
        with pytest.raises(ms.Error, match=match):
            ms.convert_checkpoint(model, tmp_path / "o", **kwargs)
    with pytest.raises(ms.Error):
        ms.convert_checkpoint(tmp_path / "missing", tmp_path / "o2", format="nvfp4")


def test_read_quantized_weights_gives_the_dequantized_weights(tmp_path):
    import torch

    model = make_model(tmp_path / "model")
    ms.convert_checkpoint(model, tmp_path / "mx", format="mxfp8")
    weights = ms.read_quantized_weights(tmp_path / "mx")
    assert sorted(weights) == ["layers.0.mlp.up_proj.weight", "layers.0.self_attn.q_proj.weight"]  # not the norm
    from safetensors.numpy import load_file

    original = load_file(str(model / "model.safetensors"))["layers.0.mlp.up_proj.weight"]
    bf16 = torch.from_numpy(original.astype(np.float32)).to(torch.bfloat16)
    want = ms.dequantize(ms.quantize(bf16, "mxfp8_e4m3", scale_mode="rceil"))  # the converter's MXFP8
    got = weights["layers.0.mlp.up_proj.weight"]
    assert got.dtype == np.float32 and got.shape == (128, 256) and np.array_equal(got, want)
    ms.convert_checkpoint(model, tmp_path / "nv", format="nvfp4", convention="compressed-tensors")
    x = original.astype(np.float64)
    got = ms.read_quantized_weights(tmp_path / "nv" / "model.safetensors")["layers.0.mlp.up_proj.weight"]
    assert 10 * np.log10(np.sum(x**2) / np.sum((x - got) ** 2)) > 12
    with pytest.raises(ms.Error):
        ms.read_quantized_weights(tmp_path / "missing")
