"""Dropout: zeroes each element with probability `rate` in training and rescales the rest by 1 / (1 - rate)."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from model.modules.module import Module


def dropout(x, rate: float, key: jax.Array | None):
    """Inverted dropout of x; the identity when rate is 0."""
    if rate == 0.0:
        return x
    if key is None:
        raise ValueError("dropout with rate > 0 in training needs a PRNG key: call the model with key=...")
    if rate >= 1.0:
        return jnp.zeros_like(x)
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    # Rescaling the kept values keeps E[y] = x, so evaluation can skip dropout without any correction.
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


class Dropout(Module):
    """Identity in evaluation; `dropout(x, rate, key)` when called with train=True."""

    @classmethod
    def export_examples(cls):
        from model.modules.linear import Linear
        from model.modules.sequential import Sequential

        return {"dropout_eval": (Sequential([Linear(6), cls(0.5)]), (5,), "normal")}

    def __init__(self, rate: float):
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"dropout: must be a rate in [0, 1], got {rate!r}")
        self.rate = rate

    def __call__(self, params, state, x, *, train=False, key=None):
        if not train:
            return x, state
        return dropout(x, self.rate, key), state
