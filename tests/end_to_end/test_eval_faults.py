"""test.py when its inputs or its output folder fail: one `error:` line, no traceback. Bad input (checkpoint, config,
--out) exits 2 before anything is evaluated; a file that cannot be written after the results were printed exits 1."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from tests.conftest import make_idx_dataset
from training.config.components import build
from training.config.validation import load_config
from training.run import checkpoint
from training.run.figures import plots

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_template(tmp_path_factory):
    """A run folder (config.json, model_best.params of an untrained MLP) over tiny MNIST-format data."""
    root = tmp_path_factory.mktemp("eval")
    make_idx_dataset(root / "mnist", n_train=40, n_test=20)
    loader = {"name": "mnist", "args": {"data_dir": str(root / "mnist"), "verify": False, "validation_size": 10}}
    config = {
        "name": "tiny",
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [8]}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {
            "train": {**loader, "args": {**loader["args"], "split": "train"}},
            "test": {**loader, "args": {**loader["args"], "split": "test"}},
        },
        "trainer": {"epochs": 1, "monitor": "off", "save_dir": str(root / "saved")},
    }
    run = root / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config))
    model = build(load_config(run / "config.json")["model"], "model")
    params, state = model.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    checkpoint.save(run / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 2})
    return run


@pytest.fixture
def run_dir(run_template, tmp_path):
    """A copy of the run folder that a test may damage."""
    return Path(shutil.copytree(run_template, tmp_path / "run"))


def evaluate(capsys, *args) -> tuple[int, str, str]:
    """test.py in this process: (exit status, stdout, the one stderr line it must print when it fails)."""
    spec = importlib.util.spec_from_file_location("test_script", ROOT / "test.py")  # "test" is a stdlib package
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    try:
        status = script.main([str(a) for a in args])
    except SystemExit as stop:
        status = stop.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) <= 1, err
    return status, out, lines[0] if lines else ""


def test_a_good_run_writes_its_files(run_dir, capsys):
    status, out, err = evaluate(capsys, "--run", run_dir)
    assert (status, err) == (0, "") and "accuracy" in out
    assert (run_dir / "per_class.csv").is_file()
    assert plots() is None or (run_dir / "confusion_matrix.png").is_file()  # training/plots/ draws it


def test_a_folder_where_a_file_goes_is_refused_before_the_evaluation(run_dir, capsys):
    (run_dir / "per_class.csv").mkdir()  # as a link or a pipe would be: nothing is written in its place
    status, out, err = evaluate(capsys, "--run", run_dir)
    assert status == 2 and out == ""  # refused before anything was evaluated
    assert err.startswith(f"error: {run_dir / 'per_class.csv'}: a folder stands where a regular file"), err
    (run_dir / "per_class.csv").rmdir()


def test_a_read_only_output_folder_exits_1_after_the_results(run_dir, tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode:
        pytest.skip(
            f"cannot mount a read-only tmpfs here ({mounted.stderr.decode().strip() or 'no permission'}); "
            "the directory case above covers the same path"
        )
    try:
        status, out, err = evaluate(capsys, "--run", run_dir, "--out", disk / "figures")
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert status == 1 and "accuracy" in out
    assert err.startswith(f"error: cannot write {disk / 'figures'} (Read-only file system)"), err


def test_out_under_a_regular_file_is_refused_before_evaluating(run_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    status, out, err = evaluate(capsys, "--run", run_dir, "--out", tmp_path / "file" / "figures")
    assert (status, out) == (2, "")
    assert err == f"error: --out {tmp_path / 'file' / 'figures'}: {tmp_path / 'file'} is a file, not a folder"


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_checkpoint_is_one_line(run_dir, capsys, damage):
    path = run_dir / "model_best.params"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x07" * 64, "empty": b""}[damage])
    status, out, err = evaluate(capsys, "--run", run_dir)
    assert (status, out) == (2, "") and err.startswith(f"error: {path}:"), err


def test_missing_or_unreadable_config_and_checkpoint_are_one_line(run_dir, tmp_path, capsys):
    status, _, err = evaluate(capsys, "--run", tmp_path / "nothing")
    assert status == 2 and err == f"error: {tmp_path / 'nothing'}: no such checkpoint file"
    (run_dir / "config.json").unlink()
    status, _, err = evaluate(capsys, "--run", run_dir)
    assert status == 2 and err.startswith(f"error: {run_dir / 'config.json'}: no such file; give the run's config")
    (run_dir / "config.json").mkdir()
    status, _, err = evaluate(capsys, "--run", run_dir)
    assert status == 2 and err.startswith(f"error: {run_dir / 'config.json'}: "), err  # a folder
