"""A sweep's trials as processes: each `train.py` tied to the sweep's life (it saves and exits when the sweep dies),
and why one failed, in one line from its output.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import NamedTuple


def parent_death_signal():
    """A preexec_fn for each trial's process: it gets SIGTERM (saves, exits) when the sweep dies, even by SIGKILL,
    instead of training on unwatched and holding its run folder. Linux only (None elsewhere); the call is resolved
    here, so the child between fork and exec only makes it."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the sweep died before the line above
            os._exit(1)

    return preexec


class Running(NamedTuple):
    process: subprocess.Popen
    started: float
    log: Path
    log_start: int
    run_dir: Path


def error_line(running: Running) -> str:
    """Why a trial failed: train.py's `error:` line, else the last error in its train.log, else its last line."""
    with open(running.log, "rb") as f:
        f.seek(running.log_start)
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    try:
        logged = [
            line.split(" ERROR ", 1)[1].split(": ", 1)[-1]  # without the time, level and logger
            for line in (running.run_dir / "train.log").read_text().splitlines()
            if " ERROR " in line
        ]
    except OSError:
        logged = []
    code = running.process.returncode
    reason = f"killed by {signal.Signals(-code).name}" if code < 0 else ""
    return (logged[-1] if logged else reason or (lines[-1] if lines else f"exit status {code}"))[:500]
