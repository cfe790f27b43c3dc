"""Checkpoints that are corrupt, cut short, hand-edited or diverged are refused with a CheckpointError naming the
file and what is wrong; none loads silently and none ends in a traceback of another kind."""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest
from safetensors.numpy import save as safetensors_bytes

from training.run import checkpoint
from training.run.checkpoint import CheckpointError

HEADER = {
    "epoch": 2,
    "step": 20,
    "best": 0.9,
    "best_epoch": 2,
    "bad_epochs": 0,
    "monitor": "max val/accuracy",
    "config_hash": "abc",
    "data_seed": 1,
    "min_loss": 0.1,
    "row": {"epoch": 2, "val/accuracy": 0.9},
}


def small_tree() -> dict:
    rng = np.random.default_rng(0)
    return {
        "params": {
            "conv1": {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": np.zeros((0, 3), np.float32)},
            "head": {"w": rng.normal(size=(2, 2)).astype(np.float16)},
        },
        "state": {"count": np.array(7, np.int64), "mask": np.array([True, False, True])},
        "opt_state": {"mu": rng.normal(size=(5,)), "ids": np.arange(6, dtype=np.uint8)},
        "rng": np.array([1, 2], np.uint32),
    }


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "checkpoint-latest.params"
    checkpoint.save(path, small_tree(), HEADER)
    return path


def data_start(payload: bytes) -> int:
    return 8 + int.from_bytes(payload[:8], "little")


def rewrite(path, arrays: dict, header_text: str, header_crc: bool = True) -> None:
    """A file whose checksums are all valid around whatever header text a test needs, as encode would write it."""
    meta = {"header": header_text}
    if header_crc:
        meta["header_crc32"] = str(zlib.crc32(header_text.encode()))
    path.write_bytes(safetensors_bytes(arrays, metadata=meta))


def refused(path, match: str | None = None) -> CheckpointError:
    with pytest.raises(CheckpointError, match=match) as error:
        checkpoint.read(path)
    assert str(path) in str(error.value)
    return error.value


def test_round_trip_records_a_checksum_per_array(saved):
    arrays, header = checkpoint.read(saved)
    tree = small_tree()
    assert set(header["arrays"]) == set(arrays) == set(checkpoint.flatten(tree))
    for name, value in checkpoint.flatten(tree).items():
        np.testing.assert_array_equal(arrays[name], value)
        assert arrays[name].dtype == value.dtype
    assert header["format_version"] == checkpoint.FORMAT_VERSION == 2
    restored, _ = checkpoint.restore(saved, small_tree())
    np.testing.assert_array_equal(restored["params"]["head"]["w"], tree["params"]["head"]["w"])


def test_every_byte_flipped_is_refused(saved, tmp_path):
    """Each byte of the file, XORed with 0xFF and with 0x01 (one bit), header region and data section alike."""
    payload = saved.read_bytes()
    start = data_start(payload)
    assert len(payload) - start == 12 * 4 + 4 * 2 + 8 + 3 + 5 * 8 + 6 + 2 * 4  # every array's bytes, nothing else
    bad = tmp_path / "bad.params"
    cases = 0
    for mask in (0xFF, 0x01):
        for i in range(len(payload)):
            flipped = bytearray(payload)
            flipped[i] ^= mask
            bad.write_bytes(flipped)
            error = refused(bad)
            if i >= start:
                assert "fails its checksum (the file is corrupt" in str(error), (i, error)
            cases += 1
    assert cases == 2 * len(payload) > 1000


def test_any_value_at_the_end_of_the_header_is_refused(saved, tmp_path):
    """safetensors pads its JSON with spaces, where a tab or a newline would still parse."""
    payload = saved.read_bytes()
    start = data_start(payload)
    assert payload[start - 2 : start] == b"  "  # this file has padding to test
    bad = tmp_path / "bad.params"
    for i in range(start - 8, start):
        for value in set(range(256)) - {payload[i]}:
            changed = bytearray(payload)
            changed[i] = value
            bad.write_bytes(changed)
            refused(bad)


def test_a_data_flip_names_the_array(saved, tmp_path):
    payload = saved.read_bytes()
    layout = json.loads(payload[8 : data_start(payload)])
    begin, end = layout["params.conv1.w"]["data_offsets"]
    flipped = bytearray(payload)
    flipped[data_start(payload) + (begin + end) // 2] ^= 0x10
    (tmp_path / "bad.params").write_bytes(flipped)
    refused(tmp_path / "bad.params", r"bad.params: array params.conv1.w fails its checksum \(the file is corrupt")


def test_every_truncation_and_appended_garbage_is_refused(saved, tmp_path):
    payload = saved.read_bytes()
    bad = tmp_path / "bad.params"
    for length in range(len(payload)):
        bad.write_bytes(payload[:length])
        refused(bad)
    for tail in (b"\0", b" ", b"x" * 100):
        bad.write_bytes(payload + tail)
        refused(bad)


def test_changed_dtype_shape_or_name_with_the_same_bytes_is_refused(saved, tmp_path):
    """Edits that keep every size right, so only the checksums can tell."""
    text = saved.read_bytes()
    start = data_start(text)
    head = text[8:start].decode()
    for old, new in (
        ('"dtype":"U8"', '"dtype":"I8"'),
        ('"dtype":"F16"', '"dtype":"I16"'),
        ('"shape":[0,3]', '"shape":[0,4]'),
        ('"params.conv1.w"', '"params.conv1.v"'),
    ):
        assert head.count(old) == 1, old
        edited = head.replace(old, new).encode()
        (tmp_path / "bad.params").write_bytes(len(edited).to_bytes(8, "little") + edited + text[start:])
        refused(tmp_path / "bad.params", "the file is corrupt")


WRONG_FIELDS = [
    ("epoch", "3"),
    ("epoch", -1),
    ("epoch", 1.5),
    ("epoch", True),
    ("epoch", None),
    ("epoch", [1]),
    ("epoch", 10**30),
    ("step", {"a": 1}),
    ("step", -5),
    ("best", "high"),
    ("best", float("nan")),
    ("best", float("inf")),
    ("best", [0.9]),
    ("best_epoch", "2"),
    ("bad_epochs", -1),
    ("bad_epochs", 0.5),
    ("monitor", 3),
    ("monitor", None),
    ("config_hash", 12),
    ("data_seed", "1"),
    ("data_seed", 2.0),
    ("min_loss", float("-inf")),
    ("row", [1, 2]),
    ("treedef", 5),
    ("format_version", "2"),
    ("format_version", 3),
    ("format_version", 0),
    ("format_version", None),
    ("position", -5),  # a position outside the epoch trained a wrong number of steps, "abc" or 1.5 a traceback
    ("position", 10**30),
    ("position", "abc"),
    ("position", 1.5),
    ("position", True),
    ("batches", 0),
    ("config", [1]),
]


@pytest.mark.parametrize("field, value", WRONG_FIELDS)
def test_header_field_of_the_wrong_type_is_refused(saved, tmp_path, field, value):
    arrays, header = checkpoint.read(saved)
    rewrite(tmp_path / "bad.params", arrays, json.dumps({**header, field: value}))
    refused(tmp_path / "bad.params", f"field '{field}' is ")


@pytest.mark.parametrize("field", ["epoch", "step", "format_version"])
def test_missing_required_field_is_refused(saved, tmp_path, field):
    arrays, header = checkpoint.read(saved)
    rewrite(tmp_path / "bad.params", arrays, json.dumps({k: v for k, v in header.items() if k != field}))
    refused(tmp_path / "bad.params", f"'{field}'")


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2, 3]",
        '"a string"',
        "3",
        "null",
        "NaN",
        "{",
        "",
        "[" * 100_000,
        '{"epoch": ' + "1" * 5000 + "}",
        '{"epoch": 1, "step": 1e400}',
        '{"epoch": {"a": [[[{"b": null}]]]}, "step": 2}',
        '{"format_version": 1, "epoch": 1, "step": 1, "best": NaN}',
        '{"format_version": 2, "epoch": 1, "step": 1}',  # version 2 without its array checksums
        '{"format_version": 1, "epoch": 1, "step": 1, "arrays": [1]}',  # checksums present whatever the version
        '{"format_version": 1, "epoch": 1, "step": 1, "arrays": {}}',
    ],
)
def test_any_header_text_is_an_error_not_a_traceback(saved, tmp_path, text):
    arrays, _ = checkpoint.read(saved)
    rewrite(tmp_path / "bad.params", arrays, text)
    refused(tmp_path / "bad.params")


def test_header_checksum_is_verified_whatever_the_version_says(saved, tmp_path):
    arrays, header = checkpoint.read(saved)
    path = tmp_path / "bad.params"
    meta = {"header": json.dumps({**header, "format_version": 1, "epoch": 3}), "header_crc32": "12345"}
    path.write_bytes(safetensors_bytes(arrays, metadata=meta))
    refused(path, "its header fails its checksum")
    path.write_bytes(safetensors_bytes(arrays, metadata={"hedder": json.dumps(header)}))
    refused(path, "without a checkpoint header")


def test_version_1_file_without_checksums_still_reads(saved, tmp_path):
    arrays, header = checkpoint.read(saved)
    old = {k: v for k, v in header.items() if k != "arrays"}
    rewrite(tmp_path / "old.params", arrays, json.dumps({**old, "format_version": 1}), header_crc=False)
    got, got_header = checkpoint.read(tmp_path / "old.params")
    assert got_header["epoch"] == 2 and "arrays" not in got_header
    restored, _ = checkpoint.restore(tmp_path / "old.params", small_tree())
    np.testing.assert_array_equal(restored["opt_state"]["mu"], small_tree()["opt_state"]["mu"])
    rewrite(tmp_path / "old.params", arrays, json.dumps({**old, "format_version": 2}), header_crc=False)
    refused(tmp_path / "old.params", "without its checksums")


def test_encode_refuses_a_header_it_could_not_read(tmp_path):
    for header in ({"epoch": 1}, {"epoch": 1, "step": 1, "best": float("nan")}, {"epoch": "1", "step": 1}):
        with pytest.raises(CheckpointError, match="checkpoint header: "):
            checkpoint.save(tmp_path / "x.params", small_tree(), header)
    assert not list(tmp_path.iterdir())


def test_non_finite_parameters_are_refused_unless_allowed(tmp_path):
    tree = small_tree()
    tree["params"]["conv1"]["w"][:] = np.nan
    tree["params"]["head"]["w"][:] = np.nan
    path = tmp_path / "nan.params"
    checkpoint.save(path, tree, HEADER)
    with pytest.raises(CheckpointError, match=r"nan.params: array params.conv1.w has 12 NaN/Inf value\(s\) of 12"):
        checkpoint.restore(path, small_tree())
    with pytest.raises(CheckpointError, match="params.conv1.w"):
        checkpoint.restore(path, small_tree(), only=("params", "state"))
    restored, _ = checkpoint.restore(path, small_tree(), allow_nonfinite=True)
    assert np.isnan(restored["params"]["conv1"]["w"]).all()
    fresh = small_tree()
    restored, _ = checkpoint.restore(path, fresh, exclude=("params.conv1.w", "params.head"))
    np.testing.assert_array_equal(restored["params"]["conv1"]["w"], fresh["params"]["conv1"]["w"])

    tree = small_tree()
    tree["opt_state"]["mu"][3] = np.inf
    checkpoint.save(path, tree, HEADER)
    with pytest.raises(CheckpointError, match="array opt_state.mu has 1 NaN/Inf"):
        checkpoint.restore(path, small_tree())
    checkpoint.restore(path, small_tree(), only=("params", "state"))  # the optimizer state is not restored


def test_unreadable_paths_are_checkpoint_errors(tmp_path):
    refused(tmp_path / "missing.params", "no such checkpoint file")
    (tmp_path / "folder.params").mkdir()
    refused(tmp_path / "folder.params", "cannot read the checkpoint: Is a directory")
    path = tmp_path / "private.params"
    checkpoint.save(path, small_tree(), HEADER)
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running with the right to read any file (root)")
        refused(path, "cannot read the checkpoint: Permission denied")
    finally:
        path.chmod(0o600)


def test_remove_stale_temps_removes_only_interrupted_writes(tmp_path):
    stale = [tmp_path / ".checkpoint-latest.params.k2j_9x0a.tmp", tmp_path / ".metrics.jsonl.abc123.tmp"]
    kept = [
        tmp_path / "checkpoint-latest.params",
        tmp_path / ".tmp",
        tmp_path / ".x.tmp",
        tmp_path / "a.b.tmp",
        tmp_path / ".checkpoint-latest.params.k2j_9x0a.tmp.bak",
        tmp_path / "notes.tmp",
    ]
    for p in stale + kept:
        p.write_bytes(b"x")
    (tmp_path / ".folder.abcdefgh.tmp").mkdir()
    assert checkpoint.remove_stale_temps(tmp_path) == sorted(stale)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in stale)
    assert (tmp_path / ".folder.abcdefgh.tmp").is_dir()
    assert checkpoint.remove_stale_temps(tmp_path) == []
    assert checkpoint.remove_stale_temps(tmp_path / "nowhere") == []


def test_remove_stale_temps_matches_what_write_atomic_leaves(tmp_path, monkeypatch):
    """A kill between the temporary file's write and its rename, as write_atomic names it."""

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    monkeypatch.setattr(checkpoint.Path, "unlink", lambda self, missing_ok=False: None)  # the kill skips cleanup
    with pytest.raises(KeyboardInterrupt):
        checkpoint.write_atomic(tmp_path / "model_best.params", b"payload")
    monkeypatch.undo()
    [left] = list(tmp_path.iterdir())
    assert checkpoint.remove_stale_temps(tmp_path) == [left]


def test_atomic_output_keeps_the_old_file_when_the_writer_fails(tmp_path):
    """Every atomic write (checkpoints, image cache, downloads, sweep results) goes through files.writes."""
    from files.writes import TEMP_NAME, atomic_output, atomic_path

    path = tmp_path / "results.csv"
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match="rejected"):
        with atomic_output(path) as f:
            f.write(b"half")
            raise ValueError("rejected")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["results.csv"]
    with atomic_path(tmp_path / "new" / "cache.npy") as temporary:
        assert TEMP_NAME.fullmatch(temporary.name) and temporary.parent == tmp_path / "new"
        temporary.write_bytes(b"new")
    assert (tmp_path / "new" / "cache.npy").read_bytes() == b"new" and len(list((tmp_path / "new").iterdir())) == 1
