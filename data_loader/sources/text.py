"""Character-level text for language models: windows of a text file as token ids, the target shifted by one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from files.reads import read_regular

SPLITS = ("train", "validation", "test")


def read_text(path: str | Path, sha256: str | None = None) -> str:
    """A UTF-8 text file, its SHA-256 checked when given."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such text file")
    data = read_regular(path)  # a FIFO or a device is refused without blocking
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(
            f"{path}: checksum mismatch (sha256 {hashlib.sha256(data).hexdigest()}, expected {sha256}); "
            "the file is corrupt or not the original"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start})") from None


class CharDataset:
    """One split of a text file as windows of ``context`` + 1 characters: ``input`` int32 (context,) and ``target``
    int32 (context,), the same window one character later (the next character at every position).

    The vocabulary is every character of the whole file, sorted, so the splits share ids (nanoGPT's way). The
    first ``1 - validation_fraction`` of the file, in file order, is "train", the rest "validation"; a text without
    a test split of its own answers "test" with the validation part. Windows start every ``stride`` characters, or
    at ``windows`` evenly spaced positions (how many examples an epoch has); the loader shuffles them by
    (seed, epoch).
    """

    def __init__(
        self, path, split="train", context=64, stride=None, windows=None, validation_fraction=0.1, sha256=None
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if context < 1 or not 0 < validation_fraction < 1:
            raise ValueError(
                f"context must be >= 1 and validation_fraction in (0, 1), got {context} and {validation_fraction}"
            )
        text = read_text(path, sha256)
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        alphabet = np.unique(codes)
        self.vocabulary = "".join(map(chr, alphabet))
        ids = np.searchsorted(alphabet, codes).astype(np.int32)
        cut = int(len(ids) * (1 - validation_fraction))
        self.ids = ids[:cut] if split == "train" else ids[cut:]
        self.context = context
        last = len(self.ids) - context - 1  # the last start with a full window and its next character
        if last < 0:
            raise ValueError(
                f"{path}: the {split} split has {len(self.ids)} characters, fewer than a window of {context} + 1"
            )
        if windows is not None:
            if windows < 1:
                raise ValueError(f"windows must be >= 1, got {windows}")
            self.starts = np.floor(np.linspace(0, last, windows)).astype(np.int64)
        else:
            stride = context if stride is None else stride
            if stride < 1:
                raise ValueError(f"stride must be >= 1, got {stride}")
            self.starts = np.arange(0, last + 1, stride)
        self.preprocessing = {"task": "sequence", "vocabulary": self.vocabulary, "context": context}

    def __len__(self):
        return len(self.starts)

    def get_batch(self, indices):
        window = self.ids[self.starts[indices][:, None] + np.arange(self.context + 1)]
        return {"input": window[:, :-1], "target": window[:, 1:]}
