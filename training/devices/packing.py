"""A batch, or a stack of batches, as one array of bytes: what reaches the devices in one transfer.

Placing a tree of arrays costs one transfer, and the Python of one more array, per leaf (input, target, mask, the
stack's ``active``...). Packed, every example's bytes of every leaf lie side by side in one uint8 row, so the stack
(K, B, row) or the batch (B, row) goes to its devices in one ``device_put`` (one
``make_array_from_process_local_data`` with several processes), split over the batch axis as the leaves would be;
the compiled step unpacks it (slices and bitcasts: the bytes exactly as they were). A leaf without the batch axis
(the stack's ``active``, one value per step) is repeated in every row and read back from them all.
"""

from __future__ import annotations

import math

import jax
import numpy as np


class Packing:
    """The layout of one loader's batches in a row of bytes, from its abstract batch (``DataLoader.spec``) and the
    per-step leaves a stack adds (``per_step``: name -> dtype, e.g. ``{"active": float32}``)."""

    def __init__(self, batch_spec: dict, per_step: dict | None = None):
        per_step = per_step or {}
        tree = {**batch_spec, **{name: jax.ShapeDtypeStruct((), dtype) for name, dtype in per_step.items()}}
        leaves, self.treedef = jax.tree.flatten(tree)
        steps = self.treedef.flatten_up_to(
            {**jax.tree.map(lambda _: False, batch_spec), **dict.fromkeys(per_step, True)}
        )
        self.fields = []  # (per-example shape, dtype, start, stop, per step), in the tree's leaf order
        start = 0
        for a, step in zip(leaves, steps):
            dtype = np.dtype(a.dtype)
            shape = () if step else a.shape[1:]
            stop = start + math.prod(shape) * dtype.itemsize
            self.fields.append((shape, dtype, start, stop, step))
            start = stop
        self.row_bytes = start

    @staticmethod
    def supports(batch_spec: dict) -> bool:
        """Whether every leaf is a number of at most 4 bytes (what the devices hold without x64) or a bool."""
        return all(
            np.dtype(a.dtype).kind in "biuf" and np.dtype(a.dtype).itemsize <= 4 for a in jax.tree.leaves(batch_spec)
        )

    def pack(self, tree: dict, lead: int) -> np.ndarray:
        """A host batch (`lead` = 1: (B, ...) leaves) or stack (2: (K, B, ...); per-step leaves (K,)) as one
        uint8 array (..., B, row_bytes)."""
        leaves = self.treedef.flatten_up_to(tree)
        axes = next(leaf.shape[:lead] for leaf, field in zip(leaves, self.fields) if not field[4])
        out = np.empty((*axes, self.row_bytes), np.uint8)
        for leaf, (_, dtype, start, stop, step) in zip(leaves, self.fields):
            raw = np.ascontiguousarray(leaf, dtype).view(np.uint8)
            out[..., start:stop] = raw.reshape(*axes[:-1], 1, -1) if step else raw.reshape(*axes, -1)
        return out

    def unpack(self, packed, lead: int) -> dict:
        """The tree ``pack`` was given, from its bytes on the devices (inside the compiled step)."""
        import jax.numpy as jnp

        axes, leaves = packed.shape[:lead], []
        for shape, dtype, start, stop, step in self.fields:
            raw = packed[..., start:stop]
            if dtype == np.bool_:
                value = raw != 0
            elif dtype.itemsize == 1:
                value = jax.lax.bitcast_convert_type(raw, dtype)
            else:
                value = jax.lax.bitcast_convert_type(raw.reshape(*axes, -1, dtype.itemsize), dtype)
            value = value.reshape(*axes, *shape)
            if step:  # the same value in every row: any row's (a maximum is one reduction, whatever the sharding)
                value = jnp.max(value, axis=lead - 1)
            leaves.append(value)
        return self.treedef.unflatten(leaves)
