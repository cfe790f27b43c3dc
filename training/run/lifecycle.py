"""A run folder's life in train.py, behind one call (``opened``): a resumed run's folder held while its checkpoint
loads, a new one created, the resumed one reconciled with its checkpoint, the folder written; on a failure before
the run trained, or a new run that kept nothing, the folder made is removed again. Which files it holds and how they
are made safe is ``training/run/folder.py``'s."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from files.writes import LATEST, METRICS
from signals import stops
from training.devices import mesh
from training.run import folder, location
from training.run.checkpoint import CheckpointError, remove_stale_temps
from training.run.cli import fail, setup_logging

log = logging.getLogger("train")


@dataclass
class RunFolder:
    path: Path
    repaired: list[str]  # what resuming repaired in it, for the log
    existed: Path | None = None  # a folder this process made: the deepest part of its path that existed before
    discarded: str | None = None  # why the run ended with its folder removed (``discard``)

    def kept_nothing(self) -> bool:
        """A folder made by this run, with no checkpoint to continue from in it."""
        return self.existed is not None and not (self.path / LATEST).exists()

    def discard(self, message: str) -> None:
        """The folder goes when ``opened``'s block ends (after the run's last words are written), and the command
        ends with `message` and exit status 2."""
        self.discarded = message


@contextmanager
def opened(
    config: dict,
    resume: Path | None,
    resume_dir: Path | None,
    load_state: Callable,
    write: Callable[[Path], None],
    exact: bool = False,
    here: Callable[[str], Path] = Path,
) -> Iterator[tuple[object, RunFolder]]:
    """Yields (the trainer `load_state` made, its run folder). In order: a resumed run's folder (`resume_dir`) is
    held while `load_state` loads the checkpoint `resume`, and changed only once it loaded (a failure leaves it as
    it was); process 0 then creates a new folder under trainer.save_dir (``exact``: the name itself, ``-r auto``)
    or marks and reconciles the resumed one, `write`s the run's files in it and logs there; the other processes
    learn where it is (``here``: process 0's folder as this process writes it: a bucket's run folder is staged by
    each process on its own disk). A failure up to there is one line and exit status 2, with a new folder removed
    again; a run that ``discard``s its folder has it removed when the block ends."""
    try:
        lock = folder.hold(resume_dir, mark=False) if resume_dir and mesh.is_main() else None
        trainer = load_state()
        if resume_dir and mesh.is_main():  # rows past the JSON bounds: refused before reconcile changes anything
            folder.read_rows(resume_dir / METRICS)
    except (CheckpointError, ValueError, folder.RunFolderError) as error:
        stop_all(str(error))
    stops.safe_point()
    existed, run_dir = None, None
    try:
        if not mesh.is_main():  # process 0 writes the folder; the others only learn where it is
            run_dir, repaired = here(mesh.share_text("run_dir")), []
        elif resume_dir:
            run_dir = resume_dir
            if lock is None:  # a folder without a lock file: made now that its checkpoint loaded
                folder.hold(run_dir)
            else:
                folder.mark_holder(lock)
            repaired = folder.reconcile(run_dir, resume, trainer.start.header, config["trainer"]["save_period"])
        else:
            parent, run_id = Path(config["trainer"]["save_dir"]) / config["name"], location.run_id_of(config)
            existed = folder.first_existing(parent / run_id)  # what a failed start leaves as it was
            run_dir = folder.create(parent, run_id, exact=exact)
            if existed == run_dir:  # -r auto reusing the folder of an attempt that ended before its first checkpoint
                existed = None
            folder.hold(run_dir)
            # -r auto reusing the folder of an attempt killed before its first checkpoint was on disk
            repaired = [f"removed an interrupted write: {p.name}" for p in remove_stale_temps(run_dir)]
        trainer.run_dir = run_dir
        if mesh.is_main():
            write(run_dir)  # config, preprocessing, a new run's model/
            setup_logging(run_dir)
            mesh.share_text("run_dir", str(run_dir))
        else:
            log.setLevel(logging.WARNING)  # process 0 reports the run; the others only their own errors
    except (folder.RunFolderError, mesh.DistributedError) as error:
        stop_all(str(error))
    except OSError as error:  # a full or read-only disk: a new run's folder goes again, nothing half-made stays
        removed = "; the run folder was removed again" if existed and folder.remove_new(run_dir, existed) else ""
        stop_all(f"cannot write in the run folder: {folder.os_error_text(error)}{removed}")
    logging.raiseExceptions = False  # a full disk must not print a traceback per log line; the next write fails
    made = RunFolder(run_dir, repaired, existed)
    try:
        yield trainer, made
    finally:
        if made.discarded and mesh.is_main():
            folder.remove_new(run_dir, existed)


def stop_all(message: str) -> None:
    """fail() once the processes of a run started: process 0 first tells the others, which wait for its run
    folder, that there will be none (one process: just fail)."""
    if mesh.is_main():
        try:
            mesh.share_text("run_dir", "")
        except Exception:  # noqa: BLE001 (the message below is what matters)
            pass
    fail(message)
