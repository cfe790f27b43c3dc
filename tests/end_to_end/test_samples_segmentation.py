"""The segmentation sample end to end: real `train.py` and `test.py` subprocesses on MNIST-format IDX files written
in a temp folder, with the sample's own config."""

from __future__ import annotations

import pytest

from tests.conftest import make_idx_dataset
from tests.end_to_end.samples import epochs_of, finite, sample_config
from tests.end_to_end.test_train import ROOT, run
from training.run.figures import plots

CONFIG = ROOT / "configs" / "mnist_segmentation.json"


@pytest.mark.slow
def test_mnist_segmentation_sample(tmp_path):
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=200, n_test=40)
    config = sample_config(
        CONFIG,
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
    assert (
        plots() is None
        or "predictions.png (input / target / prediction of the first 8 of 40 examples)" in tested.stdout
    )
