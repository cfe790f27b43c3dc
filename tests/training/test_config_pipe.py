"""`train.py -c /dev/stdin` after a pipe, or `-c <(...)`: a config from a pipe is read to the config's bound, and must
be written whole and closed within PIPE_SECONDS; a pipe nobody writes, or one past the bound, is one line instead
of a wait without end (issue 48, item 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.end_to_end.test_train import ROOT
from training.config import file
from training.config.file import MAX_CONFIG_BYTES, ConfigError, read_config_file


def write_then_close(fd: int, data: bytes) -> threading.Thread:
    def work():
        try:
            for start in range(0, len(data), 1 << 16):
                os.write(fd, data[start : start + (1 << 16)])
        except BrokenPipeError:  # the reader gave up past the bound
            pass
        finally:
            os.close(fd)

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_a_config_from_a_pipe_is_read():
    read, write = os.pipe()
    writer = write_then_close(write, json.dumps({"name": "piped", "trainer": {"epochs": 2}}).encode())
    try:
        assert read_config_file(f"/proc/self/fd/{read}") == {"name": "piped", "trainer": {"epochs": 2}}
    finally:
        writer.join()
        os.close(read)


def test_train_py_reads_its_config_from_stdin():
    config = json.loads((ROOT / "config.json").read_text())
    config["trainer"]["epochs"] = 0  # refused by validation: the file was read
    result = subprocess.run(
        [sys.executable, "train.py", "-c", "/dev/stdin"],
        cwd=ROOT,
        input=json.dumps(config),  # through a pipe, as `jq ... | train.py -c /dev/stdin` gives it
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.strip() == "error: stdin: trainer.epochs: must be >= 1, got 0"


def test_a_pipe_nobody_writes_is_one_line_after_its_time(monkeypatch):
    monkeypatch.setattr(file, "PIPE_SECONDS", 0.3)
    read, write = os.pipe()  # the writing end stays open and silent
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError, match=r"a pipe not closed within 0.3 s of the start"):
            read_config_file(f"/proc/self/fd/{read}")
    finally:
        os.close(read), os.close(write)
    assert time.monotonic() - started < 3


def test_a_pipe_past_the_bound_is_one_line():
    read, write = os.pipe()
    writer = write_then_close(write, b" " * (MAX_CONFIG_BYTES + 1))
    try:
        with pytest.raises(ConfigError, match="a pipe of more than the 16 MB a config file may have"):
            read_config_file(f"/proc/self/fd/{read}")
    finally:
        os.close(read)
        writer.join()
