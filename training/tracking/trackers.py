"""Experiment trackers (Weights & Biases, TensorBoard): an optional part. train.py starts them by one line marked
``[feature: tracking]`` (and imports them by another); deleting this folder and those lines leaves a template that
trains and writes its run folder as before, without trackers (``training/run/history.py`` keeps what the loop needs).

A tracker receives what the trainer logs: ``log_step(step, values)`` every ``trainer.log_every`` steps (step loss,
learning rate, gradient norm), ``log_epoch(epoch, row, best)`` with the epoch's row of ``metrics.jsonl``, and
``close(exit_code)`` at the end. Each library is imported only when the config turns its tracker on, and a tracker
that cannot start or write is a warning: tracking never stops a training run.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from training.tracking.config import wandb_mode, wandb_on

log = logging.getLogger("train")


def scalars(values: dict, skip: tuple[str, ...] = ("step",)) -> dict[str, float]:
    """The numbers of a log row; per-class vectors become ``name/0``, ``name/1``, ... Matrices (a confusion
    matrix) are left to the plots."""
    out = {}
    for name, value in values.items():
        if name in skip or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out[name] = float(value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            out.update({f"{name}/{i}": float(v) for i, v in enumerate(value)})
    return out


def flatten(config, prefix: str = "") -> dict:
    """``{"optimizer": {"args": {"lr": 0.1}}}`` -> ``{"optimizer.args.lr": 0.1}``; list items are indexed
    (``metrics.0.name``), empty lists and dicts are kept as values."""
    items = config.items() if isinstance(config, dict) else enumerate(config)
    out = {}
    for key, value in items:
        if isinstance(value, (dict, list)) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class WandbTracker:
    """Logs to a wandb run against the global step; epoch rows are logged at the step that ends the epoch."""

    def __init__(self, run, monitor: str):
        self.run, self.monitor = run, monitor

    def log_step(self, step: int, values: dict) -> None:
        self._call(self.run.log, scalars(values), step=step)

    def log_epoch(self, epoch: int, row: dict, best) -> None:
        self._call(self.run.log, scalars(row), step=row["step"])
        if best is not None:
            self._call(self.run.summary.__setitem__, f"best/{self.monitor}", best)

    def close(self, exit_code: int = 0) -> None:
        self._call(self.run.finish, exit_code=exit_code)
        self.run = None

    def _call(self, fn, *args, **kwargs) -> None:
        if self.run is None:
            return
        try:
            fn(*args, **kwargs)
        except Exception as error:  # a tracker failing mid-run loses its logs, not the run
            log.warning(f"wandb: {type(error).__name__}: {error}; wandb logging stops, training goes on")
            self.run = None


def start_wandb(config: dict, run_dir: Path, monitored: str | None = None) -> WandbTracker | None:
    """`wandb.init` with the flattened config; the run id is `wandb.id` (train.py fills it in), resumed if it exists.
    Files go to `WANDB_DIR` if set, else into the run folder."""
    settings = config["wandb"]
    mode = wandb_mode(config)
    try:
        import wandb

        run = wandb.init(
            project=settings["project"],
            entity=settings["entity"],
            group=settings["group"],
            tags=settings["tags"] or None,
            id=settings["id"],
            resume="allow",
            mode=mode,
            name=f"{config['name']}/{Path(run_dir).name}",
            config=flatten(config),
            dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
        )
    except Exception as error:  # no network, no API key, no wandb installed: train without it
        log.warning(f"wandb: could not start ({type(error).__name__}: {error}); training goes on without wandb")
        return None
    log.info(f"wandb: run {run.id} ({mode}), files in {Path(run.dir).parent}")
    return WandbTracker(run, monitored)


class TensorBoardTracker:
    """Event files: every scalar against the global step, and the flattened config as hyperparameters (the HParams
    tab), declared at the first epoch with that epoch's scalars as its metrics."""

    def __init__(self, writer, hparams: dict):
        self.writer, self.hparams, self.session_end = writer, hparams, None

    def log_step(self, step: int, values: dict) -> None:
        for name, value in scalars(values).items():
            self.writer.add_scalar(name, value, step)

    def log_epoch(self, epoch: int, row: dict, best) -> None:
        values = scalars(row, skip=("step", "epoch"))
        if self.hparams is not None:
            from tensorboardX.summary import hparams

            experiment, session_start, self.session_end = hparams(self.hparams, dict.fromkeys(values, 0.0))
            self.writer.file_writer.add_summary(experiment)
            self.writer.file_writer.add_summary(session_start)
            self.hparams = None
        for name, value in values.items():
            self.writer.add_scalar(name, value, row["step"])
        self.writer.flush()

    def close(self, exit_code: int = 0) -> None:
        if exit_code == 0 and self.session_end is not None:
            self.writer.file_writer.add_summary(self.session_end)
        self.writer.close()


def start_tensorboard(config: dict, run_dir: Path) -> TensorBoardTracker | None:
    folder = Path(run_dir) / "tensorboard"
    # tensorboardX writes through a link planted at the folder's name (train.py refuses one before a resume,
    # training/run/location.py; this guards every other caller)
    if folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir()):
        log.warning(f"tensorboard: {folder} is a link or a file, not a folder; training goes on without tensorboard")
        return None
    try:
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(str(folder), flush_secs=30)
    except Exception as error:
        log.warning(f"tensorboard: could not start ({type(error).__name__}: {error}); training goes on without it")
        return None
    # the HParams tab takes numbers, strings and booleans; lists (tags, dims) are shown as their JSON text
    hparams = {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in flatten(config).items()}
    log.info(f"tensorboard: events in {writer.logdir}")
    return TensorBoardTracker(writer, hparams)


def start_trackers(config: dict, run_dir: Path, monitored: str | None = None) -> list:
    """The trackers the config turns on, in a fixed order; those that fail to start are left out with a warning.
    ``monitored``: the name of the monitored value (``val/accuracy``), whose best goes to wandb's summary."""
    trackers = []
    if wandb_on(config):
        trackers.append(start_wandb(config, run_dir, monitored))
    if config.get("tensorboard", {}).get("enabled"):
        trackers.append(start_tensorboard(config, run_dir))
    return [t for t in trackers if t is not None]
