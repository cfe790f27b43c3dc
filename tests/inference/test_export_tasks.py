"""The export beyond image classification: regression (tolerance only), a language model (int32 ids, top-1 per
position, text out of predict.py), several named inputs, no validation data, per-channel normalisation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from inference import convert_tflite, exporter
from inference.inputs import Inputs
from inference.predict import load_image
from tests.inference.test_export_cli import PREDICTABLE, PairNet
from training.config.components import build
from training.config.validation import load_config
from training.run import checkpoint

REPO = Path(__file__).resolve().parents[2]
TEXT = "to be, or not to be: that is the question.\n" * 30


def make_run(folder: Path, config: dict) -> Path:
    """A run folder: config.json, the train split's preprocessing.json and random weights as model_best.params."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    config = load_config(folder / "config.json")
    model = build(config["model"], "model")
    loader = build(config["data_loader"]["train"], "data_loader", seed=0)
    (folder / "preprocessing.json").write_text(json.dumps(loader.preprocessing))
    params, state = model.init(jax.random.PRNGKey(3), loader.spec["input"])
    checkpoint.save(folder / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 1})
    return folder


def base_config(model: dict, loss: str, loader: dict, splits=("train", "validation")) -> dict:
    return {
        "name": "t",
        "model": model,
        "loss": {"name": loss},
        "optimizer": {"name": "adam", "args": {"lr": 1e-3}},
        "data_loader": {s: {**loader, "args": {**loader["args"], "split": s}} for s in splits},
        "trainer": {"monitor": "off"},
    }


def report_of(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((120, 3))
    path = tmp_path_factory.mktemp("csv") / "rows.csv"
    lines = ["a,b,c,y"] + [",".join(f"{v:.5f}" for v in (*row, row @ [1.0, -2.0, 0.5])) for row in x]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_regression_is_judged_by_tolerance_and_predict_prints_values(tmp_path, csv_path):
    loader = {"name": "csv", "args": {"path": str(csv_path), "targets": ["y"], "batch_size": 16}}
    run = make_run(
        tmp_path / "run", base_config({"name": "mlp", "args": {"num_classes": 1, "hidden": [8]}}, "mse", loader)
    )
    assert convert_tflite.main(["--run", str(run), "--name", "reg", "--output-dir", str(tmp_path / "out")]) == 0
    out = tmp_path / "out" / "reg"
    report = report_of(out)
    assert report["task"] == "regression"
    for entry in report["formats"]:
        assert entry["validation"]["agreement"] is None and entry["validation"]["quality"] is None
        assert entry["output"]["shape"].endswith(",1]")
    table = (out / "report.md").read_text()
    assert "accuracy" not in table and "agreement" not in table
    prep = json.loads((out / "preprocessing.json").read_text())
    assert prep["features"] == ["a", "b", "c"] and prep["targets"] == ["y"] and len(prep["mean"]) == 3
    rows = tmp_path / "rows.csv"
    rows.write_text("\n".join(csv_path.read_text().splitlines()[:3]) + "\n")
    done = subprocess.run(
        [sys.executable, str(out / "predict.py"), str(out / "reg.onnx"), str(rows)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "task regression" in done.stdout and done.stdout.count(": y = ") == 2


def test_language_model_exports_int_ids_and_generates_text(tmp_path):
    text = tmp_path / "input.txt"
    text.write_text(TEXT)
    vocabulary = "".join(sorted(set(TEXT)))
    loader = {"name": "char_text", "args": {"path": str(text), "context": 12, "batch_size": 8}}
    model = {
        "name": "char_transformer",
        "args": {"vocab_size": len(vocabulary), "context": 12, "dim": 16, "depth": 1, "num_heads": 2},
    }
    run = make_run(tmp_path / "run", base_config(model, "cross_entropy", loader))
    assert (
        convert_tflite.main(
            ["--run", str(run), "--name", "lm", "--output-dir", str(tmp_path / "out"), "--val-examples", "20"]
        )
        == 0
    )
    out = tmp_path / "out" / "lm"
    report = report_of(out)
    assert report["task"] == "sequence"
    for entry in report["formats"]:
        assert entry["inputs"][0]["dtype"] == "int32" and entry["inputs"][0]["shape"].endswith(",12]")
        assert entry["validation"]["agreement"] == 1.0 and entry["random"]["agreement"] == 1.0
        assert entry["validation"]["quality"] == entry["validation"]["jax_quality"]
    prep = json.loads((out / "preprocessing.json").read_text())
    assert prep["vocabulary"] == vocabulary and prep["inputs"][0]["dtype"] == "int32"
    for suffix in PREDICTABLE:
        done = subprocess.run(
            [
                sys.executable,
                str(out / "predict.py"),
                str(out / f"lm{suffix}"),
                "--text",
                "to be",
                "--tokens",
                "15",
                "--temperature",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("to be") and len(done.stdout.rstrip("\n")) == 20
    # the JAX model's own greedy continuation, for the same prompt
    config = load_config(run / "config.json")
    net = build(config["model"], "model")
    template = jax.eval_shape(
        lambda: dict(
            zip(("params", "state"), net.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, 12), jnp.int32)))
        )
    )
    tree, _ = checkpoint.restore(run / "model_best.params", template, only=("params", "state"))
    ids = [vocabulary.index(c) for c in "to be"]
    for _ in range(15):
        window = np.zeros((1, 12), np.int32)
        window[0, : len(ids[-12:])] = ids[-12:]
        logits, _ = net(tree["params"], tree["state"], window)
        ids.append(int(np.argmax(logits[0, len(ids[-12:]) - 1])))
    assert done.stdout.rstrip("\n") == "".join(vocabulary[i] for i in ids)


def test_no_validation_data_is_said_and_not_counted_as_a_pass(tmp_path, csv_path, capsys):
    loader = {"name": "csv", "args": {"path": str(csv_path), "targets": ["y"], "batch_size": 16}}
    config = base_config({"name": "mlp", "args": {"num_classes": 1, "hidden": [4]}}, "mse", loader, splits=("train",))
    run = make_run(tmp_path / "run", config)
    assert (
        convert_tflite.main(
            ["--run", str(run), "--name", "nv", "--output-dir", str(tmp_path / "out"), "--formats", "jax"]
        )
        == 0
    )
    assert "validation: not checked (no validation or test split in the config)" in capsys.readouterr().out
    report = report_of(tmp_path / "out" / "nv")
    assert report["validated_on_real_data"] is False and report["formats"][0]["validation"] is None


def test_several_named_inputs_in_every_format(tmp_path):
    rng = np.random.default_rng(1)
    data = {
        "image": rng.standard_normal((10, 4, 4, 1)).astype(np.float32),
        "features": rng.standard_normal((10, 3)).astype(np.float32),
    }
    loader = DataLoader(ArrayDataset(input=data, target=rng.integers(0, 2, 10).astype(np.int32)), 4)
    model = PairNet()
    params, state = model.init(jax.random.PRNGKey(0), loader.spec["input"])

    def fn(x):
        return model(params, state, x)[0]

    inputs = Inputs(loader.spec["input"], 1)
    assert inputs.names == ["features", "image"]  # a dict's inputs, in sorted key order
    validation = exporter.collect_validation(loader, jax.jit(fn), inputs, None)
    options = exporter.Options()
    for fmt in exporter.FORMATS:
        entry = exporter.export_format(
            fmt, fn, jax.jit(fn), inputs, tmp_path, "two", validation, "classification", options, {}
        )
        assert [i["name"] for i in entry["inputs"]] == ["features", "image"]
        assert entry["validation"]["agreement"] == 1.0 and entry["validation"]["examples"] == 10
    from inference.predict import OnnxModel

    runner = OnnxModel(tmp_path / "two.onnx")
    np.testing.assert_allclose(
        runner({"image": data["image"], "features": data["features"]}), np.asarray(fn(data)), atol=1e-5
    )
    with pytest.raises(ValueError, match=r"missing inputs \['image'\]"):
        runner({"features": data["features"]})


def test_per_channel_normalisation_of_images(tmp_path):
    from PIL import Image

    pixels = np.random.default_rng(2).integers(0, 256, (6, 5, 3)).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "rgb.png")
    prep = {"pixel_scale": 1 / 255, "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}
    got = load_image(tmp_path / "rgb.png", (6, 5, 3), prep)
    expected = (pixels / 255.0 - np.array(prep["mean"])) / np.array(prep["std"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
