"""predict.py's side of tabular data and thresholds, without a model: raw CSV rows prepared by the recorded
preprocessing, the decision threshold read from a config, --out files of probabilities and labels; and the export's
multi-label decisions at that threshold."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from data_loader.sources.tabular import CsvDataset, split_rows
from inference.exporter import Source, agreement, quality, write_extras
from inference.inputs import Inputs
from inference.predict import decision_threshold, load_rows, read_preprocessing, write_outputs
from inference.routes import OUTPUT_NAME

RECORDED = {
    "features": ["plan", "age"],
    "columns": {
        "plan": {"categories": ["basic", "pro"], "missing": "constant", "fill": "basic"},
        "age": {"missing": "median", "fill": 40.0, "indicator": True},
    },
    "mean": [0.0, 0.0, 40.0, 0.0],
    "std": [1.0, 1.0, 10.0, 1.0],
}


def test_raw_rows_are_filled_encoded_and_scaled(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("age,extra,plan\n50,x,pro\n,y,\n30,z,gold\n")
    warnings = []
    got = load_rows(path, RECORDED, warnings)
    np.testing.assert_allclose(got, [[0, 1, 1, 0], [1, 0, 0, 1], [0, 0, -1, 0]])
    assert warnings == [
        f"{path}: column 'plan': 'gold' not among the training categories (basic, pro): encoded as none of them"
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("plan\npro\n", r"no column 'age'; expected the columns \['plan', 'age'\]"),
        ("plan,age\npro,old\n", "row 1, column 'age': 'old', not a finite number"),
        ("plan,age\npro\n", "row 1 has 1 cells, the header has 2 columns"),
    ],
)
def test_bad_rows_are_one_error(tmp_path, text, message):
    path = tmp_path / "rows.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_rows(path, RECORDED)
    unfilled = {**RECORDED, "columns": {"plan": RECORDED["columns"]["plan"]}, "mean": [0, 0, 0], "std": [1, 1, 1]}
    path.write_text("plan,age\npro,\n")
    with pytest.raises(ValueError, match="row 1, column 'age': an empty cell, which training never filled"):
        load_rows(path, unfilled)


def identity_onnx(path: Path, width: int) -> Path:
    """An ONNX model whose outputs are its inputs: what predict.py prints and writes is what it fed the model."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], [OUTPUT_NAME])],
        "identity",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", width])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_an_export_folder_alone_encodes_raw_rows_exactly_as_the_loader(tmp_path):
    """The export's predict.py and the csv_cells.py beside it, in a folder outside the template run by an interpreter
    that cannot import the template: the loader's test split from raw rows (empty cells filled, categories one-hot,
    one the train split never had, indicators), bit for bit. Unstandardised: predict.py standardises in float32,
    the loader in float64 (equal to 1e-6, test_samples_churn.py)."""
    rng = np.random.default_rng(0)
    lines = ["plan,age,fee,y"]
    for i in range(60):
        plan = ["basic", "pro", "", "family"][i % 4]
        age = "" if i % 5 == 0 else f"{rng.normal(40, 10):.4f}"
        lines.append(f"{plan},{age},{rng.normal():.6e},{i % 3}")
    test_rows = split_rows(60, 0.2, 0.3, 0)["test"]
    lines[1 + test_rows[0]] = "gold,,1.5,1"  # a category the train split never had, an empty number
    path = tmp_path / "data.csv"
    path.write_text("\n".join(lines) + "\n")
    columns = {
        "plan": {"categorical": True, "missing": "most_frequent", "indicator": True},
        "age": {"missing": "median", "indicator": True},
    }
    data = CsvDataset(
        path, "y", split="test", validation_fraction=0.2, test_fraction=0.3, standardize=False, columns=columns
    )
    folder = tmp_path / "elsewhere" / "export"
    folder.mkdir(parents=True)
    width = data.inputs.shape[1]
    report = {"formats": [], "task": "regression", "validation": None, "validation_skipped": "a test", "fixed_axes": {}}
    inputs = Inputs(jax.ShapeDtypeStruct((1, width), np.float32), 1)
    write_extras(folder, report, inputs, "regression", Source({}, Path("unused"), data.preprocessing))
    identity_onnx(folder / "identity.onnx", width)
    raw = tmp_path / "elsewhere" / "raw.csv"
    raw.write_text("\n".join([lines[0]] + [lines[1 + i] for i in test_rows]) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, folder / "predict.py", folder / "identity.onnx", raw, "--out", "out.npy"],
        cwd=folder.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "'gold' not among the training categories" in done.stderr
    got = np.load(folder.parent / "out.npy")
    assert got.dtype == data.inputs.dtype and got.tobytes() == data.inputs.tobytes()


def test_a_bad_columns_record_is_refused(tmp_path):
    path = tmp_path / "preprocessing.json"
    path.write_text(json.dumps({"columns": {"plan": {"categories": [1, 2]}}}))
    with pytest.raises(ValueError, match="'columns' is .* expected an object of column name"):
        read_preprocessing(path)
    path.write_text(json.dumps(RECORDED))
    assert read_preprocessing(path) == RECORDED


def test_the_decision_threshold_is_the_first_a_metric_names():
    assert decision_threshold({}) == (0.5, "the default")
    metrics = [{"name": "roc_auc"}, {"name": "binary_accuracy", "args": {"threshold": 0.3}}]
    metrics.append({"name": "multilabel_f1", "args": {"threshold": 0.7}})
    assert decision_threshold({"metrics": metrics}) == (0.3, "metrics.1.args.threshold")


def test_out_holds_probabilities_and_labels(tmp_path):
    logits = np.array([[2.0, -1.0], [-3.0, 0.1]], np.float32)
    names = ["a", "b"]
    prep = {"targets": ["churn", "upgrade"]}
    (table,) = write_outputs(tmp_path / "o.csv", names, logits, "multilabel", prep, 0.6)
    rows = list(csv.reader(table.open()))
    assert rows[0] == ["input", "churn probability", "upgrade probability", "churn", "upgrade"]
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    np.testing.assert_allclose(np.array([r[1:3] for r in rows[1:]], float), p, rtol=1e-7)
    assert [r[3:] for r in rows[1:]] == [["1", "0"], ["0", "0"]]  # sigmoid(0.1) = 0.525 is under 0.6
    (npz,) = write_outputs(tmp_path / "o.npz", names, logits, "multilabel", prep, 0.5)
    with np.load(npz) as saved:
        assert saved["labels"].tolist() == [[1, 0], [0, 1]] and float(saved["threshold"]) == 0.5
        np.testing.assert_array_equal(saved["outputs"], logits)
    (classes,) = write_outputs(tmp_path / "c.csv", names, logits, "classification", {"classes": ["no", "yes"]})
    rows = list(csv.reader(classes.open()))
    assert rows[0] == ["input", "no probability", "yes probability", "predicted"]
    assert [r[-1] for r in rows[1:]] == ["no", "yes"]
    np.testing.assert_allclose(np.array([r[1:3] for r in rows[1:]], float).sum(1), 1.0, rtol=1e-7)


def test_the_export_decides_labels_at_the_threshold():
    logits = np.array([[-0.2], [0.2], [1.0]])  # probabilities 0.45, 0.55, 0.73
    targets = np.array([[1.0], [0.0], [1.0]])
    assert quality("multilabel", logits, targets, None) == pytest.approx(1 / 3)  # at 0.5: the signs
    assert quality("multilabel", logits, targets, None, 0.4) == pytest.approx(2 / 3)
    assert quality("multilabel", logits, targets, None, 0.6) == pytest.approx(2 / 3)
    nudged = logits + np.array([[0.0], [0.0], [-0.7]])  # 0.3 = probability 0.57: between 0.5 and 0.6
    assert agreement("multilabel", nudged, logits, None) == 1.0
    assert agreement("multilabel", nudged, logits, None, 0.6) == pytest.approx(2 / 3)
