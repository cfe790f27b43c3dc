"""Weight initialisers, selectable per layer by name (``weight_init="he_normal"``) or as a function.

Each initialiser is ``init(key, shape, dtype) -> array``. Fans follow the (..., in, out) convention of Linear
weights (in, out) and HWIO conv kernels: fan_in = receptive field * in, fan_out = receptive field * out.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

Initializer = Callable[[jax.Array, tuple, jnp.dtype], jax.Array]

# Stddev of a standard normal truncated to [-2, 2]; dividing by it keeps the requested variance.
_TRUNCATED_STD = 0.87962566103423978


def fans(shape: tuple) -> tuple[float, float]:
    if len(shape) < 1:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    receptive = math.prod(shape[:-2])
    return float(shape[-2] * receptive), float(shape[-1] * receptive)


def variance_scaling(scale: float, mode: str, distribution: str) -> Initializer:
    def init(key, shape, dtype=jnp.float32):
        fan_in, fan_out = fans(shape)
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        variance = scale / max(1.0, fan)
        if distribution == "truncated_normal":
            return jax.random.truncated_normal(key, -2, 2, shape, dtype) * (math.sqrt(variance) / _TRUNCATED_STD)
        if distribution == "normal":
            return jax.random.normal(key, shape, dtype) * math.sqrt(variance)
        limit = math.sqrt(3 * variance)
        return jax.random.uniform(key, shape, dtype, -limit, limit)

    return init


def normal(stddev: float = 0.01) -> Initializer:
    return lambda key, shape, dtype=jnp.float32: jax.random.normal(key, shape, dtype) * stddev


def uniform(scale: float = 0.01) -> Initializer:
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -scale, scale)


def zeros(key, shape, dtype=jnp.float32):
    return jnp.zeros(shape, dtype)


def ones(key, shape, dtype=jnp.float32):
    return jnp.ones(shape, dtype)


INITIALIZERS: dict[str, Callable[[], Initializer]] = {
    "he_normal": lambda: variance_scaling(2.0, "fan_in", "truncated_normal"),
    "he_uniform": lambda: variance_scaling(2.0, "fan_in", "uniform"),
    "glorot_normal": lambda: variance_scaling(1.0, "fan_avg", "truncated_normal"),
    "glorot_uniform": lambda: variance_scaling(1.0, "fan_avg", "uniform"),
    "lecun_normal": lambda: variance_scaling(1.0, "fan_in", "truncated_normal"),
    "lecun_uniform": lambda: variance_scaling(1.0, "fan_in", "uniform"),
    "normal": normal,
    "uniform": uniform,
    "zeros": lambda: zeros,
    "ones": lambda: ones,
}
INITIALIZERS["kaiming_normal"] = INITIALIZERS["he_normal"]
INITIALIZERS["kaiming_uniform"] = INITIALIZERS["he_uniform"]
INITIALIZERS["xavier_normal"] = INITIALIZERS["glorot_normal"]
INITIALIZERS["xavier_uniform"] = INITIALIZERS["glorot_uniform"]


def get(init: str | Initializer) -> Initializer:
    """An initialiser from its name, or the function itself."""
    if callable(init):
        return init
    if not isinstance(init, str) or init not in INITIALIZERS:
        close = difflib.get_close_matches(str(init), INITIALIZERS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown initializer {init!r}; available: {', '.join(sorted(INITIALIZERS))}.{hint}")
    return INITIALIZERS[init]()
