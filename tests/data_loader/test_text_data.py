"""Character windows of a text file: vocabulary, split, the shift by one, determinism, checksums, errors."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from data_loader.data_loaders import char_text
from data_loader.sources.text import CharDataset

TEXT = "to be, or not to be: that is the question.\nwhether 'tis nobler in the mind to suffer\n" * 20


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_vocabulary_split_and_shifted_windows(text_file):
    train = CharDataset(text_file, "train", context=8)
    valid = CharDataset(text_file, "validation", context=8)
    assert train.vocabulary == "".join(sorted(set(TEXT))) == valid.vocabulary
    cut = int(len(TEXT) * 0.9)
    assert len(train.ids) == cut and len(valid.ids) == len(TEXT) - cut  # file order, nanoGPT's 90/10
    batch = train.get_batch(np.array([0, 3]))
    assert batch["input"].dtype == batch["target"].dtype == np.int32 and batch["input"].shape == (2, 8)
    decode = lambda ids: "".join(train.vocabulary[i] for i in ids)  # noqa: E731
    assert decode(batch["input"][0]) == TEXT[:8] and decode(batch["target"][0]) == TEXT[1:9]
    assert decode(batch["input"][1]) == TEXT[24:32]  # windows start every `context` characters by default
    assert train.preprocessing == {"task": "sequence", "vocabulary": train.vocabulary, "context": 8}
    test = CharDataset(text_file, "test", context=8)
    assert np.array_equal(test.ids, valid.ids)  # no test split of its own


def test_windows_and_strides(text_file):
    spaced = CharDataset(text_file, "train", context=8, windows=100)
    last = len(spaced.ids) - 9
    assert len(spaced) == 100 and spaced.starts[0] == 0 and spaced.starts[-1] == last
    strided = CharDataset(text_file, "train", context=8, stride=3)
    assert np.array_equal(strided.starts, np.arange(0, last + 1, 3))
    window = strided.get_batch(np.array([len(strided) - 1]))
    assert window["target"].shape == (1, 8)  # the last window still has its next character


def test_loader_order_is_deterministic_and_covers_every_window(text_file):
    a = char_text(text_file, context=8, batch_size=5, shuffle=True, seed=3)
    b = char_text(text_file, context=8, batch_size=5, shuffle=True, seed=3)
    assert np.array_equal(a.order(1), b.order(1)) and not np.array_equal(a.order(1), a.order(2))
    assert a.spec["input"].shape == (5, 8) and str(a.spec["target"].dtype) == "int32"


def test_checksum_and_errors(text_file, tmp_path):
    good = hashlib.sha256(text_file.read_bytes()).hexdigest()
    CharDataset(text_file, sha256=good)
    with pytest.raises(ValueError, match="checksum mismatch"):
        CharDataset(text_file, sha256="0" * 64)
    with pytest.raises(FileNotFoundError, match="no such text file"):
        CharDataset(tmp_path / "missing.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1") * 100)
    with pytest.raises(ValueError, match="not UTF-8"):
        CharDataset(tmp_path / "latin1.txt")
    with pytest.raises(ValueError, match="fewer than a window of 1000"):
        CharDataset(text_file, "validation", context=1000)
    with pytest.raises(ValueError, match="unknown split"):
        CharDataset(text_file, "dev")
