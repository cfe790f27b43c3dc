"""MNIST and the data sets that share its IDX format (Fashion-MNIST, KMNIST), held in memory as uint8."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from data_loader.download import download, md5sum
from data_loader.idx import read_idx

FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}

SOURCES = {
    "mnist": {
        "mirrors": ["https://ossci-datasets.s3.amazonaws.com/mnist/",
                    "https://storage.googleapis.com/cvdf-datasets/mnist/"],
        "md5": {"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
                "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
                "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"},
        "mean": 0.1307, "std": 0.3081,
    },
    "fashion_mnist": {
        "mirrors": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
        "md5": {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
                "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
                "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"},
        "mean": 0.2860, "std": 0.3530,
    },
    "kmnist": {
        "mirrors": ["http://codh.rois.ac.jp/kmnist/dataset/kmnist/"],
        "md5": {"train-images-idx3-ubyte.gz": "bdb82020997e1d708af4cf47b453dcf7",
                "train-labels-idx1-ubyte.gz": "e144d726b3acfaa3e44228e80efcd344",
                "t10k-images-idx3-ubyte.gz": "5c965bf0a639b31b8f53240b1b52f4d7",
                "t10k-labels-idx1-ubyte.gz": "7320c461ea6c1c855c0b718fb2a4b134"},
        "mean": 0.1918, "std": 0.3483,
    },
}
SPLITS = ("train", "validation", "test")


def locate(dataset: str, data_dir: str | Path, split_file: str, download_missing: bool, verify: bool) -> Path:
    """The path of one of the data set's files, fetched if allowed, its checksum checked."""
    source = SOURCES[dataset]
    path = Path(data_dir) / split_file
    if not path.exists():
        if not download_missing:
            raise FileNotFoundError(
                f"{path} not found. Put the four {dataset} IDX files ({', '.join(source['md5'])}) in "
                f"{Path(data_dir).resolve()}, or set \"download\": true in the data loader's args to fetch them.")
        download(split_file, source["md5"][split_file], source["mirrors"], data_dir)
    if verify and md5sum(path) != source["md5"][split_file]:
        raise ValueError(f"{path}: checksum mismatch (md5 {md5sum(path)}, expected {source['md5'][split_file]}); "
                         "the file is corrupt or not the original: delete it and fetch it again")
    return path


class MnistDataset:
    """One split of an MNIST-format data set: `input` float32 (N, 28, 28, 1) normalised, `target` int32 (N,).

    "train" and "validation" are a seeded partition of the original training file (`validation_size` examples held
    out); "test" is the original test file.
    """

    def __init__(self, data_dir="data/mnist", split="train", dataset="mnist", validation_size=5000, split_seed=0,
                 normalize=True, download=False, verify=True):
        if dataset not in SOURCES:
            raise ValueError(f"unknown dataset {dataset!r}; available: {', '.join(SOURCES)}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        files = FILES["test" if split == "test" else "train"]
        images, labels = (read_idx(locate(dataset, data_dir, f, download, verify)) for f in files)
        if len(images) != len(labels):
            raise ValueError(f"{data_dir}: {len(images)} images but {len(labels)} labels")
        if split != "test":
            if not 0 <= validation_size < len(images):
                raise ValueError(f"validation_size must be in [0, {len(images)}), got {validation_size}")
            order = np.random.default_rng(split_seed).permutation(len(images))
            keep = order[validation_size:] if split == "train" else order[:validation_size]
            keep.sort()  # keep memory order; shuffling is the loader's job
            images, labels = images[keep], labels[keep]
        self.images = images[..., None]  # NHWC, uint8: a quarter of float32's memory, converted per batch
        self.labels = labels.astype(np.int32)
        self.num_classes = 10
        source = SOURCES[dataset]
        self.mean, self.std = (source["mean"], source["std"]) if normalize else (0.0, 1.0)

    def __len__(self):
        return len(self.labels)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.images.shape[1:]

    def get_batch(self, indices):
        images = self.images[indices].astype(np.float32)
        images *= 1.0 / (255.0 * self.std)
        images -= self.mean / self.std
        return {"input": images, "target": self.labels[indices]}
