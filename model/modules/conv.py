"""2-D convolution and transposed convolution (NHWC inputs, HWIO kernels).

Both layers run through ``conv_general``, a ``jax.custom_vjp`` convolution whose backward pass is two ordinary
*forward* convolutions on explicitly transposed operands. Plain autodiff emits backward convolutions with transposed
dimension numbers and reversed windows; inside ``lax.scan`` or ``while`` bodies XLA:CPU does not canonicalise those
to its fast convolution path, and a small CNN's training step runs 15-30x slower. Writing the backward in canonical
NHWC/HWIO form, with ``lax.optimization_barrier`` so the transposes cannot be folded back into the convolution, keeps
full speed. The finding is XLA:CPU's; on other backends (not measured) the plain ``lax`` gradient is kept, see
``custom_grad``. A convolution with one input channel (a grayscale image's first layer, stride 1) is trained as kh * kw
shifted-slice products and its weight gradient as one matrix product over taps: XLA:CPU's convolution and the
transpose it needs for the weight gradient cost more there than the ~3x wider layer after it (the reference CNN's
step: 1.1-1.2x faster). Inference and exports keep the convolution. The weight gradient of an ungrouped convolution
with at most 32 output channels is kh * kw matrix products, one per kernel tap, rather than a convolution of the
input with the output gradient (the CIFAR ResNet-20's step: 1.15-1.35x faster; wider layers measured slower).

Depthwise convolutions (one filter per channel, stride 1) take a third path on the CPU, ``depthwise_conv``: XLA:CPU
has no fast grouped convolution (a 7x7 depthwise layer of the ConvNeXt sample took 60 ms forward, 150 ms with its
gradient), so the forward pass and the input gradient are sums of kh * kw shifted slices times per-channel weights,
and the weight gradient is one batched matrix product over image tiles.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from model.modules import initializers
from model.modules.module import Module, check_size

_DIMS = ("NHWC", "HWIO", "NHWC")


def as_pair(v, name: str) -> tuple[int, int]:
    """(v, v) for an int, the pair itself otherwise; positive ints only."""
    pair = (v, v) if isinstance(v, int) else tuple(v)
    if len(pair) != 2 or not all(isinstance(i, int) and i >= 1 for i in pair):
        raise ValueError(f"{name} must be a positive int or a pair of them, got {v!r}")
    return pair


def explicit_padding(padding, in_hw, kernel_hw, stride_hw, dilation_hw=(1, 1)) -> tuple[tuple[int, int], ...]:
    """``((top, bottom), (left, right))`` for "SAME" | "VALID" | int | (int or (lo, hi)) per spatial dim.

    "SAME" follows XLA/TensorFlow: output size ceil(in / stride), the odd pixel of padding goes at the end.
    """
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return ((0, 0), (0, 0))
        if mode != "SAME":
            raise ValueError(f"padding must be 'SAME', 'VALID', an int or pairs, got {padding!r}")
        pads = []
        for n, k, s, d in zip(in_hw, kernel_hw, stride_hw, dilation_hw):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            pads.append((total // 2, total - total // 2))
        return tuple(pads)
    per_dim = (padding, padding) if isinstance(padding, int) else tuple(padding)
    if len(per_dim) != 2:
        raise ValueError(f"padding needs one entry per spatial dim (2), got {padding!r}")
    pads = tuple((p, p) if isinstance(p, int) else tuple(p) for p in per_dim)
    if not all(len(p) == 2 and all(isinstance(i, int) and i >= 0 for i in p) for p in pads):
        raise ValueError(f"padding amounts must be non-negative ints, got {padding!r}")
    return pads


def _canonical_conv(lhs, rhs, strides, pads, lhs_dilation, rhs_dilation, groups, batch_groups=1):
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
    return lax.conv_general_dilated(lhs, rhs, strides, new_pads, lhs_dilation, rhs_dilation, _DIMS,
                                    feature_group_count=groups, batch_group_count=batch_groups)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _conv_fast_grad(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
    return _canonical_conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups)


def _is_single_channel(x, strides, pads, lhs_dilation, rhs_dilation, groups) -> bool:
    """One input channel (a grayscale image's first layer), stride 1, no dilation, non-negative padding."""
    return (x.shape[-1] == 1 and groups == 1 and strides == lhs_dilation == rhs_dilation == (1, 1)
            and min(min(p) for p in pads) >= 0)


def _taps(x, kernel, pads, strides=(1, 1)):
    """The kh * kw shifted (and strided) views of the padded ``x`` that a correlation multiplies by each kernel
    tap: tap (i, j) is xp[:, i::sh, j::sw] cut to the output's size."""
    (kh, kw), (sh, sw), xp = kernel, strides, jnp.pad(x, ((0, 0), *pads, (0, 0)))
    oh, ow = (xp.shape[1] - kh) // sh + 1, (xp.shape[2] - kw) // sw + 1
    return [lax.slice(xp, (0, i, j, 0), (xp.shape[0], i + sh * (oh - 1) + 1, j + sw * (ow - 1) + 1, xp.shape[3]),
                      (1, sh, sw, 1))
            for i in range(kh) for j in range(kw)]


def _is_tap_weight_grad(w, strides, pads, lhs_dilation, rhs_dilation, groups) -> bool:
    """Ungrouped, undilated, non-negative padding, at most 32 output channels: the weight gradient is one matrix
    product per kernel tap. Measured in whole training steps on XLA:CPU (2-core AMD Zen 3): the CIFAR ResNet-20
    1.15-1.35x faster this way; a 32 -> 64 channel layer (mnist_cnn's second) 1.25x slower, the ConvNeXt sample
    unchanged. ``python benchmarks/train_benchmark.py --variants template,conv-weight-grad`` re-measures."""
    return (groups == 1 and w.shape[-1] <= 32 and lhs_dilation == rhs_dilation == (1, 1)
            and min(min(p) for p in pads) >= 0)


def _conv_fwd(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
    if _is_single_channel(x, strides, pads, lhs_dilation, rhs_dilation, groups):
        # XLA:CPU's convolution with one input channel is slow (the ~3x wider layers after it ran at the same
        # cost): kh * kw outer products of a shifted input with a kernel row, one elementwise loop. Training only:
        # inference and exports keep the convolution.
        taps = _taps(x, w.shape[:2], pads)
        y = functools.reduce(jnp.add, [t * w[k // w.shape[1], k % w.shape[1], 0] for k, t in enumerate(taps)])
        return y, (x, w)
    y = _canonical_conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups)
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
    dx = _canonical_conv(g_b, w_t, lhs_dilation, dx_pads, strides, rhs_dilation, groups)

    if _is_single_channel(x, strides, pads, lhs_dilation, rhs_dilation, groups):
        # One input channel: the weight gradient is (kh * kw taps, N*H*W) @ g (N*H*W, C_out), one matrix product,
        # instead of a convolution over the batch that needs g transposed first.
        taps = jnp.stack(_taps(x, (kh, kw), pads)).reshape(kh * kw, -1)
        dw = lax.dot_general(taps, g.reshape(-1, cout), (((1,), (0,)), ((), ())))
        return dx.astype(x.dtype), dw.reshape(kh, kw, 1, cout).astype(w.dtype)
    if _is_tap_weight_grad(w, strides, pads, lhs_dilation, rhs_dilation, groups):
        # dw[i, j] = tap(i, j)^T @ g over all N*H*W output positions: kh * kw matrix products, where XLA:CPU runs
        # the equivalent convolution (C_in "images" correlated with a kernel as large as g) slowly for few channels.
        rows = g.reshape(-1, cout)
        dw = jnp.stack([lax.dot_general(t.reshape(-1, cin), rows, (((0,), (0,)), ((), ())))
                        for t in _taps(x, (kh, kw), pads, strides)])
        return dx.astype(x.dtype), dw.reshape(kh, kw, cin, cout).astype(w.dtype)
    # dw: input channels become the batch and the batch the contracted feature axis.
    if groups > 1 and cg == og == 1:
        # Plain depthwise: a batch-grouped convolution, ~6x faster here on XLA:CPU than the form below. Elsewhere
        # (multipliers, wider groups) XLA:CPU's batch-grouped convolutions measured up to 50x slower.
        x_t, g_t, feature_groups, batch_groups = x.transpose(3, 1, 2, 0), g.transpose(1, 2, 0, 3), 1, groups
    else:
        # Each group's N batch entries form one feature group: an ordinary grouped convolution.
        x_t = x.reshape(*x.shape[:3], groups, cg).transpose(4, 1, 2, 3, 0).reshape(cg, *x.shape[1:3], groups * n)
        g_t = g.reshape(*g.shape[:3], groups, og).transpose(1, 2, 0, 3, 4).reshape(*g.shape[1:3], n, groups * og)
        feature_groups, batch_groups = groups, 1
    x_t, g_t = lax.optimization_barrier((x_t, g_t))
    dw_pads = [(lo, out_ext[i] - in_ext[i] + k_ext[i] - lo - 1) for i, (lo, _) in enumerate(pads)]
    dw = _canonical_conv(x_t, g_t, rhs_dilation, dw_pads, lhs_dilation, strides, feature_groups, batch_groups)
    dw = lax.optimization_barrier(dw).transpose(1, 2, 0, 3)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_conv_fast_grad.defvjp(_conv_fwd, _conv_bwd)


# ----------------------------------------------------------------------------------------------------- depthwise
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
    sample's step was ~3x slower either way. A rounding to the array's own precision is neither duplicated nor
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
    blocks = a.reshape(*a.shape[:axis], count + 1, step, *a.shape[axis + 1:])
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


def _is_plain_depthwise(x, w, strides, pads, lhs_dilation, rhs_dilation, groups) -> bool:
    """One filter per channel, stride 1, no dilation, non-negative padding, a non-empty output."""
    out_ok = all(x.shape[1 + a] + sum(pads[a]) >= w.shape[a] for a in range(2))
    return (groups > 1 and x.shape[-1] == groups == w.shape[-1] and w.shape[2] == 1 and strides == (1, 1)
            and lhs_dilation == rhs_dilation == (1, 1) and min(min(p) for p in pads) >= 0 and out_ok)


def conv_general(x, w, strides=(1, 1), pads=((0, 0), (0, 0)), lhs_dilation=(1, 1), rhs_dilation=(1, 1), groups=1,
                 custom_grad: bool | None = None):
    """``lax.conv_general_dilated`` on NHWC/HWIO with explicit integer padding.

    ``custom_grad`` picks the formulations written for XLA:CPU (default: on when the default backend is the CPU):
    the canonical-form backward, and ``depthwise_conv`` for plain depthwise convolutions.
    """
    args = (tuple(strides), tuple(map(tuple, pads)), tuple(lhs_dilation), tuple(rhs_dilation), int(groups))
    if custom_grad is None:
        custom_grad = jax.default_backend() == "cpu"
    if custom_grad and _is_plain_depthwise(x, w, *args):
        return depthwise_conv(x, w, args[1])
    if custom_grad:
        return _conv_fast_grad(x, w, *args)
    return _canonical_conv(x, w, *args)


def conv2d(x, w, stride=1, padding="SAME", dilation=1, groups=1, custom_grad: bool | None = None):
    """A 2-D convolution of NHWC ``x`` with an HWIO kernel ``w`` of shape (kh, kw, in / groups, out)."""
    stride, dilation = as_pair(stride, "stride"), as_pair(dilation, "dilation")
    pads = explicit_padding(padding, x.shape[1:3], w.shape[:2], stride, dilation)
    return conv_general(x, w, stride, pads, (1, 1), dilation, groups, custom_grad)


def conv_transpose2d(x, w, stride=1, padding="SAME", custom_grad: bool | None = None):
    """Transposed convolution as in ``lax.conv_transpose`` / ``flax.linen.ConvTranspose`` (kernel not flipped).

    Output size: in * stride for "SAME", in * stride + max(k - stride, 0) for "VALID". "SAME" is computed as "VALID"
    followed by a crop: TFLite mis-converts some SAME transposed convolutions (kernel 3, stride 2), the crop form
    converts correctly everywhere.
    """
    stride = as_pair(stride, "stride")
    kernel = w.shape[:2]
    pads = [(k - 1, s - 1 + max(k - s, 0)) for k, s in zip(kernel, stride)]
    y = conv_general(x, w, (1, 1), pads, stride, (1, 1), 1, custom_grad)
    mode = padding.upper() if isinstance(padding, str) else padding
    if mode == "VALID":
        return y
    if mode != "SAME":
        raise ValueError(f"padding must be 'SAME' or 'VALID', got {padding!r}")
    # lax.conv_transpose SAME pads k - 1 before when stride >= k, else ceil((k + s - 2) / 2): an offset of
    # floor((k - s) / 2) into the VALID output.
    top, left = (max(k - s, 0) // 2 for k, s in zip(kernel, stride))
    # lax.slice_in_dim, not y[:, a:b]: with a symbolic batch, basic indexing lowers to a gather that the TFLite
    # converter rejects.
    y = lax.slice_in_dim(y, top, top + x.shape[1] * stride[0], axis=1)
    return lax.slice_in_dim(y, left, left + x.shape[2] * stride[1], axis=2)


class Conv2d(Module):
    """2-D convolution; in_channels is inferred at init. Kernel HWIO (kh, kw, in / groups, out).

    padding: "SAME" | "VALID" | int | ((top, bottom), (left, right)). groups == in_channels is depthwise.
    """

    def __init__(self, out_channels: int, kernel_size, stride=1, padding="SAME", dilation=1, groups: int = 1,
                 use_bias: bool = True, weight_init="he_normal", bias_init="zeros"):
        check_size(out_channels, "out_channels")
        check_size(groups, "groups")
        self.out_channels = out_channels
        self.kernel_size = as_pair(kernel_size, "kernel_size")
        self.stride = as_pair(stride, "stride")
        self.padding = padding
        self.dilation = as_pair(dilation, "dilation")
        self.groups = groups
        self.use_bias = use_bias
        self.weight_init = weight_init
        self.bias_init = bias_init
        if out_channels % groups:
            raise ValueError(f"out_channels ({out_channels}) must be divisible by groups ({groups})")
        explicit_padding(padding, (1, 1), self.kernel_size, self.stride, self.dilation)  # validate early

    def init_params(self, key, x):
        in_channels = x.shape[-1]
        if in_channels % self.groups:
            raise ValueError(f"in_channels ({in_channels}) must be divisible by groups ({self.groups})")
        w_key, b_key = jax.random.split(key)
        shape = (*self.kernel_size, in_channels // self.groups, self.out_channels)
        params = {"weight": initializers.get(self.weight_init)(w_key, shape, x.dtype)}
        if self.use_bias:
            params["bias"] = initializers.get(self.bias_init)(b_key, (self.out_channels,), x.dtype)
        return params

    def forward(self, params, x):
        y = conv2d(x, params["weight"], self.stride, self.padding, self.dilation, self.groups)
        return y + params["bias"] if self.use_bias else y


class ConvTranspose2d(Module):
    """Transposed 2-D convolution (``flax.linen.ConvTranspose`` semantics); kernel HWIO (kh, kw, in, out).

    "SAME" gives in * stride outputs, "VALID" in * stride + max(kernel - stride, 0).
    """

    def __init__(self, out_channels: int, kernel_size, stride=1, padding="SAME", use_bias: bool = True,
                 weight_init="he_normal", bias_init="zeros"):
        if not (isinstance(padding, str) and padding.upper() in ("SAME", "VALID")):
            raise ValueError(f"padding must be 'SAME' or 'VALID', got {padding!r}")
        check_size(out_channels, "out_channels")
        self.out_channels = out_channels
        self.kernel_size = as_pair(kernel_size, "kernel_size")
        self.stride = as_pair(stride, "stride")
        self.padding = padding
        self.use_bias = use_bias
        self.weight_init = weight_init
        self.bias_init = bias_init

    def init_params(self, key, x):
        w_key, b_key = jax.random.split(key)
        shape = (*self.kernel_size, x.shape[-1], self.out_channels)
        params = {"weight": initializers.get(self.weight_init)(w_key, shape, x.dtype)}
        if self.use_bias:
            params["bias"] = initializers.get(self.bias_init)(b_key, (self.out_channels,), x.dtype)
        return params

    def forward(self, params, x):
        y = conv_transpose2d(x, params["weight"], self.stride, self.padding)
        return y + params["bias"] if self.use_bias else y
