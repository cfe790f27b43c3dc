"""Damaged data files: every way an IDX file can fail to read is a ValueError naming the file and what is wrong, and
train.py / test.py turn it into one `error:` line (exit status 2), never a traceback."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from data_loader.data_loaders import mnist
from data_loader.sources.download import checksum, download
from data_loader.sources.idx import read_idx, write_idx
from tests.conftest import make_idx_dataset

ROOT = Path(__file__).resolve().parents[2]
IMAGES = "train-images-idx3-ubyte.gz"
LABELS = "train-labels-idx1-ubyte.gz"


@pytest.fixture
def idx_file(tmp_path):
    """A small gzip IDX file and the array it holds."""
    array = np.random.default_rng(0).integers(0, 256, (6, 5, 5)).astype(np.uint8)
    path = tmp_path / "x-idx3-ubyte.gz"
    write_idx(path, array)
    return path, array


def refused(path, *words):
    """read_idx(path) raises a ValueError that names the file and says one of `words`."""
    with pytest.raises(ValueError) as error:
        read_idx(path)
    message = str(error.value)
    assert str(path) in message and any(w in message for w in words), message
    assert "\n" not in message
    return message


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.2, 0.5, 0.9, 0.99])
def test_a_truncated_gzip_file_is_named(idx_file, fraction):
    path, _ = idx_file
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)] if fraction else b"")
    refused(path, "truncated", "empty")


def test_a_byte_flipped_anywhere_in_the_data_is_named_or_harmless(idx_file):
    path, array = idx_file
    data = path.read_bytes()
    header = data.index(b"\x00", 10) + 1  # the gzip header ends after the stored file name
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x5A
        path.write_bytes(bytes(flipped))
        if i < header - 1:  # a time stamp or a name: the array itself is intact
            try:
                assert np.array_equal(read_idx(path), array)
            except ValueError:
                pass
        else:
            refused(path, "corrupt", "truncated")


def test_a_raw_idx_file_cut_short_or_with_a_broken_header_is_named(tmp_path):
    path = tmp_path / "raw-idx1-ubyte"
    write_idx(path, np.arange(10, dtype=np.uint8))
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    refused(path, "truncated")
    path.write_bytes(b"\x00\x00\x08\xff" + data[4:])  # 255 dimensions: a header longer than the file
    refused(path, "truncated")
    path.write_bytes(b"\x00\x00\x08\x02" + b"\xff" * 8)  # 2^64 elements: no overflow, just wrong
    refused(path, "truncated")
    path.write_bytes(b"PK\x03\x04" + data[4:])
    refused(path, "magic")
    (tmp_path / "plain.gz").write_bytes(data)  # not gzip at all
    refused(tmp_path / "plain.gz", "corrupt")


def test_a_directory_or_a_missing_file_is_named(tmp_path):
    (tmp_path / "folder.gz").mkdir()
    refused(tmp_path / "folder.gz", "a folder, not a regular file")
    refused(tmp_path / "none.gz", "no such file")
    with pytest.raises(ValueError, match="folder.gz: a folder, not a regular file"):
        checksum(tmp_path / "folder.gz")


def test_an_unreadable_file_is_named(idx_file):
    if os.geteuid() == 0:
        pytest.skip("running as root: file permissions do not stop reads")
    path, _ = idx_file
    path.chmod(0)
    try:
        refused(path, "permission denied")
        with pytest.raises(ValueError, match="permission denied"):
            checksum(path)
    finally:
        path.chmod(0o644)


def test_mnist_names_the_file_that_does_not_fit(tmp_path):
    folder = tmp_path / "mnist"
    make_idx_dataset(folder, n_train=30, n_test=10)
    load = lambda: mnist("train", data_dir=str(folder), verify=False, validation_size=5)  # noqa: E731
    write_idx(folder / LABELS, np.full(30, 12, np.uint8))
    with pytest.raises(ValueError, match=f"{LABELS}: expected labels 0-9 .* values 12..12"):
        load()
    write_idx(folder / LABELS, np.zeros(29, np.uint8))
    with pytest.raises(ValueError, match=f"{IMAGES} holds 30 images but .*{LABELS} 29 labels"):
        load()
    write_idx(folder / IMAGES, np.zeros((30, 784), np.uint8))
    with pytest.raises(ValueError, match=f"{IMAGES}: expected images of shape"):
        load()


def test_download_failure_is_one_line(tmp_path):
    missing = [(tmp_path / "a").as_uri(), (tmp_path / "b").as_uri()]
    with pytest.raises(OSError) as error:
        download("f.gz", "0" * 32, missing, tmp_path / "out")
    assert "\n" not in str(error.value) and "could not download f.gz" in str(error.value)


def load_test_script():
    """test.py as a module, loaded by path: "test" is also the name of a standard-library package."""
    spec = importlib.util.spec_from_file_location("test_script", ROOT / "test.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def train_error(tmp_path, capsys, monkeypatch, config: dict) -> str:
    """`config` written to tmp_path/config.json and given to train.py in-process: it must exit 2 with one error
    line, which is returned."""
    import train

    monkeypatch.setattr(train, "setup_logging", lambda *a, **k: None)  # dictConfig would close pytest's handlers
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["-c", str(tmp_path / "config.json")])
    assert exit_info.value.code == 2
    return one_error_line(capsys)


@pytest.mark.parametrize("damage", ["truncate", "flip", "directory"])
def test_train_and_test_py_report_a_damaged_file_in_one_line(tmp_path, capsys, monkeypatch, damage):
    import train

    # train.py's logging setup (dictConfig) closes every handler this process ever made: absl's, left by an export
    # test in the same worker, holds pytest's capture stream and would take it down
    monkeypatch.setattr(train, "setup_logging", lambda *args, **kwargs: None)
    folder = tmp_path / "mnist"
    make_idx_dataset(folder, n_train=30, n_test=10)
    path = folder / IMAGES
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-6] + bytes([data[-6] ^ 0xFF]) + data[-5:])  # the CRC
    else:
        path.unlink()
        path.mkdir()
    loader = {"name": "mnist", "args": {"data_dir": str(folder), "verify": False, "validation_size": 5}}
    config = {
        "name": "faults",
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [8]}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {
            "train": {**loader, "args": {**loader["args"], "split": "train"}},
            "validation": {**loader, "args": {**loader["args"], "split": "validation"}},
        },
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved")},
    }
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))

    with pytest.raises(SystemExit) as exit_info:
        train.main(["-c", str(config_path)])
    assert exit_info.value.code == 2
    line = one_error_line(capsys)
    assert str(path) in line and ("truncated" in line or "corrupt" in line or "not a regular file" in line), line
    assert not (tmp_path / "saved").exists()

    (tmp_path / "model_best.params").write_bytes(b"")  # never read: the data fails first
    with pytest.raises(SystemExit) as exit_info:
        load_test_script().main(["--run", str(tmp_path / "model_best.params"), "--split", "validation"])
    assert exit_info.value.code == 2
    assert str(path) in one_error_line(capsys)
