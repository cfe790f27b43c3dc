"""Run folders, checkpoints and exports from elsewhere: a link or a pipe planted where a tool writes one of its files
is refused in one line (exit 2) and the file it points to stays byte-identical; a checkpoint copied out of its run
folder continues in a new one; the tools run from any working folder; an export replaces the old one in one step,
two exports of one name never both win, and what a killed one left is cleared by the next."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from files import writes
from files.writes import UnsafeFile
from tests.end_to_end.test_train import ROOT, make_config, run, train_py_in_one_process
from tests.inference.test_export_cli import run_dir as export_run  # noqa: F401 (a fixture: a run folder to export)
from training.run import folder as run_folder
from training.run.figures import plots

VICTIM_BYTES = b"ssh-ed25519 AAAA... someone's key\n"


def victim(tmp_path: Path) -> Path:
    """A file outside every run folder that a planted link points at."""
    path = tmp_path / "outside" / "victim"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(VICTIM_BYTES)
    return path


def one_error_line(result: subprocess.CompletedProcess, *words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(w in lines[0] for w in words), lines[0]


# ------------------------------------------------------------------------------------------------- the mechanism
def test_open_append_and_atomic_writes_refuse_links_folders_and_pipes(tmp_path):
    target = victim(tmp_path)
    link = tmp_path / "log"
    link.symlink_to(target)
    with pytest.raises(UnsafeFile, match="a symbolic link"):
        writes.open_append(link)
    with pytest.raises(UnsafeFile, match="a symbolic link"):
        writes.write_atomic(link, b"x")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeFile, match="a named pipe"):  # refused at once, not blocked on a reader
        writes.open_append(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    with pytest.raises(UnsafeFile, match="a folder"):
        writes.open_append(tmp_path / "folder")
    assert target.read_bytes() == VICTIM_BYTES and link.is_symlink()
    with writes.open_append(tmp_path / "fresh") as f:  # a regular file: appended to as before
        f.write("a\n")
    with writes.open_append(tmp_path / "fresh") as f:
        f.write("b\n")
    assert (tmp_path / "fresh").read_text() == "a\nb\n"


def test_metrics_rows_and_the_lock_are_never_written_through_a_link(tmp_path):
    target = victim(tmp_path)
    (tmp_path / "metrics.jsonl").symlink_to(target)
    (tmp_path / ".lock").symlink_to(target)
    with pytest.raises(UnsafeFile):
        run_folder.append_row(tmp_path, {"epoch": 1})
    with pytest.raises(run_folder.RunFolderError, match="symbolic link"):
        run_folder.hold(tmp_path)
    assert target.read_bytes() == VICTIM_BYTES


def test_a_replaced_folder_is_never_absent(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "old").write_text("old")
    seen_absent, done = [], threading.Event()

    def watch():
        while not done.is_set():
            if not target.is_dir():
                seen_absent.append(1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(200):
            new = writes.temporary_folder(target)
            (new / "new").write_text(str(i))
            writes.replace_folder(new, target)
    finally:
        done.set()
        watcher.join()
    assert not seen_absent and (target / "new").read_text() == "199" and not (target / "old").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # every old copy removed


# ------------------------------------------------------------------------------------------------ a trained run
@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A finished one-epoch run folder (config.json, .lock, train.log, metrics.jsonl, checkpoints, curves.png)."""
    folder = tmp_path_factory.mktemp("trained")
    result = run("train.py", "-c", make_config(folder, data_dir, trainer__epochs=1), "--run-id", "r")
    assert result.returncode == 0, result.stderr
    return folder / "saved" / "tiny" / "r"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from tests.conftest import make_idx_dataset

    folder = tmp_path_factory.mktemp("data") / "mnist"
    make_idx_dataset(folder, n_train=200, n_test=60)
    return folder


def shared_copy(run: Path, tmp_path: Path) -> Path:
    """The run folder as someone else handed it over: a copy."""
    copy = tmp_path / "shared" / "r"
    shutil.copytree(run, copy)
    return copy


PLANTED = [".lock", "train.log", "metrics.jsonl", *(["curves.png"] if plots() else []), "config.json"]
PLANTED += ["checkpoint-epoch_1.params"]


@pytest.mark.slow
def test_resume_refuses_a_link_planted_in_the_run_folder(trained, tmp_path):
    """A link planted in a copy of the run folder in place of each of its files (or where the lock goes): each resume
    is refused in one line naming it, and the file it points to is unchanged."""
    copies, targets = [], []
    for i, name in enumerate(PLANTED):
        copies.append(shared_copy(trained, tmp_path / str(i)))
        targets.append(victim(tmp_path / str(i)))
        (copies[-1] / name).unlink(missing_ok=True)
        (copies[-1] / name).symlink_to(targets[-1])
    # one process, not one per file: each is a start of JAX's
    said = train_py_in_one_process(*(["-r", copy / "checkpoint-latest.params", "--epochs", "2"] for copy in copies))
    for name, copy, target, result in zip(PLANTED, copies, targets, said):
        one_error_line(result, str(copy / name), "symbolic link")
        assert target.read_bytes() == VICTIM_BYTES


@pytest.mark.slow
def test_a_requeued_run_copies_its_model_code_over_links_never_through_them(tmp_path, data_dir):
    """-r auto in a named run folder that holds no checkpoint yet (its first attempt died early) writes a new run's
    model/ copy there: a link planted inside model/ is replaced, never written through."""
    config = make_config(tmp_path, data_dir, trainer__epochs=1)
    model = tmp_path / "saved" / "tiny" / "q" / "model"
    model.mkdir(parents=True)
    target = victim(tmp_path)
    (model / "model.py").symlink_to(target)
    result = run("train.py", "-c", config, "-r", "auto", "--run-id", "q")
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == VICTIM_BYTES
    assert (
        not (model / "model.py").is_symlink()
        and (model / "model.py").read_text() == (ROOT / "model" / "model.py").read_text()
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["per_class.csv", *(["confusion_matrix.png"] if plots() else [])])
def test_test_py_refuses_a_link_planted_where_it_writes(trained, tmp_path, name):
    copy = shared_copy(trained, tmp_path)
    target = victim(tmp_path)
    (copy / name).symlink_to(target)
    result = run("test.py", "--run", copy)
    one_error_line(result, str(copy / name), "symbolic link")
    assert target.read_bytes() == VICTIM_BYTES


@pytest.mark.slow
def test_a_run_folders_config_writes_nowhere_outside_it_unless_given_with_c(trained, tmp_path):
    copy = shared_copy(trained, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    for spec in config["data_loader"].values():  # the data_dir outside: a download would write there
        spec["args"]["download"] = True
    (copy / "config.json").write_text(json.dumps(config))
    refused, vouched = train_py_in_one_process(  # test.py twice in one process: a JAX start fewer
        ["--run", copy], ["--run", copy, "-c", copy / "config.json"], script="test"
    )
    one_error_line(refused, "data_loader.train.args.data_dir", "outside the run folder", "-c")
    assert vouched.returncode == 0, vouched.stderr


@pytest.mark.slow
def test_a_loose_checkpoint_continues_in_a_new_run_folder(trained, tmp_path):
    """`cp RUN/checkpoint-latest.params ./x.params; train.py -c other.json -r x.params` once made the folder of x.params
    the run folder (its config.json replaced, the run's files written beside it)."""
    loose = tmp_path / "project"
    loose.mkdir()
    shutil.copy(trained / "config.json", loose / "config.json")  # even the very config it was trained with
    shutil.copy(trained / "checkpoint-latest.params", loose / "checkpoint-latest.params")
    before = {p.name: p.read_bytes() for p in loose.iterdir()}
    other = json.loads((trained / "config.json").read_text())
    other["trainer"]["save_dir"] = str(tmp_path / "saved")
    (tmp_path / "other.json").write_text(json.dumps(other))
    result = run("train.py", "-c", tmp_path / "other.json", "-r", loose / "checkpoint-latest.params", "--epochs", 2)
    assert result.returncode == 0, result.stderr
    assert {p.name: p.read_bytes() for p in loose.iterdir()} == before
    (new_run,) = (tmp_path / "saved" / "tiny").iterdir()
    rows = [json.loads(line) for line in (new_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [2]  # continued from epoch 1, not started afresh
    without_config = run("train.py", "-r", loose / "checkpoint-latest.params", "--epochs", 2)
    one_error_line(without_config, "not in the run folder", "-c CONFIG")


# --------------------------------------------------------------------------------------- another working folder
@pytest.mark.slow
def test_the_tools_run_from_another_working_folder(trained, tmp_path, data_dir):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run_in(script: str, *args) -> subprocess.CompletedProcess:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        command = [sys.executable, str(ROOT / script), *map(str, args)]
        return subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    config = make_config(tmp_path, data_dir)
    trained_here = run_in("train.py", "-c", config, "--fast-dev-run")
    assert trained_here.returncode == 0, trained_here.stderr
    tested = run_in("test.py", "--run", trained)
    assert tested.returncode == 0 and "confusion matrix" in tested.stdout, tested.stderr
    assert list(elsewhere.iterdir()) == []  # nothing written into the working folder


# ---------------------------------------------------------------------------------------------------- exports
def export(run: Path, out: Path, *extra) -> subprocess.Popen:
    command = [sys.executable, "inference/convert_tflite.py", "--run", str(run), "--name", "m"]
    command += ["--output-dir", str(out), "--formats", "jax", "--val-examples", "8", *map(str, extra)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_exports_of_one_name_one_wins(export_run, tmp_path):  # noqa: F811
    first, second = export(export_run, tmp_path), export(export_run, tmp_path)
    results = [(p.wait(timeout=300), p.stderr.read()) for p in (first, second)]
    assert sorted(code for code, _ in results) == [0, 2], results
    (refused,) = [err for code, err in results if code == 2]
    lines = refused.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "m") in lines[0], refused
    assert (tmp_path / "m" / "report.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary or lock file left


# A kill right after any rename that moves exports/m away or into place: the old export hidden by the first of two
# renames was lost with it.
KILLED_EXPORT = r"""
import os, signal, sys
sys.path.insert(0, os.getcwd())
target = os.path.abspath(sys.argv[-1])
real_rename = os.rename
def rename(src, dst, *args, **kwargs):
    real_rename(src, dst, *args, **kwargs)
    if target in (os.path.abspath(src), os.path.abspath(dst)):
        os.kill(os.getpid(), signal.SIGKILL)
os.rename = rename
sys.argv = ["convert_tflite.py", *sys.argv[1:-1]]
from inference import convert_tflite
sys.exit(convert_tflite.main())
"""


@pytest.mark.slow
def test_replacing_an_export_never_leaves_it_absent_and_clears_what_killed_ones_left(export_run, tmp_path):  # noqa: F811
    assert export(export_run, tmp_path).wait(timeout=300) == 0
    stale = tmp_path / ".m.abcd1234"  # a killed export's half-built folder
    stale.mkdir()
    (stale / "m.jax").write_bytes(b"half")
    args = ["--run", export_run, "--name", "m", "--output-dir", tmp_path, "--formats", "jax", "--force"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-c", KILLED_EXPORT, *map(str, args), tmp_path / "m"]
    subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "m" / "report.json").is_file() and (tmp_path / "m" / "m.jax").is_file()
    assert not stale.exists()
