"""The data loaders `config.json` names in `data_loader.{train,validation,test}.name`.

Add one by writing a function here that returns a `DataLoader`; its keyword arguments are what the config's `args`
may set. `seed` is supplied from the config's top-level `seed`.
"""
from __future__ import annotations

from data_loader.loader import DataLoader
from data_loader.text import CharDataset
from data_loader.mnist import MnistDataset
from data_loader.tabular import CsvDataset

__all__ = ["mnist", "fashion_mnist", "kmnist", "mnist_segmentation", "csv", "char_text", "shakespeare_char"]
# The tiny Shakespeare text shipped in data/ (public domain), as published with char-rnn.
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def mnist(split="train", batch_size=128, shuffle=False, drop_last=False, data_dir="data/mnist", validation_size=5000,
          split_seed=0, download=False, verify=True, prefetch=2, seed=0, dataset="mnist"):
    """MNIST; `verify` checks each file's MD5 against the published one (turn off only for your own IDX files)."""
    data = MnistDataset(data_dir, split, dataset, validation_size, split_seed, download=download, verify=verify)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


def fashion_mnist(split="train", batch_size=128, shuffle=False, drop_last=False, data_dir="data/fashion_mnist",
                  validation_size=5000, split_seed=0, download=False, verify=True, prefetch=2, seed=0):
    return mnist(split, batch_size, shuffle, drop_last, data_dir, validation_size, split_seed, download, verify,
                 prefetch, seed, dataset="fashion_mnist")


def kmnist(split="train", batch_size=128, shuffle=False, drop_last=False, data_dir="data/kmnist", validation_size=5000,
           split_seed=0, download=False, verify=True, prefetch=2, seed=0):
    return mnist(split, batch_size, shuffle, drop_last, data_dir, validation_size, split_seed, download, verify,
                 prefetch, seed, dataset="kmnist")


def mnist_segmentation(split="train", batch_size=128, shuffle=False, drop_last=False, data_dir="data/mnist",
                       validation_size=5000, split_seed=0, download=False, verify=True, prefetch=2, seed=0,
                       dataset="mnist", threshold=0.5, noise_std=0.5):
    """MNIST images, noisy by `noise_std` (fixed per example), with the clean digit's mask (pixel > `threshold`)
    as a float32 (B, 28, 28, 1) target: a dense-prediction task on the MNIST files."""
    data = MnistDataset(data_dir, split, dataset, validation_size, split_seed, download=download, verify=verify,
                        target="mask", threshold=threshold, noise_std=noise_std)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


def csv(path, targets, features=None, split="train", batch_size=128, shuffle=False, drop_last=False,
        validation_fraction=0.1, test_fraction=0.1, split_seed=0, standardize=True, sha256=None, prefetch=2, seed=0):
    """Rows of a CSV file with a header: `targets` (and `features`, default all other columns) name its columns;
    float32 inputs (B, features), targets (B, targets). See data_loader/tabular.py."""
    data = CsvDataset(path, targets, features, split, validation_fraction, test_fraction, split_seed, standardize,
                      sha256)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


def char_text(path, split="train", context=64, batch_size=12, shuffle=False, drop_last=False, stride=None,
              windows=None, validation_fraction=0.1, sha256=None, prefetch=2, seed=0):
    """Any UTF-8 text file as character windows for a language model (see data_loader/text.py): input and target
    int32 (B, context), the target shifted by one character; `sha256` checks the file when given."""
    data = CharDataset(path, split, context, stride, windows, validation_fraction, sha256)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


def shakespeare_char(split="train", context=64, batch_size=12, shuffle=False, drop_last=False, stride=None,
                     windows=None, path="data/tinyshakespeare/input.txt", verify=True, prefetch=2, seed=0):
    """The tiny Shakespeare text shipped in data/tinyshakespeare (1,115,394 characters, 65 distinct), split 90/10
    in file order as nanoGPT does; its SHA-256 is checked unless `verify` is false."""
    return char_text(path, split, context, batch_size, shuffle, drop_last, stride, windows, 0.1,
                     SHAKESPEARE_SHA256 if verify else None, prefetch, seed)
