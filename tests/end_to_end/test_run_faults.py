"""Faults during a run: kill -9 and SIGTERM at start-up, mid-epoch and at every write of an epoch's commit, a second
process on the same run folder, read-only and full disks. After each, the run folder is consistent and a resume
ends bitwise identical to a run that was never interrupted."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_idx_dataset
from tests.end_to_end.test_train import ROOT, in_one_process, make_config, run, train_py_in_one_process

# Runs train.main with one fault injected where FAULT says: "replace:<file name>:<nth>:<before|after>" (around the
from training.devices import memory
from training.run import checkpoint
from training.run import folder as run_folder

# atomic rename of that file), "row:<epoch>" (before the epoch's metrics row), "step:<n>:<signal>" (after the
# training step n is checked), "init:<signal>" (before the state is initialised).
FAULTY_TRAIN = r"""
import os, signal, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
kind, *spec = os.environ["FAULT"].split(":")
def hit(signame):
    os.kill(os.getpid(), getattr(signal, signame))
    if signame != "SIGKILL":
        return
    while True:
        pass
if kind == "replace":
    name, nth, when = spec[0], int(spec[1]), spec[2]
    real, seen = os.replace, [0]
    def replace(src, dst):
        if Path(dst).name == name:
            seen[0] += 1
            if seen[0] == nth and when == "before":
                hit("SIGKILL")
            real(src, dst)
            if seen[0] == nth and when == "after":
                hit("SIGKILL")
            return
        real(src, dst)
    os.replace = replace
elif kind == "row":
    from training.run import folder as run_folder
    real_row = run_folder.append_row
    def append_row(run_dir, row):
        if row["epoch"] == int(spec[0]):
            hit("SIGKILL")
        real_row(run_dir, row)
    run_folder.append_row = append_row
elif kind == "step":
    from training import trainer
    trainer.READ_EVERY_STEPS = 1  # the logs read at every call, so that the signal lands during a known call
    real_check, sent = trainer.Progress.check_losses, []
    def check_losses(self, losses, skipped, first):
        real_check(self, losses, skipped, first)
        if first + len(losses) >= int(spec[0]) and not sent:
            sent.append(1)
            hit(spec[1])
    trainer.Progress.check_losses = check_losses
elif kind == "init":
    from training import startup
    real_from_seed = startup.from_seed
    def from_seed(trainer):
        hit(spec[0])
        return real_from_seed(trainer)
    startup.from_seed = from_seed
import train
sys.exit(train.main(sys.argv[1:]))
"""

EPOCHS = 3


def run_faulty(fault: str, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "FAULT": fault}
    return subprocess.run(
        [sys.executable, "-c", FAULTY_TRAIN, *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=330, n_test=90)
    return folder


def fault_config(tmp_path: Path, data_dir: Path) -> Path:
    # val/loss keeps falling on the toy task, so model_best is rewritten at every epoch's commit; 2 steps per call
    # give step boundaries inside the 9-step epochs
    return make_config(
        tmp_path,
        data_dir,
        trainer__epochs=EPOCHS,
        trainer__monitor="min val/loss",
        trainer__log_every=3,
        trainer__steps_per_call=2,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """The run that is never interrupted."""
    folder = tmp_path_factory.mktemp("reference")
    result = run("train.py", "-c", fault_config(folder, data_dir), "--run-id", "ref")
    assert result.returncode == 0, result.stderr
    return folder / "saved/tiny/ref"


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory, data_dir):
    """A one-epoch run of the tiny config, trained once for the tests that refuse to change a run folder: each
    takes its own copy (`copy_of`)."""
    folder = tmp_path_factory.mktemp("one_epoch")
    result = run("train.py", "-c", make_config(folder, data_dir, trainer__epochs=1), "--run-id", "r")
    assert result.returncode == 0, result.stderr
    return folder / "saved/tiny/r"


def copy_of(run_dir: Path, tmp_path: Path, run_id: str) -> Path:
    """`run_dir` copied to tmp_path/saved/tiny/`run_id`, where a run of make_config(tmp_path, ...) would be."""
    return Path(shutil.copytree(run_dir, tmp_path / "saved/tiny" / run_id))


def rows_of(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the timings."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in lines]


def assert_consistent(run_dir: Path) -> None:
    """Every checkpoint present reads and verifies; metrics rows count epochs 1, 2, ... once each, none past the
    latest checkpoint (none at all when the kill came before the first checkpoint was on disk)."""
    if not (run_dir / "checkpoint-latest.params").exists():
        assert not list(run_dir.glob("*.params")) and not (run_dir / "metrics.jsonl").exists()
        return
    latest = checkpoint.read(run_dir / "checkpoint-latest.params")[1]["epoch"]
    for path in run_dir.glob("*.params"):
        checkpoint.read(path)
    epochs = [row["epoch"] for row in rows_of(run_dir)] if (run_dir / "metrics.jsonl").is_file() else []
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= latest - 1, epochs


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    assert not list(run_dir.glob(".*.tmp")), list(run_dir.glob(".*.tmp"))
    assert rows_of(run_dir) == rows_of(reference)
    names = sorted(p.name for p in reference.glob("*.params"))
    assert sorted(p.name for p in run_dir.glob("*.params")) == names
    for name in names:
        got, header = checkpoint.read(run_dir / name)
        want, want_header = checkpoint.read(reference / name)
        assert (header["epoch"], header["step"]) == (want_header["epoch"], want_header["step"]), name
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name}: {key}")


KILL_POINTS = [
    "replace:checkpoint-latest.params:2:before",
    "replace:checkpoint-latest.params:2:after",
    "replace:model_best.params:2:before",
    "replace:checkpoint-epoch_2.params:1:before",
    "row:2",
    "step:13:SIGKILL",  # mid-epoch 2 (9 steps per epoch)
    "step:10:SIGKILL",  # epoch 1's checkpoints often still being written in the background
]


@pytest.mark.slow
@pytest.mark.parametrize("fault", KILL_POINTS)
def test_kill_9_anywhere_leaves_a_consistent_folder_and_an_exact_resume(tmp_path, data_dir, reference, fault):
    """-r auto both times: a kill mid-epoch 2 may come while epoch 1's checkpoints are still being written in the
    background, and the run then starts again from nothing, which is as correct."""
    config = fault_config(tmp_path, data_dir)
    killed = run_faulty(fault, "-r", "auto", "-c", config, "--run-id", "k")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_dir = tmp_path / "saved/tiny/k"
    assert_consistent(run_dir)
    resumed = run("train.py", "-r", "auto", "-c", config, "--run-id", "k")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_as_reference(run_dir, reference)


def test_a_signal_mid_epoch_saves_the_position_and_the_resume_is_exact(tmp_path, data_dir, reference):
    """The signal arrives while steps 12-13 are checked, with the call of steps 14-15 under way (2 steps per
    call): the loop saves after step 15, 6 of 9 steps into epoch 2, and the resumed run goes on with the 7th batch
    of the same order. SIGTERM, SIGINT and SIGUSR1 each stop a run with their own status and save the same
    checkpoint, bit for bit: one resume proves the three."""
    config = fault_config(tmp_path, data_dir)
    saved = []
    for signame, status in [("SIGTERM", 143), ("SIGINT", 130), ("SIGUSR1", 138)]:
        stopped = run_faulty(f"step:13:{signame}", "-c", config, "--run-id", signame)
        assert stopped.returncode == status, stopped.stderr
        assert "Traceback" not in stopped.stderr
        run_dir = tmp_path / "saved/tiny" / signame
        latest = run_dir / "checkpoint-latest.params"
        assert (
            f"stopped by {signame} (saved at step 15 (6 of 9 into epoch 2)); continue with: python train.py -r "
            f"{latest}" in stopped.stdout
        ), stopped.stdout[-3000:]
        assert checkpoint.read(latest)[1]["position"] == 6
        assert_consistent(run_dir)
        saved.append(run_dir)
    first = saved[0]
    for run_dir in saved[1:]:
        assert rows_of(run_dir) == rows_of(first)
        names = sorted(p.name for p in first.glob("*.params"))
        assert sorted(p.name for p in run_dir.glob("*.params")) == names
        for name in names:
            (got, header), (want, want_header) = checkpoint.read(run_dir / name), checkpoint.read(first / name)
            assert [header.get(k) for k in ("epoch", "step", "position")] == [
                want_header.get(k) for k in ("epoch", "step", "position")
            ]
            assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want), name
    assert run("train.py", "-r", first / "checkpoint-latest.params").returncode == 0
    assert_same_as_reference(first, reference)


@pytest.mark.parametrize("signame, status", [("SIGTERM", 143), ("SIGINT", 130), ("SIGKILL", -9)])
def test_a_signal_at_start_up_writes_nothing(tmp_path, data_dir, signame, status):
    result = run_faulty(f"init:{signame}", "-c", fault_config(tmp_path, data_dir))
    assert result.returncode == status, result.stderr
    if status > 0:
        assert result.stderr.strip().splitlines() == [
            f"error: stopped by {signame} before training started; nothing was written"
        ]
    assert not (tmp_path / "saved").exists()


@pytest.mark.slow
def test_external_sigterm_never_aborts(tmp_path, data_dir):
    """SIGTERM from outside at moments spread over start-up (imports, data, compile) and training: always status
    143 (or -15 when it lands before Python has run train.py's first lines), never a crash or a traceback."""
    # more epochs than any machine runs in the 5 s of the last delay (with the step in the compilation cache, 50
    # tiny epochs once ended before it)
    config = make_config(tmp_path, data_dir, trainer__epochs=5000, trainer__steps_per_call=1)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    for delay in (0.5, 0.8, 1.1, 1.5, 2.0, 3.0, 5.0):
        process = subprocess.Popen(
            [sys.executable, "train.py", "-c", str(config)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
        assert process.returncode in (143, -signal.SIGTERM), (delay, process.returncode, err[-2000:])
        assert "Traceback" not in err and "terminate called" not in err, (delay, err[-2000:])
        assert "stopped by SIGTERM" in err + out or process.returncode < 0, (delay, out[-2000:])


def refused(result) -> str:
    """The one `error:` line of a command that exited 2."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def diverged_before_a_checkpoint(result, run_dir: Path) -> str:
    """A new run that diverged before its first checkpoint: status 2, one line saying so, and nothing left of its
    run folder (nor of save_dir, which it made)."""
    line = refused(result)
    assert f"the run folder {run_dir} was removed, as it held nothing to continue from" in line
    assert not run_dir.parents[1].exists()
    return line


@pytest.mark.slow
def test_divergence_before_a_checkpoint_removes_the_run_folder_without_aborting(tmp_path, data_dir):
    """Non-finite losses from the first steps stop the run the same way every time (prefetched work in flight is
    drained first)."""
    config = make_config(tmp_path, data_dir, trainer__epochs=3)
    for i in range(4):
        result = run("train.py", "-c", config, "--lr", "1e30", "--run-id", f"d{i}")
        line = diverged_before_a_checkpoint(result, tmp_path / f"saved/tiny/d{i}")
        assert "non-finite loss" in line and "is the learning rate, 1e+30 at the first step, too high?" in line


def test_divergence_guard_stops_a_loss_that_explodes(tmp_path, data_dir):
    config = make_config(tmp_path, data_dir, trainer__epochs=3, trainer__divergence_factor=20.0)
    result = run("train.py", "-c", config, "--lr", "1e4", "--run-id", "g")
    line = diverged_before_a_checkpoint(result, tmp_path / "saved/tiny/g")
    assert "diverging: loss" in line and "trainer.divergence_factor 20 x the lowest step loss" in line


def test_a_held_run_folder_refuses_a_second_process(tmp_path, one_epoch):
    run_dir = copy_of(one_epoch, tmp_path, "held")
    files = lambda: {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != ".lock"}  # noqa: E731
    before = files()
    fd = run_folder.hold(run_dir)
    try:
        result = run("train.py", "-r", run_dir / "checkpoint-latest.params", "--epochs", "2")
    finally:
        os.close(fd)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {run_dir}: in use by process {os.getpid()} (another train.py is training in it); "
        f"wait for it to end or stop it"
    ]
    assert files() == before


def test_run_folders_are_created_atomically(tmp_path):
    made, barrier = [], threading.Barrier(16)

    def create():
        barrier.wait()
        made.append(run_folder.create(tmp_path / "saved", "same_second"))

    threads = [threading.Thread(target=create) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(made)) == 16


def test_reconcile_repairs_what_a_kill_left(tmp_path):
    """Rows past the checkpoint and repeated rows dropped, its own row restored, interrupted writes removed, a best
    checkpoint whose write was cut off rewritten."""
    tree = {"params": {"w": np.arange(3, dtype=np.float32)}}
    header = {"epoch": 3, "step": 30, "best": 0.5, "best_epoch": 3, "row": {"epoch": 3, "step": 30, "x": 3}}
    checkpoint.save(tmp_path / "checkpoint-latest.params", tree, header)
    checkpoint.save(tmp_path / "model_best.params", tree, {**header, "epoch": 2, "step": 20, "best_epoch": 2})
    (tmp_path / ".checkpoint-latest.params.abc123.tmp").write_bytes(b"partial")
    rows = [{"epoch": 1}, {"epoch": 2}, {"epoch": 2}, {"epoch": 4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"epoch": 5, "st')
    repaired = run_folder.reconcile(tmp_path, tmp_path / "checkpoint-latest.params", header, save_period=5)
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"epoch": 1},
        {"epoch": 2},
        header["row"],
    ]
    assert not list(tmp_path.glob(".*.tmp"))
    assert checkpoint.read(tmp_path / "model_best.params")[1]["epoch"] == 3
    assert len(repaired) == 6, repaired
    assert run_folder.reconcile(tmp_path, tmp_path / "checkpoint-latest.params", header, save_period=5) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted for the test (needs the right to mount; skipped where there is none)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.decode().strip() or 'no permission'})")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_read_only_save_dir_is_one_error_line(tmp_path, data_dir, small_disk):
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    result = run("train.py", "-c", make_config(tmp_path, data_dir, trainer__save_dir=str(small_disk / "saved")))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: cannot create a run folder in {small_disk / 'saved/tiny'}: Read-only file system"
    ]


def test_full_disk_stops_with_one_error_line_and_keeps_the_last_checkpoint(tmp_path, data_dir, small_disk):
    """~0.6 MB per checkpoint (an MLP with Adam): epoch 1 writes three, epoch 2 finds the 2 MiB disk full."""
    # The run folder's copy of model/ comes on top of the 2 MiB, a page per file and more: a layer a project adds
    # to model/ must not move the point where the disk fills (a second write failing, curves.png, makes two lines).
    page = os.sysconf("SC_PAGE_SIZE")
    code = [p for p in (ROOT / "model").rglob("*") if "__pycache__" not in p.parts]
    extra = sum(-(-p.stat().st_size // page) * page if p.is_file() else page for p in code)
    subprocess.run(["mount", "-o", f"remount,size={2 * 2**20 + extra}", str(small_disk)], check=True)
    config = make_config(
        tmp_path, data_dir, trainer__epochs=3, trainer__save_dir=str(small_disk / "saved"), model__args__hidden=[64]
    )
    result = run("train.py", "-c", config, "--run-id", "full")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stdout.splitlines() if "No space left on device" in line]
    assert len(lines) == 1 and lines[0].startswith("cannot write "), result.stdout
    run_dir = small_disk / "saved/tiny/full"
    assert checkpoint.read(run_dir / "checkpoint-latest.params")[1]["epoch"] >= 1
    assert not list(run_dir.glob(".*.tmp"))


def test_a_failed_resume_or_fine_tune_changes_nothing(tmp_path, data_dir, one_epoch):
    """A checkpoint that does not fit the given config (here: another model) is refused before the run folder is
    touched; a failed --weights start leaves no run folder."""
    run_dir = copy_of(one_epoch, tmp_path, "r")
    files = lambda: {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}  # noqa: E731
    before = files()
    (tmp_path / "other").mkdir()
    other = make_config(tmp_path / "other", data_dir, model__args__hidden=[16])
    result, fine_tune = train_py_in_one_process(  # both in one process: a JAX start fewer
        ["-r", run_dir / "checkpoint-latest.params", "-c", other, "--epochs", "7", "--set", "optimizer.args.lr=0.5"],
        ["-c", other, "--weights", run_dir / "checkpoint-latest.params", "--run-id", "ft"],
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "does not match the model/optimizer of this config" in result.stderr
    assert files() == before
    result = fine_tune
    assert result.returncode == 2 and not (tmp_path / "other/saved").exists(), result.stderr


def test_a_read_only_run_folder_refuses_a_resume_cleanly(tmp_path, data_dir, small_disk):
    config = make_config(tmp_path, data_dir, trainer__epochs=1, trainer__save_dir=str(small_disk / "saved"))
    assert run("train.py", "-c", config, "--run-id", "ro").returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    run_dir = small_disk / "saved/tiny/ro"
    result = run("train.py", "-r", run_dir / "checkpoint-latest.params", "--epochs", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {run_dir}: cannot write in the run folder (Read-only file system); nothing was changed"
    ]


# ------------------------------------------------------------------------------------- edges a hostile user tries
def tree_of(folder: Path) -> dict:
    """Every path under `folder` with its inode, size and time of change (a rewrite changes them; nothing is read)."""
    return {p: (p.lstat().st_ino, p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.parametrize("linked", ["run folder", "name folder"])
def test_a_symlinked_run_folder_is_refused(tmp_path, data_dir, linked):
    """saved/<name>/<run> (or saved/<name>) a link to a folder elsewhere: -r auto would write the run there."""
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "saved/tiny/evil" if linked == "run folder" else tmp_path / "saved/tiny"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    before = tree_of(tmp_path)
    argvs = [["-r", "auto", "-c", config, "--run-id", "evil"]]
    if linked == "name folder":  # a new run without -r auto too (in the same process: a JAX start fewer)
        argvs.append(["-c", config])
    first, *new_run = train_py_in_one_process(*argvs)
    line = refused(first)
    assert line.startswith(f"error: {link}: a symbolic link (to {elsewhere}), not a folder"), line
    for result in new_run:
        refused(result)
    assert tree_of(tmp_path) == before


@pytest.fixture
def special_files(tmp_path):
    """A FIFO, a link to /dev/zero, a 40 GB sparse file, and one whose safetensors header describes its 40 GB."""
    files = {
        "fifo": tmp_path / "fifo.params",
        "zero": tmp_path / "zero.params",
        "sparse": tmp_path / "sparse.params",
        "described": tmp_path / "described.params",
    }
    os.mkfifo(files["fifo"])
    files["zero"].symlink_to("/dev/zero")
    with open(files["sparse"], "wb") as f:
        f.truncate(40 * 2**30)
    header = json.dumps({"a": {"dtype": "F32", "shape": [10 * 2**30], "data_offsets": [0, 40 * 2**30]}}).encode()
    with open(files["described"], "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 40 * 2**30)
    return files


@pytest.mark.parametrize(
    "kind, message",
    [
        ("fifo", "not a regular file"),
        ("zero", "not a regular file"),
        ("sparse", "not a readable checkpoint (truncated or corrupt?): 42,949,672,960 bytes, without a header"),
        ("described", "40.0 GiB, more than the"),
    ],
)
def test_special_and_sparse_files_are_refused_as_checkpoints(tmp_path, data_dir, special_files, kind, message):
    """Each within seconds, before anything is read into memory: a FIFO used to block (past SIGTERM), /dev/zero and
    a sparse file to be read until memory ran out. As --weights and -r to train.py, and as test.py's --run."""
    path = special_files[kind]
    if kind == "described" and not memory.host_available()[0] < path.stat().st_size:
        pytest.skip("a machine with more than 40 GB of memory free would read the file")
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    before = tree_of(tmp_path)
    # one process, not three: each refusal is a start of JAX's and the config's, and the file is refused before
    # anything else is read
    said = in_one_process(
        ["train", "-c", config, "--weights", path],
        ["train", "-c", config, "-r", path],
        ["test", "--run", path, "-c", config],
        timeout=60,
    )
    for result in said:
        line = refused(result)
        assert message in line and str(path) in result.stderr, (result.args, result.stderr)
    assert tree_of(tmp_path) == before


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"model__args__hidden": [1000000, 1000000]},
            (
                r"this run needs 14.6 TiB before any activation \(parameters "
                r"3.6 TiB, their gradients 3.6 TiB, optimizer state 7.3 TiB, .*\), "
                r"more than the .* of .*: make the model smaller"
            ),
        ),
        (
            {"trainer__accumulate_steps": 10**9},
            (
                "config.json: trainer.accumulate_steps: 1,000,000,000 batches per step, "
                "but an epoch of the train split has 9; at most 9"
            ),
        ),
    ],
)
def test_a_run_that_cannot_fit_is_refused_before_anything_is_allocated(tmp_path, data_dir, change, message):
    """10**12 parameters used to compile and then stall at the memory limit; 10**9 accumulated batches to be
    OOM-killed at 14 GB. Both are known from shapes alone."""
    result = run("train.py", "-c", make_config(tmp_path, data_dir, **change), timeout=60)
    assert re.search(message, refused(result)), result.stderr
    assert not (tmp_path / "saved").exists()


def test_a_compiled_step_whose_temporaries_exceed_the_memory_is_refused(tmp_path, data_dir, capsys, monkeypatch):
    """Issue 58: the state and batches fit, but the compiled step's own temporaries (a wide convolution's
    activations, ~125 MiB for 270 images) do not: refused by XLA's memory analysis before the run writes anything,
    in one line naming the figures and the limit (a cgroup's, made small here), nothing written."""
    import train

    limit = 10 * 2**20  # the state and one stack of batches take ~2 MiB, the step's temporaries over 100 MiB
    monkeypatch.setattr(memory, "host_available", lambda: (limit, "the memory limit of this process's cgroup (x)"))
    monkeypatch.setattr(train, "setup_logging", lambda *a, **k: None)  # dictConfig would close pytest's handlers
    model = {"name": "mnist_cnn", "args": {"channels": [64, 64], "hidden": 8}}
    config = make_config(
        tmp_path, data_dir, model=model, data_loader__train__args__batch_size=270, trainer__steps_per_call=1
    )
    with pytest.raises(SystemExit) as exit_info:
        train.main(["-c", str(config)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.fullmatch(
        r"error: this run needs [\d.]+ MiB by XLA's memory analysis of the compiled training step \(outputs "
        r"\d+ B, temporaries [\d.]+ MiB\), more than the 10.0 MiB of the memory limit of this "
        r"process's cgroup \(x\): lower the batch size .*; nothing was written",
        lines[0],
    ), lines[0]
    assert not (tmp_path / "saved").exists()


def test_a_checkpoint_past_the_configured_end_is_refused(tmp_path, one_epoch):
    """A checkpoint whose consistent header claims epoch 99 of a 2-epoch run: nothing trained, nothing written (its
    .lock included)."""
    latest = copy_of(one_epoch, tmp_path, "r") / "checkpoint-latest.params"
    arrays, header = checkpoint.read(latest)
    checkpoint.save(
        latest,
        arrays,
        {**{k: v for k, v in header.items() if k not in ("arrays", "format_version", "treedef")}, "epoch": 99},
    )
    before = tree_of(tmp_path)
    line = refused(run("train.py", "-r", latest, "--epochs", "2"))
    assert line == (
        f"error: {latest}: saved at the end of epoch 99, past trainer.epochs 2: nothing to train; "
        f"continue it with --epochs N, N > 99"
    )
    assert tree_of(tmp_path) == before


def test_a_full_disk_at_start_leaves_no_run_folder(tmp_path, data_dir, small_disk):
    """64 KB free: copying model/ into the run folder fails; one short line, and what was made is removed."""
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * (free - 64 * 1024))
    config = make_config(tmp_path, data_dir, trainer__save_dir=str(small_disk / "saved"))
    line = refused(run("train.py", "-c", config, "--run-id", "full"))
    assert line.startswith(f"error: cannot write in the run folder: {small_disk / 'saved/tiny/full'}/")
    assert "No space left on device" in line and line.endswith("; the run folder was removed again"), line
    assert len(line) < 300, line
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
