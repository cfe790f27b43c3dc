"""Checkpoints of several processes (training/run/shards.py): every process writes the shards it holds, process 0
commits an index; resumed on the same mesh bitwise, on another process and device count within 1e-5; a save cut by
a kill leaves the previous checkpoint the one ``-r auto`` finds."""

from __future__ import annotations

import json
import shutil
import signal
import textwrap
import time

import numpy as np
import pytest

from inference.trained_run import load_run
from tests.end_to_end.test_train import run
from tests.training.processes.test_runs import child_pair, finish, start_processes
from tests.training.test_mesh import assert_close_states, data_dir, devices_env, tiny_config
from training.run import checkpoint, shards

__all__ = ["data_dir"]  # the fixture, used by name


def assert_equal_states(path, want_path) -> None:
    got, header = checkpoint.read(path)
    want, want_header = checkpoint.read(want_path)
    assert (header["epoch"], header["step"]) == (want_header["epoch"], want_header["step"])
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def shard_files(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "shards").iterdir())


def from_epoch_one(run_dir, copy_dir):
    """A copy of `run_dir` (its shards with it) set back to its epoch-1 checkpoint."""
    shutil.copytree(run_dir, copy_dir)
    (copy_dir / "checkpoint-latest.params").write_bytes((run_dir / "checkpoint-epoch_1.params").read_bytes())
    (copy_dir / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    return copy_dir / "checkpoint-latest.params"


@pytest.mark.slow
def test_two_processes_write_their_shards_and_resume_on_any_mesh(tmp_path, data_dir):
    """2 processes x 2 devices, FSDP over the 4: each process writes one shard file per save, the checkpoints are
    indexes naming both, no shard file is left that no index names. Resumed from epoch 1 on the same mesh the run
    ends bitwise as the uninterrupted one; on 1 process x 4 devices as data 2 x FSDP 2 and on 4 processes x 1 device
    within 1e-5; merged into one file it reads as the index does."""
    config = tiny_config(tmp_path, data_dir, validation=False, mesh={"data": 1, "fsdp": 4}, trainer__save_period=1)
    for status, _out, err in finish(start_processes(2, 2, "-c", config, "--run-id", "two")):
        assert status == 0, err
    two = tmp_path / "saved/tiny/two"
    latest = checkpoint.read(two / "checkpoint-latest.params", lazy=True)[1]
    files = latest["shards"]["files"]
    assert [f.rsplit(".", 2)[1:] for f in files] == [["0", "shard"], ["1", "shard"]]
    # FSDP: a sharded leaf's pieces come from both files; the step counter (replicated) once, from process 0
    pieces = latest["shards"]["arrays"]
    kernel = next(name for name, (_, shape, _) in pieces.items() if name.startswith("params.") and len(shape) == 2)
    assert sorted(p[0] for p in pieces[kernel][2]) == [0, 0, 1, 1]
    assert [p[0] for p in pieces["step"][2]] == [0]
    # epoch 1's and epoch 2's saves are named by the indexes, nothing else is left
    named = {n for p in two.glob("*.params") for n in checkpoint.read(p, lazy=True)[1]["shards"]["files"]}
    assert {f"shards/{n}" for n in shard_files(two)} == named and len(named) == 4

    same = from_epoch_one(two, tmp_path / "same")
    for status, _out, err in finish(start_processes(2, 2, "-r", same)):
        assert status == 0, err
    assert_equal_states(same, two / "checkpoint-latest.params")

    other = from_epoch_one(two, tmp_path / "other")
    resumed = run("train.py", "-r", other, "--set", 'mesh={"data": 2, "fsdp": 2}', env=devices_env(4))
    assert resumed.returncode == 0, resumed.stderr
    assert "1 process, mesh {'data': 2, 'fsdp': 2}" in resumed.stdout, resumed.stdout
    assert_close_states(other, two / "checkpoint-latest.params")

    four = from_epoch_one(two, tmp_path / "four")
    for status, _out, err in finish(start_processes(4, 1, "-r", four)):
        assert status == 0, err
    assert_close_states(four, two / "checkpoint-latest.params")

    # the readers of a run take its sharded checkpoint: test.py, load_run, --weights (one process)
    test_split = {
        "name": "mnist",
        "args": {"data_dir": str(data_dir), "verify": False, "split": "test", "batch_size": 16},
    }
    tested = run("test.py", "--run", two, "--set", f"data_loader.test={json.dumps(test_split)}", env=devices_env(1))
    assert tested.returncode == 0 and "accuracy" in tested.stdout, tested.stderr
    loaded = load_run(two)  # in this process: one device
    sums = {name: float(np.asarray(v).sum()) for name, v in checkpoint.flatten(loaded.params).items()}
    arrays = checkpoint.read(two / "checkpoint-latest.params")[0]
    assert sums and sums == {name: float(arrays["params." + name].sum()) for name in sums}
    weights = run(
        "train.py",
        *("-c", config, "--run-id", "tuned", "--epochs", 1, "--weights", two / "checkpoint-latest.params"),
        *("--set", 'mesh={"data": 1, "fsdp": 2}'),
        env=devices_env(2),
    )
    assert weights.returncode == 0 and "params and model state from" in weights.stdout, weights.stderr

    assert shards.main(["--merge", str(two), "--out", str(tmp_path / "one.params")]) == 0  # its command: test_runs.py
    assert "shards" not in checkpoint.read(tmp_path / "one.params")[1]
    assert_equal_states(tmp_path / "one.params", two / "checkpoint-latest.params")


def committed_step(latest) -> int:
    """The step of the index `latest` names now (0 before there is one)."""
    return checkpoint.read(latest, lazy=True)[1]["step"] if latest.is_file() else 0


def wait_for_a_commit(processes, latest, after: int, survivor=None) -> None:
    """Until an index past step `after` is committed: training is under way (or, from a resume, goes on)."""
    deadline = time.monotonic() + 240
    while committed_step(latest) <= after:
        alive = all(p.poll() is None for p in (processes if survivor is None else [processes[survivor]]))
        assert time.monotonic() < deadline and alive, finish(processes, 10)
        time.sleep(0.05)


@pytest.mark.slow
def test_a_kill_during_saves_or_sigterm_to_all_leaves_a_committed_checkpoint(tmp_path, data_dir):
    """Saving after every call, one process killed (-9) at an arbitrary moment, the other ends by the watchdog:
    ``-r auto`` finds the last committed index, every shard it names is whole, and the run goes on. Either process
    is the victim in turn, and then SIGTERM to both: one checkpoint at the step they stop at, committed. One run
    stopped three times, each time resumed with ``-r auto`` from what the stop left, ends bitwise as the
    uninterrupted one (any resume that went wrong would show there)."""
    config = tiny_config(
        tmp_path,
        data_dir,
        validation=False,
        mesh={"data": 1, "fsdp": 2},
        trainer__epochs=12,
        trainer__checkpoint_every={"steps": 2},
        data_loader__train__args__batch_size=8,
    )
    for status, _out, err in finish(start_processes(2, 1, "-c", config, "--run-id", "full")):
        assert status == 0, err
    saved = tmp_path / "saved/tiny"
    latest = saved / "stopped" / "checkpoint-latest.params"
    for victim in (1, 0):  # the first time a new run, the second its resume
        resume = ["-r", "auto"] if victim == 0 else []
        processes = start_processes(2, 1, "-c", config, "--run-id", "stopped", *resume, heartbeat=4)
        wait_for_a_commit(processes, latest, committed_step(latest), survivor=1 - victim)
        time.sleep(0.5 + victim / 3)
        processes[victim].send_signal(signal.SIGKILL)
        for p in processes:
            p.communicate(timeout=60)
        assert processes[1 - victim].returncode != 0  # it was killed while training, not after the end
        header = checkpoint.read(latest)[1]  # every shard it names is there and whole
        assert header["step"] < 12 * 16

    # SIGTERM to every process (SLURM's --signal): all save at the same step, one checkpoint committed, written by
    # both, from which -r auto ends as the run never stopped
    processes = start_processes(2, 1, "-c", config, "--run-id", "stopped", "-r", "auto")
    wait_for_a_commit(processes, latest, committed_step(latest))
    time.sleep(0.5)
    signalled = time.monotonic()
    for p in processes:
        p.send_signal(signal.SIGTERM)
    results = finish(processes, 60)
    took = time.monotonic() - signalled
    assert [status for status, _, _ in results] == [143, 143], results[0][2][-2000:] + results[1][2][-2000:]
    assert "stopped by SIGTERM" in results[0][1], results[0][1][-2000:]
    header = checkpoint.read(latest)[1]
    assert header["step"] < 12 * 16 and [f.rsplit(".", 2)[1] for f in header["shards"]["files"]] == ["0", "1"]
    print(f"SIGTERM to both processes ended, checkpoint committed: {took:.2f} s")
    assert took < 30, took
    for status, _out, err in finish(start_processes(2, 1, "-c", config, "--run-id", "stopped", "-r", "auto")):
        assert status == 0, err
    assert_equal_states(latest, saved / "full" / "checkpoint-latest.params")
    log = (saved / "stopped" / "train.log").read_text()
    assert log.count("resumed from") == 3, log[-3000:]  # each stop's checkpoint taken up, none started over


CUT_CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import numpy as np
    from training.processes.launch import join

    port, index, victim, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    join(f"localhost:{port}", 2, index, heartbeat_timeout=4)
    import jax
    from training.devices import mesh
    from training.run import checkpoint, shards

    grid = mesh.make_mesh({"data": 1, "fsdp": 2})

    def save(step):
        host = {"params": {"w": np.arange(8.0).reshape(4, 2) * step}, "step": np.int32(step)}
        tree = mesh.to_mesh(host, mesh.state_shardings(host, grid))
        tag, part = shards.new_tag(step, step), shards.take(tree)
        index_bytes = shards.write(folder, tag, part, {"epoch": 1, "step": step})
        if index_bytes is not None:
            if step == 2 and victim == 0:  # every process reported; killed before the index's rename
                os.kill(os.getpid(), signal.SIGKILL)
            checkpoint.write_atomic(folder / "checkpoint-latest.params", index_bytes)

    save(1)
    mesh.share_text("saved", "yes" if index == 0 else None)  # the first save committed before the second starts
    if index == victim == 1:  # its file written, killed before it reports it
        shards.gather = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    save(2)
""")


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_a_save_cut_before_its_commit_leaves_the_previous_checkpoint(tmp_path, victim):
    """Deterministic cuts of a save: process 1 killed after writing its shard file but before reporting it, or
    process 0 killed after every report but before renaming the index. Either way the index on disk is the previous
    save's and reads whole; the cut save's files are named by no index and go at the next commit."""
    ended = child_pair(CUT_CHILD, victim, tmp_path)
    assert ended[victim][0].returncode == -signal.SIGKILL
    arrays, header = checkpoint.read(tmp_path / "checkpoint-latest.params")
    assert header["step"] == 1 and arrays["step"] == 1
    np.testing.assert_array_equal(arrays["params.w"], np.arange(8.0).reshape(4, 2))
    left = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert len([n for n in left if n.startswith("step_2-")]) == 2, left  # both processes wrote their files
    shards.remove_unreferenced(tmp_path)
    assert all(n.startswith("step_1-") for n in shard_files(tmp_path))
    checkpoint.read(tmp_path / "checkpoint-latest.params")


NAN_CHILD = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    from training.processes.launch import join

    port, index, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    join(f"localhost:{port}", 2, index, heartbeat_timeout=20)
    from training import state
    from training.devices import mesh
    from training.run import checkpoint

    grid = mesh.make_mesh({"data": 1, "fsdp": 2})
    template = {"params": {"w": jax.ShapeDtypeStruct((10, 4), np.float32)}, "step": jax.ShapeDtypeStruct((), np.int32)}
    tree, _ = checkpoint.restore(path, template, lazy=True)
    try:
        state.place(tree, mesh.state_shardings(tree, grid))
        print("placed")
    except checkpoint.CheckpointError as error:
        print(error)
    mesh.finish_processes()
""")


@pytest.mark.slow
def test_nan_seen_by_one_process_is_refused_by_all(tmp_path):
    """A NaN in the rows only process 1's device holds: both processes refuse the checkpoint (none goes on to
    train and waits for the other in the step)."""
    from tests.training.test_sharded_checkpoint_files import W, write_sharded

    w = W.copy()
    w[9, 2] = np.nan
    index = write_sharded(tmp_path / "run", w=w)
    outputs = [(out, err) for _, out, err in child_pair(NAN_CHILD, index)]
    lines = [out.strip().splitlines()[-1] for out, _ in outputs]
    assert lines[1] == f"{index}: array params.w has NaN/Inf value(s) (a diverged run?); refused, as it would " + (
        "evaluate to nonsense without an error"
    ), outputs
    assert lines[0] == f"{index}: another process found NaN/Inf values in its slices (a diverged run?); refused"
