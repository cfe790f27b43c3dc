"""The trackers' config sections (training/tracking/config.py): checked and filled while the folder is there, and the
wandb-form run id a run folder is named after."""

from __future__ import annotations

import copy
import re

import pytest

from tests.training.test_history import BASE
from training.config.file import ConfigError
from training.config.validation import validate
from training.tracking.config import SECTIONS, folder_suffix, new_run_id


def test_new_run_ids_have_the_wandb_form_and_differ():
    ids = {new_run_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(re.fullmatch(r"[a-z0-9]{8}", i) for i in ids)


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
    ],
)
def test_tracker_settings_are_validated(change, message):
    with pytest.raises(ConfigError) as error:
        validate({**copy.deepcopy(BASE), **change})
    assert message in str(error.value)


def test_tracker_defaults_are_filled_and_name_the_run_folder_only_while_wandb_is_on(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = validate(BASE)
    assert {name: config[name] for name in SECTIONS} == SECTIONS
    assert folder_suffix(config) == ""
    config = validate({**BASE, "wandb": {"enabled": True, "id": "abc123"}})
    assert folder_suffix(config) == "_abc123"
    assert config["wandb"]["tags"] is not SECTIONS["wandb"]["tags"]  # each config its own list
