"""The trackers' part of the config: the ``wandb`` and ``tensorboard`` sections (their defaults and checks), and the
wandb run id a new run folder is named after. ``training/config/schema.py`` finds this module while this folder is
there; a project without it has neither section, and a config that names one is refused as an unknown section.
"""

from __future__ import annotations

import os
import secrets
import string
from pathlib import Path

from files.writes import CONFIG
from training.config.file import ConfigError, closest, read_config_file, show

WANDB_DEFAULTS = {
    "enabled": False,
    "project": "jax-template",
    "entity": None,
    "group": None,
    "tags": [],
    "mode": "offline",
    "id": None,
}
TENSORBOARD_DEFAULTS = {"enabled": False}
# The top-level sections this feature adds to the config, with their defaults.
SECTIONS = {"wandb": WANDB_DEFAULTS, "tensorboard": TENSORBOARD_DEFAULTS}
MAX_ID = 100


def check(config: dict, source: str) -> None:
    """The wandb and tensorboard sections: unknown settings, defaults filled in place, types."""
    for name, defaults in SECTIONS.items():
        settings = config.setdefault(name, {})
        if not isinstance(settings, dict):
            raise ConfigError(f"{source}: {name}: expected an object {{...}}, got {show(settings)}")
        for key in settings:
            if key not in defaults:
                raise ConfigError(
                    f"{source}: {name}.{key}: unknown setting.{closest(key, defaults)} Settings: {', '.join(defaults)}"
                )
        for key, value in defaults.items():
            settings.setdefault(key, list(value) if isinstance(value, list) else value)
        if not isinstance(settings["enabled"], bool):
            raise ConfigError(f"{source}: {name}.enabled: expected true or false, got {show(settings['enabled'])}")
    wandb = config["wandb"]
    if wandb["mode"] not in ("online", "offline", "disabled"):
        raise ConfigError(f"{source}: wandb.mode: expected online, offline or disabled, got {show(wandb['mode'])}")
    for key in ("project", "entity", "group", "id"):
        if wandb[key] is not None and (not isinstance(wandb[key], str) or not wandb[key]):
            raise ConfigError(f"{source}: wandb.{key}: expected a non-empty string or null, got {show(wandb[key])}")
    if not isinstance(wandb["tags"], list) or not all(isinstance(t, str) for t in wandb["tags"]):
        raise ConfigError(f"{source}: wandb.tags: expected a list of strings, got {show(wandb['tags'])}")
    # the id becomes part of the run folder's name
    run_id = wandb["id"]
    if run_id is not None and (len(run_id) > MAX_ID or not all(c.isalnum() or c in "-_" for c in run_id)):
        raise ConfigError(
            f"{source}: wandb.id: letters, digits, '-' and '_' only, at most {MAX_ID}, got {show(wandb['id'])}"
        )


def wandb_mode(config: dict) -> str:
    """`WANDB_MODE` in the environment overrides `wandb.mode`, so CI can force a run offline."""
    return os.environ.get("WANDB_MODE") or config["wandb"]["mode"]


def wandb_on(config: dict) -> bool:
    return bool(config["wandb"]["enabled"]) and wandb_mode(config) != "disabled"


def new_run_id() -> str:
    """Eight random base-36 characters, the form of a wandb run id; drawn before the run folder is named after it."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def assign_wandb_id(config: dict, resume_dir: Path | None) -> None:
    """A resumed run keeps its wandb run (the id saved in its folder's config); a new one draws an id now, so the
    run folder can be named after it."""
    if not wandb_on(config) or config["wandb"]["id"]:
        return
    saved = read_config_file(resume_dir / CONFIG).get("wandb", {}) if resume_dir else {}
    config["wandb"]["id"] = saved.get("id") or new_run_id()


def folder_suffix(config: dict) -> str:
    """What a new run folder's timestamped name ends with: ``_<wandb run id>`` while wandb is on, so each finds the
    other."""
    run_id = config["wandb"]["id"]
    return f"_{run_id}" if wandb_on(config) and run_id else ""


def switch_off(config: dict) -> None:
    """No tracker starts (a --fast-dev-run: nothing of the check outlives it)."""
    config["wandb"]["enabled"] = config["tensorboard"]["enabled"] = False
