"""Mixing examples with each other: mixup and cutmix, each example with its partner (example B - 1 - i), the
targets made soft; and the Beta draws their mixing weight takes, from the example's uniform numbers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from data_loader.augment.ops import Op, Pixels, as_float, with_input
from model.checks import check_number

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
            x = as_float(x)
            weight = lam.astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
            mixed = weight * x + (1 - weight) * _flip_batch(x)
        else:
            _, h, w, _ = x.shape
            rows, cols = jnp.arange(h)[None, :], jnp.arange(w)[None, :]
            in_rows = (rows >= params["top"][:, None]) & (rows < params["bottom"][:, None])
            in_cols = (cols >= params["left"][:, None]) & (cols < params["right"][:, None])
            box = in_rows[:, :, None, None] & in_cols[:, None, :, None]
            mixed = jnp.where(box, _flip_batch(x), x)
        out = with_input(batch, mixed)
        target = _soft_targets(batch, pixels, "augment", self.name)
        if target is not None:
            out["target"] = lam[:, None] * target + (1 - lam[:, None]) * _flip_batch(target)
        return out

    def identity(self, batch, pixels):
        return with_input(batch, as_float(batch["input"])) if self.name == "mixup" else batch
