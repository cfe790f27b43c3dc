"""The multi-task sample (configs/mnist_multitask.json: a digit class and the image's mean ink, two named outputs)
end to end on tiny MNIST-format files: train.py, test.py, the export in every format and predict.py, as real
subprocesses."""

from __future__ import annotations

import json

import numpy as np
import pytest

import utils
from inference import exporter
from tests.conftest import make_idx_dataset
from tests.end_to_end.samples import epochs_of, finite, sample_config
from tests.end_to_end.test_train import ROOT, run
from tests.inference.test_export_cli import PREDICTABLE
from training.config import file
from training.run.figures import plots


@pytest.mark.slow
def test_mnist_multitask_sample(tmp_path):
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=160, n_test=40)
    config = sample_config(
        ROOT / "configs" / "mnist_multitask.json",
        tmp_path,
        {"data_dir": str(data_dir), "verify": False, "validation_size": 40, "batch_size": 40},
        trainer__epochs=2,
        trainer__save_period=2,
        model__args__channels=[4, 8],
        model__args__hidden=16,
    )
    result = run("train.py", "-c", config, "--run-id", "m")
    assert result.returncode == 0, result.stderr
    assert "heads.digit" in result.stderr + result.stdout and "output ink: float32" in result.stderr + result.stdout
    run_dir = tmp_path / "saved" / "mnist_multitask" / "m"
    rows = epochs_of(run_dir)
    assert len(rows) == 2
    for key in ("train/loss", "train/digit/accuracy", "train/ink/mae", "val/loss", "val/digit/accuracy", "val/ink/mae"):
        assert all(finite(r[key]) for r in rows), key
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "tasks: digit classification, ink regression" in tested.stdout
    assert "digit/accuracy" in tested.stdout and "ink/mae" in tested.stdout
    assert "output digit (classification):" in tested.stdout and "confusion matrix" in tested.stdout
    assert (run_dir / "per_class_digit.csv").is_file()
    if plots() is not None:  # training/plots/ draws them
        assert (run_dir / "confusion_matrix_digit.png").is_file() and (run_dir / "predictions_ink.png").is_file()

    out = tmp_path / "exports"
    exported = run("inference/convert_tflite.py", "--run", run_dir, "--name", "mt", "--output-dir", out, timeout=600)
    assert exported.returncode == 0, exported.stderr
    folder = out / "mt"
    report = json.loads((folder / "report.json").read_text())
    assert report["tasks"] == {"digit": "classification", "ink": "regression"}
    assert [e["format"] for e in report["formats"]] == list(exporter.FORMATS)
    for entry in report["formats"]:
        assert [(o["name"], o["task"]) for o in entry["outputs"]] == [
            ("digit", "classification"),
            ("ink", "regression"),
        ]
        checked = entry["validation"]["outputs"]
        assert checked["digit"]["agreement"] == 1.0 and checked["digit"]["quality"] == checked["digit"]["jax_quality"]
        assert max(checked["digit"]["max_abs_diff"], checked["ink"]["max_abs_diff"]) <= 1e-4
        assert set(entry["random"]["outputs"]) == {"digit", "ink"}
    assert "digit (classification): max abs diff" in (folder / "report.md").read_text()

    batch = np.random.default_rng(0).standard_normal((2, 28, 28, 1)).astype(np.float32)
    np.save(tmp_path / "two.npy", batch)
    for suffix in PREDICTABLE:
        predicted = run(folder / "predict.py", folder / f"mt{suffix}", tmp_path / "two.npy")
        assert predicted.returncode == 0, predicted.stderr
        lines = predicted.stdout.splitlines()
        assert "outputs digit (classification), ink (regression)" in lines[0]
        assert sum(line.startswith("  digit: ") for line in lines) == 2
        assert sum(line.startswith("  ink: mean ink = ") for line in lines) == 2


def test_named_targets_for_a_loss_of_one_are_refused_in_one_line(tmp_path):
    """(issue 48: here, beside the sample it reads, so that a project made without it loses both.) Before: AttributeError: 'dict' object has no attribute 'dtype' (the multi-task data with cross_entropy)."""
    make_idx_dataset(tmp_path / "mnist", n_train=80, n_test=20)
    config = json.loads((ROOT / "configs" / "mnist_multitask.json").read_text())
    for spec in config["data_loader"].values():
        spec["args"].update(data_dir=str(tmp_path / "mnist"), verify=False, validation_size=20, batch_size=20)
    config["model"]["args"] = {"channels": [4, 8], "hidden": 16}
    config["loss"], config["metrics"] = {"name": "cross_entropy"}, []
    config["trainer"].update(save_dir=str(tmp_path / "saved"), monitor="min val/loss")
    with pytest.raises(
        file.ConfigError, match=r"loss: cross_entropy takes one target, but the data has named targets "
    ):
        utils.fit(config, run_dir=tmp_path / "never")
    assert not (tmp_path / "never").exists() and not (tmp_path / "saved").exists()
