"""inference/convert_tflite.py stopped by a real SIGINT or SIGTERM while it converts: it ends within about a second,
in one line (status 130 or 143), and leaves no export folder, no hidden half-made one and no lock (issue 48, item 8).
SIGINT is sent to a process that inherited it ignored, as a script's background job (`... &`) does."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import IGNORING_SIGINT
from tests.inference.test_export_cli import run_dir, write_config  # noqa: F401 (the tiny run folder fixture)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_mid_export_ends_it_at_once_leaving_nothing(run_dir, tmp_path, signum, status):  # noqa: F811
    out = tmp_path / "exports"
    process = subprocess.Popen(
        [*IGNORING_SIGINT, REPO / "inference" / "convert_tflite.py", "--run", run_dir, "--name", "x"]
        + ["--output-dir", out],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    deadline = time.monotonic() + 120
    # the hidden folder the export is built in: the converters are at work
    while not (out.is_dir() and any(p.name.startswith(".x.") and p.is_dir() for p in out.iterdir())):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    process.send_signal(signum)
    sent = time.monotonic()
    try:
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    waited = time.monotonic() - sent
    assert process.returncode == status, err.decode()[-2000:]
    assert err.decode().strip().splitlines()[-1] == f"error: stopped by {signal.Signals(signum).name}" + (
        " (Ctrl-C)" if signum == signal.SIGINT else ""
    )
    assert waited < 5, f"{waited:.1f} s after the signal"  # about a second; slack for a loaded machine
    assert list(out.iterdir()) == []
