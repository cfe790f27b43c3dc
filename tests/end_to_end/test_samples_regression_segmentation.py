"""The regression and segmentation samples end to end: real `train.py` and `test.py` subprocesses on tiny data
written in a temp folder (a CSV with a known signal; MNIST-format IDX files), with the samples' own configs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.model import mnist_segmenter
from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import ROOT, run, write_config


def sample_config(name: str, tmp_path: Path, loader_args: dict, **changes) -> Path:
    """configs/<name>.json with every loader's args updated, the run folder in tmp_path and `changes` applied."""
    config = json.loads((ROOT / "configs" / f"{name}.json").read_text())
    for loader in config["data_loader"].values():
        loader["args"].update(loader_args)
    config["trainer"].update(save_dir=str(tmp_path / "saved"), log_every=1)
    return write_config(tmp_path, config, changes)


def epochs_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def finite(value) -> bool:
    return all(math.isfinite(v) for v in np.ravel(value))


def test_mnist_segmenter_shapes_paths_and_receptive_field():
    net = mnist_segmenter(channels=(4, 8))
    spec = jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)
    params, state = net.init(jax.random.PRNGKey(0), spec)
    paths = {
        jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    assert {"enc.conv0.weight", "skip.down.weight", "skip.up.weight", "head.weight", "head.bias"} <= paths
    assert params["skip"]["up"]["weight"].shape == (2, 2, 8, 4)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.shape)
    forward = jax.jit(lambda x: net(params, state, x)[0])
    logits = forward(x)
    assert logits.shape == (2, 28, 28, 1) and bool(jnp.all(jnp.isfinite(logits)))
    # row 20 reaches row 14 only through the half-resolution path: the full-resolution convs alone see 3 rows each way
    changed = jnp.abs(forward(x.at[:, 20].add(5.0)) - logits)[:, 14, 14, 0]
    assert bool(jnp.all(changed > 0))
    with pytest.raises(ValueError, match="channels must be"):
        mnist_segmenter(channels=(4, 8, 16))


@pytest.mark.slow
def test_tabular_regression_sample(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal([0, 100, -5], [1, 30, 0.1], (400, 3))
    z = (x - [0, 100, -5]) / [1, 30, 0.1]
    y = np.sin(z[:, 0]) + 0.5 * z[:, 1] - z[:, 2] ** 2 / 2 + 0.1 * rng.standard_normal(400)
    lines = ["u,v,w,label"] + [",".join(f"{value:.6g}" for value in row) for row in np.column_stack([x, y])]
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    config = sample_config(
        "tabular_regression",
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
    assert preprocessing["task"] == "regression" and len(preprocessing["mean"]) == len(preprocessing["std"]) == 3
    assert abs(preprocessing["mean"][1] - 100) < 5 and abs(preprocessing["std"][2] - 0.1) < 0.02

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "rmse" in tested.stdout and "mae" in tested.stdout


def test_tabular_regression_reports_a_missing_column(tmp_path):
    (tmp_path / "rows.csv").write_text("a,b,target\n1,2,3\n4,5,6\n")
    config = sample_config(
        "tabular_regression", tmp_path, {"path": str(tmp_path / "rows.csv"), "targets": ["y"], "sha256": None}
    )
    result = run("train.py", "-c", config)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "target column 'y' not found; available: a, b, target" in result.stderr
    assert not (tmp_path / "saved").exists()


@pytest.mark.slow
def test_mnist_segmentation_sample(tmp_path):
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=200, n_test=40)
    config = sample_config(
        "mnist_segmentation",
        tmp_path,
        {"data_dir": str(data_dir), "verify": False, "validation_size": 40, "batch_size": 40},
        trainer__epochs=3,
        trainer__save_period=3,
        model__args__channels=[4, 8],
    )
    result = run("train.py", "-c", config, "--run-id", "s")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "saved" / "mnist_segmentation" / "s"
    rows = epochs_of(run_dir)
    assert len(rows) == 3
    for key in (
        "train/loss",
        "train/binary_accuracy",
        "train/mean_iou",
        "val/loss",
        "val/binary_accuracy",
        "val/mean_iou",
        "val/iou_per_class",
    ):
        assert all(finite(r[key]) for r in rows), key
    assert rows[-1]["train/loss"] < rows[0]["train/loss"] and rows[-1]["val/loss"] < rows[0]["val/loss"]
    assert rows[-1]["val/mean_iou"] > rows[0]["val/mean_iou"]
    assert all(0 <= r["val/binary_accuracy"] <= 1 and 0 <= r["val/mean_iou"] <= 1 for r in rows)

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "binary_accuracy" in tested.stdout and "mean_iou" in tested.stdout
    # masks are images: a grid of input / target / prediction, not a scatter of pixels
    assert "predictions.png (input / target / prediction of the first 8 of 40 examples)" in tested.stdout
