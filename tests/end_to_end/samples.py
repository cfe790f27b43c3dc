"""What the samples' end-to-end tests share: a sample's own config on tiny data, and its metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tests.end_to_end.test_train import write_config


def sample_config(path: Path, tmp_path: Path, loader_args: dict, **changes) -> Path:
    """The config at `path` with every loader's args updated, the run folder in tmp_path and `changes` applied."""
    config = json.loads(path.read_text())
    for loader in config["data_loader"].values():
        loader["args"].update(loader_args)
    config["trainer"].update(save_dir=str(tmp_path / "saved"), log_every=1)
    return write_config(tmp_path, config, changes)


def epochs_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def finite(value) -> bool:
    return all(math.isfinite(v) for v in np.ravel(value))
