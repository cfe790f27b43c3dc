"""Tables of numbers in a CSV file (a header row, then one example per row), held in memory as float32.

The file is split into train / validation / test by a partition of its rows (``split_by``: seeded at random, in the
file's order, or by whole groups of a ``group`` column), the same for every split that is loaded, so three loaders
over one file never share a row. Features are standardised with the mean and standard
deviation of the train split only, whichever split is loaded: validation and test rows are scaled exactly as the model
saw during training, and no statistic leaks from them. Targets keep their units, so losses and metrics read in them.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
from pathlib import Path

import numpy as np

from data_loader.sources.download import checksum
from files.reads import open_regular

SPLITS = ("train", "validation", "test")
# How the arrays and csv loaders partition rows into train / validation / test (docs/data.md says when each is right):
# "random" a seeded shuffle of the rows; "order" the file's order, train first, then validation, then test (a time
# series: the model is judged on what comes after what it learned from); "group" whole groups of rows (a patient, a
# recording) at random, each group in one split only, named by `group`.
SPLIT_BY = ("random", "order", "group")


def check_split_by(split_by, group, what: str) -> None:
    """A loader's ``split_by`` and ``group`` (``what`` the group names: "an array", "a column"), as ValueError."""
    if split_by not in SPLIT_BY:
        raise ValueError(f"split_by: expected one of {', '.join(map(repr, SPLIT_BY))}, got {split_by!r}")
    if split_by == "group" and not (isinstance(group, str) and group):
        raise ValueError(f'group: split_by "group" needs the name of {what} holding each row\'s group, got {group!r}')
    if split_by != "group" and group is not None:
        raise ValueError(f'group: {group!r} is used only with split_by "group" (split_by is {split_by!r})')


def split_rows(
    num_rows: int,
    validation_fraction: float,
    test_fraction: float,
    split_seed: int,
    split_by: str = "random",
    groups: np.ndarray | None = None,
) -> dict:
    """Row indices of each split, each in file order: a function of (num_rows, fractions, split_seed, split_by and
    the rows' groups) only. "random": a seeded permutation of the rows; "order": the first rows train, then
    validation, then test; "group": whole groups (``groups``, one value per row) in a seeded order, validation
    taking groups until it holds its share of the rows, then test, the rest train."""
    if not (0 <= validation_fraction < 1 and 0 <= test_fraction < 1 and validation_fraction + test_fraction < 1):
        raise ValueError(
            f"validation_fraction ({validation_fraction}) and test_fraction ({test_fraction}) must be "
            "in [0, 1) and leave rows for training"
        )
    num_validation = round(num_rows * validation_fraction)
    num_test = round(num_rows * test_fraction)
    if num_validation + num_test >= num_rows:
        raise ValueError(
            f"{num_rows} rows leave none for training with validation_fraction {validation_fraction} "
            f"and test_fraction {test_fraction}"
        )
    if split_by == "order":
        num_train = num_rows - num_validation - num_test
        rows = np.arange(num_rows)
        return {
            "train": rows[:num_train],
            "validation": rows[num_train : num_train + num_validation],
            "test": rows[num_train + num_validation :],
        }
    if split_by == "group":
        return _split_groups(groups, num_validation, num_test, split_seed)
    order = np.random.default_rng(split_seed).permutation(num_rows)
    parts = {
        "validation": order[:num_validation],
        "test": order[num_validation : num_validation + num_test],
        "train": order[num_validation + num_test :],
    }
    return {name: np.sort(rows) for name, rows in parts.items()}


def _split_groups(groups: np.ndarray, num_validation: int, num_test: int, split_seed: int) -> dict:
    """Whole groups to validation until it holds ``num_validation`` rows or more, then to test likewise, the rest
    to train; the groups in a seeded order, so the splits' sizes follow the fractions as closely as the groups
    allow."""
    _, group_of_row, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    group_of_row = group_of_row.reshape(-1)
    split_of_group = np.zeros(len(sizes), np.int64)  # 0 train, 1 validation, 2 test
    taken = [0, 0, 0]
    for g in np.random.default_rng(split_seed).permutation(len(sizes)):
        target = 1 if taken[1] < num_validation else 2 if taken[2] < num_test else 0
        split_of_group[g] = target
        taken[target] += sizes[g]
    if not taken[0]:
        raise ValueError(
            f"the {len(sizes)} groups leave none for training with these fractions; lower validation_fraction or "
            "test_fraction, or split into more groups"
        )
    split_of_row = split_of_group[group_of_row]
    return {name: np.flatnonzero(split_of_row == i) for i, name in enumerate(("train", "validation", "test"))}


def _read(path: Path) -> tuple[list[str], list[list[str]], list[int]]:
    """(header, rows, the file line each row ends on); a row of a different length than the header, or one the csv
    module cannot read (a cell over its 131,072 characters), is an error naming its line."""
    readers = []  # the reader, for the line an error is on
    try:
        return _read_rows(path, readers)
    except csv.Error as error:
        line = readers[0].line_num if readers else 0
        raise ValueError(f"{path}: line {line}: not readable as CSV ({error})") from None


def _read_rows(path: Path, readers: list) -> tuple[list[str], list[list[str]], list[int]]:
    # a regular file only (a FIFO would block); -sig: spreadsheet exports often start with a byte-order mark
    with open_regular(path) as raw, io.TextIOWrapper(raw, "utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        readers.append(reader)
        header = next(reader, None)
        if header is None or not any(cell.strip() for cell in header):
            raise ValueError(f"{path}: the file is empty (expected a header row of column names, then data rows)")
        header = [name.strip() for name in header]
        rows, lines = [], []
        for row in reader:
            if not row:  # a blank line, e.g. a trailing newline
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path}: line {reader.line_num} has {len(row)} cells, the header has {len(header)} columns"
                )
            rows.append(row)
            lines.append(reader.line_num)
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise ValueError(f"{path}: column names appear more than once in the header: {', '.join(duplicates)}")
    if not rows:
        raise ValueError(f"{path}: the file has a header but no data rows")
    return header, rows, lines


def _column_indices(path: Path, header: list[str], names: list[str], what: str) -> list[int]:
    for name in names:
        if name not in header:
            close = difflib.get_close_matches(name, header, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{path}: {what} column {name!r} not found; available: {', '.join(header)}.{hint}")
    return [header.index(name) for name in names]


def _numbers(path: Path, header: list[str], rows: list[list[str]], lines: list[int], columns: list[int]) -> np.ndarray:
    """The given columns as float64 (num_rows, len(columns)); a cell that is no finite number is named."""
    out = np.empty((len(rows), len(columns)), np.float64)
    for r, row in enumerate(rows):
        for c, column in enumerate(columns):
            cell = row[column]
            try:
                value = float(cell)
            except ValueError:
                value = None
            if value is None or not math.isfinite(value):
                what = "an empty cell (a missing value)" if not cell.strip() else f"{cell!r}, not a finite number"
                raise ValueError(
                    f"{path}: data row {r + 1} (line {lines[r]}), column {header[column]!r}: {what}"
                ) from None
            out[r, c] = value
    return out


class CsvDataset:
    """One split of a CSV file: `input` float32 (N, len(features)), `target` float32 (N, len(targets)).

    `features` default to every column that is not a target; only the columns used must hold numbers. With
    `sha256` set the file's checksum is verified before it is read.
    """

    def __init__(
        self,
        path,
        targets,
        features=None,
        split="train",
        validation_fraction=0.1,
        test_fraction=0.1,
        split_seed=0,
        standardize=True,
        sha256=None,
        split_by="random",
        group=None,
    ):
        path = Path(path)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        check_split_by(split_by, group, "a column")
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file")
        actual = checksum(path, "sha256") if sha256 is not None else None
        if sha256 is not None and actual != sha256.lower():
            raise ValueError(
                f"{path}: checksum mismatch (sha256 {actual}, expected {sha256}); the file is not the "
                "one the config was written for"
            )
        targets = [targets] if isinstance(targets, str) else list(targets)
        if not targets:
            raise ValueError(f"{path}: no target columns given")
        header, rows, lines = _read(path)
        target_columns = _column_indices(path, header, targets, "target")
        if features is None:  # the group column names rows, it does not describe them
            features = [name for name in header if name not in targets and name != group]
        features = [features] if isinstance(features, str) else list(features)
        both = sorted(set(features) & set(targets))
        if both:
            raise ValueError(f"{path}: columns used both as features and targets: {', '.join(both)}")
        if not features:
            raise ValueError(f"{path}: no feature columns (every column is a target)")
        feature_columns = _column_indices(path, header, features, "feature")

        x = _numbers(path, header, rows, lines, feature_columns)
        y = _numbers(path, header, rows, lines, target_columns)
        groups = None
        if split_by == "group":
            (column,) = _column_indices(path, header, [group], "group")
            groups = np.array([row[column].strip() for row in rows])
        parts = split_rows(len(rows), validation_fraction, test_fraction, split_seed, split_by, groups)
        if not len(parts[split]):
            raise ValueError(
                f"{path}: the {split} split of {len(rows)} rows is empty (validation_fraction "
                f"{validation_fraction}, test_fraction {test_fraction})"
            )
        if standardize:
            train = x[parts["train"]]
            mean, std = train.mean(axis=0), train.std(axis=0)
            std = np.where(std > 0, std, 1.0)  # a constant column stays constant (0) instead of dividing by zero
        else:
            mean, std = np.zeros(x.shape[1]), np.ones(x.shape[1])
        keep = parts[split]
        self.inputs = ((x[keep] - mean) / std).astype(np.float32)
        self.targets = y[keep].astype(np.float32)
        self.preprocessing = {
            "task": "regression",
            "features": features,
            "targets": targets,
            "mean": [float(v) for v in mean],
            "std": [float(v) for v in std],
        }

    def __len__(self) -> int:
        return len(self.inputs)

    def get_batch(self, indices):
        return {"input": self.inputs[indices], "target": self.targets[indices]}
