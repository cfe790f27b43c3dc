"""Where a process's place in a run of several comes from (training/processes/cluster.py, launch.py): flags, SLURM,
JAX's detection; settings that cannot work are one clear line."""

from __future__ import annotations

import pytest

from tests.end_to_end.test_train import run
from training.devices.mesh import DistributedError
from training.processes.cluster import SINGLE, Cluster, cluster_of, slurm_first_host
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
