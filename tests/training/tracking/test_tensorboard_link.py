"""A run folder's `tensorboard/` that is a link to elsewhere (a run folder handed over by someone else): the resume
is refused in one line (exit 2) and nothing is written where the link points; the tracker never follows one
(issue 48, item 8)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from tests.end_to_end.test_train import data_dir, make_config, run  # noqa: F401  (data_dir is a fixture)
from training.tracking.trackers import start_tensorboard

pytest.importorskip("tensorboardX")


def test_a_resume_refuses_a_linked_tensorboard_folder(tmp_path, data_dir):  # noqa: F811
    path = make_config(tmp_path, data_dir, trainer__epochs=1)
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "tensorboard": {"enabled": True}}))
    assert (result := run("train.py", "-c", path, "--run-id", "r")).returncode == 0, result.stderr
    folder = tmp_path / "saved" / "tiny" / "r"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(folder / "tensorboard")
    (folder / "tensorboard").symlink_to(elsewhere)
    result = run("train.py", "-r", folder / "checkpoint-latest.params", "--epochs", 2)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(folder / "tensorboard") in lines[0] and "symbolic link" in lines[0], lines[0]
    assert list(elsewhere.iterdir()) == []


def test_the_tracker_never_writes_through_a_linked_folder(tmp_path, caplog):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="train"):
        assert start_tensorboard({"name": "x"}, tmp_path / "run") is None
    assert "not a folder" in caplog.text and list(elsewhere.iterdir()) == []
