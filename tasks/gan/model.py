"""The GAN as one model a config names (``gan``): params ``{"generator": ..., "discriminator": ...}``, so each
player is a group of parameters (``optimizer.groups``) and its own optimizer updates it alone.

Its call is what evaluation, test.py and the export run: latent vectors (B, latent) -> ``{"image": the generator's
images (B, *image_shape) in [0, 1], "score": the discriminator's logit of each (B,), high: "real"}``. The training
step (``step.py``) calls the players apart: ``generate`` and ``discriminate``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from model.modules.activations import Activation
from model.modules.flatten import Flatten
from model.modules.linear import Linear
from model.modules.module import Lambda, Module, check_sizes, shape_of
from model.modules.sequential import Sequential
from model.registry import register


def leaky_relu(x):
    return jax.numpy.maximum(x, 0.2 * x)


def generator_of(hidden: tuple, image_shape: tuple) -> Sequential:
    layers = {}
    for i, width in enumerate(hidden):
        layers[f"fc{i}"] = Linear(width)
        layers[f"act{i}"] = Lambda(leaky_relu, "leaky_relu")  # dead units would leave parts of z unused
    layers["out"] = Linear(math.prod(image_shape))
    layers["pixels"] = Activation("sigmoid")  # MNIST's pixels lie in [0, 1]
    layers["image"] = Lambda(lambda x: x.reshape(x.shape[0], *image_shape), "to_image")
    return Sequential(layers)


def discriminator_of(hidden: tuple) -> Sequential:
    layers = {"flatten": Flatten()}
    for i, width in enumerate(reversed(hidden)):
        layers[f"fc{i}"] = Linear(width)
        layers[f"act{i}"] = Lambda(leaky_relu, "leaky_relu")  # the generator learns through these gradients
    layers["out"] = Linear(1)
    layers["score"] = Lambda(lambda x: jnp.squeeze(x, axis=-1), "squeeze")
    return Sequential(layers)


class GAN(Module):
    def __init__(self, hidden: tuple, image_shape: tuple):
        self.hidden, self.image_shape = tuple(hidden), tuple(image_shape)

    def children(self):
        return {
            "generator": generator_of(self.hidden, self.image_shape),
            "discriminator": discriminator_of(self.hidden),
        }

    def init(self, key, z):
        z = shape_of(z)
        players = self.children()
        generator, _ = players["generator"].init(jax.random.fold_in(key, 0), z)
        image = jax.ShapeDtypeStruct((z.shape[0], *self.image_shape), z.dtype)
        discriminator, _ = players["discriminator"].init(jax.random.fold_in(key, 1), image)
        return {"generator": generator, "discriminator": discriminator}, {}

    def generate(self, params, z):
        """Latent vectors (B, latent) -> images (B, *image_shape) in [0, 1]."""
        layers = params["generator"]
        return generator_of(self.hidden, self.image_shape)(layers, {name: {} for name in layers}, z)[0]

    def discriminate(self, params, images):
        """Images -> the discriminator's logit of each (B,)."""
        layers = params["discriminator"]
        return discriminator_of(self.hidden)(layers, {name: {} for name in layers}, images)[0]

    def __call__(self, params, state, z, *, train=False, key=None):
        image = self.generate(params, z)
        return {"image": image, "score": self.discriminate(params, image)}, state


@register("model", example=({"hidden": (8,), "image_shape": (4, 4, 1)}, (3,), "normal"))
def gan(hidden: tuple = (256, 512), image_shape: tuple = (28, 28, 1)) -> Module:
    """A generator (latent vectors -> images in [0, 1]: dense layers widening through ``hidden``, a sigmoid) and a
    discriminator (images -> one logit: dense layers narrowing back through ``hidden``, leaky ReLUs) in one model.
    Its outputs are named ``image`` and ``score`` (the discriminator's logit of the image)."""
    check_sizes(hidden, "hidden", nonempty=True)
    check_sizes(image_shape, "image_shape", nonempty=True)
    return GAN(hidden, image_shape)
