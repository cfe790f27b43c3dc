"""Where train.py writes a run, decided from its validated config before anything is loaded (no JAX): a new run's
folder name, the named run that ``-r auto`` continues, whether a resumed checkpoint sits in its run folder, and the
symbolic links refused on the way."""

from __future__ import annotations

import os
import stat
from datetime import datetime
from pathlib import Path

from files.reads import parse_json, read_regular
from files.writes import (
    CONFIG,
    LOCK_NAME,
    METRICS,
    RUN_FILES,
    UnsafeFile,
    epoch_checkpoint,
    refuse_unsafe,
    step_checkpoint,
)
from training.config.file import MAX_CONFIG_BYTES, ConfigError, config_hash
from training.run.cli import log_files
from training.tracking import config as tracking  # [feature: tracking]


def run_id_of(config: dict) -> str:
    """A new run's folder name: trainer.run_id, else the start time."""
    trainer = config["trainer"]
    if trainer["run_id"]:
        return trainer["run_id"]
    run_id = datetime.now().strftime("%Y%m%d_%H%M%S")
    run_id += tracking.folder_suffix(config)  # [feature: tracking] the wandb run's id, so each finds the other
    return run_id


def named_run(config: dict) -> Path:
    """``-r auto``'s run folder: the one named by trainer.run_id (--run-id), existing or not."""
    if not config["trainer"]["run_id"]:
        raise ConfigError("-r auto: name the run with --run-id NAME (or trainer.run_id), so a requeued job finds it")
    check_not_linked(config, config["trainer"]["run_id"])
    folder = Path(config["trainer"]["save_dir"]) / config["name"] / config["trainer"]["run_id"]
    if folder.is_dir():  # continued, or reused after an attempt that ended before its first checkpoint
        check_run_files(folder)
    return folder


def check_not_linked(config: dict, run_id: str | None = None) -> None:
    """The config name's folder under save_dir, and a run folder named in advance (-r auto), must be real folders:
    through a symbolic link a run would be written (or resumed) somewhere else."""
    parent = Path(config["trainer"]["save_dir"]) / config["name"]
    for folder in (parent, parent / run_id) if run_id else (parent,):
        if folder.is_symlink():
            raise ConfigError(
                f"{folder}: a symbolic link (to {os.readlink(folder)}), not a folder; runs are written "
                f"only into real folders under {parent.parent}: remove the link or choose another "
                f"{'--run-id' if folder != parent else 'name'}"
            )


def no_config(resume: str | None) -> str:
    """What train.py says when it has no config: none given, and no run folder around the checkpoint to resume."""
    if resume:
        return (
            f"-r {resume}: not in the run folder it was trained in (no {CONFIG} of its run beside it); give its "
            f"config with -c CONFIG, and it continues in a new run folder under save_dir"
        )
    return "give a config with -c config.json (or -r a checkpoint inside a run folder)"


def check_config_writes(config: dict, run_dir: Path, source: str = CONFIG) -> None:
    """A run folder's own config.json travels with the folder, so it may come from elsewhere: a place it names where
    a tool would write (a loader's ``cache_dir``, the ``data_dir`` of a loader that may ``download``) must lie inside
    that run folder or the working folder (a shipped config's ``data/...``). Elsewhere (an absolute path, ``../``) it
    is a ConfigError unless the config is given with ``-c``, which vouches for it."""
    allowed = (run_dir.resolve(), Path.cwd().resolve())
    for split, spec in (config.get("data_loader") or {}).items():
        args = (spec.get("args") or {}) if isinstance(spec, dict) else {}
        named = {"cache_dir": args.get("cache_dir"), "data_dir": args.get("data_dir") if args.get("download") else None}
        for key, value in named.items():
            path = None if value is None else Path(value).resolve()
            if path is None or any(path == folder or folder in path.parents for folder in allowed):
                continue
            raise ConfigError(
                f"{source}: data_loader.{split}.args.{key}: {value} is outside the run folder {run_dir} and the "
                f"working folder, and a run folder's own config may come from elsewhere; give it with "
                f"-c {run_dir / CONFIG} to write there"
            )


# The folders a run writes files into by name (the profiler's traces, the trackers' event files): a link planted at
# one would have them written wherever it points, and the libraries that write them follow it.
RUN_FOLDERS = (
    "profile",
    "tensorboard",  # [feature: tracking]
    "wandb",  # [feature: tracking] wandb's files, where WANDB_DIR does not send them elsewhere
)


def check_run_files(run_dir: Path) -> None:
    """A ConfigError (one line, exit 2) when a link, a folder or a pipe stands where a run writes one of its files,
    or a link or a file where it writes into a folder (``RUN_FOLDERS``): checked before a resume writes anything
    (numbered checkpoints too: a resume may rewrite or rotate them)."""
    numbered = [p.name for pattern in (epoch_checkpoint("*"), step_checkpoint("*")) for p in run_dir.glob(pattern)]
    for name in (*RUN_FILES, *log_files(), *numbered):
        try:
            refuse_unsafe(run_dir / name)
        except UnsafeFile as error:
            raise ConfigError(f"{error}; a run folder from elsewhere may hold planted links") from None
    for name in RUN_FOLDERS:
        path = run_dir / name
        if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
            kind = f"a symbolic link (to {os.readlink(path)})" if path.is_symlink() else "not a folder"
            raise ConfigError(
                f"{path}: {kind}, where the run writes into a folder of its own; a run folder from elsewhere may "
                "hold planted links: remove it to resume"
            )


RUN_MARKS = (LOCK_NAME, METRICS)  # files only a run makes: a project's folder with a config.json has neither
HEADER_LIMIT = 100 * 2**20  # a checkpoint's JSON header is kilobytes; a larger length field is not one


def run_folder_of(checkpoint_path: Path) -> Path | None:
    """The run folder a checkpoint continues in: its own folder when that is one and the checkpoint belongs to it
    (what only a run makes, its ``.lock`` or its ``metrics.jsonl``, and a ``config.json`` with the config hash the
    checkpoint records), else None: a checkpoint copied elsewhere (``./x.params``, beside a project's own
    config.json) is continued in a new run folder under save_dir, and nothing is written beside it. A run folder may
    come from elsewhere: a link planted where the run writes a file is refused first (``check_run_files``)."""
    folder = checkpoint_path.parent
    if not any(os.path.lexists(folder / name) for name in RUN_MARKS):
        return None
    check_run_files(folder)
    try:
        saved = parse_json(read_regular(folder / CONFIG, MAX_CONFIG_BYTES, "config file"), str(folder / CONFIG))
        recorded = header_of(checkpoint_path).get("config_hash")
    except (OSError, ValueError, AttributeError):  # each JSON read held to the bounds: no RecursionError
        return None
    return folder if isinstance(saved, dict) and recorded and recorded == config_hash(saved) else None


def header_of(path: Path) -> dict:
    """A checkpoint's header without JAX or the arrays (a safetensors file: an 8-byte length, then its JSON, whose
    metadata holds the header as text). Raises OSError or ValueError on anything else; ``checkpoint.read``
    checks the file in full when the run loads it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe opens at once, to be refused
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        length = int.from_bytes(f.read(8), "little")
        if length > min(size - 8, HEADER_LIMIT):
            raise ValueError("not a checkpoint")
        where = f"{path}: header"  # held to the JSON bounds, read as a hint: nested past them is a ValueError
        header = parse_json(parse_json(f.read(length), where)["__metadata__"]["header"], where)
    if not isinstance(header, dict):
        raise ValueError("not a checkpoint header")
    return header
