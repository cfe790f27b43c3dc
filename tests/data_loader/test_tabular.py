"""The CSV dataset: columns, the seeded split, train-only standardisation, checksums and error messages; and the
noisy MNIST segmentation option of the MNIST dataset."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from data_loader.data_loaders import csv as csv_loader
from data_loader.data_loaders import mnist, mnist_segmentation
from data_loader.sources.mnist import fixed_noise
from data_loader.sources.tabular import CsvDataset, split_rows
from tests.conftest import make_idx_dataset


def write_csv(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, row)) for row in rows]) + "\n")
    return path


@pytest.fixture
def table(tmp_path):
    """50 rows: id (text), a, b (features in different units), c (constant), y, z (targets)."""
    rng = np.random.default_rng(0)
    a = rng.normal(10, 3, 50).round(4)
    b = rng.normal(-200, 50, 50).round(3)
    rows = [[f"r{i}", a[i], b[i], 7, round(2 * a[i] - b[i], 3), i] for i in range(50)]
    path = write_csv(tmp_path / "table.csv", ["id", "a", "b", "c", "y", "z"], rows)
    return path, np.array([[r[1], r[2], r[3]] for r in rows]), np.array([[r[4], r[5]] for r in rows])


def test_columns_shapes_dtypes_and_preprocessing(table):
    path, x, y = table
    data = CsvDataset(path, ["y", "z"], features=["a", "b", "c"], split="train", standardize=False)
    batch = data.get_batch(np.arange(len(data)))
    assert batch["input"].dtype == np.float32 and batch["input"].shape == (40, 3)
    assert batch["target"].dtype == np.float32 and batch["target"].shape == (40, 2)
    rows = split_rows(50, 0.1, 0.1, 0)["train"]
    np.testing.assert_allclose(batch["input"], x[rows], rtol=1e-6)
    np.testing.assert_allclose(batch["target"], y[rows], rtol=1e-6)
    assert data.preprocessing == {  # no task: the loss and the targets say it (training/task_kinds.py)
        "features": ["a", "b", "c"],
        "targets": ["y", "z"],
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
    }
    # a single target may be a string; unused text columns are never parsed
    single = CsvDataset(path, "y", features=["a"], split="test")
    assert single.get_batch(np.arange(2))["target"].shape == (2, 1)


def test_features_default_to_every_non_target_column(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["p", "y", "q"], [[i, 2 * i, -i] for i in range(20)])
    data = CsvDataset(path, ["y"], split="train")
    assert data.preprocessing["features"] == ["p", "q"] and data.preprocessing["targets"] == ["y"]


def test_split_is_a_seeded_partition_in_file_order():
    parts = split_rows(103, 0.2, 0.1, split_seed=5)
    assert [len(parts[s]) for s in ("train", "validation", "test")] == [72, 21, 10]
    everything = np.concatenate(list(parts.values()))
    assert np.array_equal(np.sort(everything), np.arange(103))  # disjoint and complete
    assert all(np.array_equal(np.sort(p), p) for p in parts.values())
    again = split_rows(103, 0.2, 0.1, split_seed=5)
    assert all(np.array_equal(parts[s], again[s]) for s in parts)
    other = split_rows(103, 0.2, 0.1, split_seed=6)
    assert not np.array_equal(parts["validation"], other["validation"])


def test_splits_of_one_file_are_disjoint_and_deterministic(table):
    path, _, _ = table
    ids = {}
    for split in ("train", "validation", "test"):
        data = CsvDataset(path, ["z"], features=["a"], split=split, split_seed=3)  # z holds the row number
        ids[split] = set(data.get_batch(np.arange(len(data)))["target"][:, 0].astype(int))
        again = CsvDataset(path, ["z"], features=["a"], split=split, split_seed=3)
        assert np.array_equal(data.targets, again.targets)
    assert sum(map(len, ids.values())) == 50 and set.union(*ids.values()) == set(range(50))


def test_standardisation_uses_train_statistics_for_every_split(table):
    path, x, _ = table
    train_rows = split_rows(50, 0.1, 0.1, 0)["train"]
    mean, std = x[train_rows].mean(axis=0), x[train_rows].std(axis=0)
    std[2] = 1.0  # the constant column: left at 0, not divided by zero
    for split in ("train", "validation", "test"):
        data = CsvDataset(path, ["y"], features=["a", "b", "c"], split=split)
        np.testing.assert_allclose(data.preprocessing["mean"], mean, rtol=1e-12)
        np.testing.assert_allclose(data.preprocessing["std"], std, rtol=1e-12)
        rows = split_rows(50, 0.1, 0.1, 0)[split]
        np.testing.assert_allclose(data.inputs, (x[rows] - mean) / std, rtol=1e-5, atol=1e-6)
    train = CsvDataset(path, ["y"], features=["a", "b", "c"], split="train").inputs
    np.testing.assert_allclose(train[:, :2].mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(train[:, :2].std(axis=0), 1, atol=1e-5)
    assert np.all(train[:, 2] == 0)


def test_sha256_is_checked(table):
    path, _, _ = table
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(CsvDataset(path, ["y"], features=["a"], sha256=digest.upper())) == 40
    with pytest.raises(ValueError, match=f"table.csv: checksum mismatch \\(sha256 {digest}, expected 00ff"):
        CsvDataset(path, ["y"], features=["a"], sha256="00ff")


@pytest.mark.parametrize(
    "targets, features, message",
    [
        (["yy"], None, "table.csv: target column 'yy' not found; available: id, a, b, c, y, z. Did you mean 'y'?"),
        (
            ["y"],
            ["a", "bb"],
            "table.csv: feature column 'bb' not found; available: id, a, b, c, y, z. Did you mean 'b'?",
        ),
        (["y"], ["qqqq"], "feature column 'qqqq' not found; available: id, a, b, c, y, z."),
        (["y"], ["a", "y"], "table.csv: columns used both as features and targets: y"),
        (["y"], None, "table.csv: data row 1 (line 2), column 'id': 'r0', not a finite number"),
        ([], None, "table.csv: no target columns given"),
    ],
)
def test_column_errors_name_the_file_and_column(table, targets, features, message):
    path, _, _ = table
    with pytest.raises(ValueError) as error:
        CsvDataset(path, targets, features=features)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty.csv: the file is empty"),
        ("\n\n", "empty.csv: the file is empty"),
        ("a,y\n", "empty.csv: the file has a header but no data rows"),
        ("a,y\n1,2\n3,x\n", "empty.csv: data row 2 (line 3), column 'y': 'x', not a finite number"),
        ("a,y\n1,2\n\n3,nan\n", "empty.csv: data row 2 (line 4), column 'y': 'nan', not a finite number"),
        ("a,y\n1,2\n,4\n", "empty.csv: data row 2 (line 3), column 'a': an empty cell (a missing value)"),
        ("a,y\n1,2\n3,4,5\n", "empty.csv: line 3 has 3 cells, the header has 2 columns"),
        ("a,a,y\n1,2,3\n", "empty.csv: column names appear more than once in the header: a"),
    ],
)
def test_file_errors(tmp_path, text, message):
    path = tmp_path / "empty.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        CsvDataset(path, ["y"], validation_fraction=0.0, test_fraction=0.0)
    assert message in str(error.value)


def test_bad_split_arguments(table, tmp_path):
    path, _, _ = table
    with pytest.raises(ValueError, match="unknown split 'val'"):
        CsvDataset(path, ["y"], features=["a"], split="val")
    with pytest.raises(ValueError, match="leave rows for training"):
        CsvDataset(path, ["y"], features=["a"], validation_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ValueError, match="the validation split of 50 rows is empty"):
        CsvDataset(path, ["y"], features=["a"], split="validation", validation_fraction=0.0)
    with pytest.raises(FileNotFoundError, match="missing.csv: no such file"):
        CsvDataset(tmp_path / "missing.csv", ["y"])


def test_csv_loader_batches_and_preprocessing(table):
    path, _, _ = table
    loader = csv_loader(str(path), ["y", "z"], features=["a", "b"], split="train", batch_size=16, shuffle=True)
    batches = list(loader.batches(0))
    assert len(batches) == 3 and all(b["input"].shape == (16, 2) and b["target"].shape == (16, 2) for b in batches)
    assert [b["mask"].sum() for b in batches] == [16, 16, 8]
    assert loader.spec["input"].shape == (16, 2) and loader.preprocessing["features"] == ["a", "b"]


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("idx") / "mnist"
    make_idx_dataset(folder, n_train=60, n_test=20)
    return folder


def test_fixed_noise_is_standard_normal_and_a_function_of_id_and_seed():
    noise = fixed_noise(np.arange(2000), 64, seed=0)
    assert noise.dtype == np.float32 and noise.shape == (2000, 64)
    assert abs(noise.mean()) < 0.01 and abs(noise.std() - 1) < 0.01
    assert abs(np.mean(noise**4) - 3) < 0.1  # Gaussian kurtosis
    assert abs(np.corrcoef(noise[:, :-1].ravel(), noise[:, 1:].ravel())[0, 1]) < 0.01
    np.testing.assert_array_equal(fixed_noise(np.array([7, 3]), 64, 0), noise[[7, 3]])
    assert not np.allclose(fixed_noise(np.array([7]), 64, 1), noise[7])


def test_mnist_segmentation_targets_and_fixed_noise(idx_dir):
    clean = mnist("train", 8, data_dir=str(idx_dir), verify=False, validation_size=10)
    labels = next(clean.batches(0))
    assert labels["target"].dtype == np.int32 and labels["target"].shape == (8,)  # the default is unchanged
    seg = mnist_segmentation("train", 8, data_dir=str(idx_dir), verify=False, validation_size=10, noise_std=0.0)
    batch = next(seg.batches(0))
    assert batch["target"].dtype == np.float32 and batch["target"].shape == (8, 28, 28, 1)
    pixels = batch["input"] * 0.3081 + 0.1307  # MNIST's normalisation undone
    np.testing.assert_array_equal(batch["target"], (pixels > 0.5).astype(np.float32))
    np.testing.assert_allclose(batch["input"], labels["input"], atol=1e-6)

    noisy = mnist_segmentation("train", 8, data_dir=str(idx_dir), verify=False, validation_size=10, noise_std=0.5)
    first = next(noisy.batches(0))
    np.testing.assert_array_equal(first["target"], batch["target"])  # the target is the clean digit's mask
    added = (first["input"] - batch["input"]) * 0.3081
    assert 0.4 < added.std() < 0.6
    # the same example gets the same noise in any epoch and batch position
    shuffled = mnist_segmentation(
        "train", 50, shuffle=True, data_dir=str(idx_dir), verify=False, validation_size=10, noise_std=0.5
    )
    for epoch in (0, 1):
        order = shuffled.order(epoch)
        again = next(shuffled.batches(epoch))
        position = {int(i): p for p, i in enumerate(order[:50])}
        for i in range(8):
            np.testing.assert_array_equal(again["input"][position[i]], first["input"][i])
