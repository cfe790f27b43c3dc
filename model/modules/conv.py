"""2-D convolution and transposed convolution (NHWC inputs, HWIO kernels).

Both layers run through ``conv_general``, a ``jax.custom_vjp`` convolution whose backward pass is two ordinary
*forward* convolutions on explicitly transposed operands. Plain autodiff emits backward convolutions with transposed
dimension numbers and reversed windows; inside ``lax.scan`` or ``while`` bodies XLA:CPU does not canonicalise those
to its fast convolution path, and a small CNN's training step runs 15-30x slower. Writing the backward in canonical
NHWC/HWIO form, with ``lax.optimization_barrier`` so the transposes cannot be folded back into the convolution, keeps
full speed. The finding is XLA:CPU's; on other backends (not measured) the plain ``lax`` gradient is kept, see
``custom_grad``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from model.modules import initializers
from model.modules.module import Module

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


def _conv_fwd(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
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


def conv_general(x, w, strides=(1, 1), pads=((0, 0), (0, 0)), lhs_dilation=(1, 1), rhs_dilation=(1, 1), groups=1,
                 custom_grad: bool | None = None):
    """``lax.conv_general_dilated`` on NHWC/HWIO with explicit integer padding.

    ``custom_grad`` picks the canonical-form backward (default: on when the default backend is the CPU).
    """
    args = (tuple(strides), tuple(map(tuple, pads)), tuple(lhs_dilation), tuple(rhs_dilation), int(groups))
    if custom_grad is None:
        custom_grad = jax.default_backend() == "cpu"
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
    return y[:, top:top + x.shape[1] * stride[0], left:left + x.shape[2] * stride[1], :]


class Conv2d(Module):
    """2-D convolution; in_channels is inferred at init. Kernel HWIO (kh, kw, in / groups, out).

    padding: "SAME" | "VALID" | int | ((top, bottom), (left, right)). groups == in_channels is depthwise.
    """

    def __init__(self, out_channels: int, kernel_size, stride=1, padding="SAME", dilation=1, groups: int = 1,
                 use_bias: bool = True, weight_init="he_normal", bias_init="zeros"):
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
