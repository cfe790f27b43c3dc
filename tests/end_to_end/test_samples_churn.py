"""The churn sample end to end with its own config and its shipped CSV (a categorical column, empty cells, about 1:9
positives): real `train.py`, `test.py` (re-scored at another threshold), the export and the exported `predict.py`
on raw rows as a user has them; and the raw-row preprocessing of predict.py against the loader's on the same rows."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from data_loader.sources.tabular import CsvDataset, split_rows
from inference.predict import load_rows
from tests.end_to_end.samples import epochs_of, finite, sample_config
from tests.end_to_end.test_train import ROOT, run

CONFIG = ROOT / "configs" / "churn.json"
COLUMNS = json.loads(CONFIG.read_text())["data_loader"]["train"]["args"]["columns"]


@pytest.mark.slow
def test_churn_sample_train_test_export_predict_on_raw_rows(tmp_path):
    config = sample_config(
        CONFIG,
        tmp_path,
        {},
        trainer__epochs=4,
        trainer__save_period=4,
        # monitored by a thresholded metric, which re-scoring at another threshold renames
        trainer__monitor="max val/multilabel_f1@0.4",
    )
    trained = run("train.py", "-c", config, "--run-id", "r")
    assert trained.returncode == 0, trained.stderr
    run_dir = tmp_path / "saved" / "churn" / "r"
    rows = epochs_of(run_dir)
    assert len(rows) == 4 and all(finite(r[k]) for r in rows for k in ("val/roc_auc", "val/pr_auc", "train/loss"))
    assert rows[-1]["val/roc_auc"] > 0.7 and rows[-1]["val/pr_auc"] > 0.2  # a ranking: chance is 0.5 and about 0.1
    preprocessing = json.loads((run_dir / "preprocessing.json").read_text())
    assert "task" not in preprocessing and preprocessing["columns"]["plan"]["categories"] == [
        "basic",
        "premium",
        "standard",
    ]
    assert preprocessing["encoded"][-3:] == ["tenure_months missing", "monthly_charges", "support_calls"]

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "task: multilabel" in tested.stdout and "roc_auc" in tested.stdout and "pr_auc" in tested.stdout
    assert "labels predicted above probability 0.4 (metrics.2.args.threshold)" in tested.stdout
    assert "true 1" in tested.stdout and (run_dir / "per_label.csv").read_text().startswith("label,precision")
    rescored = run("test.py", "--run", run_dir, "--set", "metrics.2.args.threshold=0.3")
    assert rescored.returncode == 0, rescored.stderr  # the run's monitor names multilabel_f1@0.4: set aside
    assert "multilabel_f1@0.3" in rescored.stdout and "above probability 0.3" in rescored.stdout

    out = tmp_path / "exports"
    exported = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "churn", "--output-dir", out, "--formats", "onnx"
    )
    assert exported.returncode == 0, exported.stderr
    folder = out / "churn"
    report = json.loads((folder / "report.json").read_text())
    assert report["task"] == "multilabel" and report["threshold"] == 0.4
    assert "above probability 0.4 (the config's decision threshold" in (folder / "report.md").read_text()
    # raw rows as a user has them: columns in another order, one more column, empty cells, a category never seen
    raw = tmp_path / "customers.csv"
    raw.write_text(
        "support_calls,customer,monthly_charges,tenure_months,contract,plan\n"
        "4,a,95.5,,monthly,basic\n"
        "0,b,40,60,yearly,\n"
        "2,c,70,3,monthly,gold\n"
    )
    predicted = run(folder / "predict.py", folder / "churn.onnx", raw, "--out", tmp_path / "p.csv")
    assert predicted.returncode == 0, predicted.stderr
    assert "labels predicted above probability 0.4 (metrics.2.args.threshold)" in predicted.stdout
    assert predicted.stdout.count("churned (") == 3
    assert "'gold' not among the training categories" in predicted.stderr
    table = list(csv.reader((tmp_path / "p.csv").open()))
    assert table[0] == ["input", "churned probability", "churned"]
    probabilities = np.array([float(r[1]) for r in table[1:]])
    assert ((probabilities > 0) & (probabilities < 1)).all()
    assert [int(r[2]) for r in table[1:]] == (probabilities > 0.4).astype(int).tolist()
    # --threshold overrides the config's; the .npz holds probabilities and labels beside the logits
    again = run(folder / "predict.py", folder / "churn.onnx", raw, "--threshold", "0.99", "--out", tmp_path / "p.npz")
    assert again.returncode == 0, again.stderr
    assert "labels predicted above probability 0.99 (--threshold)" in again.stdout
    with np.load(tmp_path / "p.npz") as saved:
        np.testing.assert_allclose(saved["probabilities"][:, 0], probabilities, rtol=1e-6)
        np.testing.assert_allclose(saved["probabilities"], 1 / (1 + np.exp(-saved["outputs"])), rtol=1e-5)
        assert saved["labels"].tolist() == [[int(p > 0.99)] for p in probabilities]
        assert float(saved["threshold"]) == 0.99 and saved["label_names"].tolist() == ["churned"]


def test_predict_prepares_raw_rows_as_the_loader_prepared_them(tmp_path):
    """The loader's test split and predict.py's load_rows on the same raw rows (text, empty cells, a category the
    train split never had) give the same inputs, with the train split's categories, fills and scales."""
    lines = (ROOT / "data" / "churn" / "churn.csv").read_text().splitlines()[:400]
    test_rows = split_rows(len(lines) - 1, 0.2, 0.3, 0)["test"]  # the loader's split (split_seed 0) of these rows
    lines[1 + test_rows[0]] = "gold,monthly,,80.00,1,1"  # a category the train split never had
    path = tmp_path / "c.csv"
    path.write_text("\n".join(lines) + "\n")
    common = dict(validation_fraction=0.2, test_fraction=0.3, columns=COLUMNS)
    data = CsvDataset(path, "churned", split="test", **common)
    assert data.preprocessing == CsvDataset(path, "churned", split="train", **common).preprocessing
    raw = tmp_path / "raw.csv"
    raw.write_text("\n".join([lines[0]] + [lines[1 + i] for i in test_rows]) + "\n")
    assert sum("" in lines[1 + i].split(",") for i in test_rows) > 5  # empty cells among them
    warnings = []
    np.testing.assert_allclose(load_rows(raw, data.preprocessing, warnings), data.inputs, rtol=1e-6, atol=1e-6)
    assert len(warnings) == 1 and "'gold' not among the training categories" in warnings[0]


def test_cross_entropy_on_the_binary_target_is_refused_before_the_run_folder(tmp_path):
    """The 0/1 column is a float (B, 1) target: cross_entropy against two outputs is one line, nothing written
    (declaring the target categorical makes it class ids for cross_entropy)."""
    config = sample_config(
        CONFIG,
        tmp_path,
        {},
        loss={"name": "cross_entropy"},
        model__args__num_classes=2,
        metrics=[{"name": "accuracy"}],
        trainer__monitor="max val/accuracy",
    )
    refused = run("train.py", "-c", config)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    assert "cross_entropy cannot take the model's outputs float32[64, 2] with the data's target float32[64, 1]" in (
        refused.stderr
    )
    assert not (tmp_path / "saved").exists()
