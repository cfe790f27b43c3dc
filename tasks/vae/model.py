"""The VAE as a model a config names (``vae``), and its decoder alone (``vae_decoder``), which takes latent vectors
and so samples images from the prior once it holds a trained VAE's ``decoder`` params (``decoder_params``).

In training the model draws ``z = mean + exp(log_var / 2) * eps`` with the key the training step gives every model
(the one dropout uses); in evaluation ``z`` is the mean, so test.py and the export are deterministic.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from model.modules.activations import Activation
from model.modules.flatten import Flatten
from model.modules.linear import Linear
from model.modules.module import Lambda, Module, check_size, check_sizes, shape_of
from model.modules.sequential import Sequential
from model.registry import register


def decoder_of(latent: int, hidden: tuple, image_shape: tuple) -> Sequential:
    """Latent vectors (B, latent) -> pixel logits (B, *image_shape): dense layers, then the image's shape."""
    layers = {}
    for i, width in enumerate(reversed(hidden)):
        layers[f"fc{i}"] = Linear(width)
        layers[f"act{i}"] = Activation("relu")
    layers["out"] = Linear(math.prod(image_shape))
    layers["image"] = Lambda(lambda x: x.reshape(x.shape[0], *image_shape), "to_image")
    return Sequential(layers)


class VAE(Module):
    """Images (B, H, W, C) -> ``{"reconstruction": pixel logits (B, H, W, C), "mean": (B, latent), "log_var": (B,
    latent)}``; params ``{"encoder": ..., "decoder": ...}``."""

    def __init__(self, latent: int, hidden: tuple):
        self.latent, self.hidden = latent, tuple(hidden)

    def encoder(self) -> Sequential:
        layers = {"flatten": Flatten()}
        for i, width in enumerate(self.hidden):
            layers[f"fc{i}"] = Linear(width)
            layers[f"act{i}"] = Activation("relu")
        layers["out"] = Linear(2 * self.latent)  # the mean and the log-variance of q(z | x)
        return Sequential(layers)

    def children(self):
        return {"encoder": self.encoder()}

    def init(self, key, x):
        x = shape_of(x)
        encoder, decoder = self.encoder(), decoder_of(self.latent, self.hidden, x.shape[1:])
        encoder_params, _ = encoder.init(jax.random.fold_in(key, 0), x)
        z = jax.ShapeDtypeStruct((x.shape[0], self.latent), x.dtype)
        decoder_params, _ = decoder.init(jax.random.fold_in(key, 1), z)
        return {"encoder": encoder_params, "decoder": decoder_params}, {}

    def __call__(self, params, state, x, *, train=False, key=None):
        h, _ = self.encoder()(params["encoder"], _no_state(params["encoder"]), x)
        mean, log_var = jnp.split(h, 2, axis=-1)
        if train:
            if key is None:
                raise ValueError("vae: sampling in training needs a PRNG key: call the model with key=...")
            z = mean + jnp.exp(0.5 * log_var) * jax.random.normal(key, mean.shape, mean.dtype)
        else:
            z = mean  # evaluation and the export: deterministic
        decoder = decoder_of(self.latent, self.hidden, x.shape[1:])
        logits, _ = decoder(params["decoder"], _no_state(params["decoder"]), z)
        return {"reconstruction": logits, "mean": mean, "log_var": log_var}, state


def _no_state(params: dict) -> dict:
    """The state of a Sequential of stateless layers: empty, one entry per layer (each has an entry in params)."""
    return {name: {} for name in params}


@register("model", example=({"latent": 2, "hidden": (8,)}, (8, 8, 1), "normal"))
def vae(latent: int = 16, hidden: tuple = (256,)) -> Module:
    """A variational autoencoder: an MLP encoder to a Gaussian q(z | x) of ``latent`` dimensions, a sample of it in
    training (its mean in evaluation), an MLP decoder back to pixel logits of the input's shape. Its outputs are
    named: ``reconstruction``, ``mean`` and ``log_var`` (the loss ``vae_loss`` takes them all)."""
    check_size(latent, "latent")
    check_sizes(hidden, "hidden", nonempty=True)
    return VAE(latent, hidden)


@register("model", example=({"latent": 2, "hidden": (8,), "image_shape": (8, 8, 1)}, (2,), "normal"))
def vae_decoder(latent: int = 16, hidden: tuple = (256,), image_shape: tuple = (28, 28, 1)) -> Module:
    """The decoder of ``vae`` alone: latent vectors (B, latent) -> pixel logits (B, *image_shape); a sample of the
    prior N(0, I) through it is a new image (the sigmoid of its logits). Its params are a trained VAE's
    ``params["decoder"]`` (``decoder_params``)."""
    check_size(latent, "latent")
    check_sizes(hidden, "hidden", nonempty=True)
    check_sizes(image_shape, "image_shape", nonempty=True)
    return decoder_of(latent, tuple(hidden), tuple(image_shape))


def decoder_params(vae_params: dict) -> dict:
    """A trained VAE's params as its decoder's (``vae_decoder`` with the same ``latent`` and ``hidden``)."""
    return vae_params["decoder"]
