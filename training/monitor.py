"""The metric a run watches (``trainer.monitor``): which checkpoint is the best, and when early stopping counts an
epoch as bad."""

from __future__ import annotations

from typing import NamedTuple


class Monitor(NamedTuple):
    """``trainer.monitor`` parsed: "max val/accuracy" -> Monitor("max", "val/accuracy")."""

    mode: str
    name: str

    def better(self, value, than) -> bool:
        return value > than if self.mode == "max" else value < than
