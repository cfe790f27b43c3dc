"""MNIST's images alone, pixels in [0, 1] (what a Bernoulli decoder models), without their labels: the batch has no
target, so the loss compares the outputs with the input (an autoencoder). The files are read as the template's
``mnist`` loader reads them (data_loader/sources/mnist.py), checksums verified."""

from __future__ import annotations

from data_loader.data_loaders import check_args
from data_loader.loader import DataLoader
from data_loader.sources.mnist import MnistDataset
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
