"""Which form a layer computes in: the plain math, or the optional ``model/kernels``' formulation written for
XLA:CPU (same values and gradients, computed another way).

A layer asks ``by_platform`` when it is traced. Where ``model/kernels`` is there, both forms are traced and the
platform the code is lowered for keeps its own (``jax.lax.platform_dependent``: the platform XLA compiles for
decides, not JAX's default backend), so a step or an export lowered for "cuda" or "tpu" on a CPU host carries no
kernel. ``cpu_kernels(use)`` forces one form for what is traced inside it. Without ``model/kernels`` (a project made
``--without kernels``), every layer is the plain math.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib

from jax import lax

# None: the form by the platform the code is lowered for; True or False: the kernels or the plain math everywhere.
# A context variable, so that a form forced on one thread (an export) leaves another's trace (a background compile)
# alone.
FORCED = contextvars.ContextVar("cpu_kernels", default=None)


@contextlib.contextmanager
def cpu_kernels(use: bool):
    """Every layer this thread traces inside takes model/kernels' formulations (True: on every platform, where the
    folder is there) or the plain math (False: what a tracer that resolves no platform, as jax2onnx's, needs).
    Read when traced: a function JAX traced before (jit, make_jaxpr) keeps the form it was traced with."""
    token = FORCED.set(use)
    try:
        yield
    finally:
        FORCED.reset(token)


def kernels():
    """The optional ``model.kernels`` where its folder is there, else None (the plain math)."""
    try:
        return importlib.import_module("model.kernels")
    except ModuleNotFoundError as missing:
        if missing.name != "model.kernels":  # the folder is there but broken: say so
            raise
        return None


def by_platform(plain, for_cpu, *operands):
    """``plain(*operands)``, or model/kernels' function for these operands where the code is lowered for the CPU (or
    where ``cpu_kernels`` forces one form). ``for_cpu(model.kernels)`` gives that function, or None where the kernels
    have no form for these operands: then the plain math alone is traced, as without the folder."""
    use, found = FORCED.get(), kernels()
    cpu = None if found is None or use is False else for_cpu(found)
    if cpu is None:
        return plain(*operands)
    if use:
        return cpu(*operands)
    return lax.platform_dependent(*operands, cpu=cpu, default=plain)
