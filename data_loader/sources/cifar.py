"""CIFAR-10 and CIFAR-100 from their official *binary* versions (fixed-length records; never the pickled ones).

A record is one label byte (CIFAR-100: a coarse then a fine label byte) and 3,072 pixel bytes: the red, green and
blue 32x32 planes, rows in order. CIFAR-10 has data_batch_1..5.bin (10,000 records each) and test_batch.bin;
CIFAR-100 has train.bin (50,000) and test.bin (10,000). The files may sit in `data_dir` itself or in the folder the
archive unpacks to (cifar-10-batches-bin/, cifar-100-binary/). With `download` true a missing file is fetched: the
published archive is downloaded (MD5 and SHA-256 checked, as published by the data set's authors and as used by
other loaders) and its data files extracted. With `verify` each data file's SHA-256 is checked on every load
(turn it off only for your own files in this format).

Images are held in memory as uint8 (N, 32, 32, 3) NHWC (180 MB for CIFAR-10's 60,000); "train" and "validation"
are a seeded partition of the training files (`validation_size` held out), "test" is the test file.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

from data_loader.sources.download import checksum, download
from files.reads import open_regular, read_regular

PIXELS = 32 * 32 * 3
SOURCES = {
    "cifar10": {
        "archive": "cifar-10-binary.tar.gz",
        "mirrors": ["https://www.cs.toronto.edu/~kriz/"],
        "md5": "c32a1d4ab5d03f1284b67883e8d87530",
        "sha256": "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
        "folder": "cifar-10-batches-bin",
        "label_bytes": 1,
        "train": [f"data_batch_{i}.bin" for i in range(1, 6)],
        "test": ["test_batch.bin"],
        "files": {
            "data_batch_1.bin": "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5",
            "data_batch_2.bin": "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed",
            "data_batch_3.bin": "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67",
            "data_batch_4.bin": "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48",
            "data_batch_5.bin": "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add",
            "test_batch.bin": "8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b",
        },
        "names": {"label": "batches.meta.txt"},
        "classes": {"label": 10},
    },
    "cifar100": {
        "archive": "cifar-100-binary.tar.gz",
        "mirrors": ["https://www.cs.toronto.edu/~kriz/"],
        "md5": "03b5dce01913d631647c71ecec9e9cb8",
        "sha256": "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec",
        "folder": "cifar-100-binary",
        "label_bytes": 2,
        "train": ["train.bin"],
        "test": ["test.bin"],
        "files": {
            "train.bin": "f31298fc616915fa142368359df1c4ca2ae984d6915ca468b998a5ec6aeebf29",
            "test.bin": "d8b1e6b7b3bee4020055f0699b111f60b1af1e262aeb93a0b659061746f8224a",
        },
        "names": {"coarse": "coarse_label_names.txt", "fine": "fine_label_names.txt"},
        "classes": {"coarse": 20, "fine": 100},
    },
}
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SPLITS = ("train", "validation", "test")
DTYPES = ("uint8", "float32")


def fetch(dataset: str, data_dir: Path) -> None:
    """Downloads the published archive into `data_dir` (MD5 checked while downloading, then SHA-256) unless it is
    there, and extracts its data and label-name files."""
    source = SOURCES[dataset]
    archive = data_dir / source["archive"]
    if not archive.is_file():
        download(source["archive"], source["md5"], source["mirrors"], data_dir)
    actual = checksum(archive, "sha256")
    if actual != source["sha256"]:
        raise ValueError(
            f"{archive}: checksum mismatch (sha256 {actual}, expected {source['sha256']}); delete it "
            "and download it again"
        )
    wanted = {f"{source['folder']}/{name}" for name in [*source["files"], *source["names"].values()]}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.lstrip("./") in wanted and m.isfile()]
            tar.extractall(data_dir, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as error:
        raise ValueError(f"{archive}: cannot extract it ({error})") from None


def locate(dataset: str, data_dir: Path, name: str) -> Path | None:
    source = SOURCES[dataset]
    for path in (data_dir / name, data_dir / source["folder"] / name):
        if path.exists():
            return path
    return None


def read_records(path: Path, label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (N, 32, 32, 3), uint8 labels (N, label_bytes)) of one binary file."""
    try:
        with open_regular(path) as f:  # a FIFO or a device is refused without blocking
            data = np.frombuffer(f.read(), np.uint8)
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({(error.strerror or str(error)).lower()})") from None
    record = label_bytes + PIXELS
    if not len(data) or len(data) % record:
        raise ValueError(
            f"{path}: {len(data):,} bytes is not a whole number of {record:,}-byte records; the file "
            "is truncated or not a CIFAR binary file"
        )
    records = data.reshape(-1, record)
    images = records[:, label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), records[:, :label_bytes]


def class_names(dataset: str, data_dir: Path, label: str) -> list[str]:
    """The label-name file's lines when present, else CIFAR-10's known names or numbers."""
    path = locate(dataset, data_dir, SOURCES[dataset]["names"][label])
    count = SOURCES[dataset]["classes"][label]
    if path is not None:
        text = read_regular(path).decode(errors="replace")
        names = [line.strip() for line in text.splitlines() if line.strip()]
        if len(names) == count:
            return names
    return CIFAR10_CLASSES if dataset == "cifar10" else [str(i) for i in range(count)]


class CifarDataset:
    """One split of CIFAR-10/100: `input` uint8 (N, 32, 32, 3) NHWC (float32 in [0, 1] with `dtype` "float32"),
    `target` int32 (N,): the label (CIFAR-100: the `label` "fine" one of 100 classes or the "coarse" one of 20)."""

    def __init__(
        self,
        dataset="cifar10",
        data_dir="data/cifar10",
        split="train",
        validation_size=5000,
        split_seed=0,
        download=False,
        verify=True,
        label=None,
        dtype="uint8",
    ):
        label = label or ("label" if dataset == "cifar10" else "fine")
        check_settings(dataset, split, validation_size, split_seed, label, dtype)
        source = SOURCES[dataset]
        data_dir = Path(data_dir)
        names = source["test" if split == "test" else "train"]
        if download and any(locate(dataset, data_dir, name) is None for name in names):
            fetch(dataset, data_dir)
        images, labels = [], []
        for name in names:
            path = locate(dataset, data_dir, name)
            if path is None:
                raise FileNotFoundError(
                    f"{data_dir / name} not found. Put the {dataset} binary files ({', '.join(source['files'])}) in "
                    f'{data_dir.resolve()} (or its {source["folder"]}/ folder), or set "download": true in the '
                    f"data loader's args to fetch {source['archive']}."
                )
            if verify:
                actual = checksum(path, "sha256")
                if actual != source["files"][name]:
                    raise ValueError(
                        f"{path}: checksum mismatch (sha256 {actual}, expected {source['files'][name]}); "
                        "the file is damaged or not the original: delete it and fetch it again (or set "
                        '"verify": false for your own files in this format)'
                    )
            x, y = read_records(path, source["label_bytes"])
            images.append(x)
            labels.append(y[:, 0 if label in ("label", "coarse") else 1])
        images, labels = np.concatenate(images), np.concatenate(labels).astype(np.int32)
        count = source["classes"][label]
        if labels.max() >= count:
            raise ValueError(
                f"{data_dir}: {label} labels go up to {labels.max()}, {dataset} has {count} classes "
                f"(is this a {'CIFAR-100' if dataset == 'cifar10' else 'CIFAR-10'} file?)"
            )
        if split != "test":
            if not validation_size < len(images):
                raise ValueError(
                    f"validation_size: must be below the {len(images)} training images, got {validation_size}"
                )
            order = np.random.default_rng(split_seed).permutation(len(images))
            keep = np.sort(order[validation_size:] if split == "train" else order[:validation_size])
            images, labels = images[keep], labels[keep]
        if not len(images):
            raise ValueError(f"{data_dir}: the {split} split is empty (validation_size {validation_size})")
        self.images, self.labels, self.dtype = images, labels, dtype
        self.classes = class_names(dataset, data_dir, label)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def preprocessing(self) -> dict:
        return {
            "classes": self.classes,
            "input_size": [32, 32],
            "channels": 3,
            "layout": "NHWC",
            "color": "RGB",
            "resize": "bilinear",
            "pixel_scale": 1.0 / 255.0 if self.dtype == "float32" else 1.0,
        }

    def get_batch(self, indices):
        images = self.images[indices]
        if self.dtype == "float32":
            images = images.astype(np.float32)
            images *= 1.0 / 255.0
        return {"input": images, "target": self.labels[indices]}


def check_settings(
    dataset="cifar10", split="train", validation_size=5000, split_seed=0, label=None, dtype="uint8"
) -> None:
    """The settings, checked without reading anything."""
    if split not in SPLITS:
        raise ValueError(f'split: expected "train", "validation" or "test", got {split!r}')
    if (
        isinstance(validation_size, bool)
        or not isinstance(validation_size, int)
        or not (1 if split == "validation" else 0) <= validation_size <= 10**9
    ):
        raise ValueError(
            f"validation_size: must be an integer >= {1 if split == 'validation' else 0}, got {validation_size!r}"
        )
    if isinstance(split_seed, bool) or not isinstance(split_seed, int) or not 0 <= split_seed < 2**32:
        raise ValueError(f"split_seed: must be an integer from 0 to 2**32 - 1, got {split_seed!r}")
    labels = SOURCES[dataset]["classes"]
    if label is not None and label not in labels:
        raise ValueError(f"label: {dataset} has {' or '.join(map(repr, labels))} labels, got {label!r}")
    if dtype not in DTYPES:
        raise ValueError(f'dtype: expected "uint8" (pixels as stored) or "float32" (scaled to [0, 1]), got {dtype!r}')
