"""load_run: a trained run folder (or one of its checkpoints) back in Python, ready to call, giving what test.py
evaluates."""

from __future__ import annotations

import re

import numpy as np
import pytest

from data_loader.sources.arrays import ArraysDataset
from inference.trained_run import load_run
from tests.end_to_end.test_train import run
from tests.inference.test_reports import trained
from training.config.file import ConfigError
from training.run.checkpoint import CheckpointError


@pytest.mark.slow
def test_a_loaded_run_predicts_what_test_py_evaluates(tmp_path):
    run_dir = trained(tmp_path, "cross_entropy", [{"name": "accuracy"}], lambda x: x[:, :5].argmax(1))
    loaded = load_run(run_dir)
    assert loaded.checkpoint == run_dir / "model_best.params"
    assert loaded.config["name"] == "reports" and loaded.preprocessing["classes"][0] == "T-shirt/top"
    spec = loaded.config["data_loader"]["test"]["args"]
    test = ArraysDataset(**{k: v for k, v in spec.items() if k != "batch_size"})
    batch = test.get_batch(np.arange(len(test)))
    outputs = loaded(batch["input"])
    assert outputs.shape == (len(test), 5)
    accuracy = float(np.mean(outputs.argmax(-1) == batch["target"]))
    printed = run("test.py", "--run", run_dir)
    assert printed.returncode == 0, printed.stderr
    assert float(re.search(r"accuracy\s+([0-9.]+)", printed.stdout).group(1)) == pytest.approx(accuracy, abs=1e-4)
    # a checkpoint file names the same run; its latest checkpoint is another file of the same shapes
    assert load_run(run_dir / "checkpoint-latest.params").checkpoint.name == "checkpoint-latest.params"


def test_a_folder_without_a_checkpoint_or_config_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such checkpoint file"):
        load_run(tmp_path)
    (tmp_path / "model_best.params").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"config.json: no such file; pass the run's config"):
        load_run(tmp_path)


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    run_dir = trained(tmp_path, "cross_entropy", [{"name": "accuracy"}], lambda x: x[:, :5].argmax(1))
    from training.config.validation import load_config

    config = load_config(run_dir / "config.json")
    config["model"]["args"]["hidden"] = [8]
    with pytest.raises(CheckpointError):
        load_run(run_dir, config=config)
