"""new_project.py stopped by a real SIGTERM or SIGINT mid-copy leaves nothing beside its target; a target that is a
symbolic link (dangling or not) is refused, never followed (issue 48, item 8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import IGNORING_SIGINT

REPO = Path(__file__).resolve().parents[2]


def started(target: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*IGNORING_SIGINT, REPO / "new_project.py", target, "--samples", "mnist"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def building(parent: Path) -> bool:
    return any(p.name.startswith(".proj-") for p in parent.iterdir())


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_mid_copy_leaves_nothing(tmp_path, signum, status):
    process = started(tmp_path / "proj")
    deadline = time.monotonic() + 60
    while not building(tmp_path):  # the hidden folder the project is built in
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.002)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == status, err.decode()
    assert err.decode().strip().splitlines()[-1].startswith(f"error: stopped by {signal.Signals(signum).name}")
    assert list(tmp_path.iterdir()) == []


def test_what_a_kill_9_left_the_next_run_for_the_target_removes(tmp_path):
    process = started(tmp_path / "proj")
    deadline = time.monotonic() + 60
    while not building(tmp_path):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.002)
    process.kill()
    process.communicate()
    assert building(tmp_path)  # SIGKILL cannot be caught
    again = started(tmp_path / "proj")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err.decode()
    assert [p.name for p in tmp_path.iterdir()] == ["proj"]


@pytest.mark.parametrize("points_to", ["nowhere", "empty"])
def test_a_target_that_is_a_link_is_refused(tmp_path, points_to):
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / points_to, tmp_path / "proj")
    result = subprocess.run(
        [sys.executable, REPO / "new_project.py", tmp_path / "proj", "--samples", "mnist"], capture_output=True
    )
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "a symbolic link" in lines[0], result.stderr.decode()
    assert not (tmp_path / "nowhere").exists() and list((tmp_path / "empty").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "proj"]
