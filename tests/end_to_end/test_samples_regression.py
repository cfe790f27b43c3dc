"""The tabular regression sample end to end: real `train.py` and `test.py` subprocesses on a CSV with a known
signal written in a temp folder, with the sample's own config."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.end_to_end.samples import epochs_of, finite, sample_config
from tests.end_to_end.test_train import ROOT, run

CONFIG = ROOT / "configs" / "tabular_regression.json"


@pytest.mark.slow
def test_tabular_regression_sample(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal([0, 100, -5], [1, 30, 0.1], (400, 3))
    z = (x - [0, 100, -5]) / [1, 30, 0.1]
    y = np.sin(z[:, 0]) + 0.5 * z[:, 1] - z[:, 2] ** 2 / 2 + 0.1 * rng.standard_normal(400)
    lines = ["u,v,w,label"] + [",".join(f"{value:.6g}" for value in row) for row in np.column_stack([x, y])]
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    config = sample_config(
        CONFIG,
        tmp_path,
        {"path": str(tmp_path / "rows.csv"), "targets": ["label"], "sha256": None, "batch_size": 40},
        trainer__epochs=6,
        trainer__save_period=6,
        model__args__hidden=[32, 32],
    )
    result = run("train.py", "-c", config, "--run-id", "r")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "saved" / "tabular_regression" / "r"
    rows = epochs_of(run_dir)
    assert len(rows) == 6
    for key in ("train/loss", "train/mae", "train/rmse", "val/loss", "val/mae", "val/rmse"):
        assert all(finite(r[key]) for r in rows), key
    assert rows[-1]["val/rmse"] < 0.6 * rows[0]["val/rmse"] and rows[-1]["train/loss"] < rows[0]["train/loss"]
    preprocessing = json.loads((run_dir / "preprocessing.json").read_text())
    assert preprocessing["features"] == ["u", "v", "w"] and preprocessing["targets"] == ["label"]
    # no task recorded by the loader: the loss (mse) and the targets say it
    assert "task" not in preprocessing and len(preprocessing["mean"]) == len(preprocessing["std"]) == 3
    assert abs(preprocessing["mean"][1] - 100) < 5 and abs(preprocessing["std"][2] - 0.1) < 0.02

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "rmse" in tested.stdout and "mae" in tested.stdout


def test_tabular_regression_reports_a_missing_column(tmp_path):
    (tmp_path / "rows.csv").write_text("a,b,target\n1,2,3\n4,5,6\n")
    config = sample_config(CONFIG, tmp_path, {"path": str(tmp_path / "rows.csv"), "targets": ["y"], "sha256": None})
    result = run("train.py", "-c", config)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "target column 'y' not found; available: a, b, target" in result.stderr
    assert not (tmp_path / "saved").exists()
