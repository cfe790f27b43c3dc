"""utils.fit: a config trained from Python, as a notebook would, returns the rows train.py logs, with the numbers of
the same config trained by train.py."""

from __future__ import annotations

import json

import pytest

from files.writes import LATEST, METRICS
from tests.end_to_end.test_train import data_dir, make_config, run  # noqa: F401
from training.config.file import ConfigError
from utils import fit


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


@pytest.mark.slow
def test_each_fit_is_a_complete_run_folder_that_the_tools_take(tmp_path, data_dir, capsys):
    config = json.loads(make_config(tmp_path, data_dir, trainer__epochs=1).read_text())
    fit(config)
    fit(config)
    folders = sorted((tmp_path / "saved" / "tiny").iterdir())
    assert len(folders) == 2  # a new folder per call, named as train.py names them
    for folder in folders:
        assert {"config.json", "preprocessing.json", "metrics.jsonl", "model", LATEST} <= {
            p.name for p in folder.iterdir()
        }
        assert len((folder / METRICS).read_text().splitlines()) == 1  # never another call's epochs
    printed = capsys.readouterr().out  # the epoch lines train.py prints, in a process that set up no logging
    assert printed.count("epoch 1/1") == 2 and "run folder: " in printed
    tested = run("test.py", "--run", folders[0])
    assert tested.returncode == 0, tested.stderr
    # a folder that holds a run is continued only when asked
    with pytest.raises(ConfigError, match="already holds a run; fit\\(..., resume=True\\) continues it"):
        fit(config, run_dir=folders[0])
    rows = fit({**config, "trainer": {**config["trainer"], "epochs": 2}}, run_dir=folders[0], resume=True)
    assert [row["epoch"] for row in rows] == [2]
    assert len((folders[0] / METRICS).read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_component_registered_in_a_notebook_is_refused_by_the_tools_in_one_line(tmp_path, data_dir, monkeypatch):
    from model import registry
    from model.model import mlp

    def notebook_net(num_classes: int = 10):
        return mlp(num_classes, hidden=(16,))

    notebook_net.__module__ = "__main__"  # what a function defined in a notebook's cell has
    monkeypatch.setitem(registry._REGISTERED["model"], "notebook_net", registry.Entry(notebook_net))
    config = json.loads(make_config(tmp_path, data_dir, trainer__epochs=1).read_text())
    config["model"] = {"name": "notebook_net"}
    fit(config, run_dir=tmp_path / "nb")
    assert json.loads((tmp_path / "nb" / "notebook.json").read_text()) == {
        "registered_in_notebook": {"model": ["notebook_net"]}
    }
    for command in (
        ["test.py", "--run", tmp_path / "nb"],
        ["inference/convert_tflite.py", "--run", tmp_path / "nb", "--name", "x"],
    ):
        refused = run(*command)
        assert refused.returncode == 2 and refused.stderr.splitlines() == [
            "error: config.json: model 'notebook_net' was registered in a notebook (notebook.json), so only that "
            "kernel knows it: move its function into a file of your own (tasks/<name>/, found by itself) with "
            '@register("model") to use this run here'
        ]
