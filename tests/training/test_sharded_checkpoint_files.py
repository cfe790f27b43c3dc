"""A sharded checkpoint's files (training/run/shards.py, read by training/run/checkpoint.py) in one process: read
whole or slice by slice, merged into one file, and every hostile or partial one refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.end_to_end.test_train import ROOT
from training.run import checkpoint, shards

W = np.arange(40, dtype=np.float32).reshape(10, 4)
HEADER = {"epoch": 1, "step": 7, "config_hash": "abc", "position": 0, "batches": 4}


def write_sharded(run_dir, tag="step_7-abcd", w=W):
    """The index and shard file of a state whose kernel is cut in three pieces of rows and whose step is a scalar,
    as shards.write makes them (here one process holds every piece)."""
    run_dir.mkdir(exist_ok=True)
    pieces = {"params.w@0,0": w[:3], "params.w@3,0": w[3:8], "params.w@8,0": w[8:], "step@": np.array(7, np.int32)}
    leaves = {"params.w": ["float32", [10, 4]], "step": ["int32", []]}
    index = shards.write(run_dir, tag, (pieces, leaves), HEADER)
    checkpoint.write_atomic(run_dir / "checkpoint-latest.params", index)
    return run_dir / "checkpoint-latest.params"


def shard_of(index):
    return index.parent / checkpoint.read(index, lazy=True)[1]["shards"]["files"][0]


def rewrite_index(index, change):
    """The index with its shards field changed by `change`, re-encoded so its own checksums hold: a lie, not
    damage."""
    header = checkpoint.read(index, lazy=True)[1]
    header = {k: v for k, v in header.items() if k not in ("format_version", "treedef", "arrays")}
    change(header["shards"])
    checkpoint.write_atomic(index, checkpoint.encode({}, header))


def test_read_whole_and_by_slices(tmp_path):
    index = write_sharded(tmp_path / "run")
    arrays, header = checkpoint.read(index)
    np.testing.assert_array_equal(arrays["params.w"], W)
    assert arrays["step"] == 7 and arrays["step"].dtype == np.int32
    assert {k: header[k] for k in HEADER} == HEADER
    lazy = checkpoint.read(index, lazy=True)[0]
    assert isinstance(lazy["params.w"], checkpoint.Sharded) and lazy["params.w"].shape == (10, 4)
    np.testing.assert_array_equal(lazy["params.w"][(slice(2, 9), slice(1, 3))], W[2:9, 1:3])
    np.testing.assert_array_equal(lazy["params.w"][(slice(0, 10), slice(0, 1))], W[:, :1])


def test_merged_into_one_file(tmp_path):
    index = write_sharded(tmp_path / "run")
    out = subprocess.run(
        [sys.executable, "-m", "training.run.shards", "--merge", tmp_path / "run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr
    one = tmp_path / "run/checkpoint-latest-one_file.params"
    arrays, header = checkpoint.read(one)
    np.testing.assert_array_equal(arrays["params.w"], W)
    assert "shards" not in header and header["step"] == 7
    assert json.loads(one.read_bytes()[8 : 8 + int.from_bytes(one.read_bytes()[:8], "little")])["params.w"]
    assert index.is_file()


def flip_byte(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


def truncate(path):
    path.write_bytes(path.read_bytes()[:-5])


def link_shard(path):
    copy = path.with_name("copy.bin")
    path.rename(copy)
    path.symlink_to(copy)


def link_folder(path):
    folder = path.parent
    folder.rename(folder.with_name("elsewhere"))
    folder.symlink_to(folder.with_name("elsewhere"))


def another_save(path):
    # a whole, valid shard file of another save at this one's name
    other = write_sharded(path.parent.parent.with_name("other"), w=W + 1)
    path.write_bytes(shard_of(other).read_bytes())


def lie(change):
    return lambda path: rewrite_index(path.parent.parent / "checkpoint-latest.params", change)


def grow(shards_field):
    shards_field["arrays"]["params.w"][1] = [12, 4]


def overlap(shards_field):
    shards_field["arrays"]["params.w"][2][1][1] = [2, 0]


def escape(shards_field):
    shards_field["files"][0] = "shards/../../x.shard"


def other_crc(shards_field):
    shards_field["arrays"]["params.w"][2][0][3] += 1


def drop_piece(shards_field):
    shards_field["arrays"]["params.w"][2].pop()


@pytest.mark.parametrize(
    "damage, expected",
    [
        (flip_byte, "fails its checksum"),
        (truncate, "not a readable checkpoint (truncated or corrupt?)"),
        (lambda p: p.unlink(), "missing, a shard file of"),
        (link_shard, "a symbolic link where a shard of checkpoint-latest.params is; refused"),
        (link_folder, "a symbolic link where a shard of checkpoint-latest.params is; refused"),
        (another_save, "does not hold piece params.w@0,0 as checkpoint-latest.params describes it"),
        (lie(grow), "leaves values uncovered of params.w"),
        (lie(overlap), "has overlapping pieces of params.w"),
        (lie(drop_piece), "leaves values uncovered of params.w"),
        (lie(escape), "names a file outside its shards/ folder"),
        (lie(other_crc), "does not hold piece params.w@0,0"),
    ],
)
def test_hostile_or_partial_shards_refused_in_one_line(tmp_path, capsys, damage, expected):
    index = write_sharded(tmp_path / "run")
    damage(shard_of(index))
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.read(index)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message
    # the tool that reads it (its main, in this process) says so in one line, exit status 2, nothing written
    with pytest.raises(SystemExit) as exit_info:
        shards.main(["--merge", str(index), "--out", str(tmp_path / "one.params")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "one.params").exists()


def test_an_index_that_lies_consistently_about_shapes_does_not_match_the_model(tmp_path):
    """Pieces that tile another shape than the model's: the restore names the leaf and both shapes."""
    import jax

    index = write_sharded(tmp_path / "run")
    template = {"params": {"w": jax.ShapeDtypeStruct((10, 5), np.float32)}, "step": jax.ShapeDtypeStruct((), np.int32)}
    with pytest.raises(checkpoint.CheckpointError, match=r"params.w: file has float32\[10, 4\], model expects"):
        checkpoint.restore(index, template, lazy=True)


def test_unreferenced_shard_files_are_removed_after_a_commit(tmp_path):
    run_dir = tmp_path / "run"
    write_sharded(run_dir, tag="step_7-aaaa")
    (run_dir / "shards" / "step_9-bbbb.1.shard").write_bytes(b"cut short by a kill")
    write_sharded(run_dir, tag="step_8-cccc")
    shards.remove_unreferenced(run_dir)
    assert sorted(p.name for p in (run_dir / "shards").iterdir()) == ["step_8-cccc.0.shard"]
    checkpoint.read(run_dir / "checkpoint-latest.params")


@pytest.mark.parametrize("deep", ["outer", "inner"])
def test_a_planted_checkpoint_with_a_header_nested_past_the_json_bound_names_no_shards(tmp_path, deep):
    """Before, a .params file in the run folder whose header nests 100,000 deep made the clean-up after a sharded
    save a RecursionError traceback."""
    run_dir = tmp_path / "run"
    write_sharded(run_dir, tag="step_7-aaaa")
    nested = "[" * 100_000 + "]" * 100_000
    text = nested if deep == "outer" else json.dumps({"__metadata__": {"header": nested}})
    (run_dir / "planted.params").write_bytes(len(text).to_bytes(8, "little") + text.encode())
    assert shards.referenced(run_dir) == {"shards/step_7-aaaa.0.shard"}


def test_a_slice_reads_only_the_pieces_it_overlaps(tmp_path):
    """Each device's slice reads the bytes of the pieces that overlap it and no others: a damaged piece elsewhere
    is not read (and so not noticed) until a slice that needs it is asked for."""
    index = write_sharded(tmp_path / "run")
    path = shard_of(index)
    piece = checkpoint.PieceFile(path)
    begin, _ = piece.layout["params.w@8,0"]["data_offsets"]
    data = bytearray(path.read_bytes())
    data[piece.start + begin] ^= 0x01
    del piece
    path.write_bytes(bytes(data))
    lazy = checkpoint.read(index, lazy=True)[0]
    np.testing.assert_array_equal(lazy["params.w"][(slice(0, 8), slice(0, 4))], W[:8])
    with pytest.raises(checkpoint.CheckpointError, match="array params.w@8,0 fails its checksum"):
        lazy["params.w"][(slice(7, 10), slice(0, 4))]


def test_nan_in_a_placed_slice_is_refused(tmp_path):
    """A NaN in the pieces a device's slice reads: the restore onto the mesh refuses it in one line."""
    import jax

    from training import state
    from training.devices import mesh

    w = W.copy()
    w[9, 2] = np.nan
    index = write_sharded(tmp_path / "run", w=w)
    template = {"params": {"w": jax.ShapeDtypeStruct((10, 4), np.float32)}, "step": jax.ShapeDtypeStruct((), np.int32)}
    tree, _ = checkpoint.restore(index, template, lazy=True)
    grid = mesh.make_mesh({"data": 1, "fsdp": 1}, jax.devices()[:1])
    with pytest.raises(checkpoint.CheckpointError, match=r"array params.w has NaN/Inf value\(s\) \(a diverged run"):
        state.place(tree, mesh.state_shardings(tree, grid))
    tree, _ = checkpoint.restore(index, template, lazy=True, allow_nonfinite=True)
    assert np.isnan(np.asarray(state.place(tree, mesh.state_shardings(tree, grid))["params"]["w"])[9, 2])
