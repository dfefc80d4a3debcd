"""Cross-checks of the `microscale` CLI against independent Python oracles.

* ml_dtypes: element casts. An MX block whose FLOOR scale is 2^0 (amax in [2^emax, 2^(emax+1)))
  stores plain round-to-nearest-even casts, which ml_dtypes computes independently.
* safetensors: our files load with the reference reader, and its files load with ours.
* numpy: dequantizing our bytes by the documented layout reconstructs the input.
"""
import json
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest
import safetensors
from safetensors.numpy import load_file, save_file

CLI = os.environ.get("MICROSCALE_CLI", "build/release/microscale")

# scheme -> (ml_dtypes type, emax, max_normal, packed fp4)
FORMATS = {
    "mxfp4": (ml_dtypes.float4_e2m1fn, 2, 6.0, True),
    "mxfp6_e2m3": (ml_dtypes.float6_e2m3fn, 2, 7.5, False),
    "mxfp6_e3m2": (ml_dtypes.float6_e3m2fn, 4, 28.0, False),
    "mxfp8_e4m3": (ml_dtypes.float8_e4m3fn, 8, 448.0, False),
    "mxfp8_e5m2": (ml_dtypes.float8_e5m2, 15, 57344.0, False),
}


def load_raw(path):
    """Every tensor through safetensors' own parser, as numpy arrays of its storage type (numpy has
    no float8: F8_E4M3 comes back as uint8 codes)."""
    kinds = {"U8": np.uint8, "F8_E4M3": np.uint8, "F32": np.float32, "BF16": ml_dtypes.bfloat16}
    out = {}
    for name, t in safetensors.deserialize(path.read_bytes()):
        out[name] = np.frombuffer(t["data"], dtype=kinds[t["dtype"]]).reshape(t["shape"])
    return out


def run_cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True)


def grid_values(dtype):
    """Every finite value of a small float type, with midpoints and their fp32 neighbours."""
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(dtype).astype(np.float32)
    values = np.unique(values[np.isfinite(values)])
    mids = ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)
    around = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)])
    return np.concatenate([values, around])


@pytest.mark.parametrize("scheme", sorted(FORMATS))
def test_element_casts_match_ml_dtypes(tmp_path, scheme):
    dtype, emax, max_normal, packed = FORMATS[scheme]
    rng = np.random.default_rng(0)
    values = np.concatenate([grid_values(dtype), rng.uniform(-max_normal, max_normal, 4096).astype(np.float32)])
    values = values[np.abs(values) <= max_normal]
    # Blocks of 32: element 0 pins the FLOOR scale to 2^0, the other 31 are the values under test.
    n_blocks = -(-len(values) // 31 // 4) * 4  # a whole number of 128-wide rows
    body = np.resize(values, n_blocks * 31).reshape(n_blocks, 31)
    blocks = np.concatenate([np.full((n_blocks, 1), 2.0**emax, np.float32), body], axis=1)
    x = blocks.reshape(-1, 128)
    save_file({"x": np.ascontiguousarray(x)}, str(tmp_path / "in.safetensors"))
    result = run_cli("quantize-tensors", str(tmp_path / "in.safetensors"), "-o", str(tmp_path / "out.safetensors"),
                     "--scheme", scheme, "--scale-mode", "floor", "--rowwise")
    assert result.returncode == 0, result.stderr
    out = load_file(str(tmp_path / "out.safetensors"))
    assert np.all(out["x.rowwise_scale"] == 127)
    codes = out["x.rowwise_data"]
    if packed:
        codes = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(x.shape)
    expected = x.astype(dtype).view(np.uint8)
    np.testing.assert_array_equal(codes, expected)


def test_our_files_load_with_the_safetensors_package(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
    save_file({"w": x}, str(tmp_path / "in.safetensors"))
    result = run_cli("quantize-tensors", str(tmp_path / "in.safetensors"), "-o", str(tmp_path / "out.safetensors"),
                     "--scheme", "nvfp4", "--rht", "--swizzle")
    assert result.returncode == 0, result.stderr
    out = load_file(str(tmp_path / "out.safetensors"))
    assert out["w.rowwise_data"].shape == (64, 128) and out["w.rowwise_data"].dtype == np.uint8
    assert out["w.columnwise_data"].shape == (256, 32)
    assert out["w.rowwise_scale"].shape == (128, 16)  # swizzled: [roundup(64,128), roundup(16,4)]
    assert out["w.rowwise_amax"].dtype == np.float32
    assert out["w.rowwise_amax"][0] == np.abs(x.astype(np.float32)).max()


def test_mxfp8_bytes_dequantize_by_the_documented_layout(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    save_file({"a": x}, str(tmp_path / "in.safetensors"))
    result = run_cli("quantize-tensors", str(tmp_path / "in.safetensors"), "-o", str(tmp_path / "out.safetensors"),
                     "--scheme", "mxfp8_e4m3")
    assert result.returncode == 0, result.stderr
    out = load_file(str(tmp_path / "out.safetensors"))
    for usage, scale_axis in (("rowwise", 1), ("columnwise", 0)):
        data = out[f"a.{usage}_data"].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        scale = 2.0 ** (out[f"a.{usage}_scale"].astype(np.float64) - 127)
        deq = data * np.repeat(scale, 32, axis=scale_axis)
        sqnr = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((x - deq) ** 2))
        assert sqnr > 25, (usage, sqnr)  # E4M3 with power-of-two block scales: ~30 dB on normal data


def test_bad_input_exits_non_zero(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    result = run_cli("quantize-tensors", str(tmp_path / "junk.safetensors"), "-o", str(tmp_path / "o.safetensors"),
                     "--scheme", "nvfp4")
    assert result.returncode != 0
    assert "header" in result.stderr


@pytest.mark.parametrize("fmt,convention", [("nvfp4", "modelopt"), ("nvfp4", "compressed-tensors"),
                                            ("mxfp8", "modelopt"), ("mxfp4", "compressed-tensors")])
def test_quantized_checkpoints_load_with_safetensors_and_match_the_convention(tmp_path, fmt, convention):
    rng = np.random.default_rng(3)
    w = (0.05 * rng.standard_normal((128, 256))).astype(ml_dtypes.bfloat16)
    model = tmp_path / "model"
    model.mkdir()
    save_file({"layers.0.mlp.up_proj.weight": w, "layers.0.norm.weight": np.ones(256, np.float32)},
              str(model / "model.safetensors"))
    (model / "config.json").write_text('{"model_type": "demo"}')
    out = tmp_path / "out"
    result = run_cli("quantize", str(model), "-o", str(out), "--format", fmt, "--convention", convention, "-q")
    assert result.returncode == 0, result.stderr
    t = load_raw(out / "model.safetensors")  # the reference (Rust) parser accepts our writer's file
    x = w.astype(np.float64)
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    p = "layers.0.mlp.up_proj.weight"
    if fmt == "nvfp4":
        packed = t[p] if convention == "modelopt" else t[p + "_packed"]
        codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(128, 256)
        scale = t[p + "_scale"].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        glob = float(t[p + "_scale_2"]) if convention == "modelopt" else 1.0 / float(t[p + "_global_scale"][0])
        deq = e2m1[codes] * np.repeat(scale, 16, axis=1) * glob
    elif fmt == "mxfp8":
        deq = t[p].view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.repeat(
            2.0 ** (t[p + "_scale"].astype(np.float64) - 127), 32, axis=1)
    else:
        packed = t[p + "_packed"]
        assert packed.shape == (128, 128)
        codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(128, 256)
        deq = e2m1[codes] * np.repeat(2.0 ** (t[p + "_scale"].astype(np.float64) - 127), 32, axis=1)
    sqnr = 10 * np.log10(np.sum(x ** 2) / np.sum((x - deq) ** 2))
    assert sqnr > (25 if fmt == "mxfp8" else 12), sqnr
    np.testing.assert_array_equal(t["layers.0.norm.weight"], np.ones(256, np.float32))  # kept as is


def test_gpt_oss_experts_decode_as_transformers_reads_them(tmp_path):
    # gpt-oss keeps its MoE experts as [E, in, out] (transformers' GptOssExperts); the MXFP4
    # checkpoint stores each expert's [out, in] weight in blocks of 32 along `in`, and transformers'
    # loader decodes _blocks/_scales to [E, out, in] and transposes back. The rest stays as it was.
    rng = np.random.default_rng(5)
    experts, hidden, inter2 = 2, 64, 96
    gate_up = (0.05 * rng.standard_normal((experts, hidden, inter2))).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal((experts, inter2)).astype(ml_dtypes.bfloat16)
    q_proj = (0.05 * rng.standard_normal((hidden, hidden))).astype(ml_dtypes.bfloat16)
    model = tmp_path / "model"
    model.mkdir()
    p = "model.layers.0.mlp.experts.gate_up_proj"
    save_file({p: gate_up, p + "_bias": bias, "model.layers.0.self_attn.q_proj.weight": q_proj},
              str(model / "model.safetensors"))
    (model / "config.json").write_text('{"model_type": "gpt_oss"}')
    out = tmp_path / "out"
    result = run_cli("quantize", str(model), "-o", str(out), "--format", "mxfp4", "-q")  # gpt-oss: the default here
    assert result.returncode == 0, result.stderr
    t = load_raw(out / "model.safetensors")
    blocks, scales = t[p + "_blocks"], t[p + "_scales"]
    assert blocks.shape == (experts, inter2, hidden // 32, 16) and scales.shape == (experts, inter2, hidden // 32)
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    codes = np.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(experts, inter2, hidden)
    deq = e2m1[codes] * np.repeat(2.0 ** (scales.astype(np.float64) - 127), 32, axis=2)
    x = gate_up.astype(np.float64)
    deq = deq.transpose(0, 2, 1)  # back to [E, in, out]
    sqnr = 10 * np.log10(np.sum(x ** 2) / np.sum((x - deq) ** 2))
    assert sqnr > 12, sqnr
    np.testing.assert_array_equal(t[p + "_bias"], bias)  # kept as they were
    np.testing.assert_array_equal(t["model.layers.0.self_attn.q_proj.weight"], q_proj)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
