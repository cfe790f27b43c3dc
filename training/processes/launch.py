"""How a process joins a run of several: train.py's flags for it, ``jax.distributed`` started before anything
touches a device, the watchdog, and what train.py asks of the processes afterwards (``mesh.team``: process 0's run
folder shared with the others, their meeting at the end, this process's place in the log)."""

from __future__ import annotations

import os

from training.devices import mesh
from training.devices.mesh import DistributedError
from training.processes import store
from training.processes.cluster import Cluster, check_coordinator_port, cluster_of
from training.processes.watchdog import HEARTBEAT_TIMEOUT_S, WATCHDOG_MARGIN_S, Watchdog
from training.run.cli import fail

SHUTDOWN_TIMEOUT_S = 60  # how long jax.distributed's own shutdown at exit waits for the others


def add_arguments(parser) -> None:
    """train.py's flags for several processes."""
    several = parser.add_argument_group("several processes (jax.distributed; SLURM's srun is detected)").add_argument
    several(
        "--coordinator", metavar="HOST:PORT", help="process 0's address (the same for all), or auto: JAX's detection"
    )
    several("--num-processes", type=int, metavar="N", help="how many processes train together")
    several("--process-id", type=int, metavar="I", help="this process's index, 0 to N-1")
    several(
        "--heartbeat-timeout",
        type=int,
        default=HEARTBEAT_TIMEOUT_S,
        metavar="SECONDS",
        help="a process silent this long counts as dead and the others stop with an error (default: %(default)s)",
    )


def start(args) -> None:
    """train.py's start of several processes, from its flags or the environment (one process: nothing to do); a
    setting that cannot work is one line and exit status 2."""
    try:
        join(args.coordinator, args.num_processes, args.process_id, args.heartbeat_timeout)
    except DistributedError as error:
        fail(str(error))


def join(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout: int = HEARTBEAT_TIMEOUT_S,
    environ=os.environ,
) -> Cluster:
    """Initialises jax.distributed when the run has several processes (before anything touches a device); returns
    this process's Cluster. A dead process is noticed within ``heartbeat_timeout`` seconds and ends the others."""
    if heartbeat_timeout < 1:
        raise DistributedError(f"--heartbeat-timeout: expected seconds >= 1, got {heartbeat_timeout}")
    cluster = cluster_of(coordinator, num_processes, process_id, environ)
    if cluster.source == "single":
        return cluster
    check_coordinator_port(cluster)
    import jax

    backstop = 2 * (heartbeat_timeout + WATCHDOG_MARGIN_S)
    # CPU processes exchange collectives over gloo (TCP); accelerators use their own interconnect
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # train.py handles SIGTERM itself (save the position, then stop); JAX's preemption notifier would swallow it
    jax.config.update("jax_enable_preemption_service", False)
    try:
        if cluster.source == "auto":
            jax.distributed.initialize(
                initialization_timeout=store.WAIT_S,
                heartbeat_timeout_seconds=backstop,
                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
            )
            cluster = Cluster(jax.process_index(), jax.process_count(), "auto", "auto")
        else:
            jax.distributed.initialize(
                cluster.coordinator,
                cluster.num_processes,
                cluster.process_id,
                local_device_ids=list(cluster.local_device_ids or []) or None,
                cluster_detection_method="deactivate",
                initialization_timeout=store.WAIT_S,
                heartbeat_timeout_seconds=backstop,
                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
            )
    except (RuntimeError, ValueError, TypeError) as error:
        where = f" ({cluster.source}: coordinator {cluster.coordinator})" if cluster.coordinator else ""
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DistributedError(f"jax.distributed could not start{where}: {first}") from None
    mesh.team = Team(cluster)
    Watchdog(cluster.process_id, cluster.num_processes, heartbeat_timeout).start()
    return cluster


class Team:
    """What train.py asks of a run's several processes (see mesh.Alone for one)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def describe(self) -> str:
        cluster = self.cluster
        if cluster.num_processes == 1:  # --coordinator auto where JAX found no others
            return "1 process"
        return (
            f"process {cluster.process_id} of {cluster.num_processes} (coordinator {cluster.coordinator}, "
            f"from {cluster.source})"
        )

    def share_text(self, name: str, text: str | None) -> str:
        return store.share_text(name, text)

    def gather_texts(self, name: str, text: str) -> list[str] | None:
        return store.gather_texts(name, text)

    def finish(self) -> None:
        """The watchdog stops and every process waits for the others here, so none exits while another still needs
        it (process 0 writes the last checkpoint and plots meanwhile)."""
        if self.cluster.num_processes == 1:
            return
        try:
            if Watchdog.current is not None:
                Watchdog.current.stop()
            store.meet("end")
        except Exception:  # noqa: BLE001 (a process that died at the very end: nothing is left to do together)
            pass
