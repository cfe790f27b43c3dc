"""Files someone else made, opened for reading without trusting what stands at their path: a config, a data file, a
folder's cache. A FIFO would block the open (or the read) forever, a device such as /dev/zero never ends, and a
file far larger than any real one of its kind would exhaust memory before a parser could complain. ``open_regular``
opens with O_NONBLOCK (so a FIFO's open returns at once), checks the opened file itself with fstat (no window in
which the path can be swapped after a check), refuses anything but a regular file of at most `limit` bytes, and only
then makes the descriptor blocking again for ordinary reads. Standard library only: the config reader uses it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

# What a compressed data file (a gzip IDX file, a compressed .npz member) may inflate to in memory: past it, a
# corrupt header or a decompression bomb (a few MB of deflate inflate to gigabytes), refused before it is read.
MAX_INFLATED_BYTES = 4 << 30

KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(ValueError):
    """A path that is not a regular file, or one larger than its kind may be: one line naming the path."""


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} bytes"


def open_regular(path: str | Path, limit: int | None = None, what: str = "file") -> BinaryIO:
    """`path` opened for binary reading, if it is a regular file of at most `limit` bytes (None: any size).
    FileNotFoundError when nothing is there; FileRefused (a ValueError) for a folder, a FIFO, a device, a socket or a
    file over the limit; other OSErrors (permission denied) as the system raises them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in KINDS if test(info.st_mode)), "not a regular file")
            raise FileRefused(f"{path}: {kind}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise FileRefused(f"{path}: {size_text(info.st_size)}, more than the {size_text(limit)} a {what} may have")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int | None = None, what: str = "file") -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see ``open_regular``); a file that grew past the limit
    after the check is refused too, since at most limit + 1 bytes are read."""
    with open_regular(path, limit, what) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise FileRefused(f"{path}: more than the {size_text(limit)} a {what} may have")
    return data


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a `metrics.jsonl` file, in order; a resumed run's rows follow the rows before it. A line that is
    not a JSON object (a hand-edited or foreign file) is a ValueError naming it."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as error:
            raise ValueError(f"{path}: line {number} is not JSON ({type(error).__name__})") from None
        if type(row) is not dict:
            raise ValueError(f"{path}: line {number} is {type(row).__name__}, not a JSON object of an epoch's values")
        rows.append(row)
    return rows
