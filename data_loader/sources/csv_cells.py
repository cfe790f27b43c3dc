"""A CSV's cells as the model's inputs: the one rule for a numeric cell and the one encoding of a column, shared by
the training loader (tabular.py) and inference/predict.py. The export copies this file beside predict.py, so it
imports numpy and the standard library only; each caller words its own error from what ``encode`` reports."""

from __future__ import annotations

import math

import numpy as np


def finite(cell: str) -> float | None:
    """A cell's number, or None where it holds no finite one (words, "nan", "inf", "1e400"): the rule for every
    numeric cell, of features and targets."""
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def encode(cells: list[str], learned: dict) -> tuple[np.ndarray, int | None, list]:
    """One column's cells (stripped) as the encoded columns training made of it, by what training learned of it
    (preprocessing.json's ``columns`` entry: ``categories``, ``fill``, ``indicator``; {} for plain numbers):
    (values float64 (N, k), None, the categories training never had, sorted), or, where a cell cannot be encoded
    (empty and no ``fill`` learned; numeric and no finite number), (nothing, the first such row, []). A category
    training never had is a row of zeros, in the loader's validation and test splits as in predict.py's rows."""
    fill = learned.get("fill")  # None where training learned none: an empty cell is then refused
    categories = learned.get("categories")
    filled = [(cell if categories is not None else finite(cell)) if cell else fill for cell in cells]
    if None in filled:
        return np.zeros((len(cells), 0)), filled.index(None), []
    unseen = set()
    if categories is None:
        values = np.array(filled, np.float64).reshape(-1, 1)
    else:
        index = {category: k for k, category in enumerate(categories)}
        values = np.zeros((len(cells), len(index)))
        for r, cell in enumerate(filled):
            if cell in index:
                values[r, index[cell]] = 1.0
            else:
                unseen.add(cell)
    if learned.get("indicator"):
        values = np.column_stack([values, np.array([not cell for cell in cells], np.float64)])
    return values, None, sorted(unseen, key=str)  # str: a hand-edited fill that is a number sorts among words
