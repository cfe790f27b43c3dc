"""Max and average pooling over H, W of NHWC inputs or over L of NLC inputs (sequences), and global average pooling.

No ``lax.reduce_window``: its max-pool gradient (select-and-scatter) is ~45% of a small CNN's training step on
XLA:CPU, and exporters mishandle it (jax2onnx emits a MaxPool onnxruntime rejects; a dynamic-batch average pool
becomes a TFLite op tf2onnx cannot read). Non-overlapping windows (stride == kernel) are a reshape and a max/mean;
other windows reduce over the kh * kw strided slices of the padded input.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from model.modules.conv import as_2d, as_pair, explicit_padding
from model.modules.module import Module


def _lowest(dtype):
    # A finite fill: -inf * 0 turns into NaN in exporters that lower select as arithmetic.
    return jnp.finfo(dtype).min if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _pool(x, reduce, fill, kernel, stride, pads):
    """Reduce (``"max"`` or ``"sum"``) each window of the input padded with ``fill``."""
    (kh, kw), (sh, sw) = kernel, stride
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)), constant_values=fill)
    n, h, w, c = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    if (kh, kw) == (sh, sw):
        # lax.slice_in_dim, not x[:, :a, :b]: with a symbolic batch, basic indexing lowers to a gather that the
        # TFLite converter rejects.
        x = lax.slice_in_dim(lax.slice_in_dim(x, 0, oh * kh, axis=1), 0, ow * kw, axis=2)
        x = x.reshape(n, oh, kh, ow, kw, c)
        return x.max((2, 4)) if reduce == "max" else x.sum((2, 4))
    combine = jnp.maximum if reduce == "max" else jnp.add
    out = None
    for i in range(kh):
        for j in range(kw):
            part = lax.slice(x, (0, i, j, 0), (n, i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1, c), (1, sh, sw, 1))
            out = part if out is None else combine(out, part)
    return out


class MaxPool2d(Module):
    """Max over kh x kw windows; ``stride`` defaults to the kernel size. Padding never wins the max."""

    @classmethod
    def export_examples(cls):
        from model.modules.activations import Activation
        from model.modules.sequential import Sequential

        image = (8, 8, 4)  # (H, W, C)
        return {
            "max_pool": (cls(2), image, "normal"),
            "max_pool_odd": (cls(2), (7, 7, 4), "normal"),
            "max_pool_k3s2_same": (cls(3, stride=2, padding="SAME"), image, "normal"),
            "relu_max_pool": (Sequential([Activation("relu"), cls(2)]), image, "normal"),
        }

    def __init__(self, kernel_size, stride=None, padding="VALID"):
        self.kernel_size = as_pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else as_pair(stride, "stride")
        self.padding = padding
        explicit_padding(padding, (1, 1), self.kernel_size, self.stride)  # validate early

    def forward(self, params, x):
        pads = explicit_padding(self.padding, x.shape[1:3], self.kernel_size, self.stride)
        return _pool(x, "max", _lowest(x.dtype), self.kernel_size, self.stride, pads)


class AvgPool2d(Module):
    """Mean over kh x kw windows; ``stride`` defaults to the kernel size.

    With padding, the mean is over the input elements in each window only (``count_include_pad=False``, as
    TensorFlow's SAME average pooling); ``count_include_pad=True`` divides by kh * kw (flax's default).
    """

    @classmethod
    def export_examples(cls):
        image = (8, 8, 4)  # (H, W, C)
        return {
            "avg_pool": (cls(2), image, "normal"),
            "avg_pool_k3s2_same": (cls(3, stride=2, padding="SAME"), image, "normal"),
        }

    def __init__(self, kernel_size, stride=None, padding="VALID", count_include_pad: bool = False):
        self.kernel_size = as_pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else as_pair(stride, "stride")
        self.padding = padding
        self.count_include_pad = count_include_pad
        explicit_padding(padding, (1, 1), self.kernel_size, self.stride)  # validate early

    def forward(self, params, x):
        pads = explicit_padding(self.padding, x.shape[1:3], self.kernel_size, self.stride)
        total = _pool(x, "sum", 0, self.kernel_size, self.stride, pads)
        if self.count_include_pad or not any(p for pair in pads for p in pair):
            return total / (self.kernel_size[0] * self.kernel_size[1])
        # Shapes are static, so the per-window counts are a constant computed once here.
        ones = np.pad(np.ones(x.shape[1:3], np.float32), pads)
        counts = np.lib.stride_tricks.sliding_window_view(ones, self.kernel_size)[:: self.stride[0], :: self.stride[1]]
        return total / counts.sum((2, 3))[:, :, None].astype(total.dtype)


def _pool1d(layer: Module, pool: Module, x):
    """A 2-D pooling over (N, L, 1, C): a 1-D window exports wherever a 2-D one does."""
    if x.ndim != 3:
        raise ValueError(f"{type(layer).__name__} takes (batch, length, channels) inputs, got shape {x.shape}")
    return lax.squeeze(pool.forward({}, lax.expand_dims(x, (2,))), (2,))


class MaxPool1d(Module):
    """Max over windows of ``kernel_size`` positions of (N, L, C) inputs; ``stride`` defaults to the kernel size.
    padding: "SAME" | "VALID" | int | (before, after); padding never wins the max."""

    @classmethod
    def export_examples(cls):
        from model.modules.conv import Conv1d
        from model.modules.embedding import PositionalEmbedding
        from model.modules.sequential import Sequential

        # sequences (B, L, C): the 1-D layers run as their 2-D forms over (B, L, 1, C)
        return {
            "conv1d_pool_positions": (
                Sequential([PositionalEmbedding(12), Conv1d(6, 3), cls(2), AvgPool1d(3, stride=1, padding="SAME")]),
                (10, 4),
                "normal",
            )
        }

    def __init__(self, kernel_size: int, stride: int | None = None, padding="VALID"):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        kernel, padding = as_2d(kernel_size, "kernel_size", 1), as_2d(padding, "padding", (0, 0))
        self._pool = MaxPool2d(kernel, kernel if stride is None else as_2d(stride, "stride", 1), padding)

    def forward(self, params, x):
        return _pool1d(self, self._pool, x)


class AvgPool1d(Module):
    """Mean over windows of ``kernel_size`` positions of (N, L, C) inputs; ``stride`` defaults to the kernel size.
    With padding, the mean is over the input positions in each window only, unless ``count_include_pad``."""

    def __init__(self, kernel_size: int, stride: int | None = None, padding="VALID", count_include_pad: bool = False):
        self.kernel_size, self.stride, self.padding, self.count_include_pad = (
            kernel_size,
            stride,
            padding,
            count_include_pad,
        )
        kernel, padding = as_2d(kernel_size, "kernel_size", 1), as_2d(padding, "padding", (0, 0))
        stride = kernel if stride is None else as_2d(stride, "stride", 1)
        self._pool = AvgPool2d(kernel, stride, padding, count_include_pad)

    def forward(self, params, x):
        return _pool1d(self, self._pool, x)


class GlobalAvgPool(Module):
    """Mean over every axis between the batch and the channels: (N, H, W, C) or (N, L, C) -> (N, C); with
    ``keepdims`` those axes stay, of size 1 ((N, 1, 1, C), (N, 1, C))."""

    @classmethod
    def export_examples(cls):
        image = (8, 8, 4)  # (H, W, C)
        return {
            "global_avg_pool": (cls(), image, "normal"),
            "global_avg_pool_keepdims": (cls(keepdims=True), image, "normal"),
        }

    def __init__(self, keepdims: bool = False):
        self.keepdims = keepdims

    def forward(self, params, x):
        return x.mean(tuple(range(1, x.ndim - 1)), keepdims=self.keepdims)
