"""Named numpy arrays from a ``.npz`` file or a folder of ``.npy`` files, mapped to a batch's `input` and `target`.

``input`` names one array, a list of arrays (the model then receives a dict keyed by those names) or a dict
{input name: array name}; ``target`` names one array (or null: no target, the outputs are compared with the input),
or, for a model of several named outputs, a list of array names or {output name: array name} (the batch's target is
then a dict of those names: each output's loss and metrics take their own, ``weighted_sum``);
``mask`` names an array that becomes the batch's mask (e.g. (rows, T), 0 on padding tokens).
Arrays are memory-mapped, never read whole: a ``.npy`` file through ``np.load(mmap_mode="r")``, an ``.npz`` member
stored without compression (``np.savez``) at its offset inside the zip file. Only a compressed member
(``np.savez_compressed``) has to be read into memory, since its bytes on disk are not the array's. A batch reads
just its rows, so a file larger than memory trains (the page cache keeps what fits).

Splits are a partition of the rows (the same as the CSV loader's: ``split_by`` "random", "order" or "group" with
``group`` naming an array of one id per row), or "all" for files already split.
64-bit numbers become 32-bit per batch (int64 -> int32, float64 -> float32): JAX computes in 32 bits by default.
"""

from __future__ import annotations

import difflib
import faulthandler
import io
import struct
import zipfile
from pathlib import Path

import numpy as np

from data_loader.sources.tabular import check_split_by, split_rows
from files import reads
from files.reads import open_regular, size_text
from model.checks import check_range

SPLITS = ("all", "train", "validation", "test")
NARROW = {np.dtype(np.int64): np.int32, np.dtype(np.uint64): np.uint32, np.dtype(np.float64): np.float32}


def _memmap(f, path: Path, name: str) -> np.ndarray:
    """The .npy array that starts at f's position, memory-mapped through the open file (never reopened by name)."""
    version = np.lib.format.read_magic(f)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = reader(f)
    if dtype.hasobject:
        raise ValueError(f"{path}: array {name!r} holds Python objects, not numbers")
    if not shape or 0 in shape:
        return np.zeros(shape, dtype)
    # A read past the end of a mapped file that another process cut short kills the process with SIGBUS, which
    # Python cannot catch: ArraysDataset checks the files' sizes before every batch, and for a cut in the microseconds
    # between that check and the read, faulthandler at least prints where (this module's get_batch) before it dies.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    return np.memmap(f, dtype, "r", f.tell(), shape, order="F" if fortran else "C")


def check_mapped(arrays: dict[str, np.ndarray], path: Path) -> None:
    """A ValueError naming the file when a memory-mapped array's file is now shorter than the array: truncated or
    rewritten by another process since it was opened. Reading the missing part would end the process with SIGBUS and
    no message. The size comes from the mapping's own descriptor (the file opened, not whatever now has its name).
    `path`: the .npz file or the folder of .npy files the arrays come from."""
    for name, array in arrays.items():
        mapping = getattr(array, "_mmap", None)  # np.memmap's mapping; None for arrays read into memory
        if mapping is None:
            continue
        size, needed = mapping.size(), array.offset + array.nbytes
        if size < needed:
            where = path / f"{name}.npy" if path.is_dir() else f"{path} (member {name}.npy)"
            raise ValueError(
                f"{where}: {size_text(size)} now, shorter than the {size_text(needed)} its array {name!r} needs: the "
                "file was cut short or rewritten while it was memory-mapped (another process writing it?)"
            )


def _npz_member(path: Path, f, archive: zipfile.ZipFile, info: zipfile.ZipInfo, mmap: bool) -> np.ndarray:
    """One member of an .npz file: a memory map at its offset when stored uncompressed, else read (no more than its
    declared size, which zipfile holds it to, and at most reads.MAX_INFLATED_BYTES)."""
    name = info.filename[:-4]
    if mmap and info.compress_type == zipfile.ZIP_STORED:
        f.seek(info.header_offset)
        local = f.read(30)
        if local[:4] != b"PK\x03\x04":
            raise ValueError(f"{path}: damaged zip file (member {info.filename!r} has no local header)")
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_length + extra_length)
        return _memmap(f, path, name)
    limit = reads.MAX_INFLATED_BYTES
    if info.file_size > limit:
        raise ValueError(
            f"{path}: array {name!r} declares {size_text(info.file_size)} uncompressed, more than the "
            f"{size_text(limit)} a compressed member may inflate to (store it uncompressed with np.savez to "
            "memory-map it instead)"
        )
    return np.load(io.BytesIO(archive.read(info)), allow_pickle=False)


def _npy(path: Path, mmap: bool) -> np.ndarray:
    """A .npy file, opened only if it is a regular file (a FIFO or a device is refused without blocking)."""
    with open_regular(path) as f:
        return _memmap(f, path, path.stem) if mmap else np.load(f, allow_pickle=False)


def open_arrays(path: str | Path, names: list[str], mmap: bool = True) -> dict[str, np.ndarray]:
    """The arrays called `names` in an .npz file or a folder of <name>.npy files; unknown names list what exists."""
    path = Path(path)
    archive = file = None
    if path.is_dir():
        available = {p.stem: p for p in sorted(path.glob("*.npy"))}
        opener = lambda name: _npy(available[name], mmap)  # noqa: E731
    elif path.exists():
        if path.suffix == ".npy":
            raise ValueError(
                f"{path}: a single .npy file holds one unnamed array; give the folder it is in (each "
                f"<name>.npy there is the array <name>) or an .npz file"
            )
        try:
            file = open_regular(path)
            archive = zipfile.ZipFile(file)
        except (zipfile.BadZipFile, OSError) as error:
            if file is not None:
                file.close()
            raise ValueError(f"{path}: not an .npz file ({error})") from None
        members = {info.filename[:-4]: info for info in archive.infolist() if info.filename.endswith(".npy")}
        available = members
        opener = lambda name: _npz_member(path, file, archive, members[name], mmap)  # noqa: E731
    else:
        raise FileNotFoundError(f"{path}: no such file or folder (expected an .npz file or a folder of .npy files)")
    try:
        return {name: _open(path, name, available, opener) for name in names}
    finally:
        if archive is not None:
            archive.close()
            file.close()


def _open(path: Path, name: str, available, opener) -> np.ndarray:
    """One named array, checked: numbers with a first axis."""
    if name not in available:
        close = difflib.get_close_matches(name, list(available), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{path}: no array {name!r}; available: {', '.join(available) or 'none'}.{hint}")
    try:
        array = opener(name)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: cannot read array {name!r} ({error})") from None
    if array.dtype.kind not in "biuf" or array.ndim == 0:
        raise ValueError(
            f"{path}: array {name!r} is {array.dtype} of shape {list(array.shape)}; expected "
            "numbers with a first axis of examples"
        )
    return array


def _groups(path, name: str, array: np.ndarray) -> np.ndarray:
    """The group of every row: one value per row (an id), read whole."""
    if array.ndim != 1:
        raise ValueError(f"{path}: group array {name!r} has shape {list(array.shape)}; expected one id per row")
    return np.asarray(array)


def _narrow(array: np.ndarray, name: str, rows: np.ndarray) -> np.ndarray:
    """64-bit numbers as 32-bit; an integer the narrower type cannot hold is refused, never wrapped (int64 2**32 + 3
    would become 3). A float too large becomes inf, which the loader's check of finite values reports."""
    target = NARROW.get(array.dtype)
    if target is None:
        return array
    if array.dtype.kind in "iu" and array.size:
        info = np.iinfo(target)
        outside = (array < info.min) | (array > info.max)
        if outside.any():
            at = np.unravel_index(int(np.argmax(outside)), array.shape)
            raise ValueError(
                f"array {name!r}, row {int(rows[at[0]])}: {array[at]} does not fit {np.dtype(target)} (from "
                f"{array.dtype}); store it as a narrower type or as floats"
            )
    return array.astype(target)


class ArraysDataset:
    """One split of named arrays: each batch reads only its rows of the (memory-mapped) arrays."""

    def __init__(
        self,
        path,
        input,
        target,
        split="all",
        validation_fraction=0.1,
        test_fraction=0.0,
        split_seed=0,
        mmap=True,
        classes=None,
        split_by="random",
        group=None,
        mask=None,
    ):
        check_settings(input, target, split, validation_fraction, test_fraction, classes, mask)
        check_split_by(split_by, group, "an array")
        inputs, targets = _named(input), _named(target)
        names = [inputs] if isinstance(inputs, str) else list(inputs.values())
        if targets is not None:
            names += [targets] if isinstance(targets, str) else list(targets.values())
        names += [name for name in (mask, group) if name is not None]
        self.path = Path(path)
        self.arrays = open_arrays(path, list(dict.fromkeys(names)), mmap)
        lengths = {name: len(a) for name, a in self.arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"{path}: the arrays have different numbers of rows: "
                + ", ".join(f"{n} {v}" for n, v in lengths.items())
            )
        rows = next(iter(lengths.values()))
        if split == "all":
            self.rows = np.arange(rows)
        else:
            groups = None if group is None else _groups(path, group, self.arrays[group])
            self.rows = split_rows(rows, validation_fraction, test_fraction, split_seed, split_by, groups)[split]
        if not len(self.rows):
            raise ValueError(
                f"{path}: the {split} split of {rows} rows is empty (validation_fraction "
                f"{validation_fraction}, test_fraction {test_fraction})"
            )
        self.inputs, self.target, self.mask = inputs, targets, mask
        self.preprocessing = {"classes": list(classes)} if classes else {}

    def __len__(self) -> int:
        return len(self.rows)

    def get_batch(self, indices):
        check_mapped(self.arrays, self.path)  # a mapped file cut short: a message, not SIGBUS
        rows = self.rows[indices]
        read = lambda name: _narrow(np.asarray(self.arrays[name][rows]), name, rows)  # noqa: E731
        named = lambda names: read(names) if isinstance(names, str) else {k: read(n) for k, n in names.items()}  # noqa: E731
        batch = {"input": named(self.inputs)}
        if self.target is not None:
            batch["target"] = named(self.target)
        if self.mask is not None:
            batch["mask"] = read(self.mask).astype(np.float32)
        return batch


def _named(names):
    """An array's name as it is, or a list of names / {name in the batch: array name} as {name in the batch: array
    name}; None stays None."""
    if names is None or isinstance(names, str):
        return names
    return dict(names) if isinstance(names, dict) else {name: name for name in names}


def check_settings(
    input, target, split="all", validation_fraction=0.1, test_fraction=0.0, classes=None, mask=None
) -> None:
    """The settings, checked without reading anything."""
    ok_name = lambda v: isinstance(v, str) and v != ""  # noqa: E731
    if not (
        ok_name(input)
        or (isinstance(input, list) and input and all(map(ok_name, input)) and len(set(input)) == len(input))
        or (isinstance(input, dict) and input and all(map(ok_name, input)) and all(map(ok_name, input.values())))
    ):
        raise ValueError(
            f'input: expected an array name, a list of names or {{"input name": "array name"}}, got {input!r}'
        )
    if not (
        target is None
        or ok_name(target)
        or (isinstance(target, list) and target and all(map(ok_name, target)) and len(set(target)) == len(target))
        or (isinstance(target, dict) and target and all(map(ok_name, target)) and all(map(ok_name, target.values())))
    ):
        raise ValueError(
            'target: expected an array name, null (no target), a list of names or {"output name": "array name"} '
            f"(one per output of a model of several), got {target!r}"
        )
    if mask is not None and not ok_name(mask):
        raise ValueError(f"mask: expected an array name or null (no mask), got {mask!r}")
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(map(repr, SPLITS))}, got {split!r}")
    for name, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        check_range(value, name, 0, 1, open_high=True)
    if (split == "validation" and not validation_fraction) or (split == "test" and not test_fraction):
        raise ValueError(f"{split}_fraction: must be above 0 for the {split} split")
    if validation_fraction + test_fraction >= 1:
        raise ValueError(
            f"validation_fraction: {validation_fraction} and test_fraction {test_fraction} leave no rows for training"
        )
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        raise ValueError(f"classes: expected a list of class names, got {classes!r}")
