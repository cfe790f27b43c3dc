"""Training from Python, as a notebook does it: ``fit`` trains a config in this process, exactly as train.py would,
and returns the rows train.py logs. The module a notebook imports (the repository's shape keeps its name):

    from utils import fit

    rows = fit(config)  # a new run folder: saved/<name>/<time>/

What it builds on, each where it is defined: the config's validation (training/config/validation.py), the run's
assembly (training/assembly.py), the run folder (training/run/folder.py), the loop (training/trainer.py); a trained
run comes back with ``load_run`` (inference/trained_run.py).
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from files.writes import LATEST
from training import startup
from training.assembly import assemble
from training.buckets import store as buckets  # [feature: buckets]
from training.config.file import ConfigError, config_hash
from training.config.validation import validate
from training.devices import compilation_cache
from training.run import folder as run_folder
from training.run import location
from training.run.history import History
from training.trainer import Trainer


def fit(config: dict, run_dir: str | Path | None = None, source: str = "config", resume: bool = False) -> list[dict]:
    """Trains from a config in this process, as a notebook would (Keras' ``fit``): validated, assembled and loaded
    as train.py does, the state initialised from the seed. Returns the rows train.py logs, one per epoch
    (``train/loss``, ``val/accuracy``, ``lr``...), and prints the epoch lines train.py prints (plain lines, as many
    as trainer.log_every asks for, unless logging is set up already).

    Each call is a new, complete run folder, as train.py writes one: ``run_dir`` (new or empty), or by default a new
    folder under trainer.save_dir/<name>/ named as train.py names it: config.json, a copy of model/,
    preprocessing.json, metrics.jsonl and the checkpoints, so ``test.py --run``, the export and ``load_run`` take it.
    ``resume=True`` continues the run in ``run_dir`` from its checkpoint-latest.params instead. A component registered
    in the notebook itself is recorded (notebook.json): the command-line tools refuse the run in one line, since only
    this kernel knows that component."""
    config = validate(config, source)
    buckets.local_only(config, "fit")  # [feature: buckets] a bucket's run folder is train.py's
    check_run_dir(run_dir, resume)
    compilation_cache.use()  # the machine's, where nothing has compiled yet in this kernel
    run = assemble(config, source)
    run.load_data()
    run.check_data()
    if run_dir is not None:
        run_dir = Path(run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a folder that cannot be made there (/proc, a read-only disk): nothing written
            raise ConfigError(f"fit: run_dir {run_dir}: cannot make the folder ({error.strerror or error})") from None
    else:
        parent = Path(config["trainer"]["save_dir"]) / config["name"]
        run_dir = run_folder.create(parent, location.run_id_of(config))
    lock = run_folder.hold(run_dir)
    try:
        with console_lines():
            history = History()
            trainer = Trainer(run, run_dir, trackers=[history], config_hash=config_hash(config))
            trainer.begin(startup.from_checkpoint(trainer, run_dir / LATEST) if resume else startup.from_seed(trainer))
            run_folder.write_run_files(run_dir, config, run, new=not resume)
            logging.getLogger("train").info(f"run folder: {run_dir}")
            trainer.train()
    finally:
        os.close(lock)  # the kernel lives on: the next fit in this folder (resume=True) takes the lock again
    return history.rows


def check_run_dir(run_dir: str | Path | None, resume: bool) -> None:
    """``fit``'s ``run_dir`` must be a real folder, new or empty (or, to resume, holding a checkpoint): a file, a
    link (to a file, to a folder, or to nothing), or a path under a file is a ConfigError in one line, before any
    data is read, as a folder that already holds a run is; nothing is ever written through a link."""
    if run_dir is None:
        if resume:
            raise ConfigError(f"fit(resume=True): give the run folder to continue as run_dir (its {LATEST})")
        return
    path = Path(run_dir)
    if path.is_symlink():
        target = os.readlink(path)
        dangling = "" if path.exists() else ", which does not exist"
        raise ConfigError(
            f"fit: run_dir {path}: a symbolic link (to {target}{dangling}), not a folder; runs are written only into "
            "real folders: give the folder's own path"
        )
    existing = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        what = "a file" if existing.is_file() else "not a folder"
        where = "" if existing == path else f" ({existing} is {what})"
        raise ConfigError(
            f"fit: run_dir {path}: {what if existing == path else 'not a folder it can be made in'}{where}; give a "
            "new or empty folder"
        )
    if resume and not (path / LATEST).is_file():
        raise ConfigError(f"fit(resume=True): {path}/{LATEST}: no such checkpoint; give the run folder to continue")
    if not resume and path.is_dir() and any(path.iterdir()):
        raise ConfigError(
            f"fit: {path} already holds a run; fit(..., resume=True) continues it, another run_dir (or none: a "
            "new folder under trainer.save_dir) starts a new one"
        )


@contextmanager
def console_lines():
    """The run's log lines ("train") printed as plain lines while it lasts, unless a console handler prints them
    already (train.py's logging set up in this process); a notebook has none, and fit would print nothing."""
    logger = logging.getLogger("train")
    consoles = [
        h
        for h in (*logger.handlers, *logging.getLogger().handlers)
        if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stdout, sys.stderr)
    ]
    if consoles:
        yield
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # a handler of the caller's (a capture, a file) would print them twice
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
