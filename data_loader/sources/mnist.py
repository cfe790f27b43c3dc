"""MNIST and the data sets that share its IDX format (Fashion-MNIST, KMNIST), held in memory as uint8."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_loader.sources.download import download, md5sum
from data_loader.sources.idx import read_idx

FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

SOURCES = {
    "mnist": {
        "mirrors": [
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ],
        "md5": {
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
        "mean": 0.1307,
        "std": 0.3081,
        "classes": [str(d) for d in range(10)],
    },
    "fashion_mnist": {
        "mirrors": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
        "md5": {
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
        "mean": 0.2860,
        "std": 0.3530,
        "classes": [
            "T-shirt/top",
            "Trouser",
            "Pullover",
            "Dress",
            "Coat",
            "Sandal",
            "Shirt",
            "Sneaker",
            "Bag",
            "Ankle boot",
        ],
    },
    "kmnist": {
        "mirrors": ["http://codh.rois.ac.jp/kmnist/dataset/kmnist/"],
        "md5": {
            "train-images-idx3-ubyte.gz": "bdb82020997e1d708af4cf47b453dcf7",
            "train-labels-idx1-ubyte.gz": "e144d726b3acfaa3e44228e80efcd344",
            "t10k-images-idx3-ubyte.gz": "5c965bf0a639b31b8f53240b1b52f4d7",
            "t10k-labels-idx1-ubyte.gz": "7320c461ea6c1c855c0b718fb2a4b134",
        },
        "mean": 0.1918,
        "std": 0.3483,
        "classes": ["o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"],
    },
}
SPLITS = ("train", "validation", "test")
TARGETS = ("label", "mask", "multitask")


def fixed_noise(ids: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Standard normal noise (len(ids), size), a pure function of (seed, id, position): an example gets the same
    noise in every epoch and batch, and nothing is stored (a counter hashed by splitmix64, then Box-Muller)."""
    counter = (
        ids.astype(np.uint64)[:, None] * np.uint64(2 * size)
        + np.arange(2 * size, dtype=np.uint64)
        + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
    )
    z = counter ^ (counter >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    uniform = ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1): log never sees 0
    radius = np.sqrt(-2.0 * np.log(uniform[:, :size]))
    return (radius * np.cos(2 * np.pi * uniform[:, size:])).astype(np.float32)


def locate(dataset: str, data_dir: str | Path, split_file: str, download_missing: bool, verify: bool) -> Path:
    """The path of one of the data set's files, fetched if allowed, its checksum checked."""
    source = SOURCES[dataset]
    path = Path(data_dir) / split_file
    if not path.exists():
        if not download_missing:
            raise FileNotFoundError(
                f"{path} not found. Put the four {dataset} IDX files ({', '.join(source['md5'])}) in "
                f'{Path(data_dir).resolve()}, or set "download": true in the data loader\'s args to fetch them.'
            )
        download(split_file, source["md5"][split_file], source["mirrors"], data_dir)
    actual = md5sum(path) if verify else None
    if verify and actual != source["md5"][split_file]:
        other = [name for name, s in SOURCES.items() if s["md5"].get(split_file) == actual]
        if other:  # a good file of another data set: the folder is wrong, not the file
            raise ValueError(
                f"{path} is the {other[0]} file, not {dataset}'s: point data_dir at a folder of "
                f"{dataset} files (the {dataset} loader's default is data/{dataset})"
            )
        raise ValueError(
            f"{path}: checksum mismatch (md5 {actual}, expected {source['md5'][split_file]}); "
            "the file is corrupt or not the original: delete it and fetch it again"
        )
    return path


class MnistDataset:
    """One split of an MNIST-format data set: `input` float32 (N, 28, 28, 1) normalised, `target` int32 (N,).

    "train" and "validation" are a seeded partition of the original training file (`validation_size` examples held
    out); "test" is the original test file.

    With `target="mask"` the target is the digit's own segmentation instead of its label: float32 (N, 28, 28, 1),
    1 where the clean pixel is above `threshold` (in [0, 1]), 0 elsewhere. `noise_std` > 0 adds Gaussian noise
    (in the same [0, 1] pixel units, before normalising) to the input only, fixed per example by `split_seed`, so
    a model has to denoise rather than threshold the pixels it is given.

    With `target="multitask"` the target is two named outputs: ``digit``, the label (N,) int32, and ``ink``, the
    mean of the clean image's pixels in [0, 1] (N, 1) float32, a regression target derived from the image.
    """

    def __init__(
        self,
        data_dir="data/mnist",
        split="train",
        dataset="mnist",
        validation_size=5000,
        split_seed=0,
        normalize=True,
        download=False,
        verify=True,
        target="label",
        threshold=0.5,
        noise_std=0.0,
    ):
        if dataset not in SOURCES:
            raise ValueError(f"unknown dataset {dataset!r}; available: {', '.join(SOURCES)}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
        if not 0 <= threshold < 1 or noise_std < 0:
            raise ValueError(f"threshold must be in [0, 1) and noise_std >= 0, got {threshold} and {noise_std}")
        files = FILES["test" if split == "test" else "train"]
        image_path, label_path = (locate(dataset, data_dir, f, download, verify) for f in files)
        images, labels = read_idx(image_path), read_idx(label_path)
        # without verify nothing else vouches for the files: a wrong or damaged one must fail here, by name
        if images.ndim != 3 or not len(images):
            raise ValueError(f"{image_path}: expected images of shape (N, height, width), got {images.shape}")
        if labels.ndim != 1 or (len(labels) and not 0 <= labels.min() <= labels.max() < 10):
            raise ValueError(
                f"{label_path}: expected labels 0-9 of shape (N,), got shape {labels.shape}"
                + (f", values {labels.min()}..{labels.max()}" if labels.ndim == 1 else "")
            )
        if len(images) != len(labels):
            raise ValueError(f"{image_path} holds {len(images)} images but {label_path} {len(labels)} labels")
        ids = np.arange(len(images))
        if split != "test":
            if not 0 <= validation_size < len(images):
                raise ValueError(f"validation_size must be in [0, {len(images)}), got {validation_size}")
            order = np.random.default_rng(split_seed).permutation(len(images))
            keep = order[validation_size:] if split == "train" else order[:validation_size]
            keep.sort()  # keep memory order; shuffling is the loader's job
            images, labels, ids = images[keep], labels[keep], keep
        self.images = images[..., None]  # NHWC, uint8: a quarter of float32's memory, converted per batch
        self.labels = labels.astype(np.int32)
        self.num_classes = 10
        source = SOURCES[dataset]
        self.classes = source["classes"]
        self.mean, self.std = (source["mean"], source["std"]) if normalize else (0.0, 1.0)
        self.target, self.threshold, self.noise_std = target, threshold, noise_std
        # the test file's ids would repeat the training file's: a seed of its own keeps their noise apart
        self.ids, self.noise_seed = ids, 2 * split_seed + (split == "test")

    def __len__(self):
        return len(self.labels)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.images.shape[1:]

    @property
    def preprocessing(self) -> dict:
        """What a user of the trained model needs: how pixels were scaled and normalised, and the class names."""
        info = {"layout": "NHWC", "pixel_scale": 1.0 / 255.0, "mean": self.mean, "std": self.std}
        if self.target == "label":
            info["classes"] = self.classes
        elif self.target == "multitask":  # what each named output needs, as a single output's preprocessing
            info["outputs"] = {"digit": {"classes": self.classes}, "ink": {"targets": ["mean ink"]}}
        else:
            info.update(mask_threshold=self.threshold, noise_std=self.noise_std)
        return info

    def get_batch(self, indices):
        images = self.images[indices].astype(np.float32)
        if self.target == "label":
            target = self.labels[indices]
        elif self.target == "multitask":
            ink = images.reshape(len(images), -1).mean(axis=1, keepdims=True) * np.float32(1.0 / 255.0)
            target = {"digit": self.labels[indices], "ink": ink}
        else:
            target = (images > 255.0 * self.threshold).astype(np.float32)
        if self.noise_std:
            size = images[0].size
            noise = fixed_noise(self.ids[indices], size, self.noise_seed).reshape(images.shape)
            images += (255.0 * self.noise_std) * noise
        images *= 1.0 / (255.0 * self.std)
        images -= self.mean / self.std
        return {"input": images, "target": target}
