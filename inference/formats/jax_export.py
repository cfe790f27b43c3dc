"""The native JAX artifact: `jax.export` serialises the model (weights included) as StableHLO.

Reloading needs only JAX, not the model code:

    exported = jax.export.deserialize(bytearray(open("jax_mnist.jax", "rb").read()))
    outputs = exported.call(images)           # any batch size; several inputs: exported.call(a, b) in name order
                                              # several named outputs: a tuple of them, in name order
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax import export

from inference.formats import Format, Route
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

    def __init__(self, blob: bytes, names: Sequence[str] | None = None, output_names: Sequence[str] | None = None):
        self.exported = export.deserialize(bytearray(blob))
        avals, outs = self.exported.in_avals, self.exported.out_avals
        names = list(names) if names else [f"args[{i}]" for i in range(len(avals))]
        if len(names) != len(avals):
            raise ValueError(f"{len(names)} input names {names} for an artifact of {len(avals)} inputs")
        self.inputs = [
            {"name": n, "shape": tuple(d if isinstance(d, int) else None for d in a.shape), "dtype": np.dtype(a.dtype)}
            for n, a in zip(names, avals)
        ]
        output_names = list(output_names) if output_names else ["result"] if len(outs) == 1 else None
        if output_names is None or len(output_names) != len(outs):
            raise ValueError(f"output names {output_names} for an artifact of {len(outs)} outputs")
        self.outputs = [
            {"name": n, "shape": tuple(d if isinstance(d, int) else None for d in o.shape)}
            for n, o in zip(output_names, outs)
        ]
        self.platforms = tuple(self.exported.platforms)
        self._call = jax.jit(self.exported.call)

    def __call__(self, x) -> np.ndarray:
        named = self.named(x)
        out = self._call(*(named[i["name"]] for i in self.inputs))
        return self.result([np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])])


def _route(fn, specs, names, *, dynamic_batch, output_name, quantize):
    return export_jax(fn, specs, dynamic_batch=dynamic_batch)  # a .jax file keeps no names


FORMATS = (Format("jax", ".jax", dynamic=True, rank=20),)
ROUTES = (Route("jax.export", "jax", "jax.export (StableHLO)", _route),)
