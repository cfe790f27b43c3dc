"""Where one `error:` line is promised and a traceback came instead: a loss that cannot take the data's targets (named
targets for a loss of one, labels (B, 1) against two logits) refused before the run folder exists; ``fit``'s run_dir
that is no folder; a vocabulary or class names of another model; complex input to predict.py; a command started
with stdout closed or writing to a full disk. Each on tiny data built here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import sample
from inference import predict
from tests.end_to_end.test_train import ROOT, run
from tests.end_to_end.test_untrusted_inputs import one_line, tiny_onnx
from training.config.components import build
from training.config.file import ConfigError
from training.config.validation import load_config
from training.run import checkpoint
from utils import fit

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20


def csv_config(folder: Path, **changes) -> dict:
    """A regression CSV of two features and one target column, as a config dict (loss and model changeable)."""
    rng = np.random.default_rng(0)
    rows = [f"{rng.normal():.3f},{rng.normal():.3f},{int(rng.integers(0, 2))}" for _ in range(60)]
    (folder / "rows.csv").write_text("a,b,y\n" + "\n".join(rows) + "\n")
    split = {"path": str(folder / "rows.csv"), "targets": ["y"], "batch_size": 8}
    config = {
        "name": "rows",
        "seed": 0,
        "model": {"name": "mlp", "args": {"num_classes": 1, "hidden": [4]}},
        "loss": {"name": "mse"},
        "metrics": [],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {s: {"name": "csv", "args": {**split, "split": s}} for s in ("train", "validation")},
        "trainer": {"epochs": 1, "save_dir": str(folder / "saved"), "monitor": "min val/loss"},
    }
    for key, value in changes.items():
        section, name = key.split("__")
        config[section] = {**config[section], name: value}
    return config


# ------------------------------------------------------------------------- a loss that cannot take the data's targets
def test_cross_entropy_on_a_regression_csv_is_refused_before_the_run_folder(tmp_path):
    """Before: the shape check passed (the CSV declares regression), the run folder was written, and the first step
    raised "labels of shape (8, 1) fit neither class ids nor probabilities" as a traceback."""
    config = csv_config(tmp_path, loss__name="cross_entropy")
    config["model"]["args"]["num_classes"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run("train.py", "-c", tmp_path / "config.json", timeout=120)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "error: config.json: loss: cross_entropy cannot take the model's outputs float32[8, 2] with the data's "
        "target float32[8, 1] (labels of shape (8, 1) fit neither class ids nor probabilities for logits of shape "
        "(8, 2))"
    ], result.stderr
    assert not (tmp_path / "saved").exists()
    # a metric that cannot take them is named by its place
    config = csv_config(tmp_path)
    config["metrics"] = [{"name": "mae"}, {"name": "perplexity"}]
    with pytest.raises(ConfigError, match=r"^config: metrics.1: perplexity cannot take the model's outputs float32"):
        fit(config, run_dir=tmp_path / "never")
    assert not (tmp_path / "never").exists()


# ---------------------------------------------------------------------------------------- fit(run_dir=...) not a folder
def test_fit_refuses_a_run_dir_that_is_no_folder(tmp_path):
    """Before: FileExistsError, NotADirectoryError or FileNotFoundError tracebacks (after reading the data), where a
    folder holding a run got a ConfigError; a link to an empty folder was trained through."""
    config = csv_config(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "to_file").symlink_to(tmp_path / "file")
    (tmp_path / "to_nothing").symlink_to(tmp_path / "nothing")
    (tmp_path / "to_folder").symlink_to(tmp_path / "empty")
    cases = {
        "file": "a file; give a new or empty folder",
        "to_file": "a symbolic link (to ",
        "to_nothing": "which does not exist), not a folder",
        "to_folder": "a symbolic link (to ",
        "file/sub": f"not a folder it can be made in ({tmp_path / 'file'} is a file)",
        "/proc/x": "/proc/x: cannot make the folder",
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    for name, message in cases.items():
        with pytest.raises(ConfigError) as error:
            fit(config, run_dir=tmp_path / name)
        assert str(error.value).startswith("fit: run_dir ") and message in str(error.value), (name, error.value)
        assert "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not any((tmp_path / "empty").iterdir())
    with pytest.raises(ConfigError, match="give the run folder to continue"):
        fit(config, resume=True)


# ------------------------------------------------------------------- names of another model (sample.py, predict.py)
@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    """A character model's run folder (random weights, no training): config.json, model_best.params and the text,
    with a train and a validation split."""
    root = tmp_path_factory.mktemp("lm")
    (root / "input.txt").write_text(TEXT)
    config = load_config(ROOT / "configs" / "shakespeare_char.json")
    loader = {"name": "char_text", "args": {"path": str(root / "input.txt"), "context": 8, "batch_size": 4}}
    config["model"]["args"].update(vocab_size=len(set(TEXT)), context=8, dim=8, depth=1, num_heads=1)
    config["data_loader"] = {s: {**loader, "args": {**loader["args"], "split": s}} for s in ("train", "validation")}
    config["trainer"].update(save_dir=str(root / "saved"))
    config["optimizer"]["schedule"]["args"]["warmup_steps"] = 1
    (root / "config.json").write_text(json.dumps(config))
    model = build(load_config(root / "config.json")["model"], "model")
    params, state = model.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, 8), np.int32))
    checkpoint.save(root / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 1})
    return root


def test_sample_refuses_a_vocabulary_of_another_model(lm_run, tmp_path, capsys):
    """Before: IndexError from the generator, mid-text, for ids past the 2 characters."""
    (lm_run / "preprocessing.json").write_text(json.dumps({"vocabulary": "ab"}))
    try:
        line = one_line(capsys, sample.main, "--run", lm_run, "--prompt", "ab", "--tokens", "20")
    finally:
        (lm_run / "preprocessing.json").unlink()
    assert line == (
        f"error: {lm_run / 'preprocessing.json'}: a vocabulary of 2 characters, but the model gives {len(set(TEXT))} "
        "outputs per position (one per character): is this preprocessing.json the run's own?"
    )
    (lm_run / "preprocessing.json").write_text(json.dumps({"vocabulary": "".join(sorted(set(TEXT)))}))
    try:
        assert sample.main(["--run", str(lm_run), "--prompt", "Fi", "--tokens", "5"]) == 0
    finally:
        (lm_run / "preprocessing.json").unlink()
    assert capsys.readouterr().out.startswith("Fi")


@pytest.fixture
def export(tmp_path) -> Path:
    folder = tmp_path / "export"
    folder.mkdir()
    tiny_onnx(folder / "tiny.onnx")  # (batch, 4) -> 3 logits
    np.save(folder / "x.npy", np.ones((2, 4), np.float32))
    return folder


@pytest.mark.parametrize(
    "preprocessing, message",
    [
        ({"classes": ["only one"]}, "1 class name(s), but the model gives 3 outputs per example"),
        ({"task": "multilabel", "classes": ["a", "b", "c", "d"]}, "4 class name(s), but the model gives 3 outputs"),
        ({"task": "sequence", "vocabulary": "ab"}, "a vocabulary of 2 characters, but the model gives 3 outputs"),
    ],
)
def test_predict_refuses_names_of_another_model(export, capsys, preprocessing, message):
    """Before: IndexError (list index out of range) while describing the first input."""
    (export / "preprocessing.json").write_text(json.dumps(preprocessing))
    line = one_line(capsys, predict.main, export / "tiny.onnx", export / "x.npy")
    assert line == f"error: {export / 'preprocessing.json'}: {message}" + line.split(message, 1)[1]


def test_predict_refuses_complex_input(export, capsys):
    """Before: the imaginary part dropped with a ComplexWarning, and the real part predicted as if it were all."""
    np.save(export / "c.npy", np.full((2, 4), 1 + 2j, np.complex64))
    line = one_line(capsys, predict.main, export / "tiny.onnx", export / "c.npy")
    assert line == "error: input 'input': complex numbers; the model takes real numbers (float32)"
    np.savez(export / "s.npz", input=np.array([["a", "b", "c", "d"]]))
    line = one_line(capsys, predict.main, export / "tiny.onnx", export / "s.npz")
    assert line == "error: input 'input': values of dtype <U1; the model takes real numbers (float32)"


# ----------------------------------------------------------------------------------- stdout closed or on a full disk
def redirected(*args, stream: str = ">&-") -> subprocess.CompletedProcess:
    """`python ARGS` started as a shell starts it with `stream` (">&-": stdout closed; "> /dev/full"), the rest of
    its output captured."""
    return subprocess.run(
        ["bash", "-c", f'exec "$@" {stream}', "bash", sys.executable, *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_train_py_with_stdout_closed_is_one_line(tmp_path):
    """Before: AttributeError: 'NoneType' object has no attribute 'flush' (the platform defaults' re-execution)."""
    (tmp_path / "config.json").write_text(json.dumps(csv_config(tmp_path)))
    for stream, said in ((">&-", "stderr"), ("2>&-", "stdout")):  # the line goes where it can
        result = redirected("train.py", "-c", tmp_path / "config.json", stream=stream)
        assert result.returncode == 2 and getattr(result, said).splitlines() == [
            f"error: {'stdout' if said == 'stderr' else 'stderr'} closed (>&-): give it a file or /dev/null "
            "(>/dev/null) instead"
        ], result
        assert not (tmp_path / "saved").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_test_py_writing_to_a_full_disk_is_one_line(lm_run, tmp_path):
    """Before: OSError: [Errno 28] No space left on device, a traceback from the first print."""
    result = redirected("test.py", "--run", lm_run, "--out", tmp_path / "out", stream="> /dev/full")
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        "error: cannot write to standard output (No space left on device); what the command printed is lost"
    ]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_predict_py_with_stdout_closed_or_full_is_one_line(export):
    """predict.py ships alone with its own copy of `command`: the same two endings."""
    args = ("inference/predict.py", export / "tiny.onnx", export / "x.npy")
    full = redirected(*args, stream="> /dev/full")
    assert full.returncode == 1 and full.stderr.splitlines() == [
        "error: cannot write to standard output (No space left on device); what was printed is lost"
    ], full.stderr
    closed = redirected(*args)
    assert closed.returncode == 2 and closed.stderr.splitlines() == [
        "error: stdout closed (>&-): give it a file or /dev/null (>/dev/null) instead"
    ], closed.stderr
