"""inference/convert_tflite.py end to end on a tiny run folder, and inference/predict.py on what it wrote.

The run folder (config, checkpoint) and its MNIST-format data are built here in a temporary folder. The exported
files are checked with the runtimes' own APIs, independently of the converter's runner classes.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.idx import write_idx
from data_loader.mnist import SOURCES
from inference import convert_tflite, exporter
from training import checkpoint
from utils import build, load_config

REPO = Path(__file__).resolve().parents[1]
N_VAL = 40


def write_config(folder: Path, data_dir: Path, model: dict) -> Path:
    loader = {"name": "mnist", "args": {"data_dir": str(data_dir), "verify": False, "validation_size": N_VAL,
                                        "batch_size": 16}}
    config = {
        "name": "tiny", "seed": 0, "model": model,
        "loss": {"name": "cross_entropy"}, "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adamw", "args": {"lr": 1e-3}},
        "data_loader": {"train": {**loader, "args": {**loader["args"], "split": "train"}},
                        "validation": {**loader, "args": {**loader["args"], "split": "validation"}}},
        "trainer": {"epochs": 1, "save_dir": str(folder)},
    }
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """saved/<name>/<run_id>-like folder: config.json and model_best.params of a small CNN (random weights)."""
    root = tmp_path_factory.mktemp("run")
    rng = np.random.default_rng(0)
    data = root / "data"
    data.mkdir()
    for prefix, n in (("train", 100), ("t10k", 20)):
        write_idx(data / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)).astype(np.uint8))
        write_idx(data / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n).astype(np.uint8))
    config_path = write_config(root, data, {"name": "mnist_cnn", "args": {"channels": [4, 8], "hidden": 16}})
    model = build(load_config(config_path)["model"], "model")
    params, state = model.init(jax.random.PRNGKey(1), jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    checkpoint.save(root / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 7})
    return root


def model_fn(run: Path):
    """The JAX model of a run folder, rebuilt from its files (what the export must equal)."""
    model = build(load_config(run / "config.json")["model"], "model")
    spec = jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32)
    template = jax.eval_shape(lambda: dict(zip(("params", "state"), model.init(jax.random.PRNGKey(0), spec))))
    tree, _ = checkpoint.restore(run / "model_best.params", template, only=("params", "state"))
    return jax.jit(lambda x: model(tree["params"], tree["state"], x)[0])


def convert(*args) -> int:
    return convert_tflite.main([str(a) for a in args])


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("inference")
    assert convert("-r", run_dir, "--name", "tiny_mnist", "--output-dir", out) == 0
    return out / "tiny_mnist"


def test_writes_every_format_and_report(exported, run_dir):
    files = {p.name for p in exported.iterdir()}
    assert {"tiny_mnist.tflite", "tiny_mnist.onnx", "tiny_mnist.jax", "config.json", "model", "report.json",
            "predict.py", "preprocessing.json"} <= files
    assert (exported / "model" / "model.py").is_file()
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    report = json.loads((exported / "report.json").read_text())
    entries = {e["format"]: e for e in report["formats"]}
    assert list(entries) == ["tflite", "onnx", "jax"]
    assert entries["tflite"]["inputs"][0]["shape"] == "[1,28,28,1]"  # fixed batch by default
    assert entries["onnx"]["inputs"][0]["shape"] == entries["jax"]["inputs"][0]["shape"] == "[B,28,28,1]"
    for fmt in ("tflite", "onnx"):
        assert (entries[fmt]["inputs"][0]["name"], entries[fmt]["output"]["name"]) == ("input", "outputs")
    assert report["task"] == "classification" and report["validated_on_real_data"] is True
    for e in entries.values():
        assert e["bytes"] == (exported / e["file"]).stat().st_size
        assert e["validation"]["examples"] == N_VAL and e["validation"]["agreement"] == 1.0
        assert e["validation"]["quality"] == e["validation"]["jax_quality"]
        assert max(e["random"]["max_abs_diff"], e["validation"]["max_abs_diff"]) <= 1e-4
    assert entries["jax"]["random"]["batch_sizes"] == [1, 16]
    prep = json.loads((exported / "preprocessing.json").read_text())
    assert (prep["mean"], prep["std"]) == (SOURCES["mnist"]["mean"], SOURCES["mnist"]["std"])
    assert prep["classes"] == [str(d) for d in range(10)] and prep["task"] == "classification"
    assert prep["inputs"] == [{"name": "input", "shape": "[B,28,28,1]", "dtype": "float32"}]


def test_artifacts_equal_the_model_in_their_own_runtimes(exported, run_dir):
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter

    forward = model_fn(run_dir)
    x = np.random.default_rng(5).standard_normal((3, 28, 28, 1)).astype(np.float32)
    want = np.asarray(forward(x))

    session = ort.InferenceSession(str(exported / "tiny_mnist.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["outputs"], {"input": x})[0], want, atol=1e-4, rtol=1e-4)

    exp = jax.export.deserialize(bytearray((exported / "tiny_mnist.jax").read_bytes()))
    np.testing.assert_array_equal(np.asarray(exp.call(x)), want)

    interpreter = Interpreter(model_path=str(exported / "tiny_mnist.tflite"))
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    for row in range(len(x)):  # batch 1
        interpreter.set_tensor(inp["index"], x[row:row + 1])
        interpreter.invoke()
        np.testing.assert_allclose(interpreter.get_tensor(out["index"]), want[row:row + 1], atol=1e-4, rtol=1e-4)


def test_existing_folder_needs_force(exported, run_dir):
    marker = exported / "marker"
    marker.write_text("keep")
    with pytest.raises(SystemExit) as exit_info:
        convert("-r", run_dir, "--name", "tiny_mnist", "--output-dir", exported.parent, "--formats", "jax")
    assert exit_info.value.code == 2 and marker.read_text() == "keep"
    marker.unlink()


def test_force_replaces_and_config_weights_input_interface(run_dir, tmp_path):
    args = ["-c", run_dir / "config.json", "-w", run_dir / "model_best.params", "--input", 1, 28, 28, 1,
            "--name", "m", "--output-dir", tmp_path, "--val-examples", 8]
    assert convert(*args, "--formats", "jax") == 0
    assert convert(*args, "--formats", "tflite", "--dynamic-batch", "--force") == 0
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert "m.tflite" in files and "m.jax" not in files
    (entry,) = json.loads((tmp_path / "m" / "report.json").read_text())["formats"]
    assert entry["inputs"][0]["shape"] == "[B,28,28,1]" and entry["random"]["batch_sizes"] == [1, 16]


def test_batch_fixes_every_format(run_dir, tmp_path):
    assert convert("-r", run_dir, "--name", "b", "--output-dir", tmp_path, "--batch", 4, "--formats", "onnx,jax",
                   "--val-examples", 10) == 0
    entries = json.loads((tmp_path / "b" / "report.json").read_text())["formats"]
    assert [e["inputs"][0]["shape"] for e in entries] == ["[4,28,28,1]", "[4,28,28,1]"]
    assert all(e["validation"]["examples"] == 10 for e in entries)  # 10 examples in batches of 4: padding dropped


def test_onnx_via_tflite_has_a_symbolic_batch(run_dir, tmp_path):
    assert convert("-r", run_dir, "--name", "v", "--output-dir", tmp_path, "--formats", "onnx",
                   "--onnx-via", "tflite", "--val-examples", 8) == 0
    (entry,) = json.loads((tmp_path / "v" / "report.json").read_text())["formats"]
    assert entry["route"].startswith("tf2onnx") and entry["inputs"][0]["shape"] == "[B,28,28,1]"
    assert (entry["inputs"][0]["name"], entry["output"]["name"]) == ("input", "outputs")


def test_quantized_tflite_reports_drift(exported, run_dir, tmp_path):
    assert convert("-r", run_dir, "--name", "q", "--output-dir", tmp_path, "--formats", "tflite",
                   "--quantize", "dynamic-int8", "--max-accuracy-drop", 100) == 0
    (entry,) = json.loads((tmp_path / "q" / "report.json").read_text())["formats"]
    float_entry = json.loads((exported / "report.json").read_text())["formats"][0]
    assert entry["quantize"] == "dynamic-int8" and entry["bytes"] < float_entry["bytes"]
    assert entry["validation"]["max_abs_diff"] > 0 and entry["validation"]["quality"] is not None


def test_mismatch_fails_names_the_place_and_writes_nothing(run_dir, tmp_path, monkeypatch, capsys):
    original = exporter.export_bytes

    def off_by_a_bit(route, fn, *args, **kwargs):  # an exporter that gets the model slightly wrong
        return original(route, (lambda x: fn(x) + 1e-2) if route == "jax2tf" else fn, *args, **kwargs)

    monkeypatch.setattr(exporter, "export_bytes", off_by_a_bit)
    assert convert("-r", run_dir, "--name", "bad", "--output-dir", tmp_path, "--formats", "jax,tflite",
                   "--val-examples", 4) == 1
    err = capsys.readouterr().err
    assert "tflite: FAILED" in err and "output 'outputs'" in err and "worst at example" in err
    assert "--formats jax" in err  # the format that did pass
    assert list(tmp_path.iterdir()) == []


def test_onnx_falls_back_to_the_other_route(run_dir, tmp_path, monkeypatch, capsys):
    original = exporter.export_bytes

    def no_jax2onnx(route, *args, **kwargs):
        if route == "jax2onnx":
            raise RuntimeError("unsupported primitive")
        return original(route, *args, **kwargs)

    monkeypatch.setattr(exporter, "export_bytes", no_jax2onnx)
    assert convert("-r", run_dir, "--name", "f", "--output-dir", tmp_path, "--formats", "onnx",
                   "--val-examples", 4) == 0
    assert "trying tf2onnx" in capsys.readouterr().out
    (entry,) = json.loads((tmp_path / "f" / "report.json").read_text())["formats"]
    assert entry["route"].startswith("tf2onnx") and "unsupported primitive" in entry["failed_routes"][0]


def test_usage_errors(run_dir, tmp_path):
    for args in (["--name", "x"], ["-r", run_dir, "--name", "x", "--formats", "tflite,pt"],
                 ["-r", run_dir, "--name", "x", "--formats", "onnx", "--quantize", "float16"],
                 ["-r", tmp_path / "nothing", "--name", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            convert(*args, "--output-dir", tmp_path)
        assert exit_info.value.code == 2


def bn_attention_net(num_classes: int = 10):
    """BatchNorm, exact GELU, attention and Dropout in one model (registered as a sample model by the test)."""
    from model.modules.activations import Activation
    from model.modules.attention import MultiHeadAttention
    from model.modules.conv import Conv2d
    from model.modules.dropout import Dropout
    from model.modules.flatten import Flatten
    from model.modules.linear import Linear
    from model.modules.module import Lambda
    from model.modules.normalization import BatchNorm, LayerNorm
    from model.modules.pooling import MaxPool2d
    from model.modules.residual import Residual
    from model.modules.sequential import Sequential

    return Sequential({
        "conv": Conv2d(8, 3, stride=2), "bn": BatchNorm(), "act": Activation("gelu"), "pool": MaxPool2d(2),
        "tokens": Lambda(lambda x: x.reshape(x.shape[0], -1, x.shape[-1]), "tokens"),
        "attn": Residual(MultiHeadAttention(2)), "norm": LayerNorm(), "drop": Dropout(0.3),
        "flatten": Flatten(), "head": Linear(num_classes)})


def test_command_on_a_batchnorm_attention_gelu_dropout_model(run_dir, tmp_path, monkeypatch):
    from model import model as samples

    monkeypatch.setattr(samples, "bn_attention_net", bn_attention_net, raising=False)
    monkeypatch.setattr(samples, "__all__", [*samples.__all__, "bn_attention_net"])
    run = tmp_path / "run"
    run.mkdir()
    data_dir = load_config(run_dir / "config.json")["data_loader"]["validation"]["args"]["data_dir"]
    config_path = write_config(run, Path(data_dir), {"name": "bn_attention_net", "args": {}})
    model = build(load_config(config_path)["model"], "model")
    params, state = model.init(jax.random.PRNGKey(2), jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    # Running statistics away from (0, 1), so that evaluation-mode BatchNorm is really exercised.
    state = {**state, "bn": {"mean": jnp.linspace(-1.0, 1.0, 8), "var": jnp.linspace(0.5, 2.0, 8)}}
    checkpoint.save(run / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 1})

    assert convert("-r", run, "--name", "bn", "--output-dir", tmp_path / "out", "--val-examples", 16) == 0
    entries = json.loads((tmp_path / "out" / "bn" / "report.json").read_text())["formats"]
    assert [e["format"] for e in entries] == ["tflite", "onnx", "jax"]
    assert all(e["validation"]["agreement"] == 1.0 and "failed_routes" not in e for e in entries)


def run_predict(*args) -> str:
    """predict.py in a fresh interpreter in which importing JAX or TensorFlow fails."""
    code = ("import runpy, sys\n"
            "for name in ('jax', 'tensorflow', 'tf2onnx', 'jax2onnx'): sys.modules[name] = None\n"
            "sys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code, str(REPO / "inference" / "predict.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("suffix", [".onnx", ".tflite"])
def test_predict_on_images_and_npy(exported, run_dir, tmp_path, suffix):
    from PIL import Image

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (56, 40)).astype(np.uint8)  # resized to 28x28 by predict.py
    Image.fromarray(pixels).save(tmp_path / "digit.png")
    batch = rng.standard_normal((3, 28, 28, 1)).astype(np.float32)
    np.save(tmp_path / "batch.npy", batch)

    # The expected probabilities: the same resize, MNIST's normalisation, the JAX model, a softmax.
    resized = np.asarray(Image.fromarray(pixels).resize((28, 28), Image.BILINEAR), np.float32)
    image = ((resized / 255.0 - SOURCES["mnist"]["mean"]) / SOURCES["mnist"]["std"])[None, :, :, None]
    probabilities = np.asarray(jax.nn.softmax(model_fn(run_dir)(np.concatenate([image, batch]))))

    out = run_predict(exported / f"tiny_mnist{suffix}", tmp_path / "digit.png", tmp_path / "batch.npy", "--top", 2)
    lines = [line for line in out.splitlines() if line.startswith(str(tmp_path))]
    assert len(lines) == 4
    for line, p in zip(lines, probabilities):
        printed = [(int(item.split(" (")[0]), float(item.split(" (")[1].rstrip(")")))
                   for item in line.split(": ", 1)[1].split(", ")]
        assert [c for c, _ in printed] == list(np.argsort(-p)[:2])
        np.testing.assert_allclose([q for _, q in printed], p[np.argsort(-p)[:2]], atol=2e-3)
