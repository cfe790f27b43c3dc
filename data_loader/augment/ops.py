"""The augmentation ops on images and features (``Op``) and what they share (``Pixels``): crops, flips, colour
jitter, erasing and ``normalize``. Mixing examples with each other (mixup, cutmix) is
``data_loader/augment/mixing.py``; the configured list that runs them, and the factories a config names,
``data_loader/augment/pipeline.py``.

An op is a class with ``uniforms`` (how many uniform numbers it draws per example), ``draw`` (its per-example
parameters from them), ``apply`` (training) and ``identity`` (evaluation, and deterministic ops in training), and
``check`` for what only the data's shape or dtype can refuse. Its constructor checks its arguments (ValueError
"name: ...") before any data is read.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from model.checks import check_interval, check_number

GRAY = (0.299, 0.587, 0.114)  # ITU-R 601 luma weights, as PIL's convert("L") and torchvision use


# --------------------------------------------------------------------------------------------------- argument checks
def _per_channel(value, name: str, default: float, positive: bool = False) -> tuple[float, ...]:
    """A number, or a list of numbers (one per channel)."""
    if value is None:
        return (default,)
    values = value if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise ValueError(f"{name}: expected a number or a list of numbers (one per channel), got []")
    return tuple(
        check_number(
            v, f"{name}.{i}" if isinstance(value, (list, tuple)) else name, 0.0 if positive else None, open_low=True
        )
        for i, v in enumerate(values)
    )


# ------------------------------------------------------------------------------------------------------- the ops
class Pixels:
    """What the ops of one call share: the pixel range (None: not clipped) and the model's output spec."""

    def __init__(self, max_value: float | None, outputs):
        self.max_value = max_value
        self.outputs = outputs

    def clip(self, x):
        return x if self.max_value is None else jnp.clip(x, 0.0, self.max_value)


def as_float(x):
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _index(u, count):
    """floor(u * count) as int32, at most count - 1 (count may be an array)."""
    return jnp.minimum(jnp.floor(u * count), count - 1).astype(jnp.int32)


class Op:
    """One augmentation. ``random`` ops implement ``draw`` (per-example parameters from ``uniforms`` numbers each) and
    ``apply``; ``identity`` is what evaluation does (and what a deterministic op does in training too)."""

    random = True
    name = "op"
    image = True  # needs (batch, height, width, channels)

    def check(self, batch: dict, pixels: Pixels, where: str) -> None:
        x = batch["input"]
        if isinstance(x, dict):
            raise ValueError(
                f"{where}: {self.name} works on one input array, the data has several named inputs "
                f"({', '.join(sorted(x))})"
            )
        if self.image and x.ndim != 4:
            raise ValueError(
                f"{where}: {self.name} works on images (batch, height, width, channels), the input "
                f"has shape {list(x.shape)}"
            )

    uniforms = 0  # uniform numbers drawn per example

    def draw(self, u, batch: dict) -> dict:
        """Per-example parameters from u, (B, uniforms) uniform numbers in [0, 1), row b example b's."""
        return {}

    def apply(self, batch: dict, params: dict, pixels: Pixels) -> dict:
        return self.identity(batch, pixels)

    def identity(self, batch: dict, pixels: Pixels) -> dict:
        return batch

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{self.name}({fields})"


def with_input(batch: dict, x) -> dict:
    return {**batch, "input": x}


class RandomCrop(Op):
    name = "random_crop"
    MODES = ("constant", "reflect", "edge")

    def __init__(self, padding, padding_mode, value):
        self.padding = check_number(padding, "padding", 0, 4096, integer=True)
        if padding_mode not in self.MODES:
            raise ValueError(f"padding_mode: expected one of {', '.join(self.MODES)}, got {padding_mode!r}")
        self.padding_mode = padding_mode
        self.value = check_number(value, "value")

    def check(self, batch, pixels, where):
        super().check(batch, pixels, where)
        _, h, w, _ = batch["input"].shape
        if self.padding_mode == "reflect" and self.padding >= min(h, w):
            raise ValueError(
                f"{where}.args.padding: reflect padding must be below the image's height and width "
                f"({h}x{w}), got {self.padding}"
            )

    uniforms = 2

    def draw(self, u, batch):
        return {"top": _index(u[:, 0], 2 * self.padding + 1), "left": _index(u[:, 1], 2 * self.padding + 1)}

    def apply(self, batch, params, pixels):
        x = batch["input"]
        _, h, w, c = x.shape
        p = self.padding
        extra = {"constant_values": jnp.asarray(self.value, x.dtype)} if self.padding_mode == "constant" else {}
        padded = jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0)), mode=self.padding_mode, **extra)
        crop = jax.vmap(lambda image, top, left: lax.dynamic_slice(image, (top, left, 0), (h, w, c)))
        return with_input(batch, crop(padded, params["top"], params["left"]))


class RandomResizedCrop(Op):
    name = "random_resized_crop"

    def __init__(self, scale, ratio):
        self.scale = check_interval(scale, "scale", 0.0, 1.0)
        self.ratio = check_interval(ratio, "ratio", 0.0)

    uniforms = 4

    def draw(self, u, batch):
        _, h, w, _ = batch["input"].shape
        area = h * w * (self.scale[0] + u[:, 0] * (self.scale[1] - self.scale[0]))
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = jnp.exp(log_low + u[:, 1] * (log_high - log_low))
        width = jnp.clip(jnp.sqrt(area * aspect), 1.0, w)
        height = jnp.clip(jnp.sqrt(area / aspect), 1.0, h)
        return {"top": u[:, 2] * (h - height), "left": u[:, 3] * (w - width), "height": height, "width": width}

    @staticmethod
    def weights(start, length, size):
        """(B, size, size) bilinear interpolation matrices: output pixel i reads the source at
        start + (i + 0.5) * length / size - 0.5 (pixel centres), clamped to the image."""
        centres = start[:, None] + (jnp.arange(size) + 0.5) * (length[:, None] / size) - 0.5
        centres = jnp.clip(centres, 0.0, size - 1.0)
        return jnp.maximum(0.0, 1.0 - jnp.abs(centres[:, :, None] - jnp.arange(size)))

    def apply(self, batch, params, pixels):
        x = as_float(batch["input"])
        _, h, w, _ = x.shape
        rows = self.weights(params["top"], params["height"], h).astype(x.dtype)
        cols = self.weights(params["left"], params["width"], w).astype(x.dtype)
        # separable resampling as two batched matmuls: no gather; HIGHEST keeps accelerators at float32
        y = jnp.einsum("bik,bkwc->biwc", rows, x, precision=lax.Precision.HIGHEST)
        y = jnp.einsum("bjl,bilc->bijc", cols, y, precision=lax.Precision.HIGHEST)
        return with_input(batch, y)

    def identity(self, batch, pixels):
        return with_input(batch, as_float(batch["input"]))


class Flip(Op):
    def __init__(self, p, axis, name):
        self.p = check_number(p, "p", 0.0, 1.0)
        self.axis = axis
        self.name = name

    uniforms = 1

    def draw(self, u, batch):
        return {"flip": u[:, 0] < self.p}

    def apply(self, batch, params, pixels):
        x = batch["input"]
        flip = params["flip"].reshape(-1, 1, 1, 1)
        return with_input(batch, jnp.where(flip, lax.rev(x, (self.axis,)), x))


class ColorJitter(Op):
    """Blends each image with a reference by a random factor f in [max(0, 1 - strength), 1 + strength]:
    brightness with black (x f), contrast with the image's mean gray, saturation with each pixel's gray."""

    def __init__(self, strength, name):
        self.strength = check_number(strength, "strength", 0.0, 100.0)
        self.name = name

    def check(self, batch, pixels, where):
        super().check(batch, pixels, where)
        channels = batch["input"].shape[-1]
        if self.name == "saturation" and channels != 3:
            raise ValueError(f"{where}: saturation needs RGB images (3 channels), the input has {channels}")
        if self.name == "contrast" and channels not in (1, 3):
            raise ValueError(f"{where}: contrast needs gray or RGB images (1 or 3 channels), the input has {channels}")

    uniforms = 1

    def draw(self, u, batch):
        low, high = max(0.0, 1.0 - self.strength), 1.0 + self.strength
        return {"factor": low + u[:, 0] * (high - low)}

    @staticmethod
    def gray(x):
        """(B, H, W, 1) luma of (B, H, W, 3) or 1-channel images."""
        if x.shape[-1] == 1:
            return x
        return (x * jnp.asarray(GRAY, x.dtype)).sum(axis=-1, keepdims=True)

    def apply(self, batch, params, pixels):
        x = as_float(batch["input"])
        f = params["factor"].astype(x.dtype).reshape(-1, 1, 1, 1)
        if self.name == "brightness":
            y = x * f
        elif self.name == "contrast":
            mean = self.gray(x).mean(axis=(1, 2, 3), keepdims=True)
            y = mean + f * (x - mean)
        else:
            gray = self.gray(x)
            y = gray + f * (x - gray)
        return with_input(batch, pixels.clip(y))

    def identity(self, batch, pixels):
        return with_input(batch, as_float(batch["input"]))


class RandomErasing(Op):
    name = "random_erasing"

    def __init__(self, p, scale, ratio, value):
        self.p = check_number(p, "p", 0.0, 1.0)
        self.scale = check_interval(scale, "scale", 0.0, 1.0)
        self.ratio = check_interval(ratio, "ratio", 0.0)
        self.value = check_number(value, "value")

    def check(self, batch, pixels, where):
        super().check(batch, pixels, where)
        dtype = batch["input"].dtype
        if jnp.issubdtype(dtype, jnp.integer):
            info = jnp.iinfo(dtype)
            if not (float(self.value).is_integer() and info.min <= self.value <= info.max):
                raise ValueError(
                    f"{where}.args.value: the images are {dtype}, so the value must be an integer "
                    f"from {info.min} to {info.max}, got {self.value:g}"
                )

    uniforms = 5

    def draw(self, u, batch):
        _, h, w, _ = batch["input"].shape
        area = h * w * (self.scale[0] + u[:, 1] * (self.scale[1] - self.scale[0]))
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = jnp.exp(log_low + u[:, 2] * (log_high - log_low))
        height = jnp.clip(jnp.floor(jnp.sqrt(area / aspect) + 0.5), 1, h).astype(jnp.int32)
        width = jnp.clip(jnp.floor(jnp.sqrt(area * aspect) + 0.5), 1, w).astype(jnp.int32)
        return {
            "erase": u[:, 0] < self.p,
            "height": height,
            "width": width,
            "top": _index(u[:, 3], h - height + 1),
            "left": _index(u[:, 4], w - width + 1),
        }

    def apply(self, batch, params, pixels):
        x = batch["input"]
        _, h, w, _ = x.shape
        rows = jnp.arange(h)[None, :]
        cols = jnp.arange(w)[None, :]
        in_rows = (rows >= params["top"][:, None]) & (rows < (params["top"] + params["height"])[:, None])
        in_cols = (cols >= params["left"][:, None]) & (cols < (params["left"] + params["width"])[:, None])
        box = params["erase"][:, None, None] & in_rows[:, :, None] & in_cols[:, None, :]
        return with_input(batch, jnp.where(box[..., None], jnp.asarray(self.value, x.dtype), x))


class Normalize(Op):
    name = "normalize"
    random = False
    image = False

    def __init__(self, mean, std, scale):
        self.mean = _per_channel(mean, "mean", 0.0)
        self.std = _per_channel(std, "std", 1.0, positive=True)
        self.scale = None if scale is None else check_number(scale, "scale", 0.0, open_low=True)
        if len(self.mean) > 1 and len(self.std) > 1 and len(self.mean) != len(self.std):
            raise ValueError(f"std: {len(self.std)} values, but mean has {len(self.mean)}")

    def check(self, batch, pixels, where):
        super().check(batch, pixels, where)
        channels = batch["input"].shape[-1]
        for name, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, channels):
                raise ValueError(
                    f"{where}.args.{name}: {len(values)} values, but the input has {channels} "
                    f"channel(s) (its last axis)"
                )

    def pixel_scale(self, pixels: Pixels) -> float:
        if self.scale is not None:
            return self.scale
        return 1.0 if pixels.max_value is None else 1.0 / pixels.max_value

    def identity(self, batch, pixels):
        x = batch["input"].astype(jnp.float32)
        mean, std = jnp.asarray(self.mean, jnp.float32), jnp.asarray(self.std, jnp.float32)
        y = (x * jnp.float32(self.pixel_scale(pixels)) - mean) / std
        pixels.max_value = None  # from here on values are normalised, not pixels: nothing clips them
        return with_input(batch, y)
