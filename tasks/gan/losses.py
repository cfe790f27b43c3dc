"""The GAN's two objectives, per example, with the discriminator's logit s = D(x) (high: "real"):

    discriminator: -log sigmoid(D(real)) - log(1 - sigmoid(D(G(z)))) = softplus(-D(real)) + softplus(D(G(z)))
    generator (non-saturating): -log sigmoid(D(G(z))) = softplus(-D(G(z)))

``gan_generator_loss`` is the config's loss: what evaluation reports (val/loss, on fixed latent vectors) and the
generator's objective in ``step.py``; ``fooled`` is the share of generated images the discriminator takes for real.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.registry import register
from training.metrics import Metric


def _score(outputs) -> jax.Array:
    if not isinstance(outputs, dict) or "score" not in outputs:
        raise ValueError("expected the gan model's outputs image and score")
    return outputs["score"].astype(jnp.float32)


@register("loss")
def gan_generator_loss(outputs: dict, images: jax.Array, *, mask=None) -> jax.Array:
    """The generator's non-saturating loss of each example (B,): softplus(-D(G(z))). ``images`` (the real ones, the
    batch's target) do not enter it: the discriminator judged them in its own update."""
    if mask is not None:
        raise ValueError("gan_generator_loss: a per-element mask is not taken (one value per example)")
    return jax.nn.softplus(-_score(outputs))


def discriminator_loss(real_scores: jax.Array, fake_scores: jax.Array) -> jax.Array:
    """The discriminator's loss of each example (B,): softplus(-D(real)) + softplus(D(G(z)))."""
    return jax.nn.softplus(-real_scores.astype(jnp.float32)) + jax.nn.softplus(fake_scores.astype(jnp.float32))


@register("metrics")
def fooled() -> Metric:
    """The share of generated images the discriminator scores as real (logit > 0)."""

    def stats(outputs, targets, mask=None):
        hits = (_score(outputs) > 0).astype(jnp.float32)
        weights = jnp.ones_like(hits) if mask is None else jnp.asarray(mask, jnp.float32).reshape(hits.shape)
        return {"sum": jnp.where(weights > 0, weights * hits, 0.0).sum(), "count": weights.sum()}

    def result(summed):
        return jnp.where(summed["count"] > 0, summed["sum"] / jnp.maximum(summed["count"], 1e-30), 0.0)

    return Metric("fooled", stats, result)
