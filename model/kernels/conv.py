"""The convolution for XLA:CPU: a ``jax.custom_vjp`` whose backward pass is ordinary *forward* convolutions.

Plain autodiff emits backward convolutions with transposed dimension numbers and reversed windows; inside
``lax.scan`` or ``while`` bodies XLA:CPU does not canonicalise those to its fast convolution path, and a small CNN's
training step runs many times slower (figures: benchmarks/README.md). Writing the backward in canonical NHWC/HWIO
form, with ``lax.optimization_barrier`` so the transposes cannot be folded back into the convolution, keeps full speed.

Two narrower paths, each chosen by a predicate the benchmarks can switch off (``is_single_channel``,
``is_tap_weight_grad``): a convolution with one input channel (a grayscale image's first layer, stride 1) is trained
as kh * kw shifted-slice products and its weight gradient as one matrix product over taps, because XLA:CPU's
convolution and the transpose it needs there cost more than the ~3x wider layer after it; the weight gradient of an
ungrouped convolution with at most 32 output channels is kh * kw matrix products, one per kernel tap. The figures
are in benchmarks/README.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

DIMS = ("NHWC", "HWIO", "NHWC")


def canonical_conv(lhs, rhs, strides, pads, lhs_dilation, rhs_dilation, groups, batch_groups=1):
    """A forward NHWC/HWIO convolution; negative padding becomes slicing of ``lhs``.

    Negative padding arises in the backward pass (rows the forward pass never read). Cropping the operand keeps the
    convolution itself in the plain form that XLA:CPU's fast path accepts.
    """
    new_pads = []
    for axis, ((lo, hi), dil) in enumerate(zip(pads, lhs_dilation), start=1):
        start, stop = 0, lhs.shape[axis]
        if lo < 0:  # drop -lo positions of the dilated operand: whole elements, then re-pad to the exact offset
            start = -(lo // dil)
            lo = start * dil + lo
        if hi < 0:
            last = (stop - 1) * dil + hi  # last dilated position still read
            stop = last // dil + 1
            hi = last - (stop - 1) * dil
        lhs = lax.slice_in_dim(lhs, start, stop, axis=axis)
        new_pads.append((lo, hi))
    return lax.conv_general_dilated(
        lhs,
        rhs,
        strides,
        new_pads,
        lhs_dilation,
        rhs_dilation,
        DIMS,
        feature_group_count=groups,
        batch_group_count=batch_groups,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
    """``lax.conv_general_dilated`` (NHWC/HWIO, explicit padding) with the backward pass written for XLA:CPU."""
    return canonical_conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups)


def is_single_channel(x, strides, pads, lhs_dilation, rhs_dilation, groups) -> bool:
    """One input channel (a grayscale image's first layer), stride 1, no dilation, non-negative padding."""
    return (
        x.shape[-1] == 1
        and groups == 1
        and strides == lhs_dilation == rhs_dilation == (1, 1)
        and min(min(p) for p in pads) >= 0
    )


def taps(x, kernel, pads, strides=(1, 1)):
    """The kh * kw shifted (and strided) views of the padded ``x`` that a correlation multiplies by each kernel
    tap: tap (i, j) is xp[:, i::sh, j::sw] cut to the output's size."""
    (kh, kw), (sh, sw), xp = kernel, strides, jnp.pad(x, ((0, 0), *pads, (0, 0)))
    oh, ow = (xp.shape[1] - kh) // sh + 1, (xp.shape[2] - kw) // sw + 1
    return [
        lax.slice(
            xp, (0, i, j, 0), (xp.shape[0], i + sh * (oh - 1) + 1, j + sw * (ow - 1) + 1, xp.shape[3]), (1, sh, sw, 1)
        )
        for i in range(kh)
        for j in range(kw)
    ]


def is_tap_weight_grad(w, strides, pads, lhs_dilation, rhs_dilation, groups) -> bool:
    """Ungrouped, undilated, non-negative padding, at most 32 output channels: the weight gradient is one matrix
    product per kernel tap (faster for the CIFAR ResNet-20; slower for a 32 -> 64 channel layer, hence the bound)."""
    return (
        groups == 1 and w.shape[-1] <= 32 and lhs_dilation == rhs_dilation == (1, 1) and min(min(p) for p in pads) >= 0
    )


def _conv_fwd(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
    if is_single_channel(x, strides, pads, lhs_dilation, rhs_dilation, groups):
        # kh * kw outer products of a shifted input with a kernel row, one elementwise loop. Training only:
        # inference and exports keep the convolution.
        views = taps(x, w.shape[:2], pads)
        y = functools.reduce(jnp.add, [t * w[k // w.shape[1], k % w.shape[1], 0] for k, t in enumerate(views)])
        return y, (x, w)
    y = canonical_conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups)
    return y, (x, w)


def _conv_bwd(strides, pads, lhs_dilation, rhs_dilation, groups, residuals, g):
    x, w = residuals
    n, cin, cout = x.shape[0], x.shape[-1], g.shape[-1]
    cg, og = cin // groups, cout // groups
    kh, kw = w.shape[:2]
    # Per spatial dim: input size after lhs dilation, kernel extent after rhs dilation, output extent after strides.
    in_ext = [(x.shape[i + 1] - 1) * lhs_dilation[i] + 1 for i in range(2)]
    k_ext = [(w.shape[i] - 1) * rhs_dilation[i] + 1 for i in range(2)]
    out_ext = [(g.shape[i + 1] - 1) * strides[i] + 1 for i in range(2)]

    # dx: correlate g (dilated by the forward strides) with the spatially flipped kernel, its in/out roles swapped
    # within each group: (kh, kw, cg, G*og) -> (kh, kw, og, G*cg).
    w_t = w.reshape(kh, kw, cg, groups, og).transpose(0, 1, 4, 3, 2).reshape(kh, kw, og, groups * cg)
    w_t = jnp.flip(w_t, (0, 1))
    g_b, w_t = lax.optimization_barrier((g, w_t))
    dx_pads = []
    for i, (lo, _) in enumerate(pads):
        before = k_ext[i] - lo - 1
        dx_pads.append((before, in_ext[i] + k_ext[i] - 1 - out_ext[i] - before))
    dx = canonical_conv(g_b, w_t, lhs_dilation, dx_pads, strides, rhs_dilation, groups)

    if is_single_channel(x, strides, pads, lhs_dilation, rhs_dilation, groups):
        # The weight gradient is (kh * kw taps, N*H*W) @ g (N*H*W, C_out), one matrix product, instead of a
        # convolution over the batch that needs g transposed first.
        views = jnp.stack(taps(x, (kh, kw), pads)).reshape(kh * kw, -1)
        dw = lax.dot_general(views, g.reshape(-1, cout), (((1,), (0,)), ((), ())))
        return dx.astype(x.dtype), dw.reshape(kh, kw, 1, cout).astype(w.dtype)
    if is_tap_weight_grad(w, strides, pads, lhs_dilation, rhs_dilation, groups):
        # dw[i, j] = tap(i, j)^T @ g over all N*H*W output positions: kh * kw matrix products, where XLA:CPU runs
        # the equivalent convolution (C_in "images" correlated with a kernel as large as g) slowly for few channels.
        rows = g.reshape(-1, cout)
        dw = jnp.stack(
            [
                lax.dot_general(t.reshape(-1, cin), rows, (((0,), (0,)), ((), ())))
                for t in taps(x, (kh, kw), pads, strides)
            ]
        )
        return dx.astype(x.dtype), dw.reshape(kh, kw, cin, cout).astype(w.dtype)
    # dw: input channels become the batch and the batch the contracted feature axis.
    if groups > 1 and cg == og == 1:
        # Plain depthwise: a batch-grouped convolution, faster here on XLA:CPU than the form below. Elsewhere
        # (multipliers, wider groups) XLA:CPU's batch-grouped convolutions measured far slower.
        x_t, g_t, feature_groups, batch_groups = x.transpose(3, 1, 2, 0), g.transpose(1, 2, 0, 3), 1, groups
    else:
        # Each group's N batch entries form one feature group: an ordinary grouped convolution.
        x_t = x.reshape(*x.shape[:3], groups, cg).transpose(4, 1, 2, 3, 0).reshape(cg, *x.shape[1:3], groups * n)
        g_t = g.reshape(*g.shape[:3], groups, og).transpose(1, 2, 0, 3, 4).reshape(*g.shape[1:3], n, groups * og)
        feature_groups, batch_groups = groups, 1
    x_t, g_t = lax.optimization_barrier((x_t, g_t))
    dw_pads = [(lo, out_ext[i] - in_ext[i] + k_ext[i] - lo - 1) for i, (lo, _) in enumerate(pads)]
    dw = canonical_conv(x_t, g_t, rhs_dilation, dw_pads, lhs_dilation, strides, feature_groups, batch_groups)
    dw = lax.optimization_barrier(dw).transpose(1, 2, 0, 3)
    return dx.astype(x.dtype), dw.astype(w.dtype)


conv.defvjp(_conv_fwd, _conv_bwd)
