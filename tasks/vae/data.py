"""The VAE's data. ``mnist_images``: MNIST's images alone, pixels in [0, 1] (what a Bernoulli decoder models),
without their labels: the batch has no target, so the loss compares the outputs with the input (an autoencoder); the
files are read as the template's ``mnist`` loader reads them (data_loader/sources/mnist.py), checksums verified.
``prior``: latent vectors drawn from N(0, I), the data of the decoder on its own (``vae_decoder``)."""

from __future__ import annotations

import numpy as np

from data_loader.data_loaders import check_args
from data_loader.loader import DataLoader
from data_loader.sources.mnist import MnistDataset
from model.checks import check_integer
from model.registry import register


class Images:
    """A data set's input alone (its target dropped); its preprocessing without the class names."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.preprocessing = {k: v for k, v in dataset.preprocessing.items() if k != "classes"}

    def __len__(self) -> int:
        return len(self.dataset)

    def get_batch(self, indices):
        return {"input": self.dataset.get_batch(indices)["input"]}


@register("data_loader", check=check_args)
def mnist_images(
    split="train",
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
    """MNIST's images in [0, 1] (N, 28, 28, 1) float32, no target: a VAE's or an autoencoder's data."""
    data = MnistDataset(data_dir, split, "mnist", validation_size, split_seed, normalize=False, verify=verify)
    return DataLoader(Images(data), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


class Prior:
    """``size`` draws of N(0, I) in ``latent`` dimensions, fixed by ``seed``: the inputs a VAE's decoder samples
    images from."""

    def __init__(self, latent: int, size: int, seed: int):
        self.z = np.random.default_rng(seed).standard_normal((size, latent)).astype(np.float32)
        self.preprocessing = {"prior": f"N(0, I) in {latent} dimensions"}

    def __len__(self) -> int:
        return len(self.z)

    def get_batch(self, indices):
        return {"input": self.z[indices]}


def _check_prior(latent=16, size=1000, split="train", prefetch=2, **_) -> None:
    check_integer(latent, "latent", 1, 2**20)
    check_integer(size, "size", 1, 2**24)
    if split not in ("train", "validation", "test"):
        raise ValueError(f'split: expected "train", "validation" or "test", got {split!r}')


@register("data_loader", check=_check_prior)
def prior(latent=16, size=1000, split="train", batch_size=128, shuffle=False, drop_last=False, prefetch=2, seed=0):
    """Latent vectors drawn from N(0, I), (size, latent) float32, no target: what ``vae_decoder`` turns into images.
    Each split draws its own, from ``seed``."""
    data = Prior(latent, size, seed * 3 + ("train", "validation", "test").index(split))
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)
