"""Tables of numbers in a CSV file (a header row, then one example per row), held in memory as float32.

The file is split into train / validation / test by a partition of its rows (``split_by``: seeded at random, in the
file's order, or by whole groups of a ``group`` column), the same for every split that is loaded, so three loaders
over one file never share a row. Features are standardised with the mean and standard
deviation of the train split only, whichever split is loaded: validation and test rows are scaled exactly as the model
saw during training, and no statistic leaks from them. Targets keep their units, so losses and metrics read in them.

``columns`` declares what a column is beyond numbers (docs/data.md): a categorical column becomes one 0/1 column per
category (the categories of the train split, in sorted order; a category the train split never had is a row of
zeros, at predict time too), and a column's empty cells are filled by a rule ("mean", "median", "most_frequent",
"constant" with ``fill``) whose value is learned on the train split, with an optional 0/1 column saying which cells
were filled. A single categorical target becomes class ids (int32) named by its categories. What was learned goes
into ``preprocessing`` (``columns``, ``encoded``, ``mean``, ``std`` per encoded column) for predict.py to apply to
raw rows. The task is not the loader's to say: it follows from the loss and the targets (training/task_kinds.py).
"""

from __future__ import annotations

import csv
import difflib
import io
import math
from pathlib import Path

import numpy as np

from data_loader.sources.csv_cells import encode, finite
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


# How a column's empty cells are filled, from its values in the train split: their mean, median or most frequent value
# (a number or a category), or the declaration's own ``fill``.
MISSING_RULES = ("mean", "median", "most_frequent", "constant")
# The most categories a categorical column may have: each becomes one 0/1 input column of float64 per row while the
# file is encoded (100,000 rows x 1,000 categories is 800 MB already). Past it the column names rows (an id) or
# wants an embedding, not a one-hot, and 200,000 of them would ask for hundreds of GB before anything could fail.
MAX_CATEGORIES = 1000
COLUMN_KEYS = ("categorical", "missing", "fill", "indicator")


def check_columns(columns) -> None:
    """The loader's ``columns`` declarations, checked without reading the file (their names are checked against
    the header when it is read): ValueError naming the key."""
    if columns is None:
        return
    if not isinstance(columns, dict):
        raise ValueError(
            'columns: expected an object of column name -> declaration, such as {"plan": {"categorical": true}, '
            f'"age": {{"missing": "median"}}}}, got {columns!r}'
        )
    for name, spec in columns.items():
        where = f"columns.{name}"
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: expected an object with some of {', '.join(COLUMN_KEYS)}, got {spec!r}")
        for key in spec:
            if key not in COLUMN_KEYS:
                close = difflib.get_close_matches(str(key), COLUMN_KEYS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{where}.{key}: unknown key; a column declares {', '.join(COLUMN_KEYS)}.{hint}")
        categorical, missing = spec.get("categorical", False), spec.get("missing")
        for key in ("categorical", "indicator"):
            if not isinstance(spec.get(key, False), bool):
                raise ValueError(f"{where}.{key}: expected true or false, got {spec[key]!r}")
        if missing is not None and missing not in MISSING_RULES:
            raise ValueError(f"{where}.missing: expected one of {', '.join(map(repr, MISSING_RULES))}, got {missing!r}")
        if categorical and missing in ("mean", "median"):
            raise ValueError(
                f'{where}.missing: {missing!r} needs numbers; a categorical column fills with "most_frequent" or '
                '"constant"'
            )
        if missing == "constant":
            fill = spec.get("fill")
            fits = isinstance(fill, str) if categorical else _is_number(fill)
            if not fits:
                expected = "a category (a string)" if categorical else "a finite number"
                raise ValueError(f'{where}.fill: missing "constant" fills with {expected}, got {fill!r}')
        elif "fill" in spec:
            raise ValueError(f'{where}.fill: used only with missing "constant" (missing is {missing!r})')
        if spec.get("indicator") and missing is None:
            raise ValueError(f"{where}.indicator: marks the cells that were filled; declare {where}.missing too")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _most_frequent(values: list):
    """The most frequent value; of several as frequent, the smallest (a rule that never depends on row order)."""
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    top = max(counts.values())
    return min(value for value, count in counts.items() if count == top)


def _cell_error(path: Path, header, column: int, r: int, lines, cell: str, hint: str = "") -> ValueError:
    what = "an empty cell (a missing value)" if not cell.strip() else f"{cell!r}, not a finite number"
    return ValueError(f"{path}: data row {r + 1} (line {lines[r]}), column {header[column]!r}: {what}{hint}")


def _words_hint(name: str, cells: list[str]) -> str:
    """What to do with a column of words: declare it categorical, or, where its values never repeat (an id) or are
    too many to be categories, leave it out of features: as categories it would be an input column per row."""
    known = [cell for cell in cells if cell]
    distinct = len(set(known))
    if distinct > MAX_CATEGORIES or 1 < distinct == len(known):
        return (
            f"; its {distinct:,} distinct values are an id's or too many for categories (at most {MAX_CATEGORIES:,}): "
            "leave it out of features"
        )
    return f"; declare columns.{name}.categorical (true) if it holds categories"


def _encode_feature(path, header, rows, lines, column: int, spec: dict, train: np.ndarray):
    """One feature column as encoded columns: (values float64 (N, k), their names, whether each is standardised,
    what was learned for predict.py). What is learned comes from the train split; every row is then encoded by it
    through csv_cells.encode, as predict.py encodes raw rows."""
    name = header[column]
    cells = [row[column].strip() for row in rows]
    empty = np.array([not cell for cell in cells])
    missing = spec.get("missing")
    fill_hint = f'; declare columns.{name}.missing ("mean", "median", "most_frequent" or "constant") to fill it'
    if missing is None and spec.get("categorical") and empty.any():  # before its categories are counted
        r = int(np.argmax(empty))
        raise _cell_error(path, header, column, r, lines, cells[r], fill_hint)
    learned: dict = {}
    seen = train[~empty[train]].tolist()  # the train split's rows holding a value
    if missing not in (None, "constant") and not seen:
        raise ValueError(
            f"{path}: column {name!r}: every cell of the train split is empty, nothing to take the {missing} of"
        )
    if spec.get("categorical"):
        fill = (
            spec.get("fill") if missing == "constant" else _most_frequent([cells[i] for i in seen]) if missing else None
        )
        categories = sorted({fill if empty[i] else cells[i] for i in train})
        if len(categories) > MAX_CATEGORIES:  # refused before the one-hot array is allocated
            raise ValueError(
                f"{path}: column {name!r}: {len(categories):,} categories in the train split, more than the "
                f"{MAX_CATEGORIES:,} a categorical column may have; leave it out of features"
            )
        names = [f"{name}={category}" for category in categories]
        scaled = [False] * len(categories)
        learned["categories"] = categories
    else:
        if missing:  # a cell that is no number is NaN here, and reported by encode below
            known = np.array([finite(cells[i]) for i in seen], np.float64)
            fill = {
                "mean": lambda: float(known.mean()),
                "median": lambda: float(np.median(known)),
                "most_frequent": lambda: float(_most_frequent(list(known))),
                "constant": lambda: float(spec["fill"]),
            }[missing]()
        names, scaled = [name], [True]
    if missing:
        learned.update(missing=missing, fill=fill)
    if spec.get("indicator"):
        names.append(f"{name} missing")
        scaled.append(False)
        learned["indicator"] = True
    values, bad, _ = encode(cells, learned)  # a category the train split never had: a row of zeros
    if bad is not None:
        cell = cells[bad]
        try:  # "nan" and "1e400" are numbers, refused as they are; an empty cell or words get a hint
            float(cell)
            hint = ""
        except ValueError:
            hint = fill_hint if not cell else _words_hint(name, cells)
        raise _cell_error(path, header, column, bad, lines, cell, hint)
    return values, names, scaled, learned


def _categorical_target(path, header, rows, lines, column: int, parts: dict, split: str):
    """A categorical target as class ids (int32 (N,)) and its classes, the train split's categories in sorted order;
    a row of the loaded split whose category the train split never had cannot be scored: an error naming it."""
    cells = [row[column].strip() for row in rows]
    classes = sorted({cells[i] for i in parts["train"]})
    index = {category: k for k, category in enumerate(classes)}
    for r in parts[split]:
        if cells[r] not in index:
            what = "an empty cell" if not cells[r] else f"the category {cells[r]!r}"
            raise ValueError(
                f"{path}: data row {r + 1} (line {lines[r]}), target {header[column]!r}: {what}, which the train "
                f"split does not have (its classes: {', '.join(classes)})"
            )
    return np.array([index.get(cell, -1) for cell in cells], np.int32), classes


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
            value = finite(row[column])
            if value is None:
                raise _cell_error(path, header, column, r, lines, row[column])
            out[r, c] = value
    return out


class CsvDataset:
    """One split of a CSV file: `input` float32 (N, encoded features), `target` float32 (N, len(targets)), or int32
    class ids (N,) for a single categorical target.

    `features` default to every column that is not a target; only the columns used are read, numbers unless
    `columns` declares them otherwise (see the module's docstring). With `sha256` set the file's checksum is
    verified before it is read.
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
        columns=None,
    ):
        path = Path(path)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        check_split_by(split_by, group, "a column")
        check_columns(columns)
        columns = columns or {}
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
        self._check_declared(path, header, columns, features, targets)

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
        encoded, names, scaled, learned = [], [], [], {}
        for name, column in zip(features, feature_columns):
            values, its_names, its_scaled, its_learned = _encode_feature(
                path, header, rows, lines, column, columns.get(name, {}), parts["train"]
            )
            encoded.append(values)
            names += its_names
            scaled += its_scaled
            if name in columns:
                learned[name] = its_learned
        x = np.concatenate(encoded, axis=1)
        # one-hot and missing-indicator columns stay 0/1: what they say needs no scale
        scaled = np.array(scaled) & bool(standardize)
        train = x[parts["train"]]
        mean = np.where(scaled, train.mean(axis=0), 0.0)
        std = np.where(scaled, train.std(axis=0), 1.0)
        std = np.where(std > 0, std, 1.0)  # a constant column stays constant (0) instead of dividing by zero
        keep = parts[split]
        self.inputs = ((x[keep] - mean) / std).astype(np.float32)
        self.preprocessing = {"features": features, "targets": targets}
        if len(targets) == 1 and columns.get(targets[0], {}).get("categorical"):
            ids, classes = _categorical_target(path, header, rows, lines, target_columns[0], parts, split)
            self.targets = ids[keep]
            self.preprocessing["classes"] = classes
        else:
            # every row's targets read, as every feature's: a bad cell is reported whichever split is loaded
            self.targets = _numbers(path, header, rows, lines, target_columns)[keep].astype(np.float32)
        if learned:
            self.preprocessing.update(columns=learned, encoded=names)
        self.preprocessing.update(mean=[float(v) for v in mean], std=[float(v) for v in std])

    @staticmethod
    def _check_declared(path: Path, header: list[str], columns: dict, features: list[str], targets: list[str]) -> None:
        """Each declared column is a feature, or a single target declared categorical and nothing more."""
        for name, spec in columns.items():
            if name in targets:
                if len(targets) > 1 or set(spec) != {"categorical"} or not spec["categorical"]:
                    raise ValueError(
                        f"{path}: columns.{name}: a target may only be declared categorical, and only as the one "
                        'target ({"categorical": true}: its categories become class ids); its cells cannot be filled'
                    )
            elif name not in features:
                where = "is not one of the features" if name in header else "is not a column of the file"
                close = difflib.get_close_matches(name, features, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{path}: columns.{name}: {where}; the features: {', '.join(features)}.{hint}")

    def __len__(self) -> int:
        return len(self.inputs)

    def get_batch(self, indices):
        return {"input": self.inputs[indices], "target": self.targets[indices]}
