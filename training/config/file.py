"""A config file read strictly, and changed from the command line: JSON whose duplicate keys, non-finite numbers,
control characters and absurd nesting are refused with their place (``config.json: ...``), and ``--set KEY=VALUE``
overrides. Every config problem is a ``ConfigError``: one line, exit status 2.
"""

from __future__ import annotations

import codecs
import difflib
import hashlib
import json
import math
import os
import select
import stat
import time
from pathlib import Path
from typing import Any

from files.reads import MAX_JSON_BYTES, MAX_JSON_DEPTH, FileRefused, read_regular, size_text

# Past these a config is a typo or an attack, not a setting: nesting deeper than any real config, integers
# wider than int64, a file larger than any config written by hand or by a tool (the largest shipped is a few kB).
# The size and depth are every JSON file's (files/reads.py), so a config and a preprocessing.json are held alike.
MAX_DEPTH = MAX_JSON_DEPTH
MAX_INTEGER = 2**63 - 1
MAX_CONFIG_BYTES = MAX_JSON_BYTES
# A config given as a pipe (`-c /dev/stdin` after `jq ... |`, `-c <(jq ...)`) is read like a file, to the same bound,
# but must be written whole and closed within this many seconds of the start: a pipe nobody writes never ends.
PIPE_SECONDS = 10


class ConfigError(Exception):
    """A problem with the user's config: reported as one line, exit status 2."""


def closest(name: str, choices) -> str:
    match = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" Did you mean {match[0]!r}?" if match else ""


def show(value: Any, limit: int = 60) -> str:
    """A config value as JSON for a message, cut to `limit` characters (a 300-character name stays readable)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _DuplicateKeys(dict):
    """An object whose text repeated a key: json keeps the last value silently, so the walk reports it instead."""

    duplicate = ""


class _HugeInteger:
    """An integer past Python's digit limit for int(), kept as a marker so the walk reports it at its place."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))


def _object(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen = set()
        obj = _DuplicateKeys(obj)
        obj.duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
    return obj


def _integer(text: str):
    try:
        return int(text)
    except ValueError:
        return _HugeInteger(text)


def parse_json(text: str, where: str) -> Any:
    """JSON text as Python values, refusing what json.loads lets through but no setting can mean (see check_values).
    Raises json.JSONDecodeError for text that is not JSON at all."""
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_int=_integer)
    except RecursionError:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    check_values(value, where)
    return value


def check_values(value: Any, where: str) -> None:
    """NaN and infinities (NaN, Infinity, 1e400), integers beyond 64 bits, repeated keys, keys with control
    characters and nesting deeper than MAX_DEPTH: each reported at its key path. Iterative, so depth cannot
    overflow the stack."""
    stack = [(value, ())]
    while stack:
        node, path = stack.pop()
        place = f"{where}: {'.'.join(path)}" if path else where
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{where}: {'.'.join(path[:3])}...: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, _HugeInteger):
            raise ConfigError(f"{place}: an integer of {node.digits} digits (at most {MAX_INTEGER:,} accepted)")
        if isinstance(node, bool):
            continue
        if isinstance(node, int) and abs(node) > MAX_INTEGER:
            raise ConfigError(f"{place}: {show(node)} is too large (at most {MAX_INTEGER:,} accepted)")
        if isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{place}: {show(node)} is not a finite number")
        if isinstance(node, str) and not encodable(node):
            raise ConfigError(f"{place}: {show(node)} holds a lone surrogate, which no file or file name can hold")
        if isinstance(node, _DuplicateKeys):
            inside = f" in {'.'.join(path)}" if path else ""
            raise ConfigError(f"{where}: duplicate key {show(node.duplicate)}{inside}")
        if isinstance(node, dict):
            for key in node:
                if not str(key).isprintable():
                    raise ConfigError(f"{place}: key {show(key)} has a control character")
            stack.extend((v, (*path, str(k))) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, (*path, str(i))) for i, v in reversed(list(enumerate(node))))


def encodable(text: str) -> bool:
    """Whether `text` can be written to a file or be a file name: a lone surrogate (JSON's "\\ud800") cannot; the
    ones that stand for the undecodable bytes of a file name (U+DC80..U+DCFF, as Python reads them) can."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def read_config_file(path: str | Path, source: str | None = None) -> dict:
    """A JSON object from a UTF-8 file (a UTF-8 byte-order mark is allowed, as json.load allows it); errors name
    `source` (default: the path). Only a regular file of at most MAX_CONFIG_BYTES is read: a FIFO, a device or a
    huge file is refused before it can block or fill memory. An anonymous pipe (`-c /dev/stdin` after `|`) is read
    to the same bound within PIPE_SECONDS."""
    path = Path(path)
    source = source or str(path)
    try:
        raw = read_config_bytes(path, MAX_CONFIG_BYTES)
    except FileRefused as error:
        raise ConfigError(str(error)) from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a config file") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\0" in raw:
        raise ConfigError(f"{source}: UTF-16 or binary data, not UTF-8 text; save the file as UTF-8")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        body = error.object  # after a byte-order mark, which the positions do not count
        line = body[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"{source}: not UTF-8 text (byte 0x{body[error.start]:02x} on line {line}); save the file as UTF-8"
        ) from None
    try:
        config = parse_json(text, source)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source}: invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: the top level must be an object {{...}}")
    return config


def read_config_bytes(path: Path, limit: int) -> bytes:
    """A config file's bytes: a regular file's (``read_regular``: a named FIFO, a device or a larger file refused
    before it is read), or an anonymous pipe's, what a shell hands over for `-c /dev/stdin` after `|` or for
    `-c <(...)` (``read_pipe``: the same bound, within PIPE_SECONDS)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a named FIFO's open waits for no writer
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode) and anonymous_pipe(fd):
            return read_pipe(fd, path, limit)
    finally:
        os.close(fd)
    return read_regular(path, limit, "config file")


def anonymous_pipe(fd: int) -> bool:
    """Whether the pipe open at `fd` is one a shell made (Linux names it ``pipe:[inode]``), not a FIFO someone left
    at a path, which stays refused as any file that is not regular."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:  # no /proc (not Linux): every pipe is refused, as before
        return False


def read_pipe(fd: int, path: Path, limit: int) -> bytes:
    """What the pipe open at `fd` gives until its writer closes it: at most `limit` bytes, within PIPE_SECONDS of the
    start; a ConfigError past either, so a pipe nobody writes (or that never ends, as `yes |`) is one line."""
    seconds = PIPE_SECONDS
    deadline = time.monotonic() + seconds
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise ConfigError(
                f"{path}: a pipe not closed within {seconds:g} s of the start; a config from a pipe must be "
                "written whole by then (or give a file)"
            )
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:  # woken with nothing to read yet
            continue
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ConfigError(f"{path}: a pipe of more than the {size_text(limit)} a config file may have")
        chunks.append(chunk)


def is_index(part: str) -> bool:
    """A list index in a key path: ASCII digits only ("²".isdigit() and "٣".isdecimal() are true, int("²") fails)."""
    return part.isascii() and part.isdecimal()


def set_path(config: dict, dotted: str, value: Any, source: str) -> None:
    """Sets config[a][b][c] = value for 'a.b.c'; integer parts index lists (metrics.0.args.k)."""
    parts = dotted.split(".")
    node = config
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not is_index(part) or int(part) >= len(node):
                raise ConfigError(f"{source}: {'.'.join(parts[: i + 1])}: no such list index")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"{source}: {'.'.join(parts[: i + 1])} is a value, not a section")
    last = parts[-1]
    if isinstance(node, list):
        if not is_index(last) or int(last) >= len(node):
            raise ConfigError(f"{source}: {dotted}: no such list index")
        node[int(last)] = value
    else:
        node[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key.isprintable():
        raise ConfigError(f"--set {show(key)}: the key has a control character")
    try:
        value = parse_json(raw, f"--set {key}")
    except json.JSONDecodeError:
        value = raw  # a bare word is a string: --set model.name=mlp
    return key, value


def config_hash(config: dict) -> str:
    """Hash of what defines the weights and their training (not paths, epochs or trackers)."""
    keys = ("model", "loss", "optimizer", "seed", *(("step",) if "step" in config else ()))  # older runs': as they were
    canonical = json.dumps({k: config.get(k) for k in keys}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
