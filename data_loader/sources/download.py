"""Fetching dataset files when a network exists: mirrors in order, MD5 verified, atomic write, progress bar."""

from __future__ import annotations

import hashlib
import urllib.request
from pathlib import Path

from files.reads import open_regular
from files.writes import atomic_output


def checksum(path: str | Path, algorithm: str = "md5") -> str:
    """The file's hex digest, read in blocks (data files can be large); ValueError naming a file it cannot read, or
    one that is not a regular file (a FIFO would block, a device never end)."""
    digest = hashlib.new(algorithm)
    try:
        with open_regular(path) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:  # permission denied, a directory, a disk error
        raise ValueError(f"{path}: cannot read it ({(error.strerror or str(error)).lower()})") from None
    return digest.hexdigest()


def md5sum(path: str | Path) -> str:
    return checksum(path, "md5")


def download(filename: str, md5: str, mirrors: list[str], folder: str | Path, timeout: float = 30.0) -> Path:
    """Downloads `filename` from the first mirror that serves it with the right checksum into `folder`."""
    from tqdm import tqdm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / filename
    errors = []
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + filename
        try:
            # the temporary file becomes `target` only if the block ends without an error
            with urllib.request.urlopen(url, timeout=timeout) as response, atomic_output(target) as out:
                total = int(response.headers.get("Content-Length") or 0) or None
                digest = hashlib.md5()
                with tqdm(total=total, unit="B", unit_scale=True, desc=filename, leave=False) as bar:
                    for block in iter(lambda: response.read(1 << 16), b""):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
                if digest.hexdigest() != md5:
                    raise ValueError(f"checksum mismatch (md5 {digest.hexdigest()}, expected {md5})")
            return target
        except Exception as error:  # try the next mirror, report all failures together
            errors.append(f"{url}: {error}")
    # one line: the commands print an error as one `error:` line
    raise OSError(f"could not download {filename} into {folder}: " + "; ".join(errors))
