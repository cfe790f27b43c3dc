"""The files a run writes: their names in a run folder, and how each is written.

Names: tests spell them out instead of importing them, since they are the contract with users and tools (a
changed name breaks resuming old runs, test.py and the export).

Atomic writes: a temporary file in the target's folder, fsynced, then renamed over the target, and the folder
fsynced, so a reader (or a run resumed after a kill) finds the old file or the new one, never half of one.

A kill between the write and the rename leaves the temporary behind under a name that ``TEMP_NAME`` recognises
(".<name>.<random>.tmp", hidden from folder listings); ``training.checkpoint.remove_stale_temps`` clears them.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from training.config_file import ConfigError

# A run folder's files. Here, not in run_folder.py, because this module imports neither JAX nor the checkpoint
# format: sweep.py reads run folders without JAX, and training/checkpoint.py resolves a run's best checkpoint.
CONFIG = "config.json"  # the config the run trained with, defaults filled in
PREPROCESSING = "preprocessing.json"  # the training data's preprocessing, class names or vocabulary
LATEST = "checkpoint-latest.params"  # written first at every commit: resuming starts from it
BEST = "model_best.params"
METRICS = "metrics.jsonl"  # one row per epoch
LOCK_NAME = ".lock"  # held by the process training in the folder (a sweep's folder has one too)

# atomic_path's temporaries (mkstemp's names as it asks for them).
TEMP_NAME = re.compile(r"\..+\.[^.]+\.tmp")


def check_checkpoint_file(path: Path, flag: str = "") -> None:
    """A checkpoint named on a command line (after ``flag``, if any) is a regular file: a pipe or a device would
    block or never end (``checkpoint.read`` refuses them too; this says so before any data is read)."""
    if not path.is_file():
        what = "not a regular file" if path.exists() else "no such checkpoint file"
        raise ConfigError(f"{flag + ' ' if flag else ''}{path}: {what}")


def epoch_checkpoint(epoch: int | str) -> str:
    """Every `save_period` epochs; "*" gives the glob of all of them."""
    return f"checkpoint-epoch_{epoch}.params"


def step_checkpoint(step: int | str) -> str:
    """Mid-epoch (`checkpoint_every.keep`); "*" gives the glob of all of them."""
    return f"checkpoint-step_{step}.params"


def sync_folder(folder: str | Path) -> None:
    """Makes a rename or a new name in the folder durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path next to ``path`` for writers that need a name (a memory map); once the block ends
    the file is fsynced and renamed to ``path``. On an error it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(name)
        with open(name, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


@contextmanager
def atomic_output(path: str | Path) -> Iterator[BinaryIO]:
    """Yields a binary file that becomes ``path`` when the block ends; an error in the block leaves ``path`` as
    it was (raise one to reject what was written, e.g. a bad checksum)."""
    with atomic_path(path) as temporary, open(temporary, "wb") as f:
        yield f


def write_atomic(path: str | Path, data: bytes) -> None:
    with atomic_output(path) as f:
        f.write(data)
