"""A sweep's folder checked like a run folder before a worker writes anything: it may have been copied or shared,
and a symbolic link planted at the folder, at the config name's folder above it, at logs/, best/ or a trial's
folder, or where a file is written would have the study, the logs and the results written somewhere else. Each is
refused in one line, nothing written through it (files.writes: a link is never followed)."""

from __future__ import annotations

import os
from pathlib import Path

from files.writes import UnsafeFile, refuse_unsafe

JOURNAL = "journal.log"
# what a worker writes into the sweep's folder: the journal and Optuna's lock file beside it, the table, the plots
FILES = (JOURNAL, f"{JOURNAL}.lock", "results.csv", "curves.png", "history.png", "importance.png", "parallel.png")
FOLDERS = ("logs", "best")


class LinkedFolder(ValueError):
    """A link, or something other than a folder, where a sweep keeps a folder or writes a file: one line."""


def check_folder(folder: Path) -> None:
    """Refuses (LinkedFolder) a link or a non-folder at the config name's folder, the sweep's folder, logs/, best/
    or a trial's folder, and anything but a regular file where a worker writes one (logs/trial-NNN.log included)."""
    named = {folder.parent: "name (--set name=...)", folder: "--study"}
    named |= {folder / name: "" for name in FOLDERS}
    named |= {path: "" for path in sorted(folder.glob("trial-*")) if path.is_symlink()}
    for path, other in named.items():
        if path.is_symlink():
            instead = f"remove the link or choose another {other}" if other else "remove the link"
            raise LinkedFolder(
                f"{path}: a symbolic link (to {os.readlink(path)}), not a folder; a sweep writes only into real "
                f"folders, and nothing was written through it: {instead}"
            )
        if path.exists() and not path.is_dir():
            raise LinkedFolder(f"{path}: not a folder; a sweep keeps its {path.name} there")
    logs = sorted((folder / "logs").glob("trial-*.log")) if (folder / "logs").is_dir() else []
    for path in [folder / name for name in FILES] + [folder / "best" / "config.json"] + logs:
        try:
            refuse_unsafe(path)
        except UnsafeFile as error:
            raise LinkedFolder(f"{error}; a sweep folder from elsewhere may hold planted links") from None
