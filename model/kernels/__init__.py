"""Formulations of the convolution written for XLA:CPU, and the one switch that selects them.

An optional part: ``model/__init__.py`` imports it (one line), and it plugs itself into the convolution layers
(``model.modules.conv.CPU_FORM``); deleting this folder and that line leaves the plain math everywhere.

The layers in ``model/modules`` are the plain math (``lax.conv_general_dilated`` and autodiff). On JAX's CPU
backend some of that math compiles to slow code, inside ``lax.scan`` bodies above all, and the functions here compute
the same values and gradients another way:

- ``conv.py``: a convolution whose backward pass is written out in canonical NHWC/HWIO form (plain autodiff emits
  backward convolutions that XLA:CPU does not put on its fast path: a small CNN's step ran many times slower), with a
  shifted-slice path for one-input-channel first layers and per-tap matrix products for narrow weight gradients;
- ``depthwise.py``: stride-1 depthwise convolutions as sums of shifted slices (XLA:CPU has no fast grouped
  convolution).

The switch: ``CPU_KERNELS`` below. ``None`` (the default) uses the kernels where the code is lowered for the CPU
and the plain math for every other platform (``jax.lax.platform_dependent``: the platform XLA compiles for decides,
not JAX's default backend, so a step or an export lowered for "cuda" or "tpu" on a CPU host carries no kernel);
``True`` or ``False`` forces them on or off everywhere (the environment variable ``CPU_KERNELS=0`` / ``1`` sets it
at start-up). A layer call may also pass ``cpu_kernels=`` itself. The forward pass computes the same values either
way (the ONNX export traces the plain form: jax2onnx resolves no platform); the tests compare each kernel with the
plain form in float64, gradients included. ``benchmarks/train_benchmark.py`` measures each one by ablation.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import jax

from model.kernels import conv, depthwise
from model.modules import conv as layers

_SETTING = os.environ.get("CPU_KERNELS", "").strip().lower()
CPU_KERNELS: bool | None = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}.get(_SETTING)


def select(cpu: Callable, plain: Callable, *args, override: bool | None = None):
    """``cpu(*args)`` or ``plain(*args)``: ``override`` if given, else ``CPU_KERNELS``, else by the platform the
    code is lowered for (both forms are traced; lowering for one platform keeps only its own)."""
    use = CPU_KERNELS if override is None else override
    if use is None:
        return jax.lax.platform_dependent(*args, cpu=cpu, default=plain)
    return cpu(*args) if use else plain(*args)


@contextlib.contextmanager
def forced(use: bool):
    """``CPU_KERNELS`` set to `use` for what is traced inside (a tracer that resolves no platform, as jax2onnx's,
    needs one form)."""
    global CPU_KERNELS
    before, CPU_KERNELS = CPU_KERNELS, use
    try:
        yield
    finally:
        CPU_KERNELS = before


def cpu_form(plain: Callable, x, w, args: tuple, override: bool | None = None):
    """`model.modules.conv`'s CPU_FORM: the depthwise or general kernel where chosen, ``plain(x, w)`` elsewhere."""

    def cpu(x, w):
        if depthwise.is_plain_depthwise(x, w, *args):
            return depthwise.depthwise_conv(x, w, args[1])
        return conv.conv(x, w, *args)

    return select(cpu, plain, x, w, override=override)


layers.CPU_FORM = cpu_form
