"""Where a process's place in a run of several comes from (training/processes/cluster.py, launch.py): flags, SLURM,
JAX's detection; settings that cannot work are one clear line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.end_to_end.test_train import ROOT, run
from tests.training.processes.test_runs import free_port
from training.devices.mesh import DistributedError
from training.processes.cluster import SINGLE, Cluster, check_coordinator_port, cluster_of, slurm_first_host
from training.processes.launch import join


def test_cluster_from_flags_slurm_or_nothing():
    assert cluster_of(None, None, None, environ={}) == SINGLE
    cluster = cluster_of("node7:29500", 4, 3, environ={})
    assert (cluster.process_id, cluster.num_processes, cluster.coordinator, cluster.source) == (
        3,
        4,
        "node7:29500",
        "flags",
    )
    assert cluster_of("localhost:1234", 1, 0, environ={}) == SINGLE
    slurm = {
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "gpu[007-008],cpu1",
        "SLURM_LOCALID": "0",
    }
    cluster = cluster_of(None, None, None, environ=slurm)
    assert cluster == Cluster(1, 2, f"gpu007:{61440 + 4242 % 4096}", "slurm", None)
    # several tasks on a node: one device each
    cluster = cluster_of(None, None, None, environ={**slurm, "SLURM_STEP_NUM_NODES": "1", "SLURM_LOCALID": "1"})
    assert cluster.local_device_ids == (1,)
    assert cluster_of(None, None, None, environ={**slurm, "SLURM_NTASKS": "1"}) == SINGLE
    batch_shell = {k: v for k, v in slurm.items() if k != "SLURM_STEP_NODELIST"}  # sbatch's script, not srun
    assert cluster_of(None, None, None, environ=batch_shell) == SINGLE
    assert slurm_first_host("node001") == "node001"
    assert slurm_first_host("a[3,5-9],b2") == "a3"
    assert cluster_of("auto", None, None, environ={}).source == "auto"


@pytest.mark.parametrize(
    "flags, message",
    [
        (("localhost:1234", 2, None), "missing --process-id"),
        (("localhost", 2, 0), "--coordinator: expected HOST:PORT"),
        (("localhost:99999", 2, 0), "--coordinator: expected HOST:PORT"),
        (("localhost:1234", 2, 2), "--process-id: expected 0 to 1"),
        (("localhost:1234", 0, 0), "--num-processes: expected a number >= 1"),
        (("auto", 2, None), "--coordinator auto detects"),
    ],
)
def test_bad_flags_are_one_clear_error(flags, message):
    with pytest.raises(DistributedError, match=message):
        cluster_of(*flags, environ={})


def test_heartbeat_timeout_checked():
    with pytest.raises(DistributedError, match="--heartbeat-timeout: expected seconds >= 1, got 0"):
        join("localhost:1234", 2, 0, heartbeat_timeout=0)


def test_train_py_reports_bad_flags_in_one_line(tmp_path):
    result = run("train.py", "-c", tmp_path / "unread.json", "--coordinator", "localhost:1234", "--num-processes", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: several processes need --coordinator HOST:PORT, --num-processes N and --process-id I together; "
        "missing --process-id"
    ]


def serving(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("localhost", port)) == 0


def test_a_port_another_coordinator_serves_is_refused_in_one_line(tmp_path):
    """JAX's coordinator binds its port with SO_REUSEPORT: a second run given the same port would share it with the
    first, its processes reaching either coordinator. Process 0 refuses such a port before JAX starts: one line,
    exit status 2, nothing written. The port is held by a real coordinator: a train.py process 0 waiting for its
    process 1."""
    port = free_port()
    flags = ("--coordinator", f"localhost:{port}", "--num-processes", "2")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    first = subprocess.Popen(
        [sys.executable, "train.py", "-c", str(tmp_path / "unread.json"), *flags, "--process-id", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not serving(port):
            assert time.monotonic() < deadline and first.poll() is None, "the first coordinator never served"
            time.sleep(0.1)
        second = run(
            "train.py", "-c", tmp_path / "config.json", *flags, "--process-id", "0", "--run-id", "second", timeout=60
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr.strip().splitlines() == [
            f"error: --coordinator localhost:{port}: port {port} is in use on this machine (another run's "
            "coordinator?); choose another"
        ]
        # process 1 does not serve the port, so it does not ask
        check_coordinator_port(cluster_of(f"localhost:{port}", 2, 1, environ={}))
    finally:
        first.kill()
        first.wait()
    assert list(tmp_path.iterdir()) == []
    check_coordinator_port(cluster_of(f"localhost:{port}", 2, 0, environ={}))  # free again: no error


def test_slurm_names_the_variable_that_moves_its_port():
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        slurm = Cluster(0, 2, f"node001:{port}", "slurm")
        with pytest.raises(
            DistributedError,
            match=f"SLURM's coordinator: port {port} is in use on this machine.*set JAX_COORDINATOR_PORT to another",
        ):
            check_coordinator_port(slurm)
