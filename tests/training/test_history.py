"""What the core keeps of tracking: the wandb-form run id a run folder is named after, the wandb and tensorboard
sections of the config (checked and filled whether or not training/tracking/ is there), and test.py's per-class
table. The trackers themselves: tests/training/tracking/."""

from __future__ import annotations

import copy
import importlib.util
import re

import numpy as np
import pytest

from tests.end_to_end.test_train import ROOT
from training.run.history import new_run_id
from utils import ConfigError, validate


def load_test_script():
    """test.py as a module, loaded by path: "test" is also the name of a standard-library package."""
    spec = importlib.util.spec_from_file_location("test_script", ROOT / "test.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_new_run_ids_have_the_wandb_form_and_differ():
    ids = {new_run_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(re.fullmatch(r"[a-z0-9]{8}", i) for i in ids)


def test_per_class_table_matches_counts_from_the_labels():
    per_class = load_test_script().per_class

    rng = np.random.default_rng(0)
    true, predicted = rng.integers(0, 5, 400), rng.integers(0, 5, 400)
    predicted[true == 1] = 1  # class 1 always found; class 4 never predicted
    predicted[predicted == 4] = 0
    matrix = np.zeros((5, 5), np.int64)
    np.add.at(matrix, (true, predicted), 1)
    table = per_class(matrix)
    for c in range(5):
        hits = np.sum((true == c) & (predicted == c))
        assert table["recall"][c] == pytest.approx(hits / np.sum(true == c))
        assert table["precision"][c] == pytest.approx(hits / np.sum(predicted == c) if np.any(predicted == c) else 0.0)
        assert table["support"][c] == np.sum(true == c)
    assert table["recall"][1] == 1.0 and table["precision"][4] == 0.0 and table["f1"][4] == 0.0


BASE = {
    "name": "t",
    "model": {"name": "mlp"},
    "loss": {"name": "cross_entropy"},
    "optimizer": {"name": "sgd", "args": {"lr": 0.1}},
    "data_loader": {"train": {"name": "mnist"}},
    "trainer": {"monitor": "min train/loss"},
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tensorboard": {"enabeld": True}}, "tensorboard.enabeld: unknown setting. Did you mean 'enabled'?"),
        ({"tensorboard": {"enabled": "yes"}}, "tensorboard.enabled: expected true or false"),
        ({"tensorboard": True}, "tensorboard: expected an object"),
        ({"wandb": {"enabled": 1}}, "wandb.enabled: expected true or false"),
        ({"wandb": {"tags": "a"}}, "wandb.tags: expected a list of strings"),
        ({"wandb": {"id": "a/b"}}, "wandb.id: letters, digits"),
        ({"wandb": {"project": ""}}, "wandb.project: expected a non-empty string or null"),
        ({"wandb": {"mode": "cloud"}}, "wandb.mode: expected online, offline or disabled"),
        ({"trainer": {"profile": {"start": 3}}}, 'trainer.profile: expected {"start_step": N, "num_steps": K}'),
        ({"trainer": {"profile": {"start_step": 0, "num_steps": 2}}}, "trainer.profile.start_step: must be >= 1"),
        ({"trainer": {"profile": {"start_step": 3, "num_steps": 1.5}}}, "trainer.profile.num_steps: expected int"),
    ],
)
def test_tracker_settings_are_validated(change, message):
    config = copy.deepcopy(BASE)
    for section, value in change.items():
        config[section] = {**config[section], **value} if section == "trainer" else value
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert message in str(error.value)


def test_tracker_defaults_are_filled():
    config = validate({**BASE, "trainer": {**BASE["trainer"], "profile": {"start_step": 5, "num_steps": 2}}})
    assert config["tensorboard"] == {"enabled": False}
    assert config["wandb"]["enabled"] is False and config["wandb"]["id"] is None
    assert config["trainer"]["profile"] == {"start_step": 5, "num_steps": 2}
