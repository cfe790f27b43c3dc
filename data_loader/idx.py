"""Reader for the IDX format used by MNIST, Fashion-MNIST and KMNIST (gzip or raw)."""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """The file's array; any file that cannot be read as IDX raises ValueError naming it and what is wrong."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except EOFError:
        raise ValueError(f"{path}: truncated or corrupt gzip file (the compressed data ends early)") from None
    except (zlib.error, gzip.BadGzipFile) as error:  # BadGzipFile before OSError: it is one
        raise ValueError(f"{path}: corrupt gzip file ({error})") from None
    except OSError as error:  # permission denied, a directory, a disk error
        raise ValueError(f"{path}: cannot read it ({(error.strerror or str(error)).lower()})") from None
    if not data:
        raise ValueError(f"{path}: empty file, not an IDX file")
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    header = 4 + 4 * data[3]
    if len(data) < header:
        raise ValueError(f"{path}: truncated or corrupt IDX file ({len(data)} bytes, shorter than its header)")
    shape = tuple(int(d) for d in np.frombuffer(data[4:header], ">u4"))
    dtype = np.dtype(_DTYPES[data[2]])
    expected = header + math.prod(shape) * dtype.itemsize  # Python ints: a corrupt header must not overflow
    if len(data) != expected:
        raise ValueError(f"{path}: truncated or corrupt IDX file ({len(data)} bytes, header says {expected})")
    return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Writes an IDX file (gzip if the name ends in .gz); used by tests to build tiny datasets."""
    path = Path(path)
    codes = {np.dtype(v).newbyteorder(">") if np.dtype(v).itemsize > 1 else np.dtype(v): k for k, v in _DTYPES.items()}
    dtype = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    header = bytes([0, 0, codes[dtype], array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    payload = header + np.ascontiguousarray(array, dtype).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(payload)
