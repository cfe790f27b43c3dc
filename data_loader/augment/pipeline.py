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

Add an op by writing its class (``data_loader/augment/ops.py``) and a factory here that returns it, decorated with
``@register("augment")``: the factory's keyword arguments are the config's ``args``, checked by the constructor
(ValueError "name: ...") before any data is read.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from data_loader.augment.mixing import Mix
from data_loader.augment.ops import (
    ColorJitter,
    Flip,
    Normalize,
    Op,
    Pixels,
    RandomCrop,
    RandomErasing,
    RandomResizedCrop,
)
from model.registry import register


@register("augment")
def random_crop(padding: int = 4, padding_mode: str = "constant", value: float = 0.0) -> Op:
    """Pads each side by ``padding`` pixels (``padding_mode`` constant (``value``), reflect or edge) and crops a
    window of the original size at a random offset: a random shift of up to ``padding`` pixels each way."""
    return RandomCrop(padding, padding_mode, value)


@register("augment")
def random_resized_crop(scale: tuple = (0.08, 1.0), ratio: tuple = (3 / 4, 4 / 3)) -> Op:
    """A random box of ``scale`` (fraction of the area) and aspect ratio ``ratio`` (width / height, drawn
    log-uniformly), clipped to the image, resampled bilinearly to the image's size. Float32 out."""
    return RandomResizedCrop(scale, ratio)


@register("augment")
def flip_horizontal(p: float = 0.5) -> Op:
    """Mirrors each image left-right with probability ``p``."""
    return Flip(p, 2, "flip_horizontal")


@register("augment")
def flip_vertical(p: float = 0.5) -> Op:
    """Mirrors each image top-bottom with probability ``p``."""
    return Flip(p, 1, "flip_vertical")


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


@register("augment")
def random_erasing(p: float = 0.5, scale: tuple = (0.02, 0.33), ratio: tuple = (0.3, 3.3), value: float = 0.0) -> Op:
    """Cutout: with probability ``p`` fills a random box of ``scale`` (fraction of the area) and aspect ``ratio``
    (width / height, log-uniform) with ``value`` in every channel. After ``normalize``, 0 is the mean pixel."""
    return RandomErasing(p, scale, ratio, value)


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


def input_range(loader, augment: Augment | None) -> dict:
    """{"input_range": [min, max]} of what the model takes, over the real examples of the loader's first batch (after
    the augmentation's deterministic part): predict.py warns when a user's input falls far outside it (an image of
    0..255 given to a model trained on 0..1). Empty for named inputs, which have a range each."""
    batch = next(loader.batches(0, whole=True))
    if isinstance(batch["input"], dict):
        return {}
    if augment is not None:
        batch = jax.device_get(augment(batch, None, train=False))
    x = np.asarray(batch["input"])
    real = np.asarray(batch["mask"]).reshape(len(x), -1).max(axis=1) > 0
    x = x[real] if real.any() else x
    return {"input_range": [float(x.min()), float(x.max())]}
