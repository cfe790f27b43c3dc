"""When the loop stops or saves inside an epoch: a stop asked for by a signal (``request_stop``, from
signals/stops.py's handler) and the checkpoints ``trainer.checkpoint_every`` asks for. The loop asks ``due`` after
each call, ``save``s the position when it says so, and ``agreed_stop`` at each epoch's end; several processes agree
on both, so that none saves (a collective) or stops alone.
"""

from __future__ import annotations

import logging

import jax

from training.devices import mesh
from training.run.saving import Checkpoints
from training.steps_per_call import StepsPerCall

log = logging.getLogger("train")

# Several processes agree on a stop signal or a timed checkpoint (one blocking collective) about every this many
# steps, and at each epoch's end: agreeing at every call would make each call wait for the slowest process.
AGREE_EVERY_STEPS = 64


class Stops:
    def __init__(self, checkpoints: Checkpoints, steps_per_call: StepsPerCall):
        self.checkpoints, self.steps_per_call = checkpoints, steps_per_call
        self.signal = None  # set by request_stop (a signal handler); honoured at the next step boundary

    def request_stop(self, signum: int) -> None:
        """Called from a signal handler: the loop saves and stops at the next step boundary."""
        self.signal = signum

    def due(self, step: int, calls: int) -> bool:
        """Whether to save the position now, at `step`, after this epoch's `calls`-th call: a stop was asked for, or
        trainer.checkpoint_every says so. Several processes must agree (a signal or a clock seen by some processes
        only must not make them save, a collective, or stop alone), and agreeing is a blocking collective: they
        agree every ``AGREE_EVERY_STEPS`` steps' worth of calls (a count every process keeps alike), and at a save
        that checkpoint_every's steps make due for all. A stop asked of any process becomes every process's."""
        if jax.process_count() == 1:
            return self.signal is not None or self.checkpoints.save_due(step)
        every = max(1, AGREE_EVERY_STEPS // self.steps_per_call.k)
        if calls % every and not self.checkpoints.save_due(step, clock=False):
            return False
        signum, due = mesh.max_over_processes(self.signal or 0, int(self.checkpoints.save_due(step)))
        self.signal = self.signal or signum or None
        return bool(signum or due)

    def agreed_stop(self) -> int | None:
        """The stop signal any process received (every process then stops at the same boundary), or None."""
        (signum,) = mesh.max_over_processes(self.signal or 0)
        self.signal = self.signal or signum or None
        return self.signal

    def save(self, train_state: dict, totals, header: dict, batches: int) -> list[str]:
        """A checkpoint in the middle of an epoch of `batches` (``Checkpoints.save_position``; `header` holds the
        position); returns the files written."""
        names, pause = self.checkpoints.save_position(train_state, totals, header)
        log.info(
            f"checkpoint at step {header['step']} ({header['position']} of {batches} into epoch "
            f"{header['epoch'] + 1}); the loop paused {1000 * pause:.0f} ms"
        )
        return names
