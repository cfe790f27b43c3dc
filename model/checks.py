"""Numeric argument checks, shared by the layers, losses, optimizers, schedules, loaders and augmentations (here in
model/, the lowest layer, so that every other one may use them). Each raises ValueError "<name>: must be ...,
got <value>"; the config resolver adds where in the config the argument is.

Three wordings, each the one its callers have always printed (tests and users match them):
``check_integer`` "must be an integer from 1 to 64", ``check_range`` "must be in [0, 1)" / ">= 0" / "> 0",
``check_number`` "must be a number > 0 and <= 1" (with ``check_interval`` for [min, max] pairs).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

# A layer size past this (16,777,216) fits in no memory: it is a typo, not a model.
MAX_SIZE = 2**24


def check_integer(
    value: Any, name: str, minimum: int = 1, maximum: int = MAX_SIZE, *, whole_float: bool = False
) -> None:
    """An integer from `minimum` to `maximum`; a bool is none. ``whole_float``: 10.0 counts as 10."""
    whole = isinstance(value, numbers.Integral) or (whole_float and isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not minimum <= value <= maximum:
        raise ValueError(f"{name}: must be an integer from {minimum} to {maximum:,}, got {value!r}")


def check_range(
    value: Any, name: str, low: float = 0.0, high: float = math.inf, *, open_low: bool = False, open_high: bool = False
) -> None:
    """A number from `low` to `high` (an open end excludes its bound); NaN is in no range."""
    try:
        number = math.nan if isinstance(value, (bool, str)) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if math.isnan(number) and not isinstance(value, float):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    if (
        math.isnan(number)
        or (number <= low if open_low else number < low)
        or (number >= high if open_high else number > high)
    ):
        if high == math.inf:
            expected = f"{'>' if open_low else '>='} {low:g}"
        else:
            expected = f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
        raise ValueError(f"{name}: must be {expected}, got {value!r}")


def check_number(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    integer: bool = False,
    open_low: bool = False,
) -> float:
    """A finite number in [low, high] ((low, high] with open_low), an integer when `integer`; returned as a float
    (an int when `integer`)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        kind = "an integer" if integer else "a number"
        bounds = ("" if low is None else f" {'>' if open_low else '>='} {low:g}") + (
            "" if high is None else f"{' and' if low is not None else ''} <= {high:g}"
        )
        raise ValueError(f"{name}: must be {kind}{bounds}, got {value!r}")
    return int(value) if integer else float(value)


def check_interval(value: Any, name: str, low: float, high: float | None = None) -> tuple[float, float]:
    """[a, b] with low < a <= b (<= high)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"{name}: expected [min, max], got {value!r}")
    a = check_number(value[0], f"{name}.0", low, high, open_low=True)
    b = check_number(value[1], f"{name}.1", low, high, open_low=True)
    if a > b:
        raise ValueError(f"{name}: min {a:g} is above max {b:g}")
    return a, b
