"""Splits that do not leak: the arrays and csv loaders' `split_by` "order" (chronological: train, then validation,
then test, each in file order) and "group" (whole groups of rows, never one group in two splits), beside the seeded
random split."""

from __future__ import annotations

import numpy as np
import pytest

from data_loader.data_loaders import arrays, csv
from data_loader.sources.tabular import split_rows
from training.config.file import ConfigError
from training.config.validation import validate

SPLITS = ("train", "validation", "test")


def partition(loaders: dict) -> dict:
    return {split: loader.dataset.rows for split, loader in loaders.items()}


def check_partition(parts: dict, rows: int) -> None:
    """Every row in exactly one split."""
    joined = np.concatenate(list(parts.values()))
    assert sorted(joined.tolist()) == list(range(rows))


@pytest.fixture
def series(tmp_path):
    """A time series cut into overlapping windows (row i holds steps i..i+7), with the patient each row is from."""
    steps = np.arange(108, dtype=np.float32)
    windows = np.stack([steps[i : i + 8] for i in range(100)])
    patient = np.repeat(np.arange(13), 8)[:100]  # 12 patients of 8 rows and one of 4
    np.savez(tmp_path / "series.npz", x=windows, y=steps[8:108], patient=patient)
    return tmp_path / "series.npz", windows, patient


def loaders_of(path, **args) -> dict:
    return {
        s: arrays(str(path), "x", "y", split=s, validation_fraction=0.2, test_fraction=0.1, batch_size=8, **args)
        for s in SPLITS
    }


def test_ordered_split_keeps_the_order_and_never_overlaps_in_time(series):
    path, windows, _ = series
    parts = partition(loaders_of(path, split_by="order"))
    check_partition(parts, 100)
    assert [len(parts[s]) for s in SPLITS] == [70, 20, 10]
    # train is the past, validation after it, test last; each split in file order
    assert parts["train"].max() < parts["validation"].min() and parts["validation"].max() < parts["test"].min()
    for rows in parts.values():
        assert np.all(np.diff(rows) == 1)
    # the windows of train and test share no time step once the gap between them is a window wide; the random
    # split mixes them everywhere
    random = partition(loaders_of(path))
    gap = lambda p: windows[p["test"]].min() - windows[p["train"]].max()  # noqa: E731
    assert gap(parts) > 0 > gap(random)


def test_grouped_split_never_puts_one_group_in_two_splits(series):
    path, _, patient = series
    parts = partition(loaders_of(path, split_by="group", group="patient"))
    check_partition(parts, 100)
    groups = {s: set(patient[parts[s]].tolist()) for s in SPLITS}
    assert all(groups[s] for s in SPLITS)
    assert not (groups["train"] & groups["validation"] or groups["train"] & groups["test"])
    assert not groups["validation"] & groups["test"]
    # whole groups: the validation split holds its share of the rows, to the nearest group
    assert 20 <= len(parts["validation"]) < 20 + 8
    # the random split does mix them
    random = partition(loaders_of(path))
    assert set(patient[random["train"]].tolist()) & set(patient[random["test"]].tolist())
    # the same seed, the same groups; another seed, others
    again = partition(loaders_of(path, split_by="group", group="patient"))
    assert all(np.array_equal(parts[s], again[s]) for s in SPLITS)
    other = split_rows(100, 0.2, 0.1, 1, "group", patient)
    assert not np.array_equal(other["validation"], parts["validation"])


def test_csv_splits_by_order_and_by_a_group_column(tmp_path):
    lines = ["patient,a,b,y"] + [f"p{i % 7},{i},{i * 2},{i % 3}" for i in range(60)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    build = lambda **args: {  # noqa: E731
        s: csv(str(tmp_path / "t.csv"), "y", split=s, validation_fraction=0.2, test_fraction=0.2, **args)
        for s in SPLITS
    }
    ordered = build(split_by="order", features=["a", "b"])
    assert [ordered[s].dataset.inputs.shape[0] for s in SPLITS] == [36, 12, 12]
    grouped = build(split_by="group", group="patient")
    # the group column names rows; it is not a feature unless asked for
    assert grouped["train"].dataset.preprocessing["features"] == ["a", "b"]
    seen = {}
    for s in SPLITS:  # standardised features: the raw `a` (the row number) comes back through mean and std
        pre = grouped[s].dataset.preprocessing
        a = np.rint(grouped[s].dataset.inputs[:, 0] * pre["std"][0] + pre["mean"][0]).astype(int)
        seen[s] = {f"p{i % 7}" for i in a}
        assert seen[s]
    assert not (seen["train"] & seen["validation"] or seen["train"] & seen["test"] or seen["validation"] & seen["test"])


@pytest.mark.parametrize(
    "args, message",
    [
        ({"split_by": "time"}, "split_by: expected one of 'random', 'order', 'group', got 'time'"),
        ({"split_by": "group"}, 'group: split_by "group" needs the name of an array'),
        ({"group": "patient"}, "group: 'patient' is used only with split_by \"group\""),
    ],
)
def test_a_wrong_split_by_is_one_line_naming_its_place(tmp_path, args, message):
    config = {
        "name": "s",
        "model": {"name": "mlp", "args": {"num_classes": 2}},
        "loss": {"name": "cross_entropy"},
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {"train": {"name": "arrays", "args": {"path": "x.npz", "input": "x", "target": "y", **args}}},
    }
    with pytest.raises(ConfigError, match="data_loader.train") as error:
        validate(config)
    assert message in str(error.value) and "\n" not in str(error.value)
