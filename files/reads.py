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

# One bound for every JSON file the tools read (a config, a run folder's or an export's preprocessing.json, a
# metrics row): far larger than any written by hand or by a tool (the largest shipped is a few kB), so a sparse
# 4 GB file is refused before it is read; and nesting deeper than any real one (a few levels), refused before a
# recursive walk could overflow the stack. training/config/file.py and inference/predict.py (which ships alone and
# repeats the numbers) hold every file to these.
MAX_JSON_BYTES = 16 << 20
MAX_JSON_DEPTH = 32

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


class NotJson(ValueError):
    """Text that is not UTF-8 JSON within the depth bound: one line naming where, ``reason`` the rest of it."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.reason = reason


def json_depth(value) -> int:
    """How deeply `value` (parsed JSON) nests lists and objects: 0 for a number or a string. Iterative, so no depth
    can overflow the stack."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def parse_json(data: bytes | str, where: str, depth: int = MAX_JSON_DEPTH):
    """JSON text (UTF-8 bytes, a byte-order mark allowed, or str) as Python values, nested at most `depth` levels;
    NotJson (a ValueError) naming `where` for text that is not UTF-8 or not JSON, or nests deeper."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
        value = json.loads(text)
    except RecursionError:  # the parser's own stack gave out: far past any bound
        raise NotJson(where, f"nested deeper than {depth} levels") from None
    except UnicodeDecodeError as error:
        raise NotJson(where, f"not UTF-8 text (byte 0x{error.object[error.start]:02x})") from None
    except json.JSONDecodeError as error:
        raise NotJson(where, f"not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    if json_depth(value) > depth:
        raise NotJson(where, f"nested deeper than {depth} levels")
    return value


def read_json(path: str | Path, what: str = "JSON file", limit: int = MAX_JSON_BYTES, depth: int = MAX_JSON_DEPTH):
    """The JSON value of a regular file of at most `limit` bytes, nested at most `depth` levels: what every tool
    reads a JSON file it did not write through (a run folder's preprocessing.json, say). FileNotFoundError when
    nothing is there; a ValueError (FileRefused for the file itself) naming the path for a folder, a FIFO, a device,
    a file over the limit, text that is not UTF-8 or JSON, or nesting past the depth; other OSErrors as raised."""
    return parse_json(read_regular(path, limit, what), str(path), depth)


def read_metrics(path: str | Path, limit: int = MAX_JSON_BYTES, torn: bool = False) -> list[dict]:
    """The rows of a `metrics.jsonl` file, in order; a resumed run's rows follow the rows before it. A line that is
    not a JSON object (a hand-edited or foreign file), or one longer than `limit` bytes (a sparse file of zeros has
    no line end), is a ValueError naming it; the file is read a line at a time, each held to the JSON bound.
    ``torn``: a line that is not a JSON object is dropped instead (what a kill left of the row it was writing); one
    past the bounds is still refused."""
    rows = []
    with open_regular(path) as f:
        for number, line in enumerate(iter(lambda: f.readline(limit + 1), b""), 1):
            if len(line) > limit:
                raise ValueError(f"{path}: line {number} is longer than the {size_text(limit)} a JSON row may have")
            if not line.strip():
                continue
            try:
                row = parse_json(line, f"{path}: line {number}")
            except NotJson as error:
                if torn and not error.reason.startswith("nested"):  # nesting past the bound is no kill's doing
                    continue
                raise ValueError(f"{path}: line {number} is {error.reason}") from None
            if type(row) is not dict:
                if torn:
                    continue
                raise ValueError(
                    f"{path}: line {number} is {type(row).__name__}, not a JSON object of an epoch's values"
                )
            rows.append(row)
    return rows
