"""CIFAR-10/100 from their binary format, on small files written here in that format: the record layout (planes to
NHWC), labels (CIFAR-100's coarse and fine), splits, checksums, and `download: true` through a local mirror."""

from __future__ import annotations

import hashlib
import io
import tarfile

import numpy as np
import pytest

from data_loader.data_loaders import cifar10, cifar100
from data_loader.sources import cifar
from tests.end_to_end.test_data_faults import train_error


def records(images: np.ndarray, *labels: np.ndarray) -> bytes:
    """The binary format, written independently of the reader: label byte(s), then the R, G and B planes."""
    out = bytearray()
    for i, image in enumerate(images):
        out += bytes(int(label[i]) for label in labels)
        for channel in range(3):
            out += image[:, :, channel].tobytes()  # row-major 32x32 plane
    return bytes(out)


def write_cifar10(folder, per_file=12, seed=0):
    """data_batch_1..5.bin and test_batch.bin with `per_file` records each, plus batches.meta.txt; the arrays."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in [*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"]:
        images = rng.integers(0, 256, (per_file, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 10, per_file)
        (folder / name).write_bytes(records(images, labels))
        written[name] = (images, labels)
    (folder / "batches.meta.txt").write_text("\n".join(cifar.CIFAR10_CLASSES) + "\n\n")
    return written


def write_cifar100(folder, train=30, test=10, seed=1):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, count in (("train.bin", train), ("test.bin", test)):
        images = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
        coarse, fine = rng.integers(0, 20, count), rng.integers(0, 100, count)
        (folder / name).write_bytes(records(images, coarse, fine))
        written[name] = (images, coarse, fine)
    (folder / "fine_label_names.txt").write_text("\n".join(f"fine{i}" for i in range(100)))
    (folder / "coarse_label_names.txt").write_text("\n".join(f"coarse{i}" for i in range(20)))
    return written


def test_cifar10_records_become_nhwc_uint8_in_file_order(tmp_path):
    written = write_cifar10(tmp_path / "cifar-10-batches-bin")  # the archive's folder inside data_dir
    test = cifar10("test", data_dir=str(tmp_path), verify=False, batch_size=5)
    images, labels = written["test_batch.bin"]
    batch = test.dataset.get_batch(np.arange(12))
    assert batch["input"].dtype == np.uint8 and batch["input"].shape == (12, 32, 32, 3)
    np.testing.assert_array_equal(batch["input"], images)
    np.testing.assert_array_equal(batch["target"], labels)
    assert batch["target"].dtype == np.int32
    assert test.preprocessing["classes"] == cifar.CIFAR10_CLASSES
    assert test.preprocessing["input_size"] == [32, 32] and test.preprocessing["channels"] == 3
    # train + validation: a seeded partition of the five training files
    all_train = np.concatenate([written[f"data_batch_{i}.bin"][0] for i in range(1, 6)])
    train = cifar10("train", data_dir=str(tmp_path), verify=False, validation_size=15)
    validation = cifar10("validation", data_dir=str(tmp_path), verify=False, validation_size=15)
    assert len(train.dataset) == 45 and len(validation.dataset) == 15
    order = np.random.default_rng(0).permutation(60)
    np.testing.assert_array_equal(validation.dataset.images, all_train[np.sort(order[:15])])
    np.testing.assert_array_equal(train.dataset.images, all_train[np.sort(order[15:])])
    scaled = cifar10("test", data_dir=str(tmp_path), verify=False, dtype="float32").dataset.get_batch(np.arange(2))
    np.testing.assert_allclose(scaled["input"], images[:2] / 255.0, rtol=1e-6)


def test_cifar100_fine_and_coarse_labels(tmp_path):
    written = write_cifar100(tmp_path)  # the files directly in data_dir
    images, coarse, fine = written["test.bin"]
    fine_set = cifar100("test", data_dir=str(tmp_path), verify=False).dataset
    np.testing.assert_array_equal(fine_set.images, images)
    np.testing.assert_array_equal(fine_set.labels, fine)
    assert fine_set.classes == [f"fine{i}" for i in range(100)]
    coarse_set = cifar100("test", data_dir=str(tmp_path), verify=False, label="coarse").dataset
    np.testing.assert_array_equal(coarse_set.labels, coarse)
    assert coarse_set.classes == [f"coarse{i}" for i in range(20)]
    assert len(cifar100("train", data_dir=str(tmp_path), verify=False, validation_size=5).dataset) == 25


def test_damaged_or_foreign_files_are_named(tmp_path):
    write_cifar10(tmp_path)
    path = tmp_path / "test_batch.bin"
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ValueError, match="test_batch.bin: .* not a whole number of 3,073-byte records"):
        cifar10("test", data_dir=str(tmp_path), verify=False)
    with pytest.raises(ValueError, match="test_batch.bin: checksum mismatch .*verify"):
        cifar10("test", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="test.bin not found.*download"):
        cifar100("test", data_dir=str(tmp_path / "nothing"))
    # CIFAR-100 records read as CIFAR-10 ones: the sizes differ, so the file is refused by its size or labels
    write_cifar100(tmp_path / "c100", train=3073, test=10)
    (tmp_path / "c100" / "test_batch.bin").write_bytes((tmp_path / "c100" / "train.bin").read_bytes())
    with pytest.raises(ValueError, match="labels go up to .* 10 classes"):
        cifar10("test", data_dir=str(tmp_path / "c100"), verify=False)


def test_download_fetches_verifies_and_extracts_the_archive(tmp_path, monkeypatch):
    """`download: true` through a local mirror: the archive's MD5 and SHA-256 are checked, its data files extracted
    (and nothing else: a path outside the folder is never written)."""
    source = tmp_path / "mirror"
    written = write_cifar10(tmp_path / "staging" / "cifar-10-batches-bin")
    source.mkdir()
    archive = source / "cifar-10-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "staging" / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
        evil = tarfile.TarInfo("../evil.txt")
        evil.size = 4
        tar.addfile(evil, io.BytesIO(b"evil"))
    data = archive.read_bytes()
    files = {
        name: hashlib.sha256((tmp_path / "staging" / "cifar-10-batches-bin" / name).read_bytes()).hexdigest()
        for name in written
    }
    monkeypatch.setitem(
        cifar.SOURCES,
        "cifar10",
        {
            **cifar.SOURCES["cifar10"],
            "mirrors": [(tmp_path / "offline").as_uri(), source.as_uri()],
            "md5": hashlib.md5(data).hexdigest(),
            "sha256": hashlib.sha256(data).hexdigest(),
            "files": files,
        },
    )
    target = tmp_path / "data" / "cifar10"
    loader = cifar10("test", data_dir=str(target), download=True)  # verify: every file's SHA-256 too
    np.testing.assert_array_equal(loader.dataset.images, written["test_batch.bin"][0])
    assert sorted(p.name for p in (target / "cifar-10-batches-bin").iterdir()) == sorted([*written, "batches.meta.txt"])
    assert not (tmp_path / "data" / "evil.txt").exists()
    assert len(cifar10("train", data_dir=str(target), download=True, validation_size=10).dataset) == 50
    # a corrupt archive already in the folder is refused by its checksum, not extracted
    (target / "cifar-10-batches-bin" / "data_batch_3.bin").unlink()
    (target / "cifar-10-binary.tar.gz").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="cifar-10-binary.tar.gz: checksum mismatch"):
        cifar10("train", data_dir=str(target), download=True)


def test_published_checksums_are_well_formed():
    for source in cifar.SOURCES.values():
        assert len(source["md5"]) == 32 and len(source["sha256"]) == 64
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in source["files"].values())
        assert set(source["files"]) == {*source["train"], *source["test"]}


@pytest.mark.parametrize(
    "name, args, message",
    [
        ("cifar10", {"split": "all"}, 'args.split: expected "train", "validation" or "test"'),
        ("cifar100", {"label": "medium"}, "args.label: cifar100 has 'coarse' or 'fine' labels, got 'medium'"),
        ("cifar10", {"validation_sise": 10}, "args.validation_sise: unknown argument. Did you mean 'validation_size'?"),
        ("cifar10", {"dtype": "int8"}, 'args.dtype: expected "uint8"'),
        ("cifar10", {"data_dir": "NOWHERE"}, "data_batch_1.bin not found"),
    ],
)
def test_config_errors_are_one_line_with_status_2(tmp_path, capsys, monkeypatch, name, args, message):
    config = {
        "name": "cifar",
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [8]}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {"train": {"name": name, "args": {"split": "train", **args}}},
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "monitor": "off"},
    }
    if args.get("data_dir") == "NOWHERE":
        config["data_loader"]["train"]["args"]["data_dir"] = str(tmp_path / "nowhere")
    line = train_error(tmp_path, capsys, monkeypatch, config)
    assert message in line, line
