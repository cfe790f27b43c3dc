"""One bound for every JSON file the tools read: a run folder's preprocessing.json, an export's (read by predict.py,
which ships alone and repeats the numbers), metrics.jsonl's rows and the config are held to the config's size limit
and nesting depth (files/reads.py), each refused in one line before it fills memory or overflows a stack."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from files import reads
from inference import predict
from inference.trained_run import load_run
from tests.end_to_end.test_train import data_dir, make_config, run  # noqa: F401  (data_dir: the fixture)
from tests.inference.test_reports import trained
from training.config import file as config_file
from training.config.file import ConfigError

OVERSIZED = reads.MAX_JSON_BYTES + 1024  # valid JSON, a little past the bound
DEEP = 200_000  # past Python's recursion limit: json.loads raises RecursionError
SHALLOW_BUT_PAST = reads.MAX_JSON_DEPTH + 2  # parses, but nests deeper than any real file


def oversized(path: Path) -> Path:
    path.write_text(json.dumps({"classes": ["a", "b"], "pad": "x" * OVERSIZED}))
    return path


def deep(path: Path, levels: int = DEEP) -> Path:
    path.write_text('{"classes": ' + "[" * levels + "]" * levels + "}")
    return path


def test_one_bound_from_one_place():
    """The config's limits are every JSON file's, and predict.py's copies of them match."""
    assert config_file.MAX_CONFIG_BYTES == reads.MAX_JSON_BYTES == predict.MAX_JSON_BYTES
    assert config_file.MAX_DEPTH == reads.MAX_JSON_DEPTH == predict.MAX_JSON_DEPTH


def test_the_reader_refuses_size_depth_and_kind(tmp_path):
    with pytest.raises(reads.FileRefused, match=r"more than the 16 MB a preprocessing.json may have"):
        reads.read_json(oversized(tmp_path / "big.json"), "preprocessing.json")
    sparse = tmp_path / "sparse.json"
    with open(sparse, "wb") as f:
        f.truncate(4 << 30)  # 4 GB of zeros that take no disk: refused from its size, never read
    with pytest.raises(reads.FileRefused, match=r"4 GB, more than the 16 MB"):
        reads.read_json(sparse)
    for levels in (DEEP, SHALLOW_BUT_PAST):
        with pytest.raises(ValueError, match=rf"nested deeper than {reads.MAX_JSON_DEPTH} levels"):
            reads.read_json(deep(tmp_path / f"deep{levels}.json", levels))
    assert reads.read_json(deep(tmp_path / "fine.json", reads.MAX_JSON_DEPTH - 1))["classes"]
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(reads.FileRefused, match="a folder"):
        reads.read_json(tmp_path / "folder.json")
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(ValueError, match="not UTF-8"):
        reads.read_json(tmp_path / "latin1.json")


def test_metrics_rows_are_held_to_the_bound(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    good = json.dumps({"epoch": 1, "val/loss": 0.5}) + "\n"
    metrics.write_text(good + "{" + '"a": "' + "x" * OVERSIZED + '"}\n')
    with pytest.raises(ValueError, match="line 2 is longer than the 16 MB"):
        reads.read_metrics(metrics)
    metrics.write_text(good + '{"epoch": 2, "x": ' + "[" * DEEP + "]" * DEEP + "}\n")
    with pytest.raises(ValueError, match="line 2 is nested deeper than"):
        reads.read_metrics(metrics)
    metrics.write_text(good + good)
    assert [r["epoch"] for r in reads.read_metrics(metrics)] == [1, 1]


def test_a_resume_refuses_a_metrics_row_past_the_bounds_and_changes_nothing(tmp_path, data_dir):
    """train.py -r reads the run's metrics.jsonl to reconcile it: before, a row nested 100,000 deep was a
    RecursionError traceback, after the run folder's lock was rewritten. A line a kill cut short is still dropped."""
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    assert run("train.py", "-c", config, "--run-id", "r").returncode == 0
    folder = tmp_path / "saved/tiny/r"
    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    resumed = run("train.py", "-r", folder / "checkpoint-latest.params", "--epochs", "2")
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr
    assert resumed.stderr.splitlines() == [f"error: {folder}/metrics.jsonl: line 2 is nested deeper than 32 levels"]
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("make", [oversized, deep], ids=["large", "deep"])
def test_a_logger_config_past_the_bounds_is_one_config_error(tmp_path, make):
    """logger_config.json, which train.py reads first: before, a deep one was a RecursionError traceback."""
    from training.run.cli import log_files, setup_logging

    path = make(tmp_path / "logger_config.json")
    for read in (log_files, lambda path: setup_logging(None, path)):
        with pytest.raises(ConfigError, match=r"logger_config.json: (.*more than the 16 MB|nested deeper than 32)"):
            read(path)


def test_predict_reads_preprocessing_within_the_bound(tmp_path):
    """predict.py (and sample.py and the export, which read through it): one ValueError line, before any reading
    of a file past the bound."""
    with pytest.raises(
        ValueError, match="not a readable JSON file .*bytes, more than the 16,777,216 a JSON file may have"
    ):
        predict.read_preprocessing(oversized(tmp_path / "preprocessing.json"))
    for levels in (DEEP, SHALLOW_BUT_PAST):
        with pytest.raises(ValueError, match="nested"):
            predict.read_preprocessing(deep(tmp_path / "preprocessing.json", levels))
    assert predict.read_preprocessing(tmp_path / "absent.json") == {}
    assert predict.read_json(oversized(tmp_path / "config.json")) == {}  # only the model's name: left out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return trained(
        tmp_path_factory.mktemp("bounds"), "cross_entropy", [{"name": "accuracy"}], lambda x: x.argmax(1) % 5
    )


@pytest.mark.parametrize("make", [oversized, deep, lambda p: deep(p, SHALLOW_BUT_PAST)], ids=["large", "deep", "past"])
def test_load_run_and_test_py_refuse_a_bad_preprocessing_json_in_one_line(tmp_path, run_dir, make):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    make(copy / "preprocessing.json")
    with pytest.raises(ConfigError, match=r"preprocessing.json: (.*more than the 16 MB|nested deeper than 32)"):
        load_run(copy)
    tested = run("test.py", "--run", copy, "--out", tmp_path / "out")
    assert tested.returncode == 2, tested.stderr
    assert tested.stderr.startswith("error: ") and len(tested.stderr.splitlines()) == 1, tested.stderr
    assert "preprocessing.json" in tested.stderr and not (tmp_path / "out").exists()


def test_a_run_without_preprocessing_json_still_loads(tmp_path, run_dir):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "preprocessing.json").unlink()
    loaded = load_run(copy)
    assert loaded.preprocessing.get("classes") and np.asarray(loaded(np.zeros((2, 6), np.float32))).shape == (2, 5)


def test_a_deep_or_large_notebook_json_is_only_a_hint(tmp_path):
    """notebook.json (a run fit made in a notebook) is read by every tool that takes a run: before, a deep one was a
    RecursionError traceback from test.py and the export."""
    from training.config.notebook_components import check_kernel_components

    for make in (deep, oversized):
        make(tmp_path / "notebook.json")
        assert check_kernel_components(tmp_path, "config.json") is None
    (tmp_path / "notebook.json").write_text(json.dumps({"registered_in_notebook": {"model": ["nowhere_net"]}}))
    with pytest.raises(ConfigError, match="model 'nowhere_net' was registered in a notebook"):
        check_kernel_components(tmp_path, "config.json")
