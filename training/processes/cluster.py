"""Where this process's place in a run of several comes from: explicit flags (``--coordinator HOST:PORT
--num-processes N --process-id I``), SLURM's variables (``srun`` with more than one task), or ``--coordinator auto``
(JAX's own detection: Cloud TPU pod slices, GKE, Open MPI). Checked here without touching JAX."""

from __future__ import annotations

import errno
import os
import re
import socket
from typing import NamedTuple

from training.devices.mesh import DistributedError


class Cluster(NamedTuple):
    """How this process was started: its index, the number of processes, the coordinator and where that came from."""

    process_id: int
    num_processes: int
    coordinator: str | None
    source: str  # "flags", "slurm", "auto" or "single"
    local_device_ids: tuple[int, ...] | None = None


SINGLE = Cluster(0, 1, None, "single")


def slurm_first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'node[003-007,010],gpu1' -> 'node003'."""
    match = re.match(r"([^,\[]*)(\[([^\]]*)\])?", nodelist.strip())
    prefix, ranges = match.group(1), match.group(3)
    if ranges is None:
        return prefix
    return prefix + re.split(r"[,-]", ranges)[0]


def cluster_of(
    coordinator: str | None, num_processes: int | None, process_id: int | None, environ=os.environ
) -> Cluster:
    """This process's place in the run, from the flags or the environment, checked (no JAX call)."""
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if coordinator == "auto":
        if num_processes is not None or process_id is not None:
            raise DistributedError(
                "--coordinator auto detects the process count and index itself; leave out "
                "--num-processes and --process-id"
            )
        return Cluster(-1, -1, "auto", "auto")
    if any(given):
        if not all(given):
            missing = [flag for flag, ok in zip(("--coordinator", "--num-processes", "--process-id"), given) if not ok]
            raise DistributedError(
                f"several processes need --coordinator HOST:PORT, --num-processes N and "
                f"--process-id I together; missing {', '.join(missing)}"
            )
        if not re.fullmatch(r"\S+:\d{1,5}", coordinator) or not 0 < int(coordinator.rsplit(":", 1)[1]) < 65536:
            raise DistributedError(
                f"--coordinator: expected HOST:PORT (e.g. localhost:12355 or node001:29500), got {coordinator!r}"
            )
        if num_processes < 1:
            raise DistributedError(f"--num-processes: expected a number >= 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise DistributedError(
                f"--process-id: expected 0 to {num_processes - 1} (--num-processes {num_processes}), got {process_id}"
            )
        return Cluster(process_id, num_processes, coordinator, "flags") if num_processes > 1 else SINGLE
    # srun sets the step's variables; a batch script's own shell (no step) is one process
    tasks = environ.get("SLURM_NTASKS")
    slurm = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_LOCALID")
    if all(environ.get(name) for name in slurm) and tasks and int(tasks) > 1:
        nodelist = environ["SLURM_STEP_NODELIST"]
        port = environ.get("JAX_COORDINATOR_PORT") or str(61440 + int(environ["SLURM_JOB_ID"]) % 4096)
        nodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or tasks)
        # one task per node sees all of the node's devices; several tasks per node get one device each
        local = None if int(tasks) <= nodes else (int(environ.get("SLURM_LOCALID", "0")),)
        return Cluster(int(environ["SLURM_PROCID"]), int(tasks), f"{slurm_first_host(nodelist)}:{port}", "slurm", local)
    return SINGLE


def check_coordinator_port(cluster: Cluster) -> None:
    """Process 0 serves the coordinator on its port, on every interface of this machine. JAX's server binds it with
    SO_REUSEPORT, so a run given a port another run's coordinator already serves would share it silently: the
    processes of both runs would reach either coordinator, and hang or mix. A port something listens on is refused
    here, in one line, before JAX starts (a closed run's connections waiting out TIME_WAIT are no obstacle)."""
    if cluster.process_id != 0 or cluster.source not in ("flags", "slurm"):
        return
    port = int(cluster.coordinator.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            if error.errno not in (errno.EADDRINUSE, errno.EACCES):
                return  # no IPv4 here, say: JAX's own start reports what it cannot do
            what = "is in use on this machine (another run's coordinator?)"
            if error.errno == errno.EACCES:
                what = "cannot be served by this user"
            choose = "choose another" if cluster.source == "flags" else "set JAX_COORDINATOR_PORT to another"
            given = f"--coordinator {cluster.coordinator}" if cluster.source == "flags" else "SLURM's coordinator"
            raise DistributedError(f"{given}: port {port} {what}; {choose}") from None
