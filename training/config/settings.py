"""What the trainer reads of a config, typed: the ``"trainer"`` section and the metric it watches (``Monitor``)
(validated and given its defaults by ``training.config.validation.validate``; the defaults are
training/config/schema.py's ``TRAINER_DEFAULTS``) and the seed."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple


@dataclass(frozen=True)
class CheckpointEvery:
    """``trainer.checkpoint_every``: a mid-epoch checkpoint every ``steps`` steps and/or ``minutes`` minutes; ``keep``
    > 0 also keeps the last ``keep`` of them as numbered files."""

    steps: int | None = None
    minutes: float | None = None
    keep: int = 0


@dataclass(frozen=True)
class Settings:
    seed: int
    epochs: int
    accumulate_steps: int  # loader batches per optimizer step
    steps_per_call: int | str  # optimizer steps per compiled call, or "auto"
    precision: str | None
    log_every: int
    divergence_factor: float | None
    early_stop: int  # epochs without improvement of the monitored value; 0: never stop early
    monitor: str  # as written ("max val/accuracy", "off"); the parsed form is the run's ``monitor``
    save_period: int  # epochs between numbered checkpoints
    checkpoint_every: CheckpointEvery
    async_checkpoints: bool
    profile: dict | None  # {"start_step", "num_steps"}: a profiler trace of those steps

    @classmethod
    def of(cls, config: dict) -> Settings:
        """From a validated config (every default already filled in)."""
        trainer = config["trainer"]
        values = {f.name: trainer.get(f.name) for f in fields(cls) if f.name != "seed"}
        values["checkpoint_every"] = CheckpointEvery(**(trainer.get("checkpoint_every") or {}))
        return cls(seed=config["seed"], **values)


class Monitor(NamedTuple):
    """``trainer.monitor`` parsed: "max val/accuracy" -> Monitor("max", "val/accuracy"); which checkpoint is the best,
    and when early stopping counts an epoch as bad."""

    mode: str
    name: str

    def better(self, value, than) -> bool:
        return value > than if self.mode == "max" else value < than
