"""Checkpoints: arrays by key path in a safetensors file plus a JSON header; written atomically, never pickled.

A checkpoint is a dict of pytrees (``{"params": ..., "state": ..., "opt_state": ..., "rng": ...}``) flattened to
``params.blocks.1.norm.scale``-style names. Reading needs a template tree of the same structure (built from the
config with ``jax.eval_shape``, no compute): every path, shape and dtype is checked against it and all differences
are reported together. Nothing falls back silently to fresh weights.

Since format version 2 the header records a crc32 of every array (with its dtype and shape) and the file keeps a
crc32 of the header text, both verified on every read: a flipped byte anywhere is an error, never silently other
weights. Version 1 files (no checksums) still read.

A run of several processes writes a sharded checkpoint (training/run/shards.py): each process's distinct shards in a
file of this same format under ``shards/``, and at the checkpoint's name an index, also of this format, holding no
arrays but a ``shards`` header field: every leaf's dtype and global shape, and each of its pieces' file, corner and
crc32. ``read`` takes both kinds; from an index it gives ``Sharded`` leaves that read a piece's file only when a slice
overlapping it is asked for (``lazy``), or whole arrays.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from files.writes import BEST, LATEST, TEMP_NAME, write_atomic
from model.modules.module import key_path_str
from training.config.file import ConfigError
from training.devices.memory import host_available, show_bytes

FORMAT_VERSION = 2  # 2: checksums of the header and of every array (dtype, shape, bytes); 1 had none
CORRUPT = "the file is corrupt; use another checkpoint of the run or a copy"
INT64 = 2**63


class CheckpointError(Exception):
    pass


def flatten(tree: Any) -> dict[str, Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {key_path_str(path): leaf for path, leaf in leaves}


def raw_bytes(array: np.ndarray) -> memoryview:
    # A uint8 view: extension dtypes (bfloat16) export no buffer of their own.
    return memoryview(array.reshape(-1).view(np.uint8))


def little_endian(leaf: Any) -> np.ndarray:
    # The bytes safetensors writes, so that the checksum taken here is the one a read recomputes from the file.
    array = np.asarray(leaf, order="C")
    return array.astype(array.dtype.newbyteorder("<")) if array.dtype.byteorder == ">" else array


def text_crc(text: str) -> str:
    return str(zlib.crc32(text.encode("utf-8", "surrogatepass")))


def describe(array: np.ndarray, data: memoryview) -> list:
    """What the header records of an array: [dtype, shape, crc32 of its bytes]."""
    return [array.dtype.name, list(array.shape), zlib.crc32(data)]


def encode(tree: dict, header: dict | None = None) -> bytes:
    """The checkpoint file's bytes: every leaf by key path, and the header as JSON metadata with its own crc32."""
    from safetensors.numpy import save as to_bytes

    arrays = {name: little_endian(leaf) for name, leaf in flatten(jax.device_get(tree)).items()}
    meta = dict(header or {})
    meta.update(
        format_version=FORMAT_VERSION,
        treedef=str(jax.tree_util.tree_structure(tree)),
        arrays={name: describe(a, raw_bytes(a)) for name, a in arrays.items()},
    )
    # A header this module would refuse to read is refused now, while the run that wrote it can still say why.
    problem = header_problem(meta)
    if problem:
        raise CheckpointError(f"checkpoint header: {problem}")
    text = json.dumps(meta)
    return to_bytes(arrays, metadata={"header": text, "header_crc32": text_crc(text)})


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Deletes the temporary files of writes a kill interrupted; only safe while no other process writes to the
    folder (the caller holds the run's lock). Returns what it removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = sorted(p for p in folder.iterdir() if TEMP_NAME.fullmatch(p.name) and p.is_file() and not p.is_symlink())
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def save(path: str | Path, tree: dict, header: dict | None = None) -> None:
    write_atomic(path, encode(tree, header))


def kind_of(value: Any) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)
    if value is None or isinstance(value, (list, dict)):
        return kind
    if type(value) is int and abs(value) >= INT64:
        return "an integer beyond 64 bits"  # repr of a 5000-digit int raises
    return f"{kind} ({repr(value)[:40]})"


def is_int(value: Any, low: int) -> bool:
    return type(value) is int and low <= value < INT64


def is_finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


# field -> (accepts, what it should be); bool is not taken for a number.
FIELDS = {
    "format_version": (lambda v: is_int(v, 1), "an integer >= 1"),
    "epoch": (lambda v: is_int(v, 0), "an integer >= 0"),
    "step": (lambda v: is_int(v, 0), "an integer >= 0"),
    "best": (lambda v: v is None or is_finite(v), "a finite number or null"),
    "best_epoch": (lambda v: v is None or is_int(v, 0), "an integer >= 0 or null"),
    "bad_epochs": (lambda v: is_int(v, 0), "an integer >= 0"),
    "monitor": (lambda v: type(v) is str, "a string"),
    "config_hash": (lambda v: v is None or type(v) is str, "a string or null"),
    "data_seed": (lambda v: is_int(v, -INT64), "an integer"),
    "min_loss": (lambda v: v is None or is_finite(v), "a finite number or null"),
    "treedef": (lambda v: type(v) is str, "a string"),
    "row": (lambda v: type(v) is dict, "an object"),
    "eval_params": (lambda v: type(v) is str and v.startswith("callbacks."), "a key path under callbacks."),
    "position": (lambda v: is_int(v, 0), "an integer >= 0"),
    "batches": (lambda v: is_int(v, 1), "an integer >= 1"),
    "config": (lambda v: type(v) is dict, "an object"),
    "schedule_length": (
        lambda v: type(v) is dict and set(v) == {"epochs", "steps_per_epoch"} and all(is_int(n, 1) for n in v.values()),
        'an object {"epochs": N, "steps_per_epoch": N}',
    ),
}
REQUIRED = ("epoch", "step")


def header_problem(header: Any) -> str | None:
    """What is wrong with a header's fields, or None."""
    if type(header) is not dict:
        return f"is {kind_of(header)}, expected a JSON object"
    for name in REQUIRED:
        if name not in header:
            return f"has no field {name!r} ({FIELDS[name][1]})"
    for name, (accepts, expected) in FIELDS.items():
        if name in header and not accepts(header[name]):
            return f"field {name!r} is {kind_of(header[name])}, expected {expected}"
    # fields that bound each other: a position inside the epoch's batches, no more epochs counted than were run
    for name, limit, below in (
        ("position", "batches", True),
        ("best_epoch", "epoch", False),
        ("bad_epochs", "epoch", False),
    ):
        value, most = header.get(name), header.get(limit)
        if value is not None and most is not None and (value >= most if below else value > most):
            return f"field {name!r} is {value}, expected {'less than' if below else 'at most'} {limit!r} ({most})"
    return None


def verify_arrays(path: Path, entries: Any, arrays: dict, layout: dict, data: memoryview, start: int) -> None:
    """Every array against the [dtype, shape, crc32] its header recorded, in the order of the file."""
    if type(entries) is not dict:
        raise CheckpointError(f"{path}: header field 'arrays' is {kind_of(entries)}, expected an object ({CORRUPT})")
    extra = sorted(set(entries) - set(arrays))
    if extra:
        raise CheckpointError(f"{path}: array {extra[0]} is in the header but not in the file ({CORRUPT})")
    for name in sorted(layout, key=lambda n: layout[n]["data_offsets"][0]):
        begin, end = layout[name]["data_offsets"]
        if entries.get(name) != describe(arrays[name], data[start + begin : start + end]):
            raise CheckpointError(f"{path}: array {name} fails its checksum ({CORRUPT})")


def read_bytes(path: Path) -> bytes:
    """The file's bytes, once it is known to be a regular file whose size is the one its safetensors header
    describes: a pipe would block for ever, a device or a sparse file would be read until memory runs out."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, to be refused below
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read the checkpoint: {error.strerror or error}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        what = "Is a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe, socket or device)"
        raise CheckpointError(f"{path}: cannot read the checkpoint: {what}")
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little")
        described = None
        if len(head) == 8 and length <= info.st_size - 8:
            try:
                layout = json.loads(f.read(length))
                described = (
                    8
                    + length
                    + max(
                        (entry["data_offsets"][1] for name, entry in layout.items() if name != "__metadata__"),
                        default=0,
                    )
                )
            except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
                pass
        if described != info.st_size:
            expected = (
                f"its header describes {described:,}"
                if isinstance(described, int)
                else "without a header that describes them"
            )
            raise CheckpointError(
                f"{path}: not a readable checkpoint (truncated or corrupt?): {info.st_size:,} bytes, {expected}"
            )
        available = host_available()
        if available and info.st_size > available[0]:
            raise CheckpointError(
                f"{path}: {show_bytes(info.st_size)}, more than the {show_bytes(available[0])} of "
                f"{available[1]}: it cannot be read here"
            )
        f.seek(0)
        return f.read()


def header_of(path: Path, meta: dict) -> dict:
    """The checkpoint header a safetensors file's metadata holds, once its checksum and version are checked."""
    text = meta.get("header")
    if text is None:
        raise CheckpointError(f"{path}: a safetensors file without a checkpoint header (not written by this code?)")
    if "header_crc32" in meta and meta["header_crc32"] != text_crc(text):
        raise CheckpointError(f"{path}: its header fails its checksum ({CORRUPT})")
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{path}: its header is not JSON ({type(error).__name__}: {error})") from None
    if type(header) is not dict:
        raise CheckpointError(f"{path}: its header is {kind_of(header)}, expected a JSON object")
    version = header.get("format_version")
    if not is_int(version, 1) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: its header field 'format_version' is {kind_of(version)}, this code reads "
            f"versions 1 to {FORMAT_VERSION}"
        )
    if version >= 2 and ("header_crc32" not in meta or "arrays" not in header):
        raise CheckpointError(f"{path}: format version {version} without its checksums ({CORRUPT})")
    return header


def read(path: str | Path, lazy: bool = False) -> tuple[dict[str, Any], dict]:
    """The raw arrays by name and the header, after every checksum the file has is verified and every header
    field is checked; anything wrong is a CheckpointError naming the file and what was wrong. A sharded checkpoint's
    index gives its leaves whole, or (``lazy``) as ``Sharded`` leaves whose files are read when sliced."""
    from safetensors import SafetensorError
    from safetensors.numpy import load as from_bytes

    path = Path(path)
    data = read_bytes(path)
    try:
        arrays = from_bytes(data)
        start = 8 + int.from_bytes(data[:8], "little")
        layout = json.loads(data[8:start])
        meta = layout.pop("__metadata__", None) or {}
        # JSON would take other whitespace in safetensors' space padding; refused, so that no changed byte passes.
        if data[8:9] != b"{" or data[8:start].rstrip(b" ")[-1:] != b"}":
            raise ValueError("the header has bytes around its JSON")
    except (
        SafetensorError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        UnicodeDecodeError,
        OverflowError,
        RecursionError,
    ) as error:
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated or corrupt?): {type(error).__name__}: {error}"
        ) from None
    header = header_of(path, meta)
    if "arrays" in header:
        verify_arrays(path, header["arrays"], arrays, layout, memoryview(data), start)
    problem = header_problem(header)
    if problem:
        raise CheckpointError(f"{path}: its header {problem}")
    if "shards" in header:
        if arrays:
            raise CheckpointError(f"{path}: an index of shards that holds arrays of its own ({CORRUPT})")
        arrays = sharded_leaves(path, header["shards"])
        if not lazy:
            arrays = {name: leaf[()] for name, leaf in arrays.items()}
    return arrays, header


# ------------------------------------------------------------------------------------------ sharded checkpoints
SHARD_FILE = re.compile(r"shards/[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.shard")
MAX_RANK = 64
HEADER_LIMIT = 100 * 2**20  # a shard file's JSON header is kilobytes to megabytes; a larger length is not one
MAX_PIECES = 2**16  # a piece per device at most; an index listing more is refused before any work on them
MAX_CELLS = 2**22


def cover_problem(shape: list[int], boxes: list[tuple[list[int], list[int]]]) -> str | None:
    """Whether the boxes (start, stop) tile the shape exactly, each value in one box: counted on the grid their
    corners make (a few cells per box for a sharding's pieces), or what is wrong."""
    if not shape or math.prod(shape) == 0:
        return None if len(boxes) == (0 if shape else 1) else "has pieces that do not tile"
    cuts = [np.unique([0, n, *(b[0][d] for b in boxes), *(b[1][d] for b in boxes)]) for d, n in enumerate(shape)]
    if math.prod(len(c) - 1 for c in cuts) > MAX_CELLS:
        return "cuts into too many pieces"
    counts = np.zeros([len(c) - 1 for c in cuts], np.int32)
    for start, stop in boxes:
        counts[tuple(slice(np.searchsorted(c, a), np.searchsorted(c, b)) for c, a, b in zip(cuts, start, stop))] += 1
    if (counts > 1).any():
        return "has overlapping pieces"
    if (counts == 0).any():
        return "leaves values uncovered"
    return None


def piece_name(leaf: str, start: tuple[int, ...] | list[int]) -> str:
    """A piece's array name in its shard file: the leaf's key path and its corner in the global array."""
    return f"{leaf}@{','.join(map(str, start))}"


class PieceFile:
    """A shard file read piece by piece: its header read whole and checked as ``read`` checks one (the file's size,
    the JSON's bytes, the header's checksum, version and fields), then each array's bytes only when asked for,
    checked against the crc32 the header records. A link is refused (O_NOFOLLOW)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such checkpoint file") from None
        except OSError as error:
            raise CheckpointError(f"{path}: cannot read the checkpoint: {error.strerror or error}") from None
        size = os.fstat(self.fd).st_size
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            raise CheckpointError(f"{path}: cannot read the checkpoint: not a regular file")
        described = None
        try:
            length = int.from_bytes(os.pread(self.fd, 8, 0), "little")
            if length > min(size - 8, HEADER_LIMIT):
                raise ValueError("its header's length is past the end of the file")
            text = os.pread(self.fd, length, 8)
            self.layout = json.loads(text)
            meta = self.layout.pop("__metadata__", None) or {}
            if text[:1] != b"{" or text.rstrip(b" ")[-1:] != b"}":
                raise ValueError("the header has bytes around its JSON")
            ends = [entry["data_offsets"] for entry in self.layout.values()]
            if not all(is_int(a, 0) and is_int(b, a) for a, b in ends):
                raise ValueError("an array's offsets are not two growing integers")
            described = 8 + length + max((b for _, b in ends), default=0)
            if described != size:
                raise ValueError(f"{size:,} bytes, its header describes {described:,}")
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as error:
            raise CheckpointError(
                f"{path}: not a readable checkpoint (truncated or corrupt?): {type(error).__name__}: {error}"
            ) from None
        self.start = 8 + length
        self.header = header_of(path, meta)
        entries = self.header.get("arrays")
        if type(entries) is not dict or set(entries) != set(self.layout):
            raise CheckpointError(f"{path}: its header's arrays are not the file's ({CORRUPT})")
        problem = header_problem(self.header)
        if problem:
            raise CheckpointError(f"{path}: its header {problem}")

    def array(self, name: str) -> np.ndarray:
        import jax.numpy as jnp

        begin, end = self.layout[name]["data_offsets"]
        data = os.pread(self.fd, end - begin, self.start + begin)
        entry = self.header["arrays"][name]
        try:
            dtype = np.dtype(jnp.dtype(entry[0])).newbyteorder("<")
            array = np.frombuffer(data, dtype).reshape(entry[1])
        except (TypeError, ValueError, IndexError):
            raise CheckpointError(f"{self.path}: array {name} fails its checksum ({CORRUPT})") from None
        if describe(array, memoryview(data)) != entry:
            raise CheckpointError(f"{self.path}: array {name} fails its checksum ({CORRUPT})")
        return array

    def __del__(self):
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)


class ShardFiles:
    """The shard files of one index, each opened once, its pieces read when first needed; the pieces of the leaf
    being read are kept (the devices that hold copies of a slice ask for it in turn), no others."""

    def __init__(self, index: Path, names: list[str]):
        self.index, self.names, self.open, self.kept = index, names, {}, {}

    def array(self, file: int, name: str, expected: list) -> np.ndarray:
        if file not in self.open:
            path = self.index.parent / self.names[file]
            for part in (path.parent, path):  # a link would read another file than the one the run wrote
                if part.is_symlink():
                    raise CheckpointError(f"{part}: a symbolic link where a shard of {self.index.name} is; refused")
            if not path.exists():
                raise CheckpointError(
                    f"{path}: missing, a shard file of {self.index} (an index reads its shards/ beside it: copy the "
                    f"run folder whole, or merge it into one file: python -m training.run.shards --merge)"
                )
            opened = PieceFile(path)
            if "shards" in opened.header:
                raise CheckpointError(f"{path}: an index where a shard file of {self.index} is ({CORRUPT})")
            self.open[file] = opened
        opened = self.open[file]
        if name not in opened.layout or opened.header["arrays"].get(name) != expected:
            raise CheckpointError(
                f"{opened.path}: does not hold piece {name} as {self.index.name} describes it ({CORRUPT})"
            )
        leaf = name.rpartition("@")[0]
        if (file, name) not in self.kept:
            if any(key[1].rpartition("@")[0] != leaf for key in self.kept):
                self.kept = {}
            self.kept[file, name] = opened.array(name)
        return self.kept[file, name]


class Sharded:
    """One leaf of a sharded checkpoint: its dtype and global shape, and a slice of it read from the pieces that
    overlap the slice (``leaf[index]``, the callback ``jax.make_array_from_callback`` calls per device)."""

    def __init__(self, name: str, dtype: np.dtype, shape: tuple, pieces: list, files: ShardFiles):
        self.name, self.dtype, self.shape, self.pieces, self.files = name, dtype, shape, pieces, files
        self.ndim = len(shape)
        self.check_finite, self.nonfinite = False, 0  # NaN/Inf counted in the slices read (``restore``'s check)

    def __getitem__(self, index) -> np.ndarray:
        index = index if isinstance(index, tuple) else (index,)
        index = index + (slice(None),) * (self.ndim - len(index))
        box = [s.indices(n) for s, n in zip(index, self.shape)]
        if any(step != 1 for _, _, step in box):
            raise ValueError(f"{self.name}: only contiguous slices are read, got {index}")
        low, high = [b[0] for b in box], [max(b[0], b[1]) for b in box]
        out = np.empty([h - lo for lo, h in zip(low, high)], self.dtype)
        for file, start, stop, crc in self.pieces:
            top = [max(a, b) for a, b in zip(low, start)]
            end = [min(a, b) for a, b in zip(high, stop)]
            if any(t >= e for t, e in zip(top, end)) and self.ndim:
                continue
            shape = [b - a for a, b in zip(start, stop)]
            piece = self.files.array(file, piece_name(self.name, start), [self.dtype.name, shape, crc])
            source = tuple(slice(t - s, e - s) for t, e, s in zip(top, end, start))
            out[tuple(slice(t - lo, e - lo) for t, e, lo in zip(top, end, low))] = piece[source]
        if self.check_finite and jax.dtypes.issubdtype(out.dtype, np.inexact):
            # counted, not raised: the processes placing a leaf see their own slices, and decide together
            self.nonfinite += int(out.size - np.isfinite(out).sum())
        return out

    def refusal(self) -> str:
        return (
            f"{self.files.index}: array {self.name} has NaN/Inf value(s) (a diverged run?); refused, as it would "
            f"evaluate to nonsense without an error"
        )

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self[()] if dtype is None else self[()].astype(dtype)


def sharded_leaves(path: Path, shards: Any) -> dict[str, Sharded]:
    """An index's ``shards`` field as leaves, once it is known to describe whole arrays: every piece inside its
    leaf, none overlapping another, together covering it. A lie is one CheckpointError line naming the leaf."""
    import jax.numpy as jnp

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: its index of shards {what} ({CORRUPT})")

    if type(shards) is not dict or set(shards) != {"files", "arrays"}:
        raise bad('is not an object {"files": [...], "arrays": {...}}')
    names, leaves = shards["files"], shards["arrays"]
    if type(names) is not list or not all(type(n) is str and SHARD_FILE.fullmatch(n) for n in names):
        raise bad("names a file outside its shards/ folder, or not a .shard file")
    if type(leaves) is not dict:
        raise bad("has no object of arrays")
    files = ShardFiles(path, names)
    out = {}
    for name, entry in leaves.items():
        if type(entry) is not list or len(entry) != 3 or type(entry[0]) is not str or type(entry[2]) is not list:
            raise bad(f"describes {name} as {kind_of(entry)}, expected [dtype, shape, pieces]")
        dtype_name, shape, pieces = entry
        try:
            dtype = np.dtype(jnp.dtype(dtype_name))
        except TypeError:
            raise bad(f"gives {name} the dtype {dtype_name[:40]!r}") from None
        if dtype.name != dtype_name:
            raise bad(f"gives {name} the dtype {dtype_name[:40]!r}")
        if type(shape) is not list or len(shape) > MAX_RANK or not all(is_int(n, 0) for n in shape):
            raise bad(f"gives {name} the shape {kind_of(shape)}")
        size = math.prod(shape)
        if size >= INT64:
            raise bad(f"gives {name} the shape {shape}")
        if type(pieces) is not list or len(pieces) > MAX_PIECES or (not shape and len(pieces) != 1):
            raise bad(f"has {kind_of(pieces)} as the pieces of {name}")
        for piece in pieces:
            corners = piece[1:3] if type(piece) is list else []
            if (
                type(piece) is not list
                or len(piece) != 4
                or not is_int(piece[0], 0)
                or piece[0] >= len(names)
                or not all(type(c) is list and len(c) == len(shape) and all(is_int(n, 0) for n in c) for c in corners)
                or not is_int(piece[3], 0)
            ):
                raise bad(f"has a piece of {name} that is not [file, start, stop, crc32] of its rank")
            if not all(a < b <= n for a, b, n in zip(piece[1], piece[2], shape)):
                raise bad(f"has a piece of {name} outside its shape {shape}: {piece[1]} to {piece[2]}")
        problem = cover_problem(shape, [(p[1], p[2]) for p in pieces])
        if problem:
            raise bad(f"{problem} of {name}")
        out[name] = Sharded(name, dtype, tuple(shape), [tuple(p) for p in pieces], files)
    return out


def restore(
    path: str | Path,
    template: dict | Callable[[dict], dict],
    only: tuple[str, ...] | None = None,
    exclude: tuple[str, ...] = (),
    allow_nonfinite: bool = False,
    lazy: bool = False,
) -> tuple[dict, dict]:
    """Fills `template` (arrays or ShapeDtypeStructs) from the file; `only` restricts to top-level keys. Key paths
    under an `exclude` prefix (``params.head``) keep the template's values, which must then be arrays. A NaN or
    Inf in a restored array is refused unless `allow_nonfinite`: a diverged run's weights evaluate to nonsense
    without any error. `template` may be a function of the file's header (what the file holds can depend on it).
    ``lazy``: a sharded checkpoint's leaves come as ``Sharded`` (each device's slice read when placed, its NaN/Inf
    counted then, for the placing code to refuse), a one-file checkpoint's as arrays."""
    arrays, header = read(path, lazy=lazy)
    if callable(template):
        template = template(header)
    if only is not None and "params" in only and header.get("eval_params"):
        # the run evaluated other parameters than it trained (an average of them, say): those are its weights
        prefix = header["eval_params"] + "."
        evaluated = {"params." + n[len(prefix) :]: a for n, a in arrays.items() if n.startswith(prefix)}
        if not evaluated:
            raise CheckpointError(f"{path}: header names eval_params {header['eval_params']!r}, which holds no arrays")
        arrays = {**{n: a for n, a in arrays.items() if not n.startswith("params.")}, **evaluated}
    if only is not None:
        template = {k: template[k] for k in only}
        arrays = {n: a for n, a in arrays.items() if n.split(".", 1)[0] in only}
    excluded = lambda name: any(name == p or name.startswith(p + ".") for p in exclude)  # noqa: E731
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    likes = {key_path_str(p): like for p, like in leaves}
    unused = [p for p in exclude if not any(n == p or n.startswith(p + ".") for n in likes)]
    if unused:
        layers = sorted({".".join(n.split(".")[:2]) for n in likes})
        raise CheckpointError(f"exclude {unused[0]!r}: no such key path in the model; its layers: {', '.join(layers)}")
    fresh = {n for n in likes if excluded(n)}
    arrays = {n: a for n, a in arrays.items() if not excluded(n)}
    problems = [f"missing {n}" for n in likes if n not in arrays and n not in fresh]
    problems += [f"unexpected {n}" for n in sorted(set(arrays) - set(likes))]
    for name, like in likes.items():
        if name in arrays:
            got = arrays[name]
            if tuple(got.shape) != tuple(like.shape) or got.dtype != np.dtype(like.dtype):
                problems.append(
                    f"{name}: file has {got.dtype}{list(got.shape)}, "
                    f"model expects {np.dtype(like.dtype)}{list(like.shape)}"
                )
    if problems:
        shown = "; ".join(problems[:8]) + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else "")
        raise CheckpointError(f"{path}: does not match the model/optimizer of this config: {shown}")
    if not allow_nonfinite:
        for name in likes:
            got = arrays.get(name)
            if isinstance(got, Sharded):
                got.check_finite = True
            elif got is not None and jax.dtypes.issubdtype(got.dtype, np.inexact) and not np.isfinite(got).all():
                bad = int(got.size - np.isfinite(got).sum())
                raise CheckpointError(
                    f"{path}: array {name} has {bad} NaN/Inf value(s) of {got.size} (a diverged "
                    f"run?); refused, as it would evaluate to nonsense without an error"
                )
    values = [likes[n] if n in fresh else arrays[n] for n in likes]
    return jax.tree_util.tree_unflatten(treedef, values), header


def of_run(path: str | Path) -> Path:
    """A checkpoint file itself, or a run folder's best checkpoint (``model_best.params``; its
    ``checkpoint-latest.params`` when the run monitors nothing and so has no best)."""
    path = Path(path)
    if not path.is_dir():
        return path
    best = path / BEST
    return best if best.is_file() or not (path / LATEST).is_file() else path / LATEST


def check_checkpoint_file(path: Path, flag: str = "") -> None:
    """A checkpoint named on a command line (after ``flag``, if any) is a regular file: a pipe or a device would
    block or never end (``checkpoint.read`` refuses them too; this says so before any data is read)."""
    if not path.is_file():
        what = "not a regular file" if path.exists() else "no such checkpoint file"
        raise ConfigError(f"{flag + ' ' if flag else ''}{path}: {what}")
