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
import os
import signal
import sys
import threading
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


def stop_at_next_step(loop_stops) -> None:
    """Training: the loop saves at the next step boundary and stops (every finished epoch or saved step is kept
    either way); a signal noted during start-up asks it to at once. `loop_stops`: the loop's (``signal``, the one
    asked for; ``request_stop(signum)``: training/run/stops.py)."""

    def handler(signum, frame):
        if signum == signal.SIGINT and loop_stops.signal is not None:
            raise KeyboardInterrupt
        loop_stops.request_stop(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    if RECEIVED:  # while the run folder was being written
        loop_stops.request_stop(RECEIVED[0])


# ------------------------------------------------------------------------------------- commands that stop at once
AT_ONCE = (signal.SIGINT, signal.SIGTERM)


def stop_line(signum: int) -> str:
    """The one line of a command a stop signal ended (without the ``error: `` every command's errors start with)."""
    return f"stopped by {signal.Signals(signum).name}" + (" (Ctrl-C)" if signum == signal.SIGINT else "")


class _AtOnce:
    lock = threading.RLock()  # held while deciding to end: a ``finishing`` block's edges and the end never interleave
    undo: list = []  # what removes a half-made result, run before the process ends
    finishing = 0  # depth of ``finishing`` blocks the main thread is in
    pending: int | None = None  # a signal received in a ``finishing`` block, acted on at its end
    done = False  # ``finished()``: the result is in place
    watching: tuple | None = None  # (read end, write end, the previous wakeup descriptor, the previous handlers)
    stderr = -1  # standard error as it was when watching began: a converter may point descriptor 2 at /dev/null


def watch() -> None:
    """At the top of a command's script, before its heavy imports: from here on SIGINT and SIGTERM end the command
    at once (``stop_at_once``); with nothing half-made yet, nothing is removed."""
    _watch()


def at_once(main):
    """An entry point's ``main`` run under ``stop_at_once``: ``command(at_once(main))``."""

    @functools.wraps(main)
    def run(argv=None):
        with stop_at_once():
            return main(argv)

    return run


@contextmanager
def stop_at_once():
    """A command that builds its result in a temporary folder and renames it into place: SIGINT or SIGTERM ends it
    at once, even while a converter or a compiler holds the main thread in native code. A watcher thread learns of
    the signal (``signal.set_wakeup_fd``), runs what ``undone_on_stop`` registered (the half-made folder removed, the
    lock released), prints one line and exits with 128 + the signal's number (``os._exit``). Nothing is raised in the
    main thread: an exception raised at an arbitrary Python line lands in callbacks native code makes (a garbage
    collector's hook swallows it; one inside a C++ extension aborts the process). A signal during a ``finishing``
    block ends the command at the block's end; one after ``finished()`` is ignored, the result being whole. Installed
    even where SIGINT was inherited ignored (a job started with ``&`` by a script): a stop the user sent must not
    wait for minutes of converting. The previous handlers come back at the end."""
    _watch()  # unless watched since the script's top (``watch``)
    try:
        yield
    finally:
        _unwatch()


@contextmanager
def undone_on_stop(undo):
    """``undo()`` runs if a stop signal ends the command while in this block, from the watcher thread while the main
    thread may still run: it must be safe to run twice, and alongside what it undoes."""
    _AtOnce.undo.append(undo)
    try:
        yield
    finally:
        _AtOnce.undo.remove(undo)


def _watch() -> None:
    if _AtOnce.watching is not None:
        return
    read, write = os.pipe()
    os.set_blocking(write, False)  # the C-level handler must never block
    previous = {signum: signal.signal(signum, _noted) for signum in AT_ONCE}
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    _AtOnce.undo, _AtOnce.finishing, _AtOnce.pending, _AtOnce.done = [], 0, None, False
    _AtOnce.watching = (read, write, wakeup, previous)
    _AtOnce.stderr = os.dup(2)
    threading.Thread(target=_wait, args=(read,), name="stop-at-once", daemon=True).start()


def _unwatch() -> None:
    if _AtOnce.watching is None:
        return
    read, write, wakeup, previous = _AtOnce.watching
    _AtOnce.watching = None
    signal.set_wakeup_fd(wakeup)
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    os.close(write)  # the watcher reads the end of the pipe and returns; it closes its end
    os.close(_AtOnce.stderr)


def _noted(signum, frame) -> None:
    """The Python-level handler: the signal is acted on by the watcher, which the wakeup descriptor told."""


def _wait(read: int) -> None:
    try:
        while received := os.read(read, 64):
            for signum in received:
                if signum in AT_ONCE:
                    _stop(signum)
    finally:
        os.close(read)


def _stop(signum: int) -> None:
    with _AtOnce.lock:
        if _AtOnce.done:
            return
        if _AtOnce.finishing:
            _AtOnce.pending = _AtOnce.pending or signum
            return
        _end(signum)


def _end(signum: int) -> None:
    """Undoes what is half-made, says so in one line and ends the process (no Python cleanup: the main thread may be
    anywhere, in native code included)."""
    # first what the command printed, by a helper thread given a second: the main thread may hold a stream's lock,
    # blocked on a pipe no one reads
    flushing = threading.Thread(target=_flush, daemon=True)
    flushing.start()
    flushing.join(timeout=1)
    # then nothing more from the main thread, which runs on meanwhile (a write into the folder the undo removes
    # fails, and its error would print after the stop's line): its standard output and error go to /dev/null
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
    except OSError:
        pass
    for undo in reversed(_AtOnce.undo):
        try:
            undo()
        except BaseException:  # noqa: BLE001, S110 (what one undo could not remove, the next run of the command does)
            pass
    try:
        os.write(_AtOnce.stderr, f"error: {stop_line(signum)}\n".encode())
    finally:
        os._exit(128 + signum)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


@contextmanager
def finishing():
    """A step that must end once begun (renaming a finished folder into place, removing a half-made one): a stop
    signal received in it ends the command at its end, not in its middle. Without ``stop_at_once`` (train.py, or
    none) it changes nothing."""
    with _AtOnce.lock:
        _AtOnce.finishing += 1
    try:
        yield
    finally:
        with _AtOnce.lock:
            _AtOnce.finishing -= 1
            if not _AtOnce.finishing and _AtOnce.pending is not None and not _AtOnce.done:
                _end(_AtOnce.pending)


def finished() -> None:
    """The command's result is in place (renamed there in a ``finishing`` block): a stop signal from now on is
    ignored, since all that is left is to say so; it would report a stop while the result is whole."""
    with _AtOnce.lock:
        _AtOnce.done = True
