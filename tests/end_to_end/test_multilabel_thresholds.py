"""Multi-label end to end at the config's decision threshold: a CSV of three 0/1 target columns, test.py's per-label
table at the threshold the metrics name (and re-scored at another under a monitor that names the old one), and the
exported predict.py's labels on the same raw rows agreeing with that table; --threshold overrides."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from data_loader.sources.tabular import split_rows
from tests.end_to_end.test_train import run
from tests.inference.test_export_tasks import base_config, make_run

LABELS = ["red", "round", "sweet"]


@pytest.mark.slow
def test_multilabel_thresholds_through_test_and_predict(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 3))
    y = (x @ rng.normal(size=(3, 3)) + rng.normal(size=(150, 3)) > 0.3).astype(int)
    lines = ["a,b,c," + ",".join(LABELS)] + [",".join([*(f"{v:.5f}" for v in r), *map(str, t)]) for r, t in zip(x, y)]
    data = tmp_path / "fruit.csv"
    data.write_text("\n".join(lines) + "\n")
    loader = {"name": "csv", "args": {"path": str(data), "targets": LABELS, "batch_size": 16}}
    config = base_config(
        {"name": "mlp", "args": {"num_classes": 3, "hidden": [8]}},
        "binary_cross_entropy",
        loader,
        ("train", "validation", "test"),
    )
    config["metrics"] = [
        {"name": "multilabel_f1", "args": {"threshold": 0.45}},
        {"name": "roc_auc", "args": {"average": "none"}},
    ]
    config["trainer"]["monitor"] = "max val/multilabel_f1@0.45"
    run_dir = make_run(tmp_path / "run", config)  # random weights: decisions on both sides of any threshold

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "labels predicted above probability 0.45 (metrics.0.args.threshold)" in tested.stdout
    assert "roc_auc_per_label:" in tested.stdout and all(f"    {name}" in tested.stdout for name in LABELS)
    table = {r["label"]: r for r in csv.DictReader((run_dir / "per_label.csv").open())}
    assert list(table) == LABELS and all(r["threshold"] == "0.45" for r in table.values())
    rescored = run("test.py", "--run", run_dir, "--set", "metrics.0.args.threshold=0.55")
    assert rescored.returncode == 0, rescored.stderr  # trainer.monitor names multilabel_f1@0.45: set aside
    assert "multilabel_f1@0.55" in rescored.stdout and "above probability 0.55" in rescored.stdout

    out = tmp_path / "exports"
    exported = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "m", "--output-dir", out, "--formats", "onnx"
    )
    assert exported.returncode == 0, exported.stderr
    test_rows = split_rows(150, 0.1, 0.1, 0)["test"]  # the loader's test split
    raw = tmp_path / "raw.csv"
    raw.write_text("\n".join([lines[0]] + [lines[1 + i] for i in test_rows]) + "\n")
    folder = out / "m"
    for flag, threshold in (([], 0.45), (["--threshold", "0.7"], 0.7)):
        predicted = run(folder / "predict.py", folder / "m.onnx", raw, *flag, "--out", tmp_path / "p.npz")
        assert predicted.returncode == 0, predicted.stderr
        assert f"labels predicted above probability {threshold:g}" in predicted.stdout
        with np.load(tmp_path / "p.npz") as saved:
            labels, probabilities = saved["labels"], saved["probabilities"]
            assert saved["label_names"].tolist() == LABELS and float(saved["threshold"]) == threshold
        np.testing.assert_array_equal(labels, (probabilities > threshold).astype(labels.dtype))
    # test.py's table at 0.45 is what predict.py's labels at 0.45 give on the same rows
    with np.load(tmp_path / "p.npz") as saved:
        at_default = (saved["probabilities"] > 0.45).astype(int)
    truth = y[test_rows]
    for k, name in enumerate(LABELS):
        tp = int((at_default[:, k] & truth[:, k]).sum())
        precision = tp / max(int(at_default[:, k].sum()), 1)
        recall = tp / max(int(truth[:, k].sum()), 1)
        assert int(table[name]["support"]) == int(truth[:, k].sum())
        assert float(table[name]["precision"]) == pytest.approx(precision, abs=1e-6)
        assert float(table[name]["recall"]) == pytest.approx(recall, abs=1e-6)
    assert 0 < at_default.mean() < 1  # decisions on both sides: the comparison is not vacuous
    assert json.loads((folder / "report.json").read_text())["threshold"] == 0.45
