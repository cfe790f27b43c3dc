"""Data augmentation on the device: a list of ops that runs inside the jitted training call, before the forward pass.

A train loader's spec may carry ``"augment"``, a list of ``{"name", "args"}`` components applied in order:

    "train": {"name": "cifar10", "args": {...},
              "augment": [{"name": "random_crop", "args": {"padding": 4}}, {"name": "flip_horizontal"},
                          {"name": "normalize", "args": {"mean": [0.4914, 0.4822, 0.4465],
                                                         "std": [0.2470, 0.2435, 0.2616]}}]}

Each op is pure jnp over the whole batch (no Python per example). In training each example draws one stream of
uniform numbers from ``fold_in(key, example index)``, the key being the step's (run seed, step), and each random op
takes its parameters from the next numbers of it: a run is reproducible, a resumed one bit-exact, and one example's
draws do not depend on the batch around it (nor on how it is sharded over devices). In
evaluation (``train=False``) random ops are the identity and deterministic work still happens: ``normalize``, and the
conversion to float32 of the ops whose training output is float (so training and evaluation give the model the same
dtype).

Images are (batch, height, width, channels). Ops before ``normalize`` see pixels: on integer images (uint8) the
colour ops clip to the dtype's range (0..255); float images are not clipped (they may already be normalised).
``normalize`` turns pixels into ``(x * scale - mean) / std`` in float32, ``scale`` being 1/255 for uint8 images
unless given; its numbers are written into the run's ``preprocessing.json`` (``pixel_scale``, ``mean``, ``std``), so
``inference/predict.py`` prepares an image file exactly as training did.

Add an op by writing a factory here that returns an ``Op`` and listing it in ``__all__``: its keyword arguments are
the config's ``args``, checked by the constructor (ValueError "name: ...") before any data is read.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from model.checks import check_interval, check_number
from model.registry import register

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


def _float(x):
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _index(u, count):
    """floor(u * count) as int32, at most count - 1 (count may be an array)."""
    return jnp.minimum(jnp.floor(u * count), count - 1).astype(jnp.int32)


GAMMA_TRIES = 16  # candidates per gamma draw; all 16 rejected has probability below 1e-20
BETA_UNIFORMS = 2 * (2 * GAMMA_TRIES + 1)  # uniform numbers one Beta draw takes


def _log_gamma(u, alpha: float):
    """log of Gamma(alpha, 1) draws (...,) from uniform numbers (..., 2 * GAMMA_TRIES + 1), by Marsaglia and
    Tsang's method without a loop: GAMMA_TRIES candidates at once, the first accepted one kept (each is accepted
    with probability >= 0.95 at the shape used, alpha + 1 when alpha < 1, boosted back by U ** (1 / alpha)).
    jax.random.gamma's rejection loop and its extra random streams cost seconds of compile time per step."""
    shape = alpha + 1.0 if alpha < 1.0 else alpha
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    tiny = jnp.finfo(u.dtype).tiny
    t = GAMMA_TRIES
    z = math.sqrt(2.0) * lax.erf_inv(jnp.clip(2.0 * u[..., :t] - 1.0, -1.0 + 1e-7, 1.0 - 1e-7))  # standard normal
    accept_u = jnp.maximum(u[..., t : 2 * t], tiny)
    v = (1.0 + c * z) ** 3
    safe_v = jnp.where(v > 0, v, 1.0)
    accept = (v > 0) & (jnp.log(accept_u) < 0.5 * z * z + d - d * safe_v + d * jnp.log(safe_v))
    first = jnp.argmax(accept, axis=-1)
    chosen = jnp.take_along_axis(safe_v, first[..., None], axis=-1)[..., 0]
    log_value = jnp.log(d * jnp.where(accept.any(axis=-1), chosen, 1.0))
    if alpha < 1.0:
        log_value = log_value + jnp.log(jnp.maximum(u[..., 2 * t], tiny)) / alpha
    return log_value


def beta_from_uniform(u, alpha: float):
    """Beta(alpha, alpha) draws (...,) from uniform numbers (..., BETA_UNIFORMS): G1 / (G1 + G2) of two gamma
    draws, computed from their logs (small alphas give gamma draws that underflow float32)."""
    half = BETA_UNIFORMS // 2
    return jax.nn.sigmoid(_log_gamma(u[..., :half], alpha) - _log_gamma(u[..., half:], alpha))


def _flip_batch(x):
    """The partner of example i is example B - 1 - i (the batch order is already shuffled)."""
    return lax.rev(x, (0,))


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


def _with_input(batch: dict, x) -> dict:
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
        return _with_input(batch, crop(padded, params["top"], params["left"]))


@register("augment")
def random_crop(padding: int = 4, padding_mode: str = "constant", value: float = 0.0) -> Op:
    """Pads each side by ``padding`` pixels (``padding_mode`` constant (``value``), reflect or edge) and crops a
    window of the original size at a random offset: a random shift of up to ``padding`` pixels each way."""
    return RandomCrop(padding, padding_mode, value)


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
        x = _float(batch["input"])
        _, h, w, _ = x.shape
        rows = self.weights(params["top"], params["height"], h).astype(x.dtype)
        cols = self.weights(params["left"], params["width"], w).astype(x.dtype)
        # separable resampling as two batched matmuls: no gather; HIGHEST keeps accelerators at float32
        y = jnp.einsum("bik,bkwc->biwc", rows, x, precision=lax.Precision.HIGHEST)
        y = jnp.einsum("bjl,bilc->bijc", cols, y, precision=lax.Precision.HIGHEST)
        return _with_input(batch, y)

    def identity(self, batch, pixels):
        return _with_input(batch, _float(batch["input"]))


@register("augment")
def random_resized_crop(scale: tuple = (0.08, 1.0), ratio: tuple = (3 / 4, 4 / 3)) -> Op:
    """A random box of ``scale`` (fraction of the area) and aspect ratio ``ratio`` (width / height, drawn
    log-uniformly), clipped to the image, resampled bilinearly to the image's size. Float32 out."""
    return RandomResizedCrop(scale, ratio)


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
        return _with_input(batch, jnp.where(flip, lax.rev(x, (self.axis,)), x))


@register("augment")
def flip_horizontal(p: float = 0.5) -> Op:
    """Mirrors each image left-right with probability ``p``."""
    return Flip(p, 2, "flip_horizontal")


@register("augment")
def flip_vertical(p: float = 0.5) -> Op:
    """Mirrors each image top-bottom with probability ``p``."""
    return Flip(p, 1, "flip_vertical")


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
        x = _float(batch["input"])
        f = params["factor"].astype(x.dtype).reshape(-1, 1, 1, 1)
        if self.name == "brightness":
            y = x * f
        elif self.name == "contrast":
            mean = self.gray(x).mean(axis=(1, 2, 3), keepdims=True)
            y = mean + f * (x - mean)
        else:
            gray = self.gray(x)
            y = gray + f * (x - gray)
        return _with_input(batch, pixels.clip(y))

    def identity(self, batch, pixels):
        return _with_input(batch, _float(batch["input"]))


@register("augment")
def brightness(strength: float = 0.4) -> Op:
    """Multiplies each image by a random factor in [max(0, 1 - strength), 1 + strength]. Float32 out."""
    return ColorJitter(strength, "brightness")


@register("augment")
def contrast(strength: float = 0.4) -> Op:
    """Moves each image towards (factor < 1) or away from its mean gray by a random factor in
    [max(0, 1 - strength), 1 + strength]. Float32 out."""
    return ColorJitter(strength, "contrast")


@register("augment")
def saturation(strength: float = 0.4) -> Op:
    """Moves each RGB pixel towards (factor < 1) or away from its gray by a random factor in
    [max(0, 1 - strength), 1 + strength]; factor 0 is a gray image. Float32 out."""
    return ColorJitter(strength, "saturation")


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
        return _with_input(batch, jnp.where(box[..., None], jnp.asarray(self.value, x.dtype), x))


@register("augment")
def random_erasing(p: float = 0.5, scale: tuple = (0.02, 0.33), ratio: tuple = (0.3, 3.3), value: float = 0.0) -> Op:
    """Cutout: with probability ``p`` fills a random box of ``scale`` (fraction of the area) and aspect ``ratio``
    (width / height, log-uniform) with ``value`` in every channel. After ``normalize``, 0 is the mean pixel."""
    return RandomErasing(p, scale, ratio, value)


def _soft_targets(batch: dict, pixels: Pixels, where: str, name: str):
    """The targets as probabilities (B, C): class ids one-hot over the model's C outputs; None without targets."""
    if "target" not in batch:
        return None
    target = batch["target"]
    outputs = pixels.outputs
    classes = None if outputs is None else outputs.shape[-1]
    if jnp.issubdtype(target.dtype, jnp.integer) and target.ndim == 1:
        if classes is None:
            raise ValueError(f"{where}: {name} needs the model's class count to one-hot the labels")
        return jax.nn.one_hot(target, classes, dtype=jnp.float32)
    if target.ndim == 2 and (classes is None or target.shape[-1] == classes):
        return target.astype(jnp.float32)
    raise ValueError(
        f"{where}: {name} mixes class labels: targets of class ids (batch,) or probabilities "
        f"(batch, classes), got {target.dtype} {list(target.shape)}"
    )


class Mix(Op):
    """Mixup and CutMix: each example with its partner (example B - 1 - i); the targets become soft."""

    def __init__(self, alpha, p, name):
        self.alpha = check_number(alpha, "alpha", 0.0, 1000.0, open_low=True)
        self.p = check_number(p, "p", 0.0, 1.0)
        self.name = name
        self.image = name == "cutmix"

    def check(self, batch, pixels, where):
        super().check(batch, pixels, where)
        if pixels.outputs is not None:  # evaluation leaves targets alone; the shapes are checked where they mix
            _soft_targets(batch, pixels, where, self.name)

    uniforms = BETA_UNIFORMS + 3

    def draw(self, u, batch):
        lam = jnp.where(u[:, -3] < self.p, beta_from_uniform(u[:, :BETA_UNIFORMS], self.alpha), 1.0)
        centre = u[:, -2:]
        if self.name == "mixup":
            return {"lam": lam}
        _, h, w, _ = batch["input"].shape
        cut = jnp.sqrt(1.0 - lam)
        cy, cx = centre[:, 0] * h, centre[:, 1] * w
        half_h, half_w = cut * h / 2, cut * w / 2
        top = jnp.clip(jnp.floor(cy - half_h + 0.5), 0, h).astype(jnp.int32)
        bottom = jnp.clip(jnp.floor(cy + half_h + 0.5), 0, h).astype(jnp.int32)
        left = jnp.clip(jnp.floor(cx - half_w + 0.5), 0, w).astype(jnp.int32)
        right = jnp.clip(jnp.floor(cx + half_w + 0.5), 0, w).astype(jnp.int32)
        # the label weight is the share of pixels kept, after the box was clipped to the image
        kept = 1.0 - ((bottom - top) * (right - left)).astype(jnp.float32) / (h * w)
        return {"lam": kept, "top": top, "bottom": bottom, "left": left, "right": right}

    def apply(self, batch, params, pixels):
        x = batch["input"]
        lam = params["lam"]
        if self.name == "mixup":
            x = _float(x)
            weight = lam.astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
            mixed = weight * x + (1 - weight) * _flip_batch(x)
        else:
            _, h, w, _ = x.shape
            rows, cols = jnp.arange(h)[None, :], jnp.arange(w)[None, :]
            in_rows = (rows >= params["top"][:, None]) & (rows < params["bottom"][:, None])
            in_cols = (cols >= params["left"][:, None]) & (cols < params["right"][:, None])
            box = in_rows[:, :, None, None] & in_cols[:, None, :, None]
            mixed = jnp.where(box, _flip_batch(x), x)
        out = _with_input(batch, mixed)
        target = _soft_targets(batch, pixels, "augment", self.name)
        if target is not None:
            out["target"] = lam[:, None] * target + (1 - lam[:, None]) * _flip_batch(target)
        return out

    def identity(self, batch, pixels):
        return _with_input(batch, _float(batch["input"])) if self.name == "mixup" else batch


@register("augment")
def mixup(alpha: float = 0.2, p: float = 1.0) -> Op:
    """With probability ``p``, each example becomes lam x + (1 - lam) x' with its partner x' (example B - 1 - i),
    lam ~ Beta(alpha, alpha) per example, and its target the same mix of the two one-hot (or soft) targets. Works
    on any input array (features too); float32 out."""
    return Mix(alpha, p, "mixup")


@register("augment")
def cutmix(alpha: float = 1.0, p: float = 1.0) -> Op:
    """With probability ``p``, pastes a box of the partner image (example B - 1 - i) into each image: lam ~
    Beta(alpha, alpha), a box of (1 - lam) of the area centred at a random pixel and clipped to the image; the
    target mixes the two by the share of pixels each contributes."""
    return Mix(alpha, p, "cutmix")


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
        return _with_input(batch, y)


@register("augment")
def normalize(mean: Any = None, std: Any = None, scale: float | None = None) -> Op:
    """(x * scale - mean) / std in float32, ``mean`` and ``std`` one number or one per channel (default 0 and 1);
    ``scale`` defaults to 1/255 for uint8 images (1 / the integer dtype's maximum) and 1 for float ones. Applied in
    evaluation too, and recorded in preprocessing.json for predict.py."""
    return Normalize(mean, std, scale)


# ------------------------------------------------------------------------------------------------------- the list
def uniforms(key, count: int, n: int):
    """(count, n) uniform numbers in [0, 1): row i from fold_in(key, i) alone, so an example's draws depend on its
    index in the batch and the step's key, never on the other examples (or on how the batch is sharded)."""
    return jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i), (max(n, 1),)))(jnp.arange(count))


class Augment:
    """The configured ops in order: ``augment(batch, key, train=..., outputs=...) -> batch``.

    ``key``: the step's PRNG key (None in evaluation); ``outputs``: the model output's abstract value
    (``jax.ShapeDtypeStruct``), whose last axis is the class count mixup and cutmix one-hot integer labels with."""

    def __init__(self, ops: list[Op], where: str = "data_loader.train.augment"):
        self.ops = list(ops)
        self.where = where
        normalizing = [i for i, op in enumerate(self.ops) if isinstance(op, Normalize)]
        if len(normalizing) > 1:
            raise ValueError(
                f"{where}.{normalizing[1]}: normalize appears twice (at {normalizing[0]} too); give it "
                "once, with the combined numbers"
            )

    def __call__(self, batch: dict, key=None, *, train: bool, outputs=None) -> dict:
        if train and key is None:
            raise ValueError("augment: training needs the step's key")
        batch = dict(batch)
        x = batch["input"]
        dtype = None if isinstance(x, dict) else x.dtype
        integer = dtype is not None and jnp.issubdtype(dtype, jnp.integer)
        pixels = Pixels(float(jnp.iinfo(dtype).max) if integer else None, outputs)
        if train:
            # one stream per example, fold_in(key, example index); each random op takes the next columns of it
            u = uniforms(key, jax.tree.leaves(x)[0].shape[0], sum(op.uniforms for op in self.ops if op.random))
        used = 0
        for position, op in enumerate(self.ops):
            op.check(batch, pixels, f"{self.where}.{position}")
            if train and op.random:
                batch = op.apply(batch, op.draw(u[:, used : used + op.uniforms], batch), pixels)
                used += op.uniforms
            else:
                batch = op.identity(batch, pixels)
        return batch

    def spec(self, batch_spec: dict) -> dict:
        """The batch as evaluation gives it to the model (abstract: shapes and dtypes), from the loader's spec."""
        return jax.eval_shape(lambda b: self(b, None, train=False), batch_spec)

    def preprocessing(self, data: dict, batch_spec: dict) -> dict:
        """The data set's preprocessing with this list's normalisation folded in: the model input is
        (pixel * pixel_scale - mean) / std, as predict.py computes it, whatever normalised before (the data set,
        or nothing)."""
        op = next((op for op in self.ops if isinstance(op, Normalize)), None)
        if op is None:
            return dict(data)
        x = batch_spec["input"]
        dtype = None if isinstance(x, dict) else x.dtype
        integer = dtype is not None and np.issubdtype(np.dtype(dtype), np.integer)
        scale = op.pixel_scale(Pixels(float(np.iinfo(dtype).max) if integer else None, None))
        # the data set's own x0 = (pixel * s0 - m0) / d0, then x1 = (x0 * scale - mean) / std
        s0 = np.asarray(data.get("pixel_scale", 1.0), np.float64)
        m0 = np.asarray(data.get("mean", 0.0), np.float64)
        d0 = np.asarray(data.get("std", 1.0), np.float64)
        mean, std = np.asarray(op.mean, np.float64), np.asarray(op.std, np.float64)
        pixel_scale = s0 * scale / d0
        shift = m0 * scale / d0 + mean

        def plain(a):  # one number when every channel shares it, else a list per channel
            values = [float(v) for v in np.ravel(a)]
            return values[0] if len(set(values)) == 1 and np.ndim(a) == 0 else values

        return {**data, "pixel_scale": plain(pixel_scale), "mean": plain(shift), "std": plain(std)}

    def __repr__(self):
        return f"Augment([{', '.join(map(repr, self.ops))}])"


class Prepared:
    """A loader whose batches come out as evaluation gives them to the model: the list's deterministic part applied
    (one jitted call per batch, numpy out). For tools that feed the model outside the steps, such as the export's
    parity checks on real data. Everything else is the loader's."""

    def __init__(self, loader, augment: Augment):
        self.loader = loader
        self.augment = augment
        self._prepare = jax.jit(lambda b: augment(b, None, train=False))

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __len__(self):
        return len(self.loader)

    @property
    def spec(self) -> dict:
        return self.augment.spec(self.loader.spec)

    def batches(self, epoch: int = 0, start: int = 0):
        for batch in self.loader.batches(epoch, start):
            yield jax.device_get(self._prepare(batch))
