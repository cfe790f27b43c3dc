"""How a run reports itself: its last line (the best value rounded, checkpoints named only when there are some), the
evaluated weights of an ema run in the console and in test.py, and a
--fast-dev-run that names no file of the folder it removes."""

from __future__ import annotations

import re
from argparse import Namespace
from pathlib import Path

import pytest

from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import make_config, run
from train import done_line


def test_the_last_line_rounds_the_best_value_and_names_checkpoints_only_when_written(tmp_path):
    plain = Namespace(overfit_batches=None)
    assert done_line("max val/accuracy", 0.9905999898910522, tmp_path, plain) == (
        f"done: best max val/accuracy = 0.9906; no checkpoint written (the run's files are in {tmp_path})"
    )
    (tmp_path / "model_best.params").write_bytes(b"")
    assert done_line("min val/loss", 1.2345678e-5, tmp_path, plain) == (
        f"done: best min val/loss = 1.23457e-05; checkpoints in {tmp_path}"
    )
    assert done_line("off", None, tmp_path, plain) == f"done: checkpoints in {tmp_path}"
    overfit = done_line("min val/loss", 0.001, tmp_path, Namespace(overfit_batches=2))
    assert overfit.endswith("; an --overfit-batches check: remove the folder when done")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=200, n_test=60)
    return folder


def test_a_fast_dev_run_names_no_file_of_the_folder_it_removes(tmp_path, data_dir):
    result = run("train.py", "-c", make_config(tmp_path, data_dir), "--fast-dev-run")
    assert result.returncode == 0, result.stderr
    folder = re.search(r"\(in (\S+), removed at the end\)", result.stdout).group(1)
    assert not Path(folder).exists()
    named = [line for line in result.stdout.splitlines() if folder in line]
    assert named and all("removed at the end" in line for line in named), named


@pytest.mark.slow
def test_an_ema_run_says_which_weights_it_evaluates(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, callbacks=[{"name": "ema", "args": {"decay": 0.9}}], trainer__epochs=1)
    trained = run("train.py", "-c", config, "--run-id", "e")
    assert trained.returncode == 0, trained.stderr
    assert "weights: evaluation, model_best, test.py and the export use ema's parameters" in trained.stdout
    value = re.search(r"done: best max val/accuracy = (\S+); checkpoints in ", trained.stdout).group(1)
    assert 0 <= float(value) <= 1 and len(value.removeprefix("0.")) <= 6, value  # six significant digits at most
    tested = run("test.py", "--run", tmp_path / "saved" / "tiny" / "e")
    assert tested.returncode == 0, tested.stderr
    assert "  weights: callbacks.ema.params (the run evaluated these, not the trained parameters)" in tested.stdout


@pytest.mark.slow
def test_an_lr_finder_run_that_stops_says_no_checkpoint_was_written(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, callbacks=[{"name": "lr_finder", "args": {"steps": 5}}])
    result = run("train.py", "-c", config, "--run-id", "f")
    assert result.returncode == 0, result.stderr
    last = [line for line in result.stdout.splitlines() if "done" in line][-1]
    assert "no checkpoint written" in last and "checkpoints in" not in last
