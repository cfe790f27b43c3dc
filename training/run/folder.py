"""A run folder's bookkeeping: created atomically, held by one training process at a time, reconciled on resume.

The end of an epoch is committed in one order (``Checkpoints.commit_epoch`` in training/run/saving.py):
``checkpoint-latest.params`` first (its header carries the epoch's metrics row and where the best epoch is), then
what derives from it (``model_best.params``, ``checkpoint-epoch_N.params``, the row in ``metrics.jsonl``). A process
killed at any moment leaves the latest checkpoint readable and everything else either done or re-derivable, and
``reconcile`` re-derives it on resume.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import shutil
from pathlib import Path

from files.reads import read_metrics
from files.writes import (
    BEST,
    CONFIG,
    LOCK_NAME,
    METRICS,
    PREPROCESSING,
    UnsafeFile,
    epoch_checkpoint,
    kind_of_file,
    open_append,
    open_nofollow,
    replace_folder,
    temporary_folder,
    write_atomic,
)
from training.config.notebook_components import NOTEBOOK, kernel_components
from training.run import checkpoint

ROOT = Path(__file__).resolve().parents[2]  # the repository: where model/ and tasks/ lie


class RunFolderError(Exception):
    """A run folder that cannot be created, held or written: reported as one line."""


def create(parent: Path, run_id: str, exact: bool = False) -> Path:
    """A new folder ``parent/run_id`` (``run_id_1``, ``_2``, ... when taken), made with one exclusive ``mkdir`` so
    two runs started in the same second never share one. ``exact``: that name, existing or not (``-r auto``
    starting a run whose earlier attempt ended before its first checkpoint)."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if exact:
            (parent / run_id).mkdir(exist_ok=True)
            if (parent / run_id).is_symlink():  # train.py refuses one before; this guards every other caller
                raise RunFolderError(f"{parent / run_id}: a symbolic link, not a run folder; nothing was written")
            return parent / run_id
        for suffix in itertools.count():
            path = parent / (run_id if suffix == 0 else f"{run_id}_{suffix}")
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as error:
        raise RunFolderError(f"cannot create a run folder in {parent}: {error.strerror or error}") from None


def first_existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def remove_new(run_dir: Path, existed: Path) -> bool:
    """Undoes a new run's start: its folder, and the empty folders made above it (`existed`: ``first_existing`` of
    its path before it was made). Returns whether the run folder is gone."""
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in run_dir.parents:
        if existed not in folder.parents:
            break
        try:
            folder.rmdir()
        except OSError:
            break
    return not run_dir.exists()


def os_error_text(error: OSError) -> str:
    """An OSError in one line: copytree's shutil.Error carries a list of (source, destination, reason), whose repr
    would fill a screen."""
    if isinstance(error, shutil.Error) and error.args and isinstance(error.args[0], list) and error.args[0]:
        _, destination, reason = error.args[0][0]
        more = f" (and {len(error.args[0]) - 1} more files)" if len(error.args[0]) > 1 else ""
        reason = re.match(r"(?:\[Errno \d+\] )?([^:]*)", str(reason)).group(1)  # "[Errno 28] No space ...: 'path'"
        return f"{destination}: {reason}{more}"
    return f"{error.filename or ''}: {error.strerror or error}"


def hold(run_dir: Path, mark: bool = True) -> int | None:
    """Locks the run folder for this process (released when it exits, however it exits); a second process that
    tries to train in it gets an error naming the holder. ``mark`` False (a resume, before its checkpoint loaded):
    nothing written yet, so that a failed one changes nothing: the lock file is not made (None where it is missing;
    hold it again once the checkpoint loaded) and this process's id is written by ``mark_holder``."""
    import fcntl

    path = run_dir / LOCK_NAME
    try:
        fd = open_nofollow(path, os.O_RDWR | (os.O_CREAT if mark else 0))  # a planted link: refused
    except UnsafeFile as error:
        raise RunFolderError(f"{error}; nothing was changed") from None
    except OSError as error:
        if isinstance(error, FileNotFoundError) and not mark:
            return None
        raise RunFolderError(
            f"{run_dir}: cannot write in the run folder ({error.strerror or error}); nothing was changed"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunFolderError(
            f"{run_dir}: in use by process {holder} (another train.py is training in it); wait for it to end or stop it"
        ) from None
    if mark:
        mark_holder(fd)
    return fd


def mark_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


class Writer:
    """Runs checkpoint writes on one background thread, one at a time and in order; a write's error is raised by
    the next ``submit`` or ``wait``. ``background=False`` writes in the caller's thread."""

    def __init__(self, background: bool = True):
        self.background = background
        self.pool = None
        self.pending = None

    def submit(self, job) -> None:
        self.wait()
        if not self.background:
            job()
            return
        if self.pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self.pending = self.pool.submit(job)

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()


def append_row(run_dir: Path, row: dict) -> None:
    """One epoch's row in metrics.jsonl, flushed to disk before the epoch counts as logged."""
    with open_append(run_dir / METRICS) as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: Path) -> list[dict]:
    """metrics.jsonl's rows; a line cut short by a kill (the last one) is dropped. A line past the JSON bounds
    (longer, or nested deeper, than any row) is a ValueError naming it, not a RecursionError."""
    rows = read_metrics(path, torn=True) if path.is_file() else []
    return [row for row in rows if isinstance(row.get("epoch"), int)]


def reconcile(run_dir: Path, latest: Path, header: dict, save_period: int) -> list[str]:
    """Makes the run folder agree with the checkpoint a run resumes from (held by this process): temporary files of
    interrupted writes removed, metrics rows past its epoch dropped, its own row restored, and a best or epoch
    checkpoint that a kill left unwritten rewritten from it. Returns what was repaired, for the log."""
    repaired = [f"removed an interrupted write: {p.name}" for p in checkpoint.remove_stale_temps(run_dir)]
    epoch = header["epoch"]
    metrics = run_dir / METRICS
    lines = metrics.read_text(errors="replace").splitlines() if metrics.is_file() else []  # counted, not parsed
    rows = read_rows(metrics)
    if len(rows) < len(lines):
        repaired.append(f"{METRICS}: dropped {len(lines) - len(rows)} line(s) cut short")
    past = [r for r in rows if r["epoch"] > epoch]
    if past:
        repaired.append(f"{METRICS}: dropped {len(past)} row(s) past epoch {epoch}")
    kept = list({r["epoch"]: r for r in rows if r["epoch"] <= epoch}.values())  # a repeated epoch: its last row
    if len(kept) < len(rows) - len(past):
        repaired.append(f"{METRICS}: dropped {len(rows) - len(past) - len(kept)} repeated row(s)")
    own = header.get("row")
    if isinstance(own, dict) and not any(r["epoch"] == epoch for r in kept):
        kept.append(own)
        repaired.append(f"{METRICS}: restored the row of epoch {epoch}")
    text = "".join(json.dumps(r) + "\n" for r in kept)
    if "".join(line + "\n" for line in lines) != text:
        checkpoint.write_atomic(metrics, text.encode())
    derived = []
    if header.get("position"):  # saved mid-epoch: the epoch-end files belong to the epoch before
        return repaired
    if header.get("best_epoch") == epoch:
        derived.append(run_dir / BEST)
    if epoch and epoch % save_period == 0:
        derived.append(run_dir / epoch_checkpoint(epoch))
    for path in derived:
        if path.resolve() == latest.resolve() or written_at(path) == (epoch, header["step"]):
            continue
        checkpoint.write_atomic(path, latest.read_bytes())
        repaired.append(f"{path.name}: rewritten from epoch {epoch}'s checkpoint (its write was interrupted)")
    return repaired


def written_at(path: Path) -> tuple[int, int] | None:
    """(epoch, step) of a checkpoint file, or None when it is missing or unreadable."""
    try:
        header = checkpoint.read(path, lazy=True)[1]  # a sharded checkpoint's index: its shards are not read
    except checkpoint.CheckpointError:
        return None
    return header.get("epoch"), header.get("step")


def model_code(config: dict) -> list[Path]:
    """The code that defines a run's weights, as folders relative to the repository: model/, and the folder of a
    model written in a file of your own (tasks/vae/ for the VAE sample's model), which a run folder and an export
    copy beside it. A model registered in a notebook has no file (notebook.json names it)."""
    from model.registry import entries

    folders = [Path("model")]
    name = (config.get("model") or {}).get("name")
    entry = entries("model").get(name) if isinstance(name, str) else None
    code = getattr(entry.fn, "__code__", None) if entry else None
    source = Path(code.co_filename).resolve() if code else None
    if source and source.is_relative_to(ROOT) and not source.is_relative_to(ROOT / "model"):
        folders.append(source.parent.relative_to(ROOT))
    return folders


def write_run_files(run_dir: Path, config: dict, run, new: bool = True) -> None:
    """What makes a folder a run that test.py, sample.py, the export and load_run take, as train.py and ``fit``
    write it: the resolved config, the training data's preprocessing, a copy of model/ (``new``: the code of the
    weights), and notebook.json naming the components that only this process knows. ``run``: the assembled run
    (``training.assembly.Run``) with its train data loaded."""
    if new:
        for code in model_code(config):
            # copied into a folder made here, then swapped in: a folder named model/ in a run folder from elsewhere
            # (a requeued -r auto run) may hold links, and copying over them would write through them
            for parent in reversed(code.parents[:-1]):  # tasks/ of tasks/vae: a folder, never a link followed
                path = run_dir / parent
                if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
                    kind = kind_of_file(os.lstat(path).st_mode, path)
                    raise OSError(errno.EEXIST, f"{kind} stands where the run copies its model's code into a folder; "
                                  "nothing was written through it (remove it)", str(path))  # fmt: skip
                path.mkdir(exist_ok=True)
            building = temporary_folder(run_dir / code)
            try:
                shutil.copytree(ROOT / code, building, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
                replace_folder(building, run_dir / code)
            except BaseException:
                shutil.rmtree(building, ignore_errors=True)
                raise
    write_atomic(run_dir / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
    preprocessing = run_preprocessing(run)
    if preprocessing:
        write_atomic(run_dir / PREPROCESSING, (json.dumps(preprocessing, indent=2) + "\n").encode())
    local = kernel_components(config)
    if local:
        write_atomic(run_dir / NOTEBOOK, (json.dumps({"registered_in_notebook": local}, indent=2) + "\n").encode())


def run_preprocessing(run) -> dict:
    """preprocessing.json of a run: the training data's preprocessing, the augmentation's normalisation folded in
    (what predict.py computes), and the range of the model's inputs (predict.py's range check)."""
    from data_loader.augment.pipeline import input_range

    loader = run.loaders["train"]
    preprocessing = loader.preprocessing
    if run.augment is not None:
        preprocessing = run.augment.preprocessing(preprocessing, loader.spec)
    preprocessing.update(input_range(loader, run.augment))
    return preprocessing
