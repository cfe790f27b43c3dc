"""A memory-mapped .npy file (or an uncompressed .npz) cut short by another process while a run reads it: the next
batch is a ValueError naming the file and both sizes, where reading past the end killed the process with SIGBUS and
no message (issue 48, item 9). Run in a child process, since before the check it died."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

READ_AFTER_CUT = r"""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np
from data_loader.sources.arrays import ArraysDataset
path, cut = sys.argv[1], sys.argv[2]
dataset = ArraysDataset(path, "x", "y")
print(dataset.get_batch(np.arange(8))["input"].shape, flush=True)
os.truncate(cut, 1000)  # as another process rewriting the file would
try:
    dataset.get_batch(np.arange(4000, 4008))
except ValueError as error:
    print(error)
"""


@pytest.mark.parametrize("kind", ["npy", "npz"])
def test_a_mapped_file_cut_short_is_a_message_not_sigbus(tmp_path, kind):
    x, y = np.ones((4096, 64), np.float32), np.zeros(4096, np.int64)
    if kind == "npy":
        path = tmp_path / "arrays"
        path.mkdir()
        np.save(path / "x.npy", x)
        np.save(path / "y.npy", y)
        cut, named = path / "x.npy", str(path / "x.npy")
    else:
        path = cut = tmp_path / "data.npz"
        np.savez(path, x=x, y=y)  # stored uncompressed: each member is mapped at its offset
        named = f"{path} (member "
    result = subprocess.run(
        [sys.executable, "-c", READ_AFTER_CUT, path, cut], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != -signal.SIGBUS, "killed by SIGBUS: " + result.stderr[-500:]
    assert result.returncode == 0, result.stderr
    first, message = result.stdout.strip().splitlines()
    assert first == "(8, 64)"
    assert message.startswith(named) and "1000 bytes now, shorter than the" in message, message
    assert "cut short or rewritten while it was memory-mapped" in message
