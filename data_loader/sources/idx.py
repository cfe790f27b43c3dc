"""Reader for the IDX format used by MNIST, Fashion-MNIST and KMNIST (gzip or raw)."""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from files import reads
from files.reads import open_regular, size_text

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """The file's array; any file that cannot be read as IDX raises ValueError naming it and what is wrong. Only a
    regular file is opened (a FIFO or a device is refused without blocking), and no more than its header declares
    (at most reads.MAX_INFLATED_BYTES: MNIST's largest file holds 47 MB) is read or inflated."""
    path = Path(path)
    limit = reads.MAX_INFLATED_BYTES
    try:
        with open_regular(path, None if path.suffix == ".gz" else limit, "IDX file") as raw:
            f = gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw
            head = f.read(4)
            if not head:
                raise ValueError(f"{path}: empty file, not an IDX file")
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _DTYPES:
                # inflated from a gzip file, a bad header is as likely its damage as another format's data
                damaged = ", or a corrupt gzip file" if f is not raw else ""
                raise ValueError(f"{path}: not an IDX file (bad magic number{damaged})")
            dims = f.read(4 * head[3])
            if len(dims) < 4 * head[3]:
                size = 4 + len(dims)
                raise ValueError(f"{path}: truncated or corrupt IDX file ({size} bytes, shorter than its header)")
            shape = tuple(int(d) for d in np.frombuffer(dims, ">u4"))
            dtype = np.dtype(_DTYPES[head[2]])
            header = 4 + len(dims)
            expected = header + math.prod(shape) * dtype.itemsize  # Python ints: a corrupt header must not overflow
            if expected > limit:
                raise ValueError(
                    f"{path}: truncated or corrupt IDX file (its header declares {size_text(expected)}, more than "
                    f"the {size_text(limit)} an IDX file may hold; or a decompression bomb)"
                )
            data = f.read(expected - header + 1)  # one byte more: a file longer than its header says is refused
    except EOFError:
        raise ValueError(f"{path}: truncated or corrupt gzip file (the compressed data ends early)") from None
    except (zlib.error, gzip.BadGzipFile) as error:  # BadGzipFile before OSError: it is one
        raise ValueError(f"{path}: corrupt gzip file ({error})") from None
    except OSError as error:  # permission denied, a directory, a disk error
        raise ValueError(f"{path}: cannot read it ({(error.strerror or str(error)).lower()})") from None
    if header + len(data) != expected:
        size = header + len(data)
        what = f"more than {expected}" if size > expected else str(size)
        raise ValueError(f"{path}: truncated or corrupt IDX file ({what} bytes, header says {expected})")
    return np.frombuffer(data, dtype).reshape(shape).astype(dtype.newbyteorder("="))


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
