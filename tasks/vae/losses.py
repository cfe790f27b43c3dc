"""The VAE's objective, the negative evidence lower bound per example, and its two terms as metrics of their own
(``kl``, ``reconstruction``), logged every epoch beside the loss (train/kl, val/kl).

    loss = reconstruction + beta * KL(q(z | x) || N(0, I))
    KL = 1/2 sum_j (exp(log_var_j) + mean_j^2 - 1 - log_var_j)
    reconstruction = sum over pixels of -log p(x | z): Bernoulli (pixels in [0, 1], the decoder's logits), or a
                     unit Gaussian around the logits taken as values (1/2 squared error), constant dropped

Sums over pixels and latent dimensions, as the ELBO is written (a mean over pixels would weigh the KL by the image's
size); the training step averages the examples.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.checks import check_range
from model.registry import register
from training.metrics import Metric

LIKELIHOODS = ("bernoulli", "gaussian")


def _check_likelihood(likelihood: str = "bernoulli") -> None:
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood: expected one of {', '.join(LIKELIHOODS)}, got {likelihood!r}")


def _check_vae_loss(beta: float = 1.0, likelihood: str = "bernoulli") -> None:
    check_range(beta, "beta")
    _check_likelihood(likelihood)


def _parts(outputs) -> tuple[jax.Array, jax.Array, jax.Array]:
    if not isinstance(outputs, dict) or not {"reconstruction", "mean", "log_var"} <= set(outputs):
        found = f"outputs {sorted(outputs)}" if isinstance(outputs, dict) else "one output"
        raise ValueError(f"expected the vae model's outputs reconstruction, mean and log_var, got {found}")
    return outputs["reconstruction"], outputs["mean"], outputs["log_var"]


def kl_per_example(mean: jax.Array, log_var: jax.Array) -> jax.Array:
    """KL(N(mean, exp(log_var)) || N(0, I)) of each example, summed over the latent dimensions: (B,)."""
    return 0.5 * (jnp.exp(log_var) + jnp.square(mean) - 1.0 - log_var).sum(axis=-1)


def reconstruction_per_example(logits: jax.Array, images: jax.Array, likelihood: str = "bernoulli") -> jax.Array:
    """-log p(x | z) of each example, summed over its pixels: (B,)."""
    if logits.shape != images.shape:
        raise ValueError(f"reconstruction of shape {logits.shape} and images of shape {images.shape} differ")
    images = images.astype(logits.dtype)
    if likelihood == "bernoulli":  # softplus(l) - l x: the sigmoid cross-entropy, stable at large |l|
        terms = jax.nn.softplus(logits) - logits * images
    else:
        terms = 0.5 * jnp.square(logits - images)
    return terms.reshape(terms.shape[0], -1).sum(axis=1)


@register("loss", check=_check_vae_loss)
def vae_loss(
    outputs: dict, images: jax.Array, *, beta: float = 1.0, likelihood: str = "bernoulli", mask=None
) -> jax.Array:
    """The negative ELBO of each example (B,): reconstruction + ``beta`` x KL (beta 1: the VAE; above 1: a
    beta-VAE). ``images``: the batch's input (a loader without a target) or a target of the same shape."""
    if mask is not None:
        raise ValueError("vae_loss: a per-element mask is not taken (one value per example)")
    logits, mean, log_var = _parts(outputs)
    return reconstruction_per_example(logits, images, likelihood) + beta * kl_per_example(mean, log_var)


def _mean_metric(name: str, per_example) -> Metric:
    """A metric that is the mean over the (unmasked) examples of ``per_example(outputs, targets)``."""

    def stats(outputs, targets, mask=None):
        values = per_example(outputs, targets).astype(jnp.float32)
        weights = jnp.ones_like(values) if mask is None else jnp.asarray(mask, jnp.float32).reshape(values.shape)
        # where, not a bare product: a padded example may hold anything, and must add exactly 0
        return {"sum": jnp.where(weights > 0, weights * values, 0.0).sum(), "count": weights.sum()}

    def result(summed):
        return jnp.where(summed["count"] > 0, summed["sum"] / jnp.maximum(summed["count"], 1e-30), 0.0)

    return Metric(name, stats, result)


@register("metrics")
def kl() -> Metric:
    """The KL term of the VAE's loss, KL(q(z | x) || N(0, I)) per example, its mean over the examples."""
    return _mean_metric("kl", lambda outputs, _: kl_per_example(*_parts(outputs)[1:]))


@register("metrics", check=_check_likelihood)
def reconstruction(likelihood: str = "bernoulli") -> Metric:
    """The reconstruction term of the VAE's loss, -log p(x | z) per example, its mean over the examples."""
    _check_likelihood(likelihood)
    return _mean_metric(
        "reconstruction", lambda outputs, images: reconstruction_per_example(_parts(outputs)[0], images, likelihood)
    )
