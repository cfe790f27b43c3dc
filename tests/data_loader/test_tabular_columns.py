"""The CSV loader's per-column declarations: categorical columns one-hot over the train split's categories, missing
cells filled by a rule learned on the train split (with an indicator column), a categorical target as class ids,
what is recorded for predict.py, and one clear error per bad declaration."""

from __future__ import annotations

import numpy as np
import pytest

from data_loader.data_loaders import _check_csv
from data_loader.sources.tabular import MAX_CATEGORIES, CsvDataset, split_rows


def write(path, text):
    path.write_text(text)
    return path


@pytest.fixture
def raw(tmp_path):
    """20 rows: plan (categorical, some empty), age (numbers, some empty), fee (numbers), label (0/1)."""
    plans = ["basic", "pro", "basic", "", "family", "basic", "pro", "basic", "", "pro"] * 2
    ages = ["30", "", "45", "22", "", "51", "38", "29", "41", "33"] * 2
    lines = ["plan,age,fee,label"]
    lines += [f"{p},{a},{10 + i},{i % 3 == 0:d}" for i, (p, a) in enumerate(zip(plans, ages))]
    return write(tmp_path / "raw.csv", "\n".join(lines) + "\n"), plans, ages


COLUMNS = {"plan": {"categorical": True, "missing": "most_frequent"}, "age": {"missing": "median", "indicator": True}}


def test_categories_and_fills_are_learned_on_the_train_split(raw):
    path, plans, ages = raw
    train_rows = split_rows(20, 0.2, 0.2, 0)["train"]
    data = CsvDataset(path, "label", split="train", validation_fraction=0.2, test_fraction=0.2, columns=COLUMNS)
    p = data.preprocessing
    train_plans = {plans[i] for i in train_rows} - {""}
    assert p["columns"]["plan"]["categories"] == sorted(train_plans)
    known_plans = [plans[i] for i in train_rows if plans[i]]
    assert p["columns"]["plan"]["fill"] == max(sorted(set(known_plans)), key=known_plans.count)
    known_ages = [float(ages[i]) for i in train_rows if ages[i]]
    assert p["columns"]["age"] == {"missing": "median", "fill": float(np.median(known_ages)), "indicator": True}
    categories = p["columns"]["plan"]["categories"]
    assert p["encoded"] == [f"plan={c}" for c in categories] + ["age", "age missing", "fee"]
    assert "task" not in p and p["features"] == ["plan", "age", "fee"] and p["targets"] == ["label"]
    x = data.inputs
    assert x.shape == (len(train_rows), len(categories) + 3) and data.targets.shape == (len(train_rows), 1)
    k = len(categories)
    # one-hot and indicator columns stay 0/1 (mean 0, std 1 recorded); numbers are standardised on the train split
    assert set(np.unique(x[:, :k])) <= {0.0, 1.0} and (x[:, :k].sum(1) == 1).all()
    assert p["mean"][:k] == [0.0] * k and p["std"][:k] == [1.0] * k and p["mean"][k + 1] == 0.0
    np.testing.assert_array_equal(x[:, k + 1], [ages[i] == "" for i in train_rows])
    filled = np.array([float(ages[i]) if ages[i] else p["columns"]["age"]["fill"] for i in train_rows])
    np.testing.assert_allclose(x[:, k], (filled - filled.mean()) / filled.std(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([p["mean"][k], p["std"][k]], [filled.mean(), filled.std()])


def test_other_splits_use_what_the_train_split_taught(tmp_path):
    # "gold" and 99 only outside the train split: the category is a row of zeros, the fill the train split's
    lines = ["plan,age,label"] + [f"{'a' if i % 2 else 'b'},{i % 5},0" for i in range(8)] + ["gold,,1", "b,99,1"]
    path = write(tmp_path / "t.csv", "\n".join(lines) + "\n")
    common = dict(split_by="order", validation_fraction=0.2, test_fraction=0.0)
    columns = {"plan": {"categorical": True}, "age": {"missing": "mean"}}
    train = CsvDataset(path, "label", split="train", columns=columns, **common)
    val = CsvDataset(path, "label", split="validation", columns=columns, **common)
    assert train.preprocessing == val.preprocessing
    assert train.preprocessing["columns"]["plan"] == {"categories": ["a", "b"]}
    mean, std = train.preprocessing["mean"][2], train.preprocessing["std"][2]
    fill = train.preprocessing["columns"]["age"]["fill"]
    assert fill == pytest.approx(np.mean([i % 5 for i in range(8)]))
    np.testing.assert_allclose(val.inputs, [[0, 0, (fill - mean) / std], [0, 1, (99 - mean) / std]], rtol=1e-5)


def test_constant_fills_and_a_categorical_target(tmp_path):
    lines = ["colour,size,kind"] + [f"{c},{s},{k}" for c, s, k in [("red", "1", "cat"), ("", "", "dog")] * 10]
    path = write(tmp_path / "t.csv", "\n".join(lines) + "\n")
    columns = {
        "colour": {"categorical": True, "missing": "constant", "fill": "unknown"},
        "size": {"missing": "constant", "fill": -1},
        "kind": {"categorical": True},
    }
    data = CsvDataset(path, "kind", split="train", standardize=False, columns=columns)
    assert data.preprocessing["classes"] == ["cat", "dog"]
    assert data.targets.dtype == np.int32 and data.targets.shape == (len(data),)
    assert data.preprocessing["columns"]["colour"]["categories"] == ["red", "unknown"]
    dogs = data.targets == 1
    np.testing.assert_array_equal(data.inputs[dogs], [[0, 1, -1]] * int(dogs.sum()))
    np.testing.assert_array_equal(data.inputs[~dogs], [[1, 0, 1]] * int((~dogs).sum()))


@pytest.mark.parametrize(
    "columns, message",
    [
        ([1], "columns: expected an object of column name -> declaration"),
        ({"plan": {"categoricl": True}}, "columns.plan.categoricl: unknown key; .* Did you mean 'categorical'?"),
        ({"age": {"missing": "avg"}}, "columns.age.missing: expected one of 'mean', 'median'"),
        ({"plan": {"categorical": True, "missing": "mean"}}, "columns.plan.missing: 'mean' needs numbers"),
        ({"age": {"missing": "constant"}}, 'columns.age.fill: missing "constant" fills with a finite number'),
        ({"plan": {"categorical": True, "missing": "constant", "fill": 0}}, "fills with a category"),
        ({"age": {"missing": "mean", "fill": 3}}, 'columns.age.fill: used only with missing "constant"'),
        ({"age": {"indicator": True}}, "columns.age.indicator: marks the cells that were filled"),
        ({"age": {"categorical": "yes"}}, "columns.age.categorical: expected true or false"),
    ],
)
def test_bad_declarations_are_one_line_before_reading(columns, message):
    with pytest.raises(ValueError, match=message):
        _check_csv(columns=columns)


def test_declarations_that_need_the_file(raw):
    path, _, _ = raw
    with pytest.raises(ValueError, match=r"column 'age': an empty cell \(a missing value\); declare columns.age"):
        CsvDataset(path, "label", columns={"plan": {"categorical": True, "missing": "most_frequent"}})
    with pytest.raises(
        ValueError, match=r"column 'plan': 'basic', not a finite number; declare columns.plan.categorical"
    ):
        CsvDataset(path, "label", features=["plan", "fee"])
    with pytest.raises(
        ValueError, match=r"columns.agee: is not a column of the file; the features: plan, age, fee. Did you"
    ):
        CsvDataset(path, "label", columns={**COLUMNS, "agee": {"missing": "mean"}})
    with pytest.raises(ValueError, match="columns.label: a target may only be declared categorical"):
        CsvDataset(path, "label", columns={**COLUMNS, "label": {"missing": "mean"}})


def test_a_bad_target_cell_is_named_by_its_file_row_whichever_split_is_loaded(tmp_path):
    lines = ["plan,y"] + [f"{'ab'[i % 2]},{i}" for i in range(19)] + ["a,oops"]
    path = write(tmp_path / "t.csv", "\n".join(lines) + "\n")
    for split in ("train", "test"):  # row 20 is in the test split (split_by "order")
        with pytest.raises(ValueError, match=r"data row 20 \(line 21\), column 'y': 'oops', not a finite number"):
            CsvDataset(path, "y", split=split, split_by="order", columns={"plan": {"categorical": True}})


def test_a_categorical_column_of_too_many_categories_is_refused_naming_the_count(tmp_path):
    """Before: 200,000 distinct values asked numpy for a one-hot array of 179 GiB (_ArrayMemoryError); here
    MAX_CATEGORIES + 1 of them in the train split would have been a 1,001-column one-hot."""
    rows = MAX_CATEGORIES + 1
    lines = ["id,x,y"] + [f"c{i},{i % 7},{i % 2}" for i in range(rows)]
    path = write(tmp_path / "ids.csv", "\n".join(lines) + "\n")
    split = {"validation_fraction": 0.0, "test_fraction": 0.0}
    with pytest.raises(ValueError) as error:
        CsvDataset(path, "y", columns={"id": {"categorical": True}}, **split)
    assert str(error.value) == (
        f"{path}: column 'id': 1,001 categories in the train split, more than the 1,000 a categorical column may "
        "have; leave it out of features"
    )
    assert CsvDataset(path, "y", features=["x"], columns={"x": {"categorical": True}}, **split).inputs.shape == (
        rows,
        7,
    )


@pytest.mark.parametrize("many", [5, MAX_CATEGORIES + 1])
def test_a_column_of_ids_is_told_to_leave_features_not_to_become_categories(tmp_path, many):
    """Before: "declare columns.id.categorical (true)", a one-hot input per row; a column of few repeated words
    is still told to declare itself categorical."""
    lines = ["id,plan,y"] + [f"c{i},{'ab'[i % 2]},{i % 2}" for i in range(many)]
    path = write(tmp_path / "ids.csv", "\n".join(lines) + "\n")
    with pytest.raises(ValueError) as error:
        CsvDataset(path, "y", features=["id"], validation_fraction=0.0, test_fraction=0.0)
    assert str(error.value) == (
        f"{path}: data row 1 (line 2), column 'id': 'c0', not a finite number; its {many:,} distinct values are an "
        "id's or too many for categories (at most 1,000): leave it out of features"
    )
    with pytest.raises(ValueError, match="'a', not a finite number; declare columns.plan.categorical"):
        CsvDataset(path, "y", features=["plan"], validation_fraction=0.0, test_fraction=0.0)
