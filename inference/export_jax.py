"""The native JAX artifact: `jax.export` serialises the model (weights included) as StableHLO.

Reloading needs only JAX, not the model code:

    exported = jax.export.deserialize(open("jax_mnist.jax", "rb").read())
    logits = exported.call(images)            # any batch size when exported with a symbolic batch
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np
from jax import export

# Lowering for several platforms costs nothing and lets the same file run on a GPU host.
PLATFORMS = ("cpu", "cuda")


def input_spec(spec: jax.ShapeDtypeStruct, dynamic_batch: bool) -> jax.ShapeDtypeStruct:
    """spec with its first axis symbolic ("b") when dynamic_batch."""
    if not dynamic_batch:
        return spec
    (batch,) = export.symbolic_shape("b")
    return jax.ShapeDtypeStruct((batch, *spec.shape[1:]), spec.dtype)


def export_jax(fn: Callable, spec: jax.ShapeDtypeStruct, *, dynamic_batch: bool = True,
               platforms: Sequence[str] = PLATFORMS) -> bytes:
    """The serialised `jax.export.Exported` of fn(x) for inputs like spec."""
    exported = export.export(jax.jit(fn), platforms=tuple(platforms))(input_spec(spec, dynamic_batch))
    return bytes(exported.serialize())


class JaxModel:
    """A deserialised artifact with the runners' interface (`input_shape` has None for a symbolic axis)."""

    def __init__(self, blob: bytes):
        self.exported = export.deserialize(bytearray(blob))
        (inp,), (out,) = self.exported.in_avals, self.exported.out_avals
        self.input_name, self.output_name = "args[0]", "result"
        self.input_shape = tuple(d if isinstance(d, int) else None for d in inp.shape)
        self.output_shape = tuple(d if isinstance(d, int) else None for d in out.shape)
        self.input_dtype = np.dtype(inp.dtype)
        self.platforms = tuple(self.exported.platforms)
        self._call = jax.jit(self.exported.call)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._call(np.asarray(x, self.input_dtype)))
