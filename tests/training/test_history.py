"""What the core keeps of a run's history with no tracker: trainer.profile's checks and test.py's per-class table.
The trackers and their config sections: tests/training/tracking/."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest

from tests.end_to_end.test_train import ROOT
from training.config.file import ConfigError
from training.config.validation import validate


def load_test_script():
    """test.py as a module, loaded by path: "test" is also the name of a standard-library package."""
    spec = importlib.util.spec_from_file_location("test_script", ROOT / "test.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


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
        ({"trainer": {"profile": {"start": 3}}}, 'trainer.profile: expected {"start_step": N, "num_steps": K}'),
        ({"trainer": {"profile": {"start_step": 0, "num_steps": 2}}}, "trainer.profile.start_step: must be >= 1"),
        ({"trainer": {"profile": {"start_step": 3, "num_steps": 1.5}}}, "trainer.profile.num_steps: expected int"),
    ],
)
def test_profile_settings_are_validated(change, message):
    config = copy.deepcopy(BASE)
    config["trainer"] = {**config["trainer"], **change["trainer"]}
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert message in str(error.value)


def test_a_profile_is_kept():
    config = validate({**BASE, "trainer": {**BASE["trainer"], "profile": {"start_step": 5, "num_steps": 2}}})
    assert config["trainer"]["profile"] == {"start_step": 5, "num_steps": 2}
