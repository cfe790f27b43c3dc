"""Stop signals in train.py: Ctrl-C, SIGTERM (a cluster's stop or a preemption) and SIGUSR1 (SLURM's warning before
the end of a job's time); and in the commands that make something whole or nothing (the export, new_project.py),
which stop at once (``stop_at_once``).

During start-up a signal is noted and acted on at the next safe point between phases (an exception raised inside an
import of a native extension, or inside XLA, crashes the process instead of ending it); while training, the loop
saves at the next step boundary and stops. A second Ctrl-C stops at once either way. Standard library only, and
below data and training: the image-folder loader's decoding stops at the same safe points.
"""

from __future__ import annotations

import functools
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


# ------------------------------------------------------------------------------------- commands that stop at once
AT_ONCE = (signal.SIGINT, signal.SIGTERM)


class _AtOnce:
    noted: list[int] = []  # signals received while stop_at_once's handlers are in place
    raised = False  # whether the first was raised already
    finishing = 0  # depth of ``finishing`` blocks the main thread is in (1 from ``defer_stops`` to the command's start)
    previous: dict = {}  # the handlers before them


def defer_stops() -> None:
    """At the top of a command's script, before its heavy imports (an exception raised inside the import of a native
    extension may crash the process instead of ending it): SIGINT and SIGTERM are noted from here on, and raised as
    the command starts (``at_once``)."""
    _AtOnce.noted, _AtOnce.raised, _AtOnce.finishing = [], False, 1
    _AtOnce.previous = {signum: signal.signal(signum, _stop_now) for signum in AT_ONCE}


def at_once(main):
    """An entry point's ``main`` run under ``stop_at_once``: ``command(at_once(main))``, so the stop's exception ends
    the command as any Ctrl-C does (one line, 128 + the signal's number)."""

    @functools.wraps(main)
    def run(argv=None):
        with stop_at_once():
            return main(argv)

    return run


@contextmanager
def stop_at_once():
    """A command that builds its result in a temporary folder and renames it into place: SIGINT raises
    KeyboardInterrupt and SIGTERM ``Interrupted`` at the next Python line of the main thread (within about a second
    where a converter or a compiler holds it in native code), so its ``except``/``finally`` blocks remove what was
    half-made before it exits. Installed even where SIGINT was inherited ignored (a job started with ``&`` by a
    script): a stop the user sent must not wait for minutes of converting. Only the first signal raises; later ones
    (a second Ctrl-C) are noted while the cleanup runs, so it completes; a signal during a ``finishing`` block is
    raised at its end, one since ``defer_stops`` at once. The previous handlers come back at the end."""
    if not (_AtOnce.finishing == 1 and _AtOnce.previous):  # not deferred since the script's top
        _AtOnce.noted, _AtOnce.raised = [], False
        _AtOnce.previous = {signum: signal.signal(signum, _stop_now) for signum in AT_ONCE}
    _AtOnce.finishing = 0
    try:
        if _AtOnce.noted:
            _raise_first()
        yield
    finally:
        for signum, handler in _AtOnce.previous.items():
            signal.signal(signum, handler)
        _AtOnce.previous = {}


def _stop_now(signum, frame):
    _AtOnce.noted.append(signum)
    if not _AtOnce.raised and not _AtOnce.finishing:
        _raise_first()


def _raise_first():
    _AtOnce.raised = True
    signum = _AtOnce.noted[0]
    raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)


@contextmanager
def finishing():
    """A step that must end once begun (renaming a finished folder into place, removing a half-made one): a stop
    signal received in it is raised at its end, not in its middle. Without ``stop_at_once``'s handlers (train.py's
    own, or none) it changes nothing."""
    _AtOnce.finishing += 1
    try:
        yield
    finally:
        _AtOnce.finishing -= 1
    if not _AtOnce.finishing and _AtOnce.noted and not _AtOnce.raised:
        _raise_first()


def finished() -> None:
    """The command's result is in place (renamed there in a ``finishing`` block): a stop signal from now on is not
    raised, since all that is left is to say so; it would report a stop while the result is whole."""
    _AtOnce.raised = True


def stopped_by(error: Interrupted) -> str:
    """The one line of a command stop_at_once stopped by a signal other than SIGINT."""
    return f"stopped by {signal.Signals(error.signum).name}"
