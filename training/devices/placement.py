"""Where a run's arrays live on the config's mesh (``mesh.py``: a data x fsdp grid over the devices of every process),
and how a loader's stacks and batches get there.

Batches are split over every device along their batch axis; parameters and optimizer state are replicated, or split
over "fsdp" when it is above 1. Each process reads only its rows of every batch (``share``) and places them as its part
of one global array, so the same code runs on one CPU, several accelerators or several machines.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from training.devices import mesh
from training.devices.packing import Packing


class Placement:
    def __init__(self, mesh_config: dict | None, batch_spec: dict, host_arrays: bool | None = None):
        """``batch_spec``: the training loader's (every stack and batch has its structure). ``host_arrays``: whether
        stacks stay the host's arrays, which the compiled call transfers itself in one go (default: on XLA:CPU with one
        process, where ``jax.device_put`` costs more per array than a small step). Otherwise (accelerators, several
        processes) each stack is packed into one array (``packing.py``), placed in one transfer and unpacked by the
        compiled call; leaf by leaf where a loader's leaves cannot be packed (64-bit numbers)."""
        self.mesh = mesh.make_mesh(mesh_config)
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_spec = batch_spec
        if host_arrays is None:
            host_arrays = jax.process_count() == 1 and self.mesh.devices.flat[0].platform == "cpu"
        self.host_arrays = host_arrays
        packable = not host_arrays and Packing.supports(batch_spec)
        self.packing = Packing(batch_spec, {"active": jnp.float32}) if packable else None
        self.packed_sharding = NamedSharding(self.mesh, P(None, mesh.BATCH_AXES))  # (K, B, bytes): split as B
        self.cached = {}  # shardings of stacks and batches, by structure (``shardings_of``)

    def check_batch_size(self, batch_size: int) -> None:
        """Training batches are split evenly over the devices (evaluation pads its batches instead)."""
        n = self.mesh.size
        if batch_size % n:
            where = f" ({jax.process_count()} processes)" if jax.process_count() > 1 else ""
            nearest = " or ".join(str(b) for b in (batch_size // n * n, batch_size // n * n + n) if b)
            raise ValueError(
                f"data_loader.train.args.batch_size {batch_size} must be a multiple of the {n} devices in use{where}: "
                f"{nearest}"
            )

    def share(self, *loaders) -> None:
        """Each process reads only its rows of every batch (process by process, as the mesh orders devices)."""
        for loader in loaders:
            if loader is not None:
                loader.share = (jax.process_index(), jax.process_count())

    def state_sharding(self, template: dict):
        """The training state's sharding: one for the whole state (replicated), or a tree of them (split over fsdp)."""
        return mesh.state_shardings(template, self.mesh) if self.mesh.shape["fsdp"] > 1 else self.replicated

    def local_devices(self) -> list:
        return [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]

    # ------------------------------------------------------------------------------------------------ stacks
    def stack_spec(self, k: int):
        """The abstract stack of `k` loader batches as the training call takes it (the shardings included)."""
        if self.packing is not None:
            rows = jax.tree.leaves(self.batch_spec)[0].shape[0]
            return jax.ShapeDtypeStruct((k, rows, self.packing.row_bytes), jnp.uint8, sharding=self.packed_sharding)
        stack = jax.tree.map(lambda a: jax.ShapeDtypeStruct((k, *a.shape), a.dtype), self.batch_spec)
        stack["active"] = jax.ShapeDtypeStruct((k,), jnp.float32)
        return mesh.with_shardings(stack, self.stack_sharding(stack))

    def stack_sharding(self, stack: dict) -> dict:
        """Stacks of K batches: split along the batch axis (the second) over every device of the mesh; ``active``
        (K,) is replicated."""
        return self.shardings_of("stack", stack, lambda a: P(None, mesh.BATCH_AXES) if a.ndim > 1 else P())

    def batch_sharding(self, batch: dict) -> dict:
        return self.shardings_of("batch", batch, lambda a: P(mesh.BATCH_AXES))

    def shardings_of(self, kind: str, tree: dict, spec: Callable) -> dict:
        """The shardings of a tree of arrays, made once per structure and rank (every stack and batch of a loader has
        the same), not again for every stack the prefetch thread places."""
        key = (kind, jax.tree.structure(tree), tuple(a.ndim for a in jax.tree.leaves(tree)))
        if key not in self.cached:
            self.cached[key] = jax.tree.map(lambda a: NamedSharding(self.mesh, spec(a)), tree)
        return self.cached[key]

    def put_stack(self, stack: dict) -> dict:
        """This process's rows of a stack (its loader's share) placed as one global stack."""
        if self.host_arrays:
            return stack
        if self.packing is not None:
            return mesh.put_local(self.packing.pack(stack, lead=2), self.packed_sharding)
        return mesh.put_local(stack, self.stack_sharding(stack))

    def put_batch(self, batch: dict) -> dict:
        return batch if self.host_arrays else mesh.put_local(batch, self.batch_sharding(batch))
