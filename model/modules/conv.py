"""2-D convolution and transposed convolution (NHWC inputs, HWIO kernels); 1-D convolution (NLC inputs, WIO kernels).

Both layers are ``lax.conv_general_dilated`` differentiated by JAX. Where the optional ``model/kernels`` is there,
``conv_general`` takes its formulation (same values and gradients, written for XLA:CPU) where the code is lowered for
the CPU, the plain math for every other platform (``model/modules/cpu_forms.py``).
"""

from __future__ import annotations

import jax
from jax import lax

from model.modules import initializers
from model.modules.cpu_forms import by_platform
from model.modules.module import Module, check_size

DIMS = ("NHWC", "HWIO", "NHWC")


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


def conv_general(x, w, strides=(1, 1), pads=((0, 0), (0, 0)), lhs_dilation=(1, 1), rhs_dilation=(1, 1), groups=1):
    """``lax.conv_general_dilated`` on NHWC/HWIO with explicit non-negative integer padding; model/kernels'
    formulation of it where the code is lowered for the CPU (``cpu_forms.by_platform``)."""
    args = (tuple(strides), tuple(map(tuple, pads)), tuple(lhs_dilation), tuple(rhs_dilation), int(groups))

    def plain(x, w):
        strides, pads, lhs_dilation, rhs_dilation, groups = args
        return lax.conv_general_dilated(
            x, w, strides, pads, lhs_dilation, rhs_dilation, DIMS, feature_group_count=groups
        )

    return by_platform(plain, lambda kernels: lambda x, w: kernels.conv_for_cpu(x, w, *args), x, w)


def conv2d(x, w, stride=1, padding="SAME", dilation=1, groups=1):
    """A 2-D convolution of NHWC ``x`` with an HWIO kernel ``w`` of shape (kh, kw, in / groups, out)."""
    stride, dilation = as_pair(stride, "stride"), as_pair(dilation, "dilation")
    pads = explicit_padding(padding, x.shape[1:3], w.shape[:2], stride, dilation)
    return conv_general(x, w, stride, pads, (1, 1), dilation, groups)


def conv_transpose2d(x, w, stride=1, padding="SAME"):
    """Transposed convolution as in ``lax.conv_transpose`` / ``flax.linen.ConvTranspose`` (kernel not flipped).

    Output size: in * stride for "SAME", in * stride + max(k - stride, 0) for "VALID". "SAME" is computed as "VALID"
    followed by a crop: TFLite mis-converts some SAME transposed convolutions (kernel 3, stride 2), the crop form
    converts correctly everywhere.
    """
    stride = as_pair(stride, "stride")
    kernel = w.shape[:2]
    pads = [(k - 1, s - 1 + max(k - s, 0)) for k, s in zip(kernel, stride)]
    y = conv_general(x, w, (1, 1), pads, stride, (1, 1), 1)
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

    @classmethod
    def export_examples(cls):
        image = (8, 8, 4)  # (H, W, C)
        return {
            "conv": (cls(6, 3), image, "normal"),
            "conv_stride2": (cls(6, 3, stride=2), image, "normal"),
            "conv_dilation2": (cls(6, 3, dilation=2), image, "normal"),
            "conv_depthwise": (cls(4, 3, groups=4), image, "normal"),
            "conv_grouped": (cls(6, 3, groups=2), image, "normal"),
            "conv_valid": (cls(6, 3, padding="VALID"), image, "normal"),
            "conv_explicit_pad": (cls(6, (3, 2), padding=((2, 0), (1, 1))), image, "normal"),
        }

    def __init__(
        self,
        out_channels: int,
        kernel_size,
        stride=1,
        padding="SAME",
        dilation=1,
        groups: int = 1,
        use_bias: bool = True,
        weight_init="he_normal",
        bias_init="zeros",
    ):
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


def as_2d(value, name: str, other):
    """A 1-D layer's stride, dilation or padding as its 2-D form over (length, 1): ``other`` on the added axis."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, other)
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return (value[0], other)
    if name == "padding" and isinstance(value, (list, tuple)) and len(value) == 2:
        return (tuple(value), other)  # (before, after)
    raise ValueError(
        f"{name} must be {'an int, (before, after), ' if name == 'padding' else 'an int'}"
        f"{' or SAME/VALID' if name == 'padding' else ''}, got {value!r}"
    )


class Conv1d(Module):
    """1-D convolution over the middle axis of (N, L, C) inputs (a sequence, a time series); in_channels is inferred
    at init. Kernel WIO (k, in / groups, out), as flax's ``Conv`` with a 1-D kernel.

    padding: "SAME" | "VALID" | int | (before, after). It runs as ``Conv2d`` over (N, L, 1, C), so it exports
    wherever the 2-D convolution does.
    """

    @classmethod
    def export_examples(cls):
        # sequences (B, L, C): the 1-D layers run as their 2-D forms over (B, L, 1, C)
        return {"conv1d_stride2_pad": (cls(6, 3, stride=2, padding=(2, 1)), (9, 4), "normal")}

    def __init__(
        self,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding="SAME",
        dilation: int = 1,
        groups: int = 1,
        use_bias: bool = True,
        weight_init="he_normal",
        bias_init="zeros",
    ):
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.out_channels, self.groups, self.use_bias = out_channels, groups, use_bias
        self.weight_init, self.bias_init = weight_init, bias_init
        self._conv = Conv2d(
            out_channels,
            as_2d(kernel_size, "kernel_size", 1),
            as_2d(stride, "stride", 1),
            as_2d(padding, "padding", (0, 0)),
            as_2d(dilation, "dilation", 1),
            groups,
            use_bias,
            weight_init,
            bias_init,
        )

    def init_params(self, key, x):
        if len(x.shape) != 3:
            raise ValueError(f"Conv1d takes (batch, length, channels) inputs, got shape {tuple(x.shape)}")
        params = self._conv.init_params(key, jax.ShapeDtypeStruct((x.shape[0], x.shape[1], 1, x.shape[2]), x.dtype))
        return {**params, "weight": params["weight"][:, 0]}

    def forward(self, params, x):
        y = self._conv.forward({**params, "weight": params["weight"][:, None]}, lax.expand_dims(x, (2,)))
        return lax.squeeze(y, (2,))


class ConvTranspose2d(Module):
    """Transposed 2-D convolution (``flax.linen.ConvTranspose`` semantics); kernel HWIO (kh, kw, in, out).

    "SAME" gives in * stride outputs, "VALID" in * stride + max(kernel - stride, 0).
    """

    @classmethod
    def export_examples(cls):
        image = (8, 8, 4)  # (H, W, C)
        return {
            "conv_transpose_k2s2": (cls(3, 2, stride=2), image, "normal"),
            "conv_transpose_k3s2": (cls(3, 3, stride=2), image, "normal"),
            "conv_transpose_k4s2": (cls(3, 4, stride=2), image, "normal"),
            "conv_transpose_k3s2_valid": (cls(3, 3, stride=2, padding="VALID"), image, "normal"),
            "conv_transpose_k3s1": (cls(3, 3), image, "normal"),
        }

    def __init__(
        self,
        out_channels: int,
        kernel_size,
        stride=1,
        padding="SAME",
        use_bias: bool = True,
        weight_init="he_normal",
        bias_init="zeros",
    ):
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
