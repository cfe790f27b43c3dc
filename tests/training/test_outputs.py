"""Outputs of any shape in the tools: test.py draws image outputs as a grid of input / target / prediction (the
figures themselves: tests/training/plots/); predict.py --out writes predictions (.npy, .npz, .csv, .png) and warns in one line when an
input's range is not the one the model was trained on."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from PIL import Image

from inference.predict import range_warning, write_outputs
from tests.end_to_end.test_train import run
from training.run.figures import plots


def test_predict_writes_npy_npz_csv_and_png(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3, 2)).astype(np.float32)
    names = ["a.png", "rows.csv[0]", 'b,"c"']
    (npy,) = write_outputs(tmp_path / "o.npy", names, vectors, "regression", {"targets": ["y", "z"]})
    np.testing.assert_array_equal(np.load(npy), vectors)
    (npz,) = write_outputs(tmp_path / "o.npz", names, vectors, "regression", {})
    with np.load(npz) as saved:
        np.testing.assert_array_equal(saved["outputs"], vectors)
        assert saved["names"].tolist() == names
    (table,) = write_outputs(tmp_path / "o.csv", names, vectors, "regression", {"targets": ["y", "z"]})
    rows = list(csv.reader(table.open()))
    assert rows[0] == ["input", "y", "z"] and [r[0] for r in rows[1:]] == names
    np.testing.assert_allclose(np.array(rows[1:])[:, 1:].astype(np.float32), vectors)
    with pytest.raises(ValueError, match=r"no table row"):
        write_outputs(tmp_path / "x.csv", names, rng.normal(size=(3, 4, 4, 1)), "regression", {})
    with pytest.raises(ValueError, match=r"no image"):
        write_outputs(tmp_path / "x.png", names, vectors, "regression", {})
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x.png").exists()
    # images: one file per input; a mask's logits as probabilities, values through the training input range
    logits = np.stack([np.full((4, 6, 1), -20.0), np.full((4, 6, 1), 20.0)])
    files = write_outputs(tmp_path / "m.png", ["p", "q"], logits, "multilabel", {})
    assert [f.name for f in files] == ["m_0.png", "m_1.png"]
    assert [np.asarray(Image.open(f)).tolist() for f in files] == [[[0] * 6] * 4, [[255] * 6] * 4]
    (one,) = write_outputs(tmp_path / "r.png", ["p"], np.full((1, 4, 6, 3), 0.5), "regression", {"input_range": [0, 1]})
    assert one.name == "r.png" and np.asarray(Image.open(one)).shape == (4, 6, 3)
    assert set(np.asarray(Image.open(one)).reshape(-1).tolist()) == {128}


def test_an_input_range_far_from_the_training_one_is_one_warning():
    trained = {"input_range": [0.0, 1.0]}
    assert range_warning(np.linspace(0, 1, 10), trained) is None
    assert range_warning(np.linspace(-0.5, 1.5, 10), trained) is None  # new data may go a little beyond
    line = range_warning(np.linspace(0, 255, 10), trained)
    assert "0..255" in line and "trained on 0..1" in line and "\n" not in line
    assert range_warning(np.linspace(0, 255, 10), {}) is None  # a run that recorded none


@pytest.mark.slow
def test_image_to_image_run_in_test_py_and_predict_py(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((48, 8, 8, 1)).astype(np.float32)  # images of 0..1, the model reconstructs them
    np.savez(tmp_path / "images.npz", x=x)
    data = {"path": str(tmp_path / "images.npz"), "input": "x", "target": None, "test_fraction": 0.25}
    config = {
        "name": "denoise",
        "model": {"name": "mnist_segmenter", "args": {"channels": [4, 8]}},
        "loss": {"name": "mse"},
        "metrics": [],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {
            s: {"name": "arrays", "args": {**data, "split": s, "batch_size": 16}} for s in ("train", "test")
        },
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "monitor": "min train/loss"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    trained = run("train.py", "-c", tmp_path / "config.json", "--run-id", "r")
    assert trained.returncode == 0, trained.stderr
    run_dir = tmp_path / "saved" / "denoise" / "r"
    lo, hi = json.loads((run_dir / "preprocessing.json").read_text())["input_range"]
    assert 0 <= lo < hi <= 1
    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    if plots() is not None:  # the grid is training/plots/' (a project may leave it out)
        assert re.search(r"predictions\.png \(input / target / prediction of the first 8 of 12 e", tested.stdout)
        width, height = Image.open(run_dir / "predictions.png").size
    assert width < height  # three columns, eight rows

    exported = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "d", "--output-dir", tmp_path / "out", "--formats",
        "onnx",
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    model = tmp_path / "out" / "d" / "d.onnx"
    np.save(tmp_path / "x.npy", x[:3])
    predicted = run("inference/predict.py", model, tmp_path / "x.npy", "--out", tmp_path / "p.npy")
    assert predicted.returncode == 0 and not predicted.stderr, predicted.stderr
    assert np.load(tmp_path / "p.npy").shape == (3, 8, 8, 1)
    predicted = run("inference/predict.py", model, tmp_path / "x.npy", "--out", tmp_path / "p.png")
    assert predicted.returncode == 0, predicted.stderr
    assert [Image.open(tmp_path / f"p_{i}.png").size for i in range(3)] == [(8, 8)] * 3
    # a PNG is 0..255: the model was trained on 0..1, which predict.py says in one line
    Image.fromarray((x[0, :, :, 0] * 255).astype(np.uint8)).save(tmp_path / "in.png")
    predicted = run("inference/predict.py", model, tmp_path / "in.png")
    assert predicted.returncode == 0, predicted.stderr
    (line,) = predicted.stderr.splitlines()
    assert line.startswith("warning: the inputs range over") and "trained on" in line
    refused = run("inference/predict.py", model, tmp_path / "x.npy", "--out", tmp_path / "p.txt")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --out")
    # images in a .csv: refused before any prediction is printed, nothing written
    refused = run("inference/predict.py", model, tmp_path / "x.npy", "--out", tmp_path / "p.csv")
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert not (tmp_path / "p.csv").exists()
