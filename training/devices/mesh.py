"""The device mesh, the FSDP sharding rule, and moving arrays between host memory and any mesh; the run's processes
as one process sees them.

**Mesh.** The config's ``"mesh": {"data": D, "fsdp": F}`` lays the devices of all processes out as a D x F grid
(``-1``: whatever the other axis leaves). Batches are split over both axes. With F > 1 every parameter and
optimizer-state leaf is split along its largest axis that F divides (replicated when none does): FSDP / ZeRO-3
expressed as shardings, which XLA partitions (gathering parameters where the step needs them whole).

**Host and mesh.** ``to_host`` gathers a (possibly sharded, possibly multi-process) state leaf by leaf into numpy
arrays on every process (a collective: every process calls it); ``to_mesh`` places host arrays onto any mesh;
``put_local`` places this process's share of a batch. Checkpoints hold whole arrays, so a run resumes on any device
count.

**Processes.** Every process runs the same program (SPMD): each reads only its share of every batch, the jitted step
sees one global batch, so losses and metrics come out summed over all processes; process 0 alone writes the run
folder (``is_main``). One process is the usual case. Starting several (``jax.distributed``, SLURM, the watchdog) is
the optional feature in training/processes/: it puts its own ``team`` here, which ``share_text``,
``describe_processes`` and ``finish_processes`` ask; alone, those share with nobody and wait for nobody.
"""

from __future__ import annotations

import functools
from typing import Any

AXES = ("data", "fsdp")
MESH_DEFAULTS = {"data": -1, "fsdp": 1}


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
            # the nearest size below that does, named as the flag that sets it: a run resumed on fewer devices
            fits = max(n for n in range(1, min(fixed, devices) + 1) if devices % n == 0)
            raise ValueError(
                f"mesh.{axis} {fixed} does not divide the {devices} devices in use; --set mesh.{axis}={fits} does"
            )
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


def with_shardings(spec, shardings):
    """Abstract values of `spec` carrying `shardings` (a matching tree): what a step is compiled for."""
    import jax

    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), spec, shardings)


def spec_of(tree):
    """The abstract value of a tree of arrays, their shardings included: what a call is compiled for."""
    import jax

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)


# -------------------------------------------------------------------------------------------- the run's processes
def is_main() -> bool:
    """Whether this process writes the run folder, logs and trackers (process 0; the only one when alone)."""
    import jax

    return jax.process_index() == 0


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


class DistributedError(Exception):
    """The run's processes cannot work together (settings for several processes that cannot work, process 0 stopped
    before training): reported as one line."""


class Alone:
    """What train.py asks of the run's processes, for a run of one: it shares its text with nobody and waits for
    nobody. training/processes/ replaces ``team`` with its own when it starts several."""

    def describe(self) -> str:
        return "1 process"

    def share_text(self, name: str, text: str | None) -> str | None:
        return text

    def finish(self) -> None:
        pass


team = Alone()


def share_text(name: str, text: str | None = None) -> str | None:
    """Process 0's `text` on every process (the run folder a new run created, say); the others wait for it. An empty
    text is process 0's word that it stopped (the others then raise DistributedError)."""
    return team.share_text(name, text)


def describe_processes() -> str:
    """This process's place among the run's processes, for the run's log."""
    return team.describe()


def finish_processes() -> None:
    """The end of a run that returned normally: with several processes each waits here until all are done."""
    team.finish()
