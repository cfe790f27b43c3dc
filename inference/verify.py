"""Parity of an exported model with the JAX model: explicit tolerances, and where it differed when it does.

Pass criterion, per element (numpy's `allclose`): |got - expected| <= atol + rtol * |expected|, and `got` finite
wherever `expected` is. The relative difference reported is max |got - expected| / max |expected|: the error on the
scale of the outputs (per element, logits near zero would make any rounding look large).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

ATOL = 1e-4
RTOL = 1e-4


@dataclass
class Comparison:
    max_abs_diff: float
    max_rel_diff: float
    ok: bool
    failure: str | None = None  # the worst element, in words, when not ok

    def to_dict(self) -> dict:
        return asdict(self)


def compare(got, expected, atol: float = ATOL, rtol: float = RTOL, what: str = "output") -> Comparison:
    """got vs expected (same shape; the first axis indexes examples)."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    if got.shape != expected.shape:
        return Comparison(
            float("inf"), float("inf"), False, f"{what}: shape {list(got.shape)}, expected {list(expected.shape)}"
        )
    if got.size == 0:
        return Comparison(0.0, 0.0, True)
    finite = np.isfinite(expected)
    with np.errstate(invalid="ignore"):  # inf - inf where JAX itself is not finite: not compared
        diff = np.where(finite, np.abs(got - expected), 0.0)
    diff = np.where(finite & ~np.isfinite(got), np.inf, diff)
    scale = float(np.abs(np.where(finite, expected, 0.0)).max())
    rel = float(diff.max()) / scale if scale > 0 else float(diff.max())
    bad = diff > atol + rtol * np.abs(np.where(finite, expected, 0.0))
    if not bad.any():
        return Comparison(float(diff.max()), rel, True)
    excess = np.where(bad, diff - rtol * np.abs(np.where(finite, expected, 0.0)), -np.inf)
    worst = np.unravel_index(int(np.argmax(excess)), diff.shape)
    message = (
        f"{what}: {int(bad.sum())} of {bad.size} values outside atol {atol:g} + rtol {rtol:g} * |expected|; "
        f"worst at example {worst[0]}, index {list(map(int, worst[1:]))}: got {got[worst]:.6g}, "
        f"expected {expected[worst]:.6g} (|diff| {diff[worst]:.3g})"
    )
    return Comparison(float(diff.max()), rel, False, message)


def merge(comparisons: list[Comparison]) -> Comparison:
    """One comparison summing up several (e.g. one per batch size): worst figures, first failure."""
    failures = [c.failure for c in comparisons if not c.ok]
    return Comparison(
        max(c.max_abs_diff for c in comparisons),
        max(c.max_rel_diff for c in comparisons),
        not failures,
        failures[0] if failures else None,
    )
