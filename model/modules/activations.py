"""Activation functions, and `Activation`, the layer that applies one by name.

All are stable for large |x| (no overflow, no NaN in values or gradients at |x| = 1000). Exact GELU avoids
`lax.erf`: TFLite lowers it with SELECT, whose unselected branch overflows and turns into NaN after tf2onnx. The erf
used here is select-free: an odd-symmetric erfc fit (abs, sign, exp, a polynomial) with derivatives given exactly.
"""

from __future__ import annotations

import difflib
import math

import jax
import jax.numpy as jnp

from model.modules.module import Module

# Chebyshev fit of erfc(z) for z >= 0 (Numerical Recipes `erfcc`): fractional error < 1.2e-7 everywhere, so
# erf = 1 - erfc is within ~1e-7 absolute and the normal tail keeps its relative accuracy. Highest order first.
_ERFC_COEFFS = (
    0.17087277,
    -0.82215223,
    1.48851587,
    -1.13520398,
    0.27886807,
    -0.18628806,
    0.09678418,
    0.37409196,
    1.00002368,
    -1.26551223,
)


def _erfc_nonneg(z):
    t = 1.0 / (1.0 + 0.5 * z)
    poly = jnp.zeros_like(z)
    for c in _ERFC_COEFFS:
        poly = poly * t + c
    # exp(-z^2 + ...) underflows to 0 for large z instead of overflowing: no inf anywhere.
    return t * jnp.exp(poly - z * z)


@jax.custom_jvp
def erf(x):
    """Select-free erf, |error| < ~1.2e-7 (plus float32 rounding)."""
    return jnp.sign(x) * (1.0 - _erfc_nonneg(jnp.abs(x)))


@erf.defjvp
def _erf_jvp(primals, tangents):
    # The exact derivative; autodiff through abs() would give 0 at x = 0.
    (x,), (dx,) = primals, tangents
    return erf(x), (2.0 / math.sqrt(math.pi)) * jnp.exp(-x * x) * dx


@jax.custom_jvp
def normal_cdf(x):
    """Phi(x), computed from erfc on both sides so that Phi(-large) keeps its relative accuracy."""
    s = jnp.sign(x)
    # For x < 0 this is erfc(|x|/sqrt2)/2 directly, never 1 - (nearly 1); sign(0) = 0 gives exactly 1/2.
    return 0.5 * (1.0 + s) - 0.5 * s * _erfc_nonneg(jnp.abs(x) * (1.0 / math.sqrt(2.0)))


@normal_cdf.defjvp
def _normal_cdf_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return normal_cdf(x), (1.0 / math.sqrt(2.0 * math.pi)) * jnp.exp(-0.5 * x * x) * dx


def relu(x):
    # A zero of x's dtype, not the literal 0: jax2onnx traces maximum(x, 0) as float64 (and then emits a float64 Pad
    # for a following pool, which onnxruntime rejects).
    return jnp.maximum(x, jnp.zeros((), x.dtype))


def sigmoid(x):
    # lax.logistic evaluates 1 / (1 + exp(-x)) without overflow for either sign.
    return jax.lax.logistic(x)


def tanh(x):
    return jnp.tanh(x)


def gelu(x, approximate: bool = False):
    """x * Phi(x); with approximate=True the tanh form, written as x * sigmoid(2u) = x * (1 + tanh u) / 2."""
    if approximate:
        # The sigmoid spelling keeps the negative tail accurate and is not matched by TFLite's fused-GELU
        # pattern, which tf2onnx cannot read.
        return x * sigmoid(math.sqrt(8.0 / math.pi) * (x + 0.044715 * x * x * x))
    return x * normal_cdf(x)


def silu(x):
    return x * sigmoid(x)


def hard_swish(x):
    return x * jnp.clip(x + 3.0, 0.0, 6.0) * (1.0 / 6.0)


def softmax(x, axis: int = -1):
    # The max is a constant shift of the logits; stop_gradient keeps it out of the backward pass.
    shifted = x - jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    e = jnp.exp(shifted)
    return e / jnp.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis: int = -1):
    shifted = x - jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))


ACTIVATIONS = {
    "relu": relu,
    "gelu": gelu,
    "silu": silu,
    "swish": silu,
    "hard_swish": hard_swish,
    "sigmoid": sigmoid,
    "tanh": tanh,
    "softmax": softmax,
    "log_softmax": log_softmax,
}


def get(name: str):
    """The activation function registered under `name`."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        close = difflib.get_close_matches(str(name), ACTIVATIONS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown activation {name!r}; available: {', '.join(sorted(ACTIVATIONS))}.{hint}")
    return ACTIVATIONS[name]


class Activation(Module):
    """An activation as a layer: `Activation("gelu", approximate=True)`; keyword arguments go to the function."""

    @classmethod
    def export_examples(cls):
        return {
            **{
                f"act_{name}": (cls(name), (4, 6), "wide")
                for name in ("relu", "gelu", "silu", "hard_swish", "sigmoid", "tanh", "softmax", "log_softmax")
            },
            "act_gelu_tanh": (cls("gelu", approximate=True), (4, 6), "wide"),
        }

    def __init__(self, name: str, **kwargs):
        self.fn = get(name)
        self.name = name
        self.kwargs = kwargs

    def forward(self, params, x):
        return self.fn(x, **self.kwargs)

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"Activation({self.name!r}{args})"
