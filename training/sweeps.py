"""A sweep's trials as they run and end: the ledger that lets a stopped sweep restart (and the lock that keeps one
sweep.py in its folder), the trials as the ledger tells them, their progress read from each run's `metrics.jsonl`, and
median pruning.

The rest of a sweep is beside it: the search space (`training/sweep_space.py`), the trial draws that a restarted sweep
repeats exactly (`training/sweep_samplers.py`), the trials' processes (`training/sweep_processes.py`) and the results
(`training/sweep_results.py`). `sweep.py` runs each trial as a `train.py` process; all of it is plain Python over the
config's key paths and the run folders, so it needs neither JAX nor the trainer.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import NamedTuple

from training.files import LOCK_NAME, sync_folder

FINISHED = ("done", "failed", "pruned")


class SweepError(Exception):
    """A bad sweep argument or a sweep folder that cannot be used: reported as one line, exit status 2."""


# ---------------------------------------------------------------------------------------------------------- ledger
def hold(folder: Path) -> int:
    """One sweep.py per sweep folder; the lock goes with the process, however it ends."""
    import fcntl

    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        raise SweepError(f"{folder}: in use by process {holder} (another sweep.py is running this sweep)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class Ledger:
    """The sweep's record, one JSON object per line, only ever appended: each line is one write of a whole line on
    a file opened for appending, fsynced before the sweep goes on. A line cut short by a crash is the last one; it
    is removed before anything else is appended."""

    def __init__(self, path: Path):
        self.path = path
        if path.is_file():
            raw = path.read_bytes()
            if raw and not raw.endswith(b"\n"):
                with open(path, "r+b") as f:
                    f.truncate(raw.rfind(b"\n") + 1)
                    os.fsync(f.fileno())

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        records = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise SweepError(f"{self.path}: line {number} is not JSON; the ledger was edited by hand?") from None
            records.append(record)
        return records

    def append(self, record: dict) -> None:
        new = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:  # the file's name is durable too
            sync_folder(self.path.parent)


class Trial(NamedTuple):
    """A trial as the ledger tells it (the last record about it wins)."""

    index: int
    params: dict
    run: str
    status: str  # running (started, not ended: resumes), done, failed, pruned
    value: float | None = None  # best monitored value (done) or the last one seen (pruned)
    epoch: int | None = None  # the epoch of that value
    epochs: int = 0
    seconds: float = 0.0
    error: str = ""
    curve: tuple = ()  # the monitored value per epoch


def trials_of(records: list[dict]) -> dict[int, Trial]:
    trials = {}
    for record in records:
        event, index = record.get("event"), record.get("trial")
        if event == "start":
            before = trials.get(index)
            trials[index] = Trial(
                index, record["params"], record["run"], "running", seconds=before.seconds if before else 0.0
            )
        elif event == "stopped" and index in trials:  # stopped with the sweep: resumes, its time so far counts
            trials[index] = trials[index]._replace(seconds=trials[index].seconds + record.get("seconds", 0.0))
        elif event == "end" and index in trials:
            before = trials[index]
            trials[index] = before._replace(
                status=record["status"],
                value=record.get("value"),
                epoch=record.get("epoch"),
                epochs=record.get("epochs", 0),
                seconds=before.seconds + record.get("seconds", 0.0),
                error=record.get("error", ""),
                curve=tuple(record.get("curve", ())),
            )
    return trials


# -------------------------------------------------------------------------------------------------------- progress
def read_rows(path: Path) -> list[dict]:
    """A run's metrics.jsonl as it stands (maybe mid-write); the last row per epoch wins."""
    rows = {}
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("epoch"), int):
            rows[row["epoch"]] = row
    return [rows[e] for e in sorted(rows)]


def curve_of(rows: list[dict], metric: str) -> list[float | None]:
    """The metric per epoch from epoch 1 (None where an epoch has no finite value)."""
    by_epoch = {row["epoch"]: row.get(metric) for row in rows}
    return [
        by_epoch.get(e) if isinstance(by_epoch.get(e), (int, float)) and math.isfinite(by_epoch[e]) else None
        for e in range(1, max(by_epoch, default=0) + 1)
    ]


def best_of(curve: list, mode: str) -> tuple[float | None, int | None]:
    """The best value and its (first) epoch, as model_best.params follows it."""
    best = epoch = None
    for e, value in enumerate(curve, 1):
        if value is not None and (best is None or (value > best if mode == "max" else value < best)):
            best, epoch = value, e
    return best, epoch


class MedianPruner(NamedTuple):
    """`--prune median[:WARMUP[:MIN_TRIALS]]`: after epoch e > WARMUP, a trial whose monitored value is worse than
    the median of the earlier trials' values at epoch e (trials not pruned, at least MIN_TRIALS of them) stops."""

    warmup: int = 0
    min_trials: int = 2

    def check(self, epoch: int, value: float | None, earlier: list[float], mode: str) -> float | None:
        """The median the trial lost to, or None if it goes on."""
        if epoch <= self.warmup or len(earlier) < self.min_trials:
            return None
        median = statistics.median(earlier)
        if value is None or (value < median if mode == "max" else value > median):
            return median
        return None


def parse_prune(text: str | None) -> MedianPruner | None:
    if text in (None, "off", "none"):
        return None
    name, *numbers = text.split(":")
    if (
        name != "median"
        or len(numbers) > 2
        or not all(n.isdigit() for n in numbers)
        or (len(numbers) == 2 and int(numbers[1]) < 1)
    ):
        raise SweepError(
            f"--prune {text}: expected median[:WARMUP_EPOCHS[:MIN_TRIALS]] (e.g. median, median:1, median:1:3) or off"
        )
    return MedianPruner(*map(int, numbers))
