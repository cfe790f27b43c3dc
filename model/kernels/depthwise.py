"""Stride-1 depthwise convolutions for XLA:CPU, which has no fast grouped convolution.

A 7x7 depthwise layer of the ConvNeXt sample took 60 ms forward and 150 ms with its gradient as a grouped
``lax.conv_general_dilated``. Here the forward pass and the input gradient are sums of kh * kw shifted slices times
per-channel weights, and the weight gradient is one batched matrix product over image tiles.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _shifted_sum(xp, w, out_hw):
    """sum over (i, j) of xp[:, i:i + oh, j:j + ow] * w[i, j]: a stride-1 depthwise correlation of padded ``xp``."""
    (oh, ow), (kh, kw) = out_hw, w.shape[:2]
    w = w.reshape(kh * kw, w.shape[-1])
    total = None
    for i in range(kh):
        for j in range(kw):
            # lax slices, not numpy indexing: that becomes a gather, which exporters reject with a symbolic batch.
            window = lax.slice_in_dim(lax.slice_in_dim(xp, i, i + oh, axis=1), j, j + ow, axis=2)
            term = window * lax.slice_in_dim(w, i * kw + j, i * kw + j + 1)[0]
            total = term if total is None else total + term
    return total


def _materialized(y):
    """An exact identity (NaN and inf included) that XLA:CPU computes once, as a loop of its own.

    Without it XLA:CPU copies a kh * kw-term sum into each consumer (recomputing it per layer-norm statistic),
    and its library fusions absorb the sum slice by slice, writing every shifted slice to memory: the ConvNeXt
    sample's step was slower either way. A rounding to the array's own precision is neither duplicated nor
    absorbed.
    """
    info = jnp.finfo(y.dtype)
    return lax.reduce_precision(y, exponent_bits=info.nexp, mantissa_bits=info.nmant)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _depthwise_valid(xp, w, pads):
    """The unpadded correlation of ``xp``, which carries ``pads`` (its gradient there is left zero).

    Evaluated without differentiation (inference, export) it is slices, products and sums only; the training
    forward pass also marks its result ``_materialized`` (which TFLite cannot convert).
    """
    return _shifted_sum(xp, w, (xp.shape[1] - w.shape[0] + 1, xp.shape[2] - w.shape[1] + 1))


def _depthwise_valid_fwd(xp, w, pads):
    return _materialized(_depthwise_valid(xp, w, pads)), (xp, w)


def depthwise_conv(x, w, pads):
    """Stride-1 depthwise convolution: NHWC ``x``, kernel (kh, kw, 1, C), explicit non-negative ``pads``.

    The padding stays outside the custom-gradient function: jax2onnx converts it there only.
    """
    return _depthwise_valid(jnp.pad(x, ((0, 0), *pads, (0, 0))), w, pads)


def _windows(a, axis, count, step, size):
    """``count`` windows of ``size`` along ``axis``, one every ``step`` (overlap size - step <= step): the axis
    becomes (count, size). Built from reshaped blocks, so the windows cost one copy."""
    blocks = a.reshape(*a.shape[:axis], count + 1, step, *a.shape[axis + 1 :])
    head = lax.slice_in_dim(blocks, 0, count, axis=axis)
    tail = lax.slice_in_dim(lax.slice_in_dim(blocks, 1, count + 1, axis=axis), 0, size - step, axis=axis + 1)
    return jnp.concatenate([head, tail], axis=axis + 1)


def _depthwise_weight_grad(xp, g, kernel):
    """dw[i, j, c] = sum over n, h, w of xp[n, h + i, w + j, c] * g[n, h, w, c], as one batched matrix product.

    The output is cut into tiles of up to 2k x 2k positions (one tile for small images) and every (sample, tile)
    pair becomes a row of the contraction: cross[c, u, p] = sum over rows of the tile's input window at position u
    times g at position p. The kernel gradient is the sum of the diagonals u = p + (i, j). That is ~8x the direct
    multiply-adds, at matrix-product speed, instead of kh * kw separate reductions that XLA:CPU runs far slower.
    """
    kh, kw = kernel
    n, oh, ow, c = g.shape
    th, tw = min(2 * kh, oh), min(2 * kw, ow)
    nh, nw = -(-oh // th), -(-ow // tw)
    uh, uw = th + kh - 1, tw + kw - 1  # a tile's input window
    if nh * nw == 1:
        x_rows = xp.transpose(3, 1, 2, 0).reshape(c, uh * uw, n)
        g_rows = g.transpose(3, 0, 1, 2).reshape(c, n, th * tw)
    else:
        g = jnp.pad(g, ((0, 0), (0, nh * th - oh), (0, nw * tw - ow), (0, 0)))
        xp = jnp.pad(xp, ((0, 0), (0, (nh + 1) * th - xp.shape[1]), (0, (nw + 1) * tw - xp.shape[2]), (0, 0)))
        x_tiles = _windows(_windows(xp, 1, nh, th, uh), 3, nw, tw, uw)  # (n, nh, uh, nw, uw, c)
        x_rows = x_tiles.transpose(5, 2, 4, 0, 1, 3).reshape(c, uh * uw, -1)
        g_rows = g.reshape(n, nh, th, nw, tw, c).transpose(5, 0, 1, 3, 2, 4).reshape(c, -1, th * tw)
    cross = jnp.einsum("cur,crp->cup", x_rows, g_rows).reshape(c, -1)
    i, j, h, v = np.ix_(np.arange(kh), np.arange(kw), np.arange(th), np.arange(tw))
    diagonals = (((i + h) * uw + (j + v)) * (th * tw) + h * tw + v).reshape(kh * kw, th * tw)
    return cross[:, diagonals].sum(-1).T.reshape(kh, kw, 1, c)


def _depthwise_valid_bwd(pads, residuals, g):
    xp, w = residuals
    kh, kw = w.shape[:2]
    (top, bottom), (left, right) = pads
    # dx inside the padding: the correlation of g with the flipped kernel; padding beyond k - 1 crops g.
    g_pads = [(0, 0, 0), (kh - 1 - top, kh - 1 - bottom, 0), (kw - 1 - left, kw - 1 - right, 0), (0, 0, 0)]
    inner = (xp.shape[1] - top - bottom, xp.shape[2] - left - right)
    dx = _materialized(_shifted_sum(lax.pad(g, jnp.zeros((), g.dtype), g_pads), jnp.flip(w, (0, 1)), inner))
    dxp = jnp.pad(dx, ((0, 0), *pads, (0, 0)))
    dw = _depthwise_weight_grad(xp, g, (kh, kw))
    return dxp.astype(xp.dtype), dw.astype(w.dtype)


_depthwise_valid.defvjp(_depthwise_valid_fwd, _depthwise_valid_bwd)


def is_plain_depthwise(x, w, strides, pads, lhs_dilation, rhs_dilation, groups) -> bool:
    """One filter per channel, stride 1, no dilation, non-negative padding, a non-empty output."""
    out_ok = all(x.shape[1 + a] + sum(pads[a]) >= w.shape[a] for a in range(2))
    return (
        groups > 1
        and x.shape[-1] == groups == w.shape[-1]
        and w.shape[2] == 1
        and strides == (1, 1)
        and lhs_dilation == rhs_dilation == (1, 1)
        and min(min(p) for p in pads) >= 0
        and out_ok
    )
