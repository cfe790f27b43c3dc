"""The data loaders `config.json` names in `data_loader.{train,validation,test}.name`.

Add one by writing a function here that returns a `DataLoader`; its keyword arguments are what the config's `args`
may set. `seed` is supplied from the config's top-level `seed`. Each loader's `check_args` is called by the config
resolver before any loader is built, so a bad setting is reported before any file is read.
"""

from __future__ import annotations

from data_loader.loader import DataLoader
from data_loader.sources import arrays as arrays_module
from data_loader.sources import cifar
from data_loader.sources import image_folder as image_folder_module
from data_loader.sources.mnist import SOURCES, MnistDataset
from data_loader.sources.tabular import CsvDataset, check_columns, check_split_by
from data_loader.sources.text import CharDataset
from model.checks import check_integer, check_range
from model.registry import register

# The tiny Shakespeare text shipped in data/ (public domain), as published with char-rnn.
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def _count(value, name: str, minimum: int, maximum: int = 2**31 - 1) -> None:
    check_integer(value, name, minimum, maximum, whole_float=True)


def _fraction(value, name: str) -> None:
    check_range(value, name, 0, 1, open_high=True)


def check_args(
    split="train",
    validation_size=5000,
    prefetch=2,
    split_seed=0,
    context=64,
    stride=None,
    windows=None,
    validation_fraction=0.1,
    test_fraction=0.1,
    dataset="mnist",
    threshold=0.5,
    noise_std=0.0,
    split_by="random",
    group=None,
    **_,
) -> None:
    """The arguments the loaders here share, checked without reading anything (batch_size: by the resolver)."""
    if split not in ("train", "validation", "test"):
        raise ValueError(f'split: expected "train", "validation" or "test", got {split!r}')
    check_split_by(split_by, group, "a column")
    if not isinstance(dataset, str) or dataset not in SOURCES:
        raise ValueError(f"dataset: expected one of {', '.join(SOURCES)}, got {dataset!r}")
    # an empty validation split would only fail when the first batch is read
    _count(validation_size, "validation_size", 1 if split == "validation" else 0)
    _count(prefetch, "prefetch", 0, 64)
    _count(split_seed, "split_seed", 0, 2**32 - 1)
    _count(context, "context", 1)
    for name, value in (("stride", stride), ("windows", windows)):
        if value is not None:
            _count(value, name, 1)
    _fraction(validation_fraction, "validation_fraction")
    _fraction(test_fraction, "test_fraction")
    _fraction(threshold, "threshold")
    check_range(noise_std, "noise_std")


def _check_image_folder(
    split="all",
    size=None,
    channels=3,
    classes=None,
    validation_fraction=0.1,
    split_seed=0,
    on_error="fail",
    workers=None,
    dtype="uint8",
    prefetch=2,
    test_fraction=0.0,
    **_,
) -> None:
    image_folder_module.check_settings(
        split, size, channels, classes, validation_fraction, split_seed, on_error, workers, dtype, test_fraction
    )
    _count(prefetch, "prefetch", 0, 64)


def _check_arrays(
    input=None,
    target=None,
    split="all",
    validation_fraction=0.1,
    test_fraction=0.0,
    classes=None,
    split_seed=0,
    prefetch=2,
    split_by="random",
    group=None,
    mask=None,
    **_,
) -> None:
    arrays_module.check_settings(input, target, split, validation_fraction, test_fraction, classes, mask)
    check_split_by(split_by, group, "an array")
    _count(split_seed, "split_seed", 0, 2**32 - 1)
    _count(prefetch, "prefetch", 0, 64)


def _check_cifar(dataset: str):
    def check(split="train", validation_size=5000, split_seed=0, label=None, dtype="uint8", prefetch=2, **_) -> None:
        cifar.check_settings(dataset, split, validation_size, split_seed, label, dtype)
        _count(prefetch, "prefetch", 0, 64)

    return check


@register("data_loader", check=check_args)
def mnist(
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/mnist",
    validation_size=5000,
    split_seed=0,
    download=False,
    verify=True,
    prefetch=2,
    seed=0,
    dataset="mnist",
):
    """MNIST; `verify` checks each file's MD5 against the published one (turn off only for your own IDX files)."""
    data = MnistDataset(data_dir, split, dataset, validation_size, split_seed, download=download, verify=verify)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


@register("data_loader", check=check_args)
def fashion_mnist(
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/fashion_mnist",
    validation_size=5000,
    split_seed=0,
    download=False,
    verify=True,
    prefetch=2,
    seed=0,
):
    return mnist(
        split,
        batch_size,
        shuffle,
        drop_last,
        data_dir,
        validation_size,
        split_seed,
        download,
        verify,
        prefetch,
        seed,
        dataset="fashion_mnist",
    )


@register("data_loader", check=check_args)
def kmnist(
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/kmnist",
    validation_size=5000,
    split_seed=0,
    download=False,
    verify=True,
    prefetch=2,
    seed=0,
):
    return mnist(
        split,
        batch_size,
        shuffle,
        drop_last,
        data_dir,
        validation_size,
        split_seed,
        download,
        verify,
        prefetch,
        seed,
        dataset="kmnist",
    )


@register("data_loader", check=check_args)
def mnist_segmentation(
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/mnist",
    validation_size=5000,
    split_seed=0,
    download=False,
    verify=True,
    prefetch=2,
    seed=0,
    dataset="mnist",
    threshold=0.5,
    noise_std=0.5,
):
    """MNIST images, noisy by `noise_std` (fixed per example), with the clean digit's mask (pixel > `threshold`)
    as a float32 (B, 28, 28, 1) target: a dense-prediction task on the MNIST files."""
    data = MnistDataset(
        data_dir,
        split,
        dataset,
        validation_size,
        split_seed,
        download=download,
        verify=verify,
        target="mask",
        threshold=threshold,
        noise_std=noise_std,
    )
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


@register("data_loader", check=check_args)
def mnist_multitask(
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/mnist",
    validation_size=5000,
    split_seed=0,
    download=False,
    verify=True,
    prefetch=2,
    seed=0,
    dataset="mnist",
):
    """MNIST images with two named targets: ``digit`` (the label, int32 (B,)) and ``ink`` (the clean image's mean
    pixel in [0, 1], float32 (B, 1)): a multi-task problem on the MNIST files."""
    data = MnistDataset(
        data_dir, split, dataset, validation_size, split_seed, download=download, verify=verify, target="multitask"
    )
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


def _check_csv(columns=None, **args) -> None:
    check_args(**args)
    check_columns(columns)


@register("data_loader", check=_check_csv)
def csv(
    path,
    targets,
    features=None,
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    validation_fraction=0.1,
    test_fraction=0.1,
    split_seed=0,
    standardize=True,
    sha256=None,
    prefetch=2,
    seed=0,
    split_by="random",
    group=None,
    columns=None,
):
    """Rows of a CSV file with a header: `targets` (and `features`, default all other columns) name its columns;
    float32 inputs (B, encoded features), targets (B, targets); `split_by` "random", "order" or "group" (with `group`
    a column); `columns` declares categorical columns and how missing cells are filled, per column name. See
    data_loader/sources/tabular.py."""
    data = CsvDataset(
        path,
        targets,
        features,
        split,
        validation_fraction,
        test_fraction,
        split_seed,
        standardize,
        sha256,
        split_by,
        group,
        columns,
    )
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


@register("data_loader", check=check_args)
def char_text(
    path,
    split="train",
    context=64,
    batch_size=12,
    shuffle=False,
    drop_last=False,
    stride=None,
    windows=None,
    validation_fraction=0.1,
    sha256=None,
    prefetch=2,
    seed=0,
):
    """Any UTF-8 text file as character windows for a language model (see data_loader/sources/text.py): input and target
    int32 (B, context), the target shifted by one character; `sha256` checks the file when given."""
    data = CharDataset(path, split, context, stride, windows, validation_fraction, sha256)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


@register("data_loader", check=check_args)
def shakespeare_char(
    split="train",
    context=64,
    batch_size=12,
    shuffle=False,
    drop_last=False,
    stride=None,
    windows=None,
    path="data/tinyshakespeare/input.txt",
    verify=True,
    prefetch=2,
    seed=0,
):
    """The tiny Shakespeare text shipped in data/tinyshakespeare (1,115,394 characters, 65 distinct), split 90/10
    in file order as nanoGPT does; its SHA-256 is checked unless `verify` is false."""
    return char_text(
        path,
        split,
        context,
        batch_size,
        shuffle,
        drop_last,
        stride,
        windows,
        0.1,
        SHAKESPEARE_SHA256 if verify else None,
        prefetch,
        seed,
    )


@register("data_loader", check=_check_image_folder)
def image_folder(
    root,
    split="all",
    size=None,
    channels=3,
    classes=None,
    validation_fraction=0.1,
    test_fraction=0.0,
    split_seed=0,
    on_error="fail",
    cache_dir=None,
    workers=None,
    dtype="uint8",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    prefetch=2,
    seed=0,
):
    """Images in class folders, root/<class>/<image> (see data_loader/sources/image_folder.py): `input` uint8
    (B, height, width, channels), `target` int32 class ids; decoded once into a memory-mapped cache in `cache_dir`
    (default root/.cache). `split` "all" takes the whole folder (separate train/validation folders); "train",
    "validation" and "test" are a stable per-class partition by `validation_fraction` and `test_fraction`."""
    data = image_folder_module.ImageFolderDataset(
        root,
        split,
        size,
        channels,
        classes,
        validation_fraction,
        split_seed,
        on_error,
        cache_dir,
        workers,
        dtype,
        test_fraction,
    )
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


@register("data_loader", check=_check_arrays)
def arrays(
    path,
    input,
    target,
    split="all",
    validation_fraction=0.1,
    test_fraction=0.0,
    split_seed=0,
    mmap=True,
    classes=None,
    batch_size=128,
    shuffle=False,
    drop_last=False,
    prefetch=2,
    seed=0,
    split_by="random",
    group=None,
    mask=None,
):
    """Named arrays of an .npz file or a folder of .npy files (see data_loader/sources/arrays.py): `input` one name, a
    list of names or {input name: array name}; `target` a name, or null for none (the outputs are compared with
    the input); `mask` a name, the batch's mask (0 on padding); memory-mapped, read a batch at a time; `split_by`
    "random", "order" or "group" (with `group` an array of one id per row)."""
    data = arrays_module.ArraysDataset(
        path,
        input,
        target,
        split,
        validation_fraction,
        test_fraction,
        split_seed,
        mmap,
        classes,
        split_by=split_by,
        group=group,
        mask=mask,
    )
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


@register("data_loader", check=_check_cifar("cifar10"))
def cifar10(
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/cifar10",
    validation_size=5000,
    split_seed=0,
    download=False,
    verify=True,
    dtype="uint8",
    prefetch=2,
    seed=0,
):
    """CIFAR-10 from its binary version (see data_loader/sources/cifar.py): `input` uint8 (B, 32, 32, 3), `target`
    int32; `download: true` fetches the archive (checksums verified) when a network exists."""
    data = cifar.CifarDataset("cifar10", data_dir, split, validation_size, split_seed, download, verify, None, dtype)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)


@register("data_loader", check=_check_cifar("cifar100"))
def cifar100(
    split="train",
    batch_size=128,
    shuffle=False,
    drop_last=False,
    data_dir="data/cifar100",
    validation_size=5000,
    split_seed=0,
    download=False,
    verify=True,
    label="fine",
    dtype="uint8",
    prefetch=2,
    seed=0,
):
    """CIFAR-100 from its binary version: `label` "fine" (100 classes) or "coarse" (20)."""
    data = cifar.CifarDataset("cifar100", data_dir, split, validation_size, split_seed, download, verify, label, dtype)
    return DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)
