"""What test.py and predict.py print, run as a user runs them: metrics of one value per class or label (an average
of "none"), tables of long class names, and a multi-label model's predicted labels."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.end_to_end.test_train import run
from training.config.components import build
from training.config.validation import load_config
from training.run import checkpoint

LABELS = ["T-shirt/top", "Trouser", "Ankle boot", "Bag", "Sneaker"]


def arrays_config(folder: Path, loss: str, metrics: list, target: np.ndarray) -> Path:
    """A run on 120 rows of 6 features whose labels or classes follow the features, named as LABELS."""
    x = np.random.default_rng(0).standard_normal((120, 6)).astype(np.float32)
    np.savez(folder / "data.npz", x=x, y=target(x))
    split = {
        "path": str(folder / "data.npz"),
        "input": "x",
        "target": "y",
        "test_fraction": 0.2,
        "classes": LABELS,
        "batch_size": 16,
    }
    config = {
        "name": "reports",
        "seed": 0,
        "model": {"name": "mlp", "args": {"num_classes": 5, "hidden": [16]}},
        "loss": {"name": loss},
        "metrics": metrics,
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {s: {"name": "arrays", "args": {**split, "split": s}} for s in ("train", "validation", "test")},
        "trainer": {"epochs": 3, "save_dir": str(folder / "saved"), "monitor": "min val/loss"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "config.json"


def trained(folder: Path, *args) -> Path:
    result = run("train.py", "-c", arrays_config(folder, *args), "--run-id", "r")
    assert result.returncode == 0, result.stderr
    return folder / "saved" / "reports" / "r"


@pytest.mark.slow
def test_per_class_table_and_vector_metrics_keep_long_class_names_aligned(tmp_path):
    run_dir = trained(
        tmp_path,
        "cross_entropy",
        [{"name": "accuracy"}, {"name": "f1", "args": {"average": "none"}}],
        lambda x: x[:, :5].argmax(1),
    )
    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    lines = tested.stdout.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("per class:"))) + 1 :][: 1 + len(LABELS)]
    assert [row.split()[0] for row in table[1:]] == [name.split()[0] for name in LABELS]
    # every column starts where its header does, whatever the length of the names
    column = table[0].index("precision")
    assert all(row[column - 1] == " " and row[column : column + 9].strip() for row in table[1:]), table
    matrix = lines[lines.index("confusion matrix (rows: true class, columns: predicted):") + 1 :][1 : 1 + len(LABELS)]
    assert [row.strip().startswith(name) for row, name in zip(matrix, LABELS)] == [True] * len(LABELS)
    assert len({len(row) for row in matrix}) == 1, matrix
    # f1 with average "none": one value per class, named, as metrics.jsonl has it
    per_class = lines[lines.index("  f1_per_class:") + 1 :][: len(LABELS)]
    assert [row.split()[0] for row in per_class] == [name.split()[0] for name in LABELS]
    assert all(0.0 <= float(row.split()[-1]) <= 1.0 for row in per_class)


@pytest.mark.slow
def test_multilabel_vector_metrics_in_test_py_and_predicted_labels_in_predict_py(tmp_path):
    run_dir = trained(
        tmp_path,
        "binary_cross_entropy",
        [{"name": "binary_accuracy"}, {"name": "multilabel_f1", "args": {"average": "none"}}],
        lambda x: (x[:, :5] > 0.3).astype(np.float32),
    )
    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert len(last["val/multilabel_f1_per_label"]) == len(LABELS)
    lines = tested.stdout.splitlines()
    shown = lines[lines.index("  multilabel_f1_per_label:") + 1 :][: len(LABELS)]
    assert [row.rsplit(None, 1)[0].strip() for row in shown] == LABELS

    exported = run(
        "inference/convert_tflite.py",
        "--run",
        run_dir,
        "--name",
        "ml",
        "--output-dir",
        tmp_path / "out",
        "--formats",
        "onnx",
    )
    assert exported.returncode == 0, exported.stderr
    x = np.load(tmp_path / "data.npz")["x"][:6]
    np.save(tmp_path / "x.npy", x)
    model = build(load_config(run_dir / "config.json")["model"], "model")
    template = jax.eval_shape(lambda: dict(zip(("params", "state"), model.init(jax.random.PRNGKey(0), x))))
    tree, _ = checkpoint.restore(run_dir / "model_best.params", template, only=("params", "state"))
    positive = np.asarray(model(tree["params"], tree["state"], x)[0]) > 0
    for top, listed in ((None, len(LABELS)), ("1", None)):
        predicted = run(
            "inference/predict.py", tmp_path / "out/ml/ml.onnx", tmp_path / "x.npy", *(("--top", top) if top else ())
        )
        assert predicted.returncode == 0, predicted.stderr
        rows = [line.split(": ", 1)[1] for line in predicted.stdout.splitlines() if "x.npy[" in line]
        for row, want in zip(rows, positive):
            said, _, others = row.partition("; below 0.5: ")
            names = (
                []
                if said == "predicted: none"
                else [n.rsplit(" (", 1)[0] for n in said.removeprefix("predicted: ").split(", ")]
            )
            # every label above 0.5, however many (never cut by --top), and --top N of the others
            assert sorted(names) == sorted(LABELS[i] for i in np.flatnonzero(want)), row
            rest = others.split(", ") if others else []
            assert len(rest) == (len(LABELS) - len(names) if listed else min(1, len(LABELS) - len(names))), row
