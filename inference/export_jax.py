"""The native JAX artifact: `jax.export` serialises the model (weights included) as StableHLO.

Reloading needs only JAX, not the model code:

    exported = jax.export.deserialize(bytearray(open("jax_mnist.jax", "rb").read()))
    outputs = exported.call(images)           # any batch size; several inputs: exported.call(a, b) in name order
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax import export

from inference.predict import Runner

# Lowering for several platforms costs nothing and lets the same file run on a GPU host.
PLATFORMS = ("cpu", "cuda")


def exported(fn: Callable, specs: list, *, dynamic_batch: bool, platforms: Sequence[str]) -> export.Exported:
    """fn(*inputs) lowered to StableHLO for inputs like `specs`, their batch axis one symbol when dynamic_batch."""
    if dynamic_batch:
        (batch,) = export.symbolic_shape("b")
        specs = [jax.ShapeDtypeStruct((batch, *s.shape[1:]), s.dtype) for s in specs]
    return export.export(jax.jit(fn), platforms=tuple(platforms))(*specs)


def export_jax(fn: Callable, specs: list, *, dynamic_batch: bool = True, platforms: Sequence[str] = PLATFORMS) -> bytes:
    """The serialised `jax.export.Exported` of fn(*inputs) for inputs like `specs` (one shared batch axis)."""
    return bytes(exported(fn, specs, dynamic_batch=dynamic_batch, platforms=platforms).serialize())


class JaxModel(Runner):
    """A deserialised artifact with the runners' interface (`inference.predict.Runner`): ``inputs`` (name, shape with
    None for a symbolic axis, dtype), called with one array or a dict of named arrays. The artifact keeps no input
    names, so they are given (the export's, in order)."""

    def __init__(self, blob: bytes, names: Sequence[str] | None = None):
        self.exported = export.deserialize(bytearray(blob))
        avals, (out,) = self.exported.in_avals, self.exported.out_avals
        names = list(names) if names else [f"args[{i}]" for i in range(len(avals))]
        if len(names) != len(avals):
            raise ValueError(f"{len(names)} input names {names} for an artifact of {len(avals)} inputs")
        self.inputs = [
            {"name": n, "shape": tuple(d if isinstance(d, int) else None for d in a.shape), "dtype": np.dtype(a.dtype)}
            for n, a in zip(names, avals)
        ]
        self.output_name = "result"
        self.output_shape = tuple(d if isinstance(d, int) else None for d in out.shape)
        self.platforms = tuple(self.exported.platforms)
        self._call = jax.jit(self.exported.call)

    def __call__(self, x) -> np.ndarray:
        named = self.named(x)
        return np.asarray(self._call(*(named[i["name"]] for i in self.inputs)))
