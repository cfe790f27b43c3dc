"""Normalisation layers over channels-last inputs: LayerNorm, RMSNorm, GroupNorm, BatchNorm.

Statistics are computed in at least float32 (so bfloat16/float16 inputs do not lose them) and the result is cast
back to the input dtype. Variances are biased (divide by n), as in Flax; PyTorch's BatchNorm differs only in storing
the unbiased variance in its running statistics.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from model.modules.module import Module, shape_of


def _stats_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _mean_var(x, axes):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    # Two-pass variance: no cancellation for inputs with a large mean (E[x^2] - E[x]^2 can go negative).
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return mean, var


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def normalize(x, axes: tuple, eps: float):
    """((x - mean) / sqrt(var + eps), mean, var) over ``axes`` (kept as size-1 axes).

    Its derivative is written out: dy = (dx - mean(dx) - y * mean(dx * y)) / sqrt(var + eps), which transposes to
    a backward pass of two reductions and one elementwise loop. Differentiating the two-pass variance instead gave
    XLA:CPU more passes over the activations: batch norm's forward and backward slower, measured alone.
    A JVP rule (not a VJP) keeps forward-mode differentiation."""
    mean, var = _mean_var(x, axes)
    return (x - mean) * jax.lax.rsqrt(var + eps), mean, var


@normalize.defjvp
def _normalize_jvp(axes, eps, primals, tangents):
    (x,), (dx,) = primals, tangents
    y, mean, var = normalize(x, axes, eps)
    rstd = jax.lax.rsqrt(var + eps)
    dmean, dxy = jnp.mean(dx, axes, keepdims=True), jnp.mean(dx * y, axes, keepdims=True)
    return (y, mean, var), (rstd * (dx - dmean - y * dxy), dmean, 2 * dxy / rstd)


def _scale_bias_params(features, dtype, use_scale=True, use_bias=True):
    params = {}
    if use_scale:
        params["scale"] = jnp.ones((features,), dtype)
    if use_bias:
        params["bias"] = jnp.zeros((features,), dtype)
    return params


def _affine(params, y):
    if "scale" in params:
        y = y * params["scale"]
    if "bias" in params:
        y = y + params["bias"]
    return y


class LayerNorm(Module):
    """Normalises each position over its last axis, then applies a per-feature scale and bias."""

    @classmethod
    def export_examples(cls):
        return {"layer_norm": (cls(), (8, 8, 4), "normal")}

    def __init__(self, eps: float = 1e-5, use_scale: bool = True, use_bias: bool = True):
        self.eps = eps
        self.use_scale = use_scale
        self.use_bias = use_bias

    def init_params(self, key, x):
        return _scale_bias_params(x.shape[-1], x.dtype, self.use_scale, self.use_bias)

    def forward(self, params, x):
        y, _, _ = normalize(x.astype(_stats_dtype(x.dtype)), (x.ndim - 1,), self.eps)
        return _affine(params, y).astype(x.dtype)


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) over the last axis, times a per-feature scale (no centring, no bias)."""

    @classmethod
    def export_examples(cls):
        return {"rms_norm": (cls(), (8, 8, 4), "normal")}

    def __init__(self, eps: float = 1e-6):
        self.eps = eps

    def init_params(self, key, x):
        return {"scale": jnp.ones((x.shape[-1],), x.dtype)}

    def forward(self, params, x):
        xf = x.astype(_stats_dtype(x.dtype))
        ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
        return (xf * jax.lax.rsqrt(ms + self.eps) * params["scale"]).astype(x.dtype)


class GroupNorm(Module):
    """Splits the channels (last axis) into groups; normalises each sample's group over all its positions."""

    @classmethod
    def export_examples(cls):
        return {"group_norm": (cls(2), (8, 8, 4), "normal")}

    def __init__(self, num_groups: int = 32, eps: float = 1e-5):
        self.num_groups = num_groups
        self.eps = eps

    def init_params(self, key, x):
        channels = x.shape[-1]
        if channels % self.num_groups:
            raise ValueError(f"GroupNorm: {channels} channels do not split into {self.num_groups} groups")
        return _scale_bias_params(channels, x.dtype)

    def forward(self, params, x):
        xf = x.astype(_stats_dtype(x.dtype))
        grouped = xf.reshape(*x.shape[:-1], self.num_groups, x.shape[-1] // self.num_groups)
        # Every axis but the batch (first) and the group index.
        axes = tuple(range(1, grouped.ndim - 2)) + (grouped.ndim - 1,)
        y, _, _ = normalize(grouped, axes, self.eps)
        return _affine(params, y.reshape(x.shape)).astype(x.dtype)


class BatchNorm(Module):
    """Normalises each feature (last axis) over all other axes.

    train=True uses the batch statistics and returns the running ones updated as
    momentum * old + (1 - momentum) * batch (Flax's convention; PyTorch's momentum is 1 minus this).
    train=False uses the running statistics and returns the state unchanged.
    """

    @classmethod
    def export_examples(cls):
        return {"batch_norm_eval": (cls(), (8, 8, 4), "normal")}

    def __init__(self, momentum: float = 0.9, eps: float = 1e-5):
        self.momentum = momentum
        self.eps = eps

    def init(self, key, x):
        x = shape_of(x)
        features = x.shape[-1]
        state = {
            "mean": jnp.zeros((features,), _stats_dtype(x.dtype)),
            "var": jnp.ones((features,), _stats_dtype(x.dtype)),
        }
        return _scale_bias_params(features, x.dtype), state

    def __call__(self, params, state, x, *, train=False, key=None):
        xf = x.astype(_stats_dtype(x.dtype))
        if train:
            y, mean, var = normalize(xf, tuple(range(x.ndim - 1)), self.eps)
            mean, var = mean.reshape(-1), var.reshape(-1)
            m = self.momentum
            state = {"mean": m * state["mean"] + (1 - m) * mean, "var": m * state["var"] + (1 - m) * var}
        else:
            y = (xf - state["mean"]) * jax.lax.rsqrt(state["var"] + self.eps)
        return _affine(params, y).astype(x.dtype), state
