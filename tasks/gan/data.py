"""The GAN's data, ``mnist_gan``: latent vectors drawn from N(0, I) as the input (what the generator takes), MNIST's
images in [0, 1] as the target (what the discriminator compares its images with); the files read as the template's
``mnist`` loader reads them, checksums verified. Each split's latent vectors are fixed by the seed, so evaluation
judges the same images every epoch; the training step draws fresh ones from its own key instead (``step.py``)."""

from __future__ import annotations

import numpy as np

from data_loader.data_loaders import check_args
from data_loader.loader import DataLoader
from data_loader.sources.mnist import MnistDataset
from model.checks import check_integer
from model.registry import register


class LatentsAndImages:
    def __init__(self, images, latent: int, seed: int):
        self.images = images
        self.z = np.random.default_rng(seed).standard_normal((len(images), latent)).astype(np.float32)
        self.preprocessing = {"prior": f"N(0, I) in {latent} dimensions"}

    def __len__(self) -> int:
        return len(self.images)

    def get_batch(self, indices):
        return {"input": self.z[indices], "target": self.images.get_batch(indices)["input"]}


def _check(latent=64, **args) -> None:
    check_integer(latent, "latent", 1, 2**16)
    check_args(**args)


@register("data_loader", check=_check)
def mnist_gan(
    split="train",
    latent=64,
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/mnist",
    validation_size=5000,
    split_seed=0,
    verify=True,
    prefetch=2,
    seed=0,
):
    """(latent vectors (N, latent) float32, MNIST's images in [0, 1] (N, 28, 28, 1) float32) as (input, target)."""
    images = MnistDataset(data_dir, split, "mnist", validation_size, split_seed, normalize=False, verify=verify)
    data = LatentsAndImages(images, latent, seed * 3 + ("train", "validation", "test").index(split))
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)
