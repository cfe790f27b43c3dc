"""The matrix product of a dense layer for XLA:CPU: a ``jax.custom_vjp`` whose weight gradient multiplies a
row-major copy of the transposed input.

Autodiff's weight gradient of ``y = x @ w`` is ``x^T g``, a product contracting the leading axis of both operands.
XLA:CPU's matrix products (Eigen's and YNNPACK's alike) run that form at about half the speed of the plain one for a
down projection (an input several times wider than the output, as a transformer's MLP ends with) over a batch of a
few thousand rows at most. Transposing ``x`` first, behind ``lax.optimization_barrier`` so that XLA cannot fold the
transpose back into the product, makes it the plain form; the copy costs one pass over ``x``. Elsewhere the copy
cost as much as it saved or more, so ``transposes_input`` takes it only where it was measured to pay
(benchmarks/README.md, "The dense layer's weight gradient"); the benchmarks switch it off to measure it.
"""

from __future__ import annotations

import jax
from jax import lax


def transposes_input(x, w) -> bool:
    """Whether the weight gradient of ``x @ w`` multiplies a transposed copy of ``x``: a down projection (input width
    a multiple of 128, at least twice the output's, which is 32 or more) over at most 2048 rows. A symbolic row
    count (an export's batch, which no gradient is taken of) never takes it."""
    (rows, width), out = x.shape, w.shape[1]
    if not all(isinstance(size, int) for size in (rows, width, out)):
        return False
    return rows <= 2048 and width % 128 == 0 and width >= 2 * out >= 64


@jax.custom_vjp
def copied_transpose_matmul(x, w):
    """``x @ w``, whose weight gradient multiplies a transposed copy of ``x``."""
    return x @ w


def _forward(x, w):
    return x @ w, (x, w)


def _backward(residuals, g):
    x, w = residuals
    return g @ w.T, lax.optimization_barrier(x.T) @ g


copied_transpose_matmul.defvjp(_forward, _backward)
