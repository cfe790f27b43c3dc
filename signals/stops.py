"""Stop signals in train.py: Ctrl-C, SIGTERM (a cluster's stop or a preemption) and SIGUSR1 (SLURM's warning before
the end of a job's time).

During start-up a signal is noted and acted on at the next safe point between phases (an exception raised inside an
import of a native extension, or inside XLA, crashes the process instead of ending it); while training, the loop
saves at the next step boundary and stops. A second Ctrl-C stops at once either way. Standard library only, and
below data and training: the image-folder loader's decoding stops at the same safe points.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
RECEIVED: list[int] = []  # stop signals received during start-up
# What start-up wrote that a stop leaves in place (an image cache decoded for later runs), for the stop's message.
KEPT: list[str] = []


class Interrupted(BaseException):
    """A stop signal received during start-up, raised at the next safe point (a BaseException, like
    KeyboardInterrupt: nothing catches it by accident)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def noted_until_safe_points():
    """Start-up: a stop signal is noted (``RECEIVED``) and raised as ``Interrupted`` at the next ``safe_point()``;
    the previous handlers come back at the end."""
    RECEIVED.clear()
    KEPT.clear()
    previous = {signum: signal.signal(signum, stop_at_safe_point) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_at_safe_point(signum, frame):
    if RECEIVED and signum == signal.SIGINT:
        raise KeyboardInterrupt
    RECEIVED.append(signum)


def stopped_at_start_up(signum: int) -> str:
    """The one line of a stop before training started: what it leaves behind."""
    written = f"no run folder was written; kept {'; '.join(KEPT)}" if KEPT else "nothing was written"
    return f"stopped by {signal.Signals(signum).name} before training started; {written}"


def safe_point() -> None:
    if RECEIVED:
        raise Interrupted(RECEIVED[0])


# A worker process's initializer (with its arguments; e.g. decoding images): Ctrl-C reaches the whole process group,
# and the loading process stops its workers itself, without a traceback from each.
IN_WORKERS = (signal.signal, (signal.SIGINT, signal.SIG_IGN))


def signal_in(error: BaseException | None) -> BaseException | None:
    """The KeyboardInterrupt or Interrupted behind an error (an import interrupted by a signal surfaces as an
    ImportError caused by it)."""
    while error is not None:
        if isinstance(error, (KeyboardInterrupt, Interrupted)):
            return error
        error = error.__cause__ or error.__context__
    return None


def stop_at_next_step(trainer) -> None:
    """Training: the trainer saves at the next step boundary and stops (every finished epoch or saved step is kept
    either way); a signal noted during start-up asks it to at once."""

    def handler(signum, frame):
        if signum == signal.SIGINT and trainer.stop_signal is not None:
            raise KeyboardInterrupt
        trainer.request_stop(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    if RECEIVED:  # while the run folder was being written
        trainer.request_stop(RECEIVED[0])
