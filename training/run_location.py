"""Where train.py writes a run, decided from its validated config before anything is loaded (no JAX): a new run's
folder name, the named run that ``-r auto`` continues, and the symbolic links refused on the way."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from training.config_file import ConfigError, read_json
from training.files import CONFIG
from training.trackers import new_run_id, wandb_on


def assign_wandb_id(config: dict, resume_dir: Path | None) -> None:
    """A resumed run keeps its wandb run (the id saved in its folder's config); a new one draws an id now, so the
    run folder can be named after it."""
    if not wandb_on(config) or config["wandb"]["id"]:
        return
    saved = read_json(resume_dir / CONFIG).get("wandb", {}) if resume_dir else {}
    config["wandb"]["id"] = saved.get("id") or new_run_id()


def run_id_of(config: dict) -> str:
    """A new run's folder name: trainer.run_id, else the start time (and the wandb run id, so each finds the
    other)."""
    trainer = config["trainer"]
    if trainer["run_id"]:
        return trainer["run_id"]
    run_id = datetime.now().strftime("%Y%m%d_%H%M%S")
    return f"{run_id}_{config['wandb']['id']}" if wandb_on(config) else run_id


def named_run(config: dict) -> Path:
    """``-r auto``'s run folder: the one named by trainer.run_id (--run-id), existing or not."""
    if not config["trainer"]["run_id"]:
        raise ConfigError("-r auto: name the run with --run-id NAME (or trainer.run_id), so a requeued job finds it")
    check_not_linked(config, config["trainer"]["run_id"])
    return Path(config["trainer"]["save_dir"]) / config["name"] / config["trainer"]["run_id"]


def check_not_linked(config: dict, run_id: str | None = None) -> None:
    """The config name's folder under save_dir, and a run folder named in advance (-r auto), must be real folders:
    through a symbolic link a run would be written (or resumed) somewhere else."""
    parent = Path(config["trainer"]["save_dir"]) / config["name"]
    for folder in (parent, parent / run_id) if run_id else (parent,):
        if folder.is_symlink():
            raise ConfigError(
                f"{folder}: a symbolic link (to {os.readlink(folder)}), not a folder; runs are written "
                f"only into real folders under {parent.parent}: remove the link or choose another "
                f"{'--run-id' if folder != parent else 'name'}"
            )
