"""utils.fit: a config trained from Python, as a notebook would, returns the rows train.py logs, with the numbers of
the same config trained by train.py."""

from __future__ import annotations

import json

import pytest

from tests.test_train import data_dir, make_config, run  # noqa: F401
from training.files import LATEST, METRICS
from utils import ConfigError, fit


@pytest.mark.slow
def test_fit_from_python_gives_train_py_s_rows(tmp_path, data_dir):
    path = make_config(tmp_path, data_dir)
    rows = fit(json.loads(path.read_text()), run_dir=tmp_path / "notebook")
    assert [row["epoch"] for row in rows] == [1, 2]
    assert {"train/loss", "train/accuracy", "val/loss", "val/accuracy", "lr"} <= set(rows[-1])
    assert (tmp_path / "notebook" / LATEST).is_file()

    assert run("train.py", "-c", path, "--run-id", "cli").returncode == 0
    logged = [json.loads(line) for line in (tmp_path / "saved/tiny/cli" / METRICS).read_text().splitlines()]
    for ours, theirs in zip(rows, logged, strict=True):
        for key in ("train/loss", "val/loss", "val/accuracy", "lr"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), key


def test_fit_refuses_a_bad_config_before_reading_data(tmp_path):
    with pytest.raises(ConfigError, match="config: model.name: unknown model 'mlpp'"):
        fit(
            {
                "name": "t",
                "model": {"name": "mlpp"},
                "loss": {"name": "cross_entropy"},
                "optimizer": {"name": "adam", "args": {"lr": 0.01}},
                "data_loader": {"train": {"name": "mnist", "args": {"data_dir": str(tmp_path / "none")}}},
            },
            run_dir=tmp_path / "never",
        )
    assert not (tmp_path / "never").exists()
