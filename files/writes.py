"""The files a run writes: their names in a run folder, and how each is written.

Names: tests spell them out instead of importing them, since they are the contract with users and tools (a
changed name breaks resuming old runs, test.py and the export).

Atomic writes: a temporary file in the target's folder, fsynced, then renamed over the target, and the folder
fsynced, so a reader (or a run resumed after a kill) finds the old file or the new one, never half of one.

A kill between the write and the rename leaves the temporary behind under a name that ``TEMP_NAME`` recognises
(".<name>.<random>.tmp", hidden from folder listings); ``training.run.checkpoint.remove_stale_temps`` clears them.

Folders from elsewhere: a run folder, an export or a data set may have been copied, downloaded or shared, and may
hold a symbolic link or a pipe where a tool writes one of its files. Every file the tools write goes through this
module: a file replaced whole is renamed over (a rename replaces a link, it never writes through it), a file
appended to or locked is opened with ``O_NOFOLLOW`` and checked to be a regular file; either way a link, a folder,
a pipe or a device standing at the name is refused with ``UnsafeFile`` (one line, nothing written through it).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# A run folder's files. Here, not in training/run/folder.py, because this module imports neither JAX nor the checkpoint
# format: sweep.py reads run folders without JAX, and training/run/checkpoint.py resolves a run's best checkpoint.
CONFIG = "config.json"  # the config the run trained with, defaults filled in
PREPROCESSING = "preprocessing.json"  # the training data's preprocessing, class names or vocabulary
LATEST = "checkpoint-latest.params"  # written first at every commit: resuming starts from it
BEST = "model_best.params"
METRICS = "metrics.jsonl"  # one row per epoch
LOCK_NAME = ".lock"  # held by the process training in the folder (a sweep's folder has one too)
CURVES = "curves.png"  # drawn from metrics.jsonl when a run ends, where the project has its figures (an optional part)
LR_FINDER_TABLE, LR_FINDER_PLOT = "lr_finder.csv", "lr_finder.png"  # callbacks.lr_finder's
SAMPLES_TEXT = "samples.txt"  # callbacks.generate_text's
# What a run writes into its folder besides numbered checkpoints: train.py checks them all before resuming, so a
# planted link is refused before anything is written (with the log files that logger_config.json names).
RUN_FILES = (
    LOCK_NAME,
    CONFIG,
    PREPROCESSING,
    LATEST,
    BEST,
    METRICS,
    CURVES,
    LR_FINDER_TABLE,
    LR_FINDER_PLOT,
    SAMPLES_TEXT,
)

# atomic_path's temporaries (mkstemp's names as it asks for them).
TEMP_NAME = re.compile(r"\..+\.[^.]+\.tmp")


class UnsafeFile(OSError):
    """Something other than a regular file (a symbolic link, a folder, a pipe, a device) where a tool writes a file:
    refused, never written through. An OSError, so that every writer's error handling reports it; one line."""

    def __init__(self, path: str | Path, kind: str):
        super().__init__(
            errno.EEXIST,
            f"{kind} stands where a regular file is written; nothing was written through it (remove it)",
            str(path),
        )

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def kind_of_file(mode: int, path: str | Path) -> str | None:
    """What stands at ``path`` (its lstat mode) when it is not a regular file: "a symbolic link (to ...)", ..."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def refuse_unsafe(path: str | Path) -> None:
    """Raises UnsafeFile when ``path`` exists and is not a regular file (a link is not followed to decide)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    kind = kind_of_file(mode, path)
    if kind:
        raise UnsafeFile(path, kind)


def open_nofollow(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for a file written in place (appended to, locked): never through a link (``O_NOFOLLOW``), never
    blocking on a pipe (``O_NONBLOCK``: a FIFO opens at once, to be refused), and only a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EWOULDBLOCK):
            refuse_unsafe(path)
        raise
    kind = kind_of_file(os.fstat(fd).st_mode, path)
    if kind:
        os.close(fd)
        raise UnsafeFile(path, kind)
    return fd


def open_append(path: str | Path, encoding: str | None = "utf-8", errors: str | None = None):
    """A text file opened to append to (a log, metrics.jsonl), created if missing, never through a link."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding=encoding, errors=errors)


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
    # the rename below would replace a link, not write through it; refused all the same, so that a planted link
    # is reported rather than silently dropped
    refuse_unsafe(path)
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


# ------------------------------------------------------------------------------------------ folders made whole
def try_lock(path: str | Path) -> tuple[int | None, str]:
    """An exclusive lock on the file ``path`` (made if missing, never through a link), released when the process
    exits however it exits. Returns (its descriptor, "") with this process's id written in it, or (None, the
    holder's id) when another process holds it. ``unlock`` removes the file again: a lock taken on a file that was
    removed meanwhile is taken again on the new one, so two processes never both hold ``path``."""
    import fcntl

    while True:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            return None, holder
        try:
            current = os.lstat(path)
        except FileNotFoundError:
            current = None
        held = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # unlocked and removed by its holder between our open and our lock: again, on the new file
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, ""


def unlock(path: str | Path, fd: int) -> None:
    """Releases ``try_lock``'s lock and removes its file (first, while still held), so nothing stays behind."""
    try:
        os.unlink(path)
    finally:
        os.close(fd)


def temporary_folder(target: Path, separator: str = ".") -> Path:
    """A new hidden folder beside ``target`` to build it in: ".<name><separator><8 random characters>"."""
    return Path(tempfile.mkdtemp(prefix=f".{target.name}{separator}", dir=target.parent))


def remove_folder(folder: Path, tries: int = 10) -> None:
    """Removes a folder ``temporary_folder`` made, though another thread of this process may still be writing in it
    (a stop signal's undo, ``signals.stops.undone_on_stop``): renamed away first, so that a write by its old name
    fails, and a file held at that name while the rest goes, so that no ``makedirs`` of a path inside makes it
    again. The renamed folder keeps the temporary name's form: if a kill leaves it, the next builder of the same
    target removes it (``remove_stale_folders``)."""
    for _ in range(tries):
        away = folder.with_name(folder.name[:-8] + secrets.token_hex(4))
        try:
            os.rename(folder, away)
        except FileNotFoundError:
            away = None
        try:
            held = os.open(folder, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
        except FileExistsError:  # made again between the two
            continue
        finally:
            if away is not None:
                shutil.rmtree(away, ignore_errors=True)
        os.close(held)
        os.unlink(folder)
        return


def remove_stale_folders(target: Path, separator: str = ".") -> list[Path]:
    """Removes the folders ``temporary_folder`` made for ``target`` that a killed process left behind; only while
    holding the lock that every builder of ``target`` holds. Links and files of those names are left alone."""
    pattern = re.compile(re.escape(f".{target.name}{separator}") + r"[a-z0-9_]{8}")
    stale = []
    for path in target.parent.iterdir() if target.parent.is_dir() else ():
        if pattern.fullmatch(path.name) and stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
            stale.append(path)
    return stale


def replace_folder(folder: Path, target: Path) -> None:
    """Makes the finished ``folder`` the ``target`` in one step: renamed into place, or, over an existing target,
    swapped with it by one ``renameat2(RENAME_EXCHANGE)`` (rename(2) cannot replace a folder that has files), so a
    reader or a kill at any moment finds the old folder or the new one, never none; the old one, now at ``folder``'s
    name, is removed after. Where the system has no exchange (not Linux, or a file system without it), two renames:
    a kill between them leaves the old folder at ``folder``'s hidden name."""
    if not os.path.lexists(target):
        os.rename(folder, target)
    elif not exchange(folder, target):
        hidden = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        os.rename(target, hidden / target.name)
        os.rename(folder, target)
        shutil.rmtree(hidden, ignore_errors=True)
        return
    shutil.rmtree(folder, ignore_errors=True)
    sync_folder(target.parent)


def exchange(a: Path, b: Path) -> bool:
    """Swaps two paths atomically (Linux's renameat2 with RENAME_EXCHANGE, through libc); False where that is not
    available, OSError on any other failure."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))
