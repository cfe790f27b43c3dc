"""Formulations of the convolution written for XLA:CPU, and the one switch that selects them.

The layers in ``model/modules`` are the plain math (``lax.conv_general_dilated`` and autodiff). On JAX's CPU
backend some of that math compiles to slow code, inside ``lax.scan`` bodies above all, and the functions here compute
the same values and gradients another way:

- ``conv.py``: a convolution whose backward pass is written out in canonical NHWC/HWIO form (plain autodiff emits
  backward convolutions that XLA:CPU does not put on its fast path: a small CNN's step ran 15-30x slower), with a
  shifted-slice path for one-input-channel first layers and per-tap matrix products for narrow weight gradients;
- ``depthwise.py``: stride-1 depthwise convolutions as sums of shifted slices (XLA:CPU has no fast grouped
  convolution).

The switch: ``CPU_KERNELS`` below. ``None`` (the default) turns the kernels on when JAX's default backend is the
CPU and leaves every other backend on the plain math; ``True`` or ``False`` forces them on or off everywhere (the
environment variable ``CPU_KERNELS=0`` / ``1`` sets it at start-up). A layer call may also pass ``cpu_kernels=``
itself. Inference and every export compute the plain forward pass either way; the tests compare each kernel with
the plain form in float64, gradients included. ``benchmarks/train_benchmark.py`` measures each one by ablation.
"""

from __future__ import annotations

import os

import jax

_SETTING = os.environ.get("CPU_KERNELS", "").strip().lower()
CPU_KERNELS: bool | None = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}.get(_SETTING)


def enabled(override: bool | None = None) -> bool:
    """Whether a layer uses the kernels here: ``override`` if given, else ``CPU_KERNELS``, else whether JAX's
    default backend is the CPU."""
    if override is not None:
        return override
    if CPU_KERNELS is not None:
        return CPU_KERNELS
    return jax.default_backend() == "cpu"
