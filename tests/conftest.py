"""Shared fixtures: tiny MNIST-format data sets written as real IDX files, so tests never need the real data."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

# One persistent compilation cache for the whole session, its xdist workers and every train.py they start: the
# suite compiles the same tiny steps in dozens of processes, and a cache hit skips XLA. A fresh folder per session
# (the controller sets it before the workers start; they inherit it), so nothing carries over between sessions.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax-test-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

import numpy as np
import pytest

from data_loader.sources import mnist as mnist_module

try:
    # absl's logging handler (imported by flax, optax, TensorFlow) keeps the stderr it was made with, and when a
    # command run in this process (train.main) reconfigures logging, closes that stream if it is no longer
    # sys.stderr. Under pytest it was the capture file of the worker, so every later test failed with "I/O operation
    # on closed file". Outside pytest sys.stderr never changes; here the handler writes to the real stderr.
    import absl.logging

    absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__
except ImportError:
    pass
from data_loader.sources.idx import write_idx

# SIGINT ignored, as a script's background job (`... &`) inherits it: set, then the command exec'd with it
IGNORING_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
]


def make_idx_dataset(folder: Path, n_train: int = 300, n_test: int = 100, seed: int = 0) -> dict[str, str]:
    """Writes the four gz IDX files of a learnable toy task (the label is drawn as a bright row band) and returns
    their md5s."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    md5 = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(labels):
            images[i, 2 + 2 * label : 4 + 2 * label, :] = 255
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{split}-{kind}-ubyte.gz"
            write_idx(folder / name, array)
            md5[name] = hashlib.md5((folder / name).read_bytes()).hexdigest()
    return md5


@pytest.fixture
def tiny_mnist(tmp_path, monkeypatch):
    """A folder of tiny IDX files registered as the "mnist" source's checksums (in this process only)."""
    folder = tmp_path / "data" / "mnist"
    md5 = make_idx_dataset(folder)
    monkeypatch.setitem(mnist_module.SOURCES, "mnist", {**mnist_module.SOURCES["mnist"], "md5": md5})
    return folder
