"""The arrays data set: .npz files and folders of .npy files mapped to input/target (several inputs as a dict),
memory-mapped rather than read (a file far larger than what the test lets the loader read), seeded splits, and the
errors a wrong name or file gives."""

from __future__ import annotations

import resource
import zipfile

import numpy as np
import pytest

from data_loader.data_loaders import arrays
from data_loader.sources.arrays import ArraysDataset, open_arrays
from data_loader.sources.tabular import split_rows
from tests.end_to_end.test_data_faults import train_error


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return {
        "images": rng.integers(0, 256, (50, 4, 4, 3), dtype=np.uint8),
        "features": rng.standard_normal((50, 5)),  # float64: read as float32
        "labels": rng.integers(0, 7, 50),  # int64: read as int32
        "fortran": np.asfortranarray(rng.standard_normal((50, 3)).astype(np.float32)),
    }


@pytest.mark.parametrize("kind", ["npz", "npz_compressed", "npy_folder"])
def test_named_arrays_become_input_and_target(tmp_path, data, kind):
    if kind == "npy_folder":
        path = tmp_path / "arrays"
        path.mkdir()
        for name, array in data.items():
            np.save(path / f"{name}.npy", array)
    else:
        path = tmp_path / "data.npz"
        (np.savez_compressed if kind == "npz_compressed" else np.savez)(path, **data)
    one = ArraysDataset(path, "images", "labels")
    idx = np.array([3, 0, 49, 3])
    batch = one.get_batch(idx)
    np.testing.assert_array_equal(batch["input"], data["images"][idx])
    assert batch["input"].dtype == np.uint8
    np.testing.assert_array_equal(batch["target"], data["labels"][idx])
    assert batch["target"].dtype == np.int32
    several = ArraysDataset(path, ["images", "features"], "labels").get_batch(idx)
    assert set(several["input"]) == {"images", "features"}
    assert several["input"]["features"].dtype == np.float32
    np.testing.assert_allclose(several["input"]["features"], data["features"][idx], rtol=1e-6)
    renamed = ArraysDataset(path, {"image": "images", "extra": "fortran"}, None).get_batch(idx)
    assert set(renamed) == {"input"} and set(renamed["input"]) == {"image", "extra"}
    np.testing.assert_array_equal(renamed["input"]["extra"], data["fortran"][idx])
    # memory-mapped unless compressed (a compressed member's bytes on disk are not the array's)
    leaf = one.arrays["images"]
    assert isinstance(leaf, np.memmap) == (kind != "npz_compressed")


def test_loader_batches_splits_and_preprocessing(tmp_path, data):
    path = tmp_path / "data.npz"
    np.savez(path, **data)
    loaders = {
        split: arrays(
            str(path),
            "images",
            "labels",
            split=split,
            validation_fraction=0.2,
            test_fraction=0.1,
            batch_size=16,
            classes=[str(i) for i in range(7)],
        )
        for split in ("train", "validation", "test")
    }
    parts = split_rows(50, 0.2, 0.1, 0)
    for split, loader in loaders.items():
        assert np.array_equal(loader.dataset.rows, parts[split])
    batch = next(loaders["validation"].batches(0))
    np.testing.assert_array_equal(batch["input"][:10], data["images"][parts["validation"]])
    assert batch["mask"].tolist() == [1.0] * 10 + [0.0] * 6
    assert loaders["train"].preprocessing == {"classes": [str(i) for i in range(7)]}
    assert len(arrays(str(path), "images", "labels").dataset) == 50  # "all": files already split


def test_a_file_larger_than_what_the_loader_may_read_stays_a_memory_map(tmp_path):
    """A 1 GiB .npy (sparse: nothing written) trained a batch at a time: the peak memory of this process grows by
    far less than the file, and the dataset's array is still the file's memory map after an epoch's batches."""
    rows, width = 1 << 15, 1 << 15  # 32768 x 32768 uint8 = 1 GiB
    folder = tmp_path / "big"
    folder.mkdir()
    x = np.lib.format.open_memmap(folder / "x.npy", mode="w+", dtype=np.uint8, shape=(rows, width))
    x[-1, -1] = 7
    del x
    np.save(folder / "y.npy", np.arange(rows, dtype=np.int32) % 10)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    loader = arrays(str(folder), "x", "y", batch_size=64, shuffle=True, prefetch=0)
    for _, batch in zip(range(20), loader.batches(0)):
        assert batch["input"].shape == (64, width)
    last = loader.dataset.get_batch(np.array([rows - 1]))
    assert last["input"][0, -1] == 7 and last["target"][0] == (rows - 1) % 10
    assert isinstance(loader.dataset.arrays["x"], np.memmap)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200, f"peak memory grew by {grown_mib:.0f} MiB reading 21 batches of a 1024 MiB file"


def test_npz_member_offsets_are_found_in_zip64_archives_too(tmp_path, data):
    path = tmp_path / "data.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in data.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array)
    loaded = open_arrays(path, list(data))
    for name, array in data.items():
        assert isinstance(loaded[name], np.memmap)
        np.testing.assert_array_equal(loaded[name], array)


def test_errors_name_the_file_and_what_exists(tmp_path, data):
    path = tmp_path / "data.npz"
    np.savez(path, **data)
    with pytest.raises(
        ValueError,
        match=r"data.npz: no array 'label'; available: images, features, labels, fortran. "
        r"Did you mean 'labels'\?",
    ):
        ArraysDataset(path, "images", "label")
    np.savez(tmp_path / "short.npz", a=np.zeros((5, 2)), b=np.zeros(4))
    with pytest.raises(ValueError, match="different numbers of rows: a 5, b 4"):
        ArraysDataset(tmp_path / "short.npz", "a", "b")
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}, None], dtype=object), b=np.zeros(2))
    with pytest.raises(ValueError, match="objects.npz: array 'a' holds Python objects"):
        ArraysDataset(tmp_path / "objects.npz", "a", "b")
    (tmp_path / "fake.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="fake.npz: not an .npz file"):
        ArraysDataset(tmp_path / "fake.npz", "a", "b")
    with pytest.raises(FileNotFoundError, match="none.npz: no such file or folder"):
        ArraysDataset(tmp_path / "none.npz", "a", "b")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(ValueError, match="a single .npy file holds one unnamed array"):
        ArraysDataset(tmp_path / "single.npy", "a", "b")


@pytest.mark.parametrize(
    "args, message",
    [
        ({"input": "images"}, "data_loader.train.args: missing argument 'target'"),
        ({"input": "images", "target": "labels", "split": "val"}, "args.split: expected one of 'all', 'train'"),
        ({"input": ["images", "images"], "target": "labels"}, "args.input: expected an array name, a list of names"),
        (
            {"input": "images", "target": "labels", "validation_fraction": 0.6, "test_fraction": 0.5},
            "leave no rows for training",
        ),
        ({"input": "images", "target": "labels", "mmaap": False}, "args.mmaap: unknown argument. Did you mean 'mmap'?"),
        ({"input": "images", "target": "labls"}, "data.npz: no array 'labls'"),
    ],
)
def test_config_errors_are_one_line_with_status_2(tmp_path, capsys, monkeypatch, data, args, message):
    np.savez(tmp_path / "data.npz", **data)
    config = {
        "name": "arrays",
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [8], "num_classes": 7}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {"train": {"name": "arrays", "args": {"path": str(tmp_path / "data.npz"), **args}}},
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "monitor": "off"},
    }
    line = train_error(tmp_path, capsys, monkeypatch, config)
    assert message in line, line
