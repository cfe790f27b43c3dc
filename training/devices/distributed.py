"""Several processes and sharded parameters: ``jax.distributed`` start-up, the device mesh, the FSDP sharding rule,
and moving a training state between host memory and any mesh.

**Processes.** ``start(...)`` calls ``jax.distributed.initialize`` before anything touches a device, when the command
line or the environment says the run has several processes: explicit ``--coordinator HOST:PORT --num-processes N
--process-id I``, SLURM's variables (``srun`` with more than one task), or ``--coordinator auto`` (JAX's own
detection: Cloud TPU pod slices, GKE, Open MPI). One process is the usual case and then nothing is initialised.
Every process runs the same program (SPMD): each reads only its share of every batch, the jitted step sees one
global batch, so losses and metrics come out summed over all processes; process 0 alone writes the run folder.

**Mesh.** The config's ``"mesh": {"data": D, "fsdp": F}`` lays the devices of all processes out as a D x F grid
(``-1``: whatever the other axis leaves). Batches are split over both axes. With F > 1 every parameter and
optimizer-state leaf is split along its largest axis that F divides (replicated when none does): FSDP / ZeRO-3
expressed as shardings, which XLA partitions (gathering parameters where the step needs them whole).

**Host and mesh.** ``to_host`` gathers a (possibly sharded, possibly multi-process) state leaf by leaf into numpy
arrays on every process (a collective: every process calls it); ``to_mesh`` places host arrays onto any mesh.
Checkpoints hold whole arrays, so a run resumes on any device count.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, NamedTuple

AXES = ("data", "fsdp")
MESH_DEFAULTS = {"data": -1, "fsdp": 1}
# A dead process is noticed within this many seconds (its heartbeats stop); the others then end with an error.
HEARTBEAT_TIMEOUT_S = 60
# JAX's own heartbeat is the backstop for a watchdog that cannot run; it notices a dead process between half its
# timeout and its timeout after the death and then aborts the others with a C++ stack trace. Half of it stays this
# many seconds beyond the watchdog's timeout, so that the watchdog's one line comes first however loaded the machine.
WATCHDOG_MARGIN_S = 10
# How long processes wait for each other at start-up (nodes of a job start minutes apart) and at the end.
INIT_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 60


class DistributedError(Exception):
    """Settings for several processes that cannot work: reported as one line."""


class Cluster(NamedTuple):
    """How this process was started: its index, the number of processes, the coordinator and where that came from."""

    process_id: int
    num_processes: int
    coordinator: str | None
    source: str  # "flags", "slurm", "auto" or "single"
    local_device_ids: tuple[int, ...] | None = None


SINGLE = Cluster(0, 1, None, "single")
_cluster = SINGLE  # set by start(); read by is_main() without touching JAX


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


def start(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout: int = HEARTBEAT_TIMEOUT_S,
    environ=os.environ,
) -> Cluster:
    """Initialises jax.distributed when the run has several processes (before anything touches a device); returns
    this process's Cluster. A dead process is noticed within ``heartbeat_timeout`` seconds and ends the others."""
    global _cluster
    if heartbeat_timeout < 1:
        raise DistributedError(f"--heartbeat-timeout: expected seconds >= 1, got {heartbeat_timeout}")
    cluster = cluster_of(coordinator, num_processes, process_id, environ)
    if cluster.source == "single":
        _cluster = cluster
        return cluster
    import jax

    backstop = 2 * (heartbeat_timeout + WATCHDOG_MARGIN_S)
    # CPU processes exchange collectives over gloo (TCP); accelerators use their own interconnect
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # train.py handles SIGTERM itself (save the position, then stop); JAX's preemption notifier would swallow it
    jax.config.update("jax_enable_preemption_service", False)
    try:
        if cluster.source == "auto":
            jax.distributed.initialize(
                initialization_timeout=INIT_TIMEOUT_S,
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
                initialization_timeout=INIT_TIMEOUT_S,
                heartbeat_timeout_seconds=backstop,
                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
            )
    except (RuntimeError, ValueError, TypeError) as error:
        where = f" ({cluster.source}: coordinator {cluster.coordinator})" if cluster.coordinator else ""
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DistributedError(f"jax.distributed could not start{where}: {first}") from None
    _cluster = cluster
    Watchdog(cluster, heartbeat_timeout).start()
    return cluster


DONE = "done"  # a process's counter once it reached the end of the run


class Watchdog:
    """Ends this process with one clear line when another process of the run dies or hangs, instead of leaving it
    blocked in a collective: every process bumps its own counter in the coordinator's key-value store each second;
    one that stays still for ``timeout`` seconds, or a coordinator that no longer answers (process 0 died), stops
    this one with exit status 1. The last checkpoint stays on disk (writes are atomic) to resume from.
    ``jax.distributed``'s own heartbeat (see WATCHDOG_MARGIN_S) remains the backstop; ``finish`` stops the watch."""

    current = None
    POLL_S = 1.0

    def __init__(self, cluster: Cluster, timeout: float):
        import threading

        self.cluster, self.timeout = cluster, timeout
        self.stopped = False
        self.lock = threading.Lock()  # the counter is never bumped after finish() wrote DONE

    def start(self) -> None:
        import threading

        Watchdog.current = self
        threading.Thread(target=self.watch, name="process-watchdog", daemon=True).start()

    def watch(self) -> None:
        import time

        from jax._src.distributed import global_state

        client, me = global_state.client, self.cluster.process_id
        seen: dict = {}  # process -> (its counter, when it last changed)
        unreachable_since = None
        beat = 0
        while not self.stopped:
            now = time.monotonic()
            try:
                beat += 1
                with self.lock:
                    if self.stopped:
                        return
                    client.key_value_set(f"train/alive/{me}", str(beat), allow_overwrite=True)
                counters = dict(client.key_value_dir_get("train/alive/"))
                unreachable_since = None
            except Exception as error:  # noqa: BLE001 (any failure to reach the coordinator)
                unreachable_since = unreachable_since or now
                if now - unreachable_since >= min(self.timeout, 10) and not self.stopped:
                    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
                    self.abort(f"the coordinator (process 0) no longer answers: it died or was stopped ({first})")
                time.sleep(self.POLL_S)
                continue
            for process in range(self.cluster.num_processes):
                value = counters.get(f"train/alive/{process}")
                last = seen.get(process)
                if process == me or value == DONE:  # a process at the end waits for the others; not a death
                    continue
                if last is None or last[0] != value:
                    seen[process] = (value, now)
                elif now - last[1] >= self.timeout and not self.stopped:
                    self.abort(
                        f"process {process} of {self.cluster.num_processes} gave no sign of life for "
                        f"{self.timeout:g} s: it died or hangs"
                    )
            time.sleep(self.POLL_S)

    def abort(self, why: str) -> None:
        import sys

        print(
            f"error: {why}; process {self.cluster.process_id} stops too (exit status 1). The last checkpoint "
            f"is kept: resume with -r",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def await_watchdog(error: BaseException) -> None:
    """After a collective failed because another process died (gloo: "Connection closed by peer"), waits for the
    watchdog's one line and exit status 1 instead of letting the error's traceback out; returns (the caller raises
    the error) when the runtime did not raise it or every process stays alive. A dead process 0 takes the
    coordinator with it: JAX's C++ agent then aborts this process within a second, which no Python code can stop
    (its missed-heartbeat hook fails with std::bad_cast when given a Python callable); the wait keeps the traceback
    out of that ending too."""
    import time

    watchdog = Watchdog.current
    if watchdog is None or watchdog.stopped or not runtime_error(error):
        return
    time.sleep(watchdog.timeout + WATCHDOG_MARGIN_S)


def runtime_error(error: BaseException | None) -> bool:
    """Whether XLA's runtime raised `error` or one behind it (a JaxRuntimeError, or another class carrying an absl
    status such as "UNKNOWN: Gloo AllGather failed"), not Python code."""
    import jax

    while error is not None:
        if isinstance(error, jax.errors.JaxRuntimeError) or re.match(r"[A-Z][A-Z_]{3,}: ", str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


def finish(timeout_s: int = INIT_TIMEOUT_S) -> None:
    """The end of a run that returned normally: the watchdog stops and every process waits for the others here,
    so none exits while another still needs it (process 0 writes the last checkpoint and plots meanwhile)."""
    if _cluster.num_processes == 1:
        return
    from jax._src.distributed import global_state

    try:
        watchdog = Watchdog.current
        if watchdog is not None:
            with watchdog.lock:
                watchdog.stopped = True
                global_state.client.key_value_set(f"train/alive/{_cluster.process_id}", DONE, allow_overwrite=True)
        global_state.client.wait_at_barrier("train/end", timeout_s * 1000)
    except Exception:  # noqa: BLE001 (a process that died at the very end: nothing is left to do together)
        pass


def cluster() -> Cluster:
    return _cluster


def is_main() -> bool:
    """Whether this process writes the run folder, logs and trackers (process 0; the only one when alone)."""
    return _cluster.process_id <= 0 or _cluster.num_processes == 1


def describe() -> str:
    """This process's place, for the run's log."""
    if _cluster.num_processes == 1:
        return "1 process"
    return (
        f"process {_cluster.process_id} of {_cluster.num_processes} (coordinator {_cluster.coordinator}, "
        f"from {_cluster.source})"
    )


# -------------------------------------------------------------------------------------------------------- the mesh
def check_mesh_section(mesh: Any, where: str) -> dict:
    """The config's "mesh" section with defaults filled: {"data": D, "fsdp": F}, each >= 1 or -1 (the rest of the
    devices), at most one -1. Raises ValueError with the place in the file."""
    if not isinstance(mesh, dict):
        raise ValueError(f'{where}: expected an object like {{"data": -1, "fsdp": 1}}, got {mesh!r}')
    unknown = sorted(set(mesh) - set(AXES))
    if unknown:
        import difflib

        match = difflib.get_close_matches(unknown[0], AXES, n=1, cutoff=0.5)
        hint = f" Did you mean {match[0]!r}?" if match else ""
        raise ValueError(f"{where}.{unknown[0]}: unknown mesh axis.{hint} Axes: {', '.join(AXES)}")
    mesh = {**MESH_DEFAULTS, **mesh}
    for axis in AXES:
        value = mesh[axis]
        if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or 1 <= value <= 2**20):
            raise ValueError(
                f"{where}.{axis}: expected a device count >= 1, or -1 for all the devices the other "
                f"axis leaves, got {value!r}"
            )
    if mesh["data"] == mesh["fsdp"] == -1:
        raise ValueError(f"{where}: only one axis may be -1 (the rest of the devices)")
    return mesh


def mesh_shape(mesh: dict, devices: int) -> tuple[int, int]:
    """(data, fsdp) for `devices` devices; a -1 takes what the other axis leaves."""
    data, fsdp = mesh["data"], mesh["fsdp"]
    fixed = fsdp if data == -1 else data
    if data == -1 or fsdp == -1:
        if devices % fixed:
            axis = "fsdp" if data == -1 else "data"
            raise ValueError(f"mesh.{axis} {fixed} does not divide the {devices} devices in use")
        data, fsdp = (devices // fixed, fsdp) if data == -1 else (data, devices // fixed)
    if data * fsdp != devices:
        raise ValueError(
            f"mesh: data {data} x fsdp {fsdp} = {data * fsdp} devices, but {devices} are in use "
            f"(set one axis to -1 to take the rest)"
        )
    return data, fsdp


def make_mesh(mesh: dict | None = None, devices=None):
    """A (data, fsdp) Mesh over `devices` (default: every device of every process, process by process, so each
    process's devices hold consecutive rows of a batch)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = jax.devices() if devices is None else list(devices)
    data, fsdp = mesh_shape(mesh or MESH_DEFAULTS, len(devices))
    return Mesh(np.array(devices).reshape(data, fsdp), AXES)


BATCH_AXES = AXES  # a batch's first axis is split over every device of the mesh


def fsdp_spec(shape: tuple[int, ...], fsdp: int):
    """The PartitionSpec of a parameter or optimizer-state leaf: split over "fsdp" along its largest axis that
    `fsdp` divides (the first of equal ones), replicated when none does or `fsdp` is 1."""
    from jax.sharding import PartitionSpec as P

    axes = [i for i, n in enumerate(shape) if fsdp > 1 and n >= fsdp and n % fsdp == 0]
    if not axes:
        return P()
    axis = max(axes, key=lambda i: (shape[i], -i))
    return P(*([None] * axis), "fsdp")


SHARDED_PARTS = ("params", "opt_state")  # what FSDP splits; model state, step, rng and statistics stay whole


def state_shardings(state: dict, mesh) -> dict:
    """NamedShardings for a training state (arrays or their abstract values): params and optimizer state by the
    FSDP rule over the mesh's "fsdp" axis, everything else replicated."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    fsdp = mesh.shape["fsdp"]
    return {
        key: jax.tree.map(
            lambda a: NamedSharding(mesh, fsdp_spec(tuple(a.shape), fsdp) if key in SHARDED_PARTS else P()), value
        )
        for key, value in state.items()
    }


def device_bytes(tree) -> dict:
    """Bytes each device holds of `tree`'s arrays (what their shardings put there), by device id."""
    import jax

    held: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return held


# --------------------------------------------------------------------------------------------- host <-> the mesh
def to_host(tree) -> Any:
    """numpy copies of `tree`'s arrays on every process. Arrays split over other processes' devices are gathered
    leaf by leaf (so at most one whole leaf is in flight beyond the shards): then this is a collective, which every
    process must call; the rest comes in one transfer."""
    import jax
    import numpy as np

    def gather(leaf):
        if isinstance(leaf, jax.Array) and not (leaf.is_fully_addressable or leaf.is_fully_replicated):
            return np.array(replicator(leaf.sharding.mesh)(leaf))
        return leaf

    return jax.tree.map(np.array, jax.device_get(jax.tree.map(gather, tree)))


@functools.cache
def replicator(mesh):
    """The identity whose output is whole on every device of `mesh` (an all-gather), compiled once per shape."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P()))


def to_mesh(tree, shardings) -> Any:
    """Host arrays (the same on every process) placed with `shardings` (a matching tree), on any mesh and any
    number of processes; device arrays are resharded."""
    import jax
    import numpy as np

    def place(leaf, sharding):
        if isinstance(leaf, jax.Array):
            return jax.device_put(leaf, sharding)
        host = np.asarray(leaf)
        if jax.process_count() == 1:
            return jax.device_put(host, sharding)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree, shardings)


def put_local(tree, shardings) -> Any:
    """This process's share of a batch (or stack of batches) as global arrays: with one process a plain
    ``device_put``; with several, each process gives the rows its devices hold (replicated leaves: all of it)."""
    import jax

    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.make_array_from_process_local_data(shardings, tree)  # the whole tree in one call


def max_over_processes(*values: int) -> tuple[int, ...]:
    """Each value's maximum over all processes (a stop signal or a timed checkpoint that only some processes saw,
    agreed on so that all save and stop at the same step); one small collective, none when alone."""
    import jax

    if jax.process_count() == 1:
        return tuple(int(v) for v in values)
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.array(values, np.int32))
    return tuple(int(v) for v in np.max(np.asarray(gathered).reshape(-1, len(values)), axis=0))


def share_text(name: str, text: str | None = None, timeout_s: int = INIT_TIMEOUT_S) -> str:
    """Process 0's `text` on every process (the run folder a new run created, say); the others wait for it. An
    empty text is process 0's word that it stopped (the others then raise DistributedError)."""
    import jax

    if jax.process_count() == 1:
        return text
    from jax._src.distributed import global_state

    key = f"train/{name}"
    if jax.process_index() == 0:
        global_state.client.key_value_set(key, text)
        return text
    try:
        text = global_state.client.blocking_key_value_get(key, timeout_s * 1000)
    except Exception as error:  # the coordinator ended (process 0 stopped) or timed out
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DistributedError(
            f"process 0 did not share its {name} (it stopped before training; see its output): {first}"
        ) from None
    if not text:
        raise DistributedError(f"process 0 stopped before training (its output says why); no {name}")
    return text


def with_shardings(spec, shardings):
    import jax

    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), spec, shardings)
