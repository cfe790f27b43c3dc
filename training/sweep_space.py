"""A sweep's search space: the swept key paths (`--grid`, `--sample`) parsed and checked against the config before
any trial starts, as Optuna's distributions, and the `--set` overrides that give a trial its values.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from training.config_file import is_index


class SweepError(Exception):
    """A bad sweep argument or a study that cannot be used: reported as one line, exit status 2."""


DISTRIBUTIONS = "uniform:LOW:HIGH, loguniform:LOW:HIGH, int:LOW:HIGH or choice:[v1, v2, ...]"


class Param(NamedTuple):
    """One swept key path: a grid (`values` in order), or a distribution to draw from."""

    key: str
    kind: str  # grid, choice, uniform, loguniform, int
    values: tuple = ()  # grid and choice
    low: float = 0.0
    high: float = 0.0

    @property
    def candidates(self) -> list:
        """The values a config must accept: every listed one, or both ends of a range."""
        return list(self.values) if self.values else [self.low, self.high]

    @property
    def encoded(self) -> bool:
        """Optuna's choices are None, bool, int, float or str: a list or object value goes as its JSON text."""
        return any(isinstance(v, (list, dict)) for v in self.values)

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.values:
            return CategoricalDistribution([json.dumps(v) if self.encoded else v for v in self.values])
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high))
        return FloatDistribution(self.low, self.high, log=self.kind == "loguniform")

    def decode(self, value: Any) -> Any:
        return json.loads(value) if self.encoded else value


def split_assignment(text: str, flag: str, expected: str) -> tuple[str, str]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip() or any(not part for part in key.split(".")):
        raise SweepError(f"{flag} {text}: expected {expected}")
    return key, raw.strip()


def json_list(raw: str) -> list | None:
    """A non-empty JSON list, or None."""
    try:
        values = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return values if isinstance(values, list) and values else None


def parse_grid(text: str) -> Param:
    key, raw = split_assignment(text, "--grid", "KEY.PATH=[v1, v2, ...] (a JSON list)")
    values = json_list(raw)
    if values is None:
        raise SweepError(f"--grid {text}: expected KEY.PATH=[v1, v2, ...] (a non-empty JSON list), got {raw!r}")
    return Param(key, "grid", tuple(values))


def parse_sample(text: str) -> Param:
    key, raw = split_assignment(text, "--sample", f"KEY.PATH=DISTRIBUTION ({DISTRIBUTIONS})")
    kind, _, rest = raw.partition(":")
    where = f"--sample {text}"
    if kind == "choice":
        values = json_list(rest)
        if values is None:
            raise SweepError(f"{where}: expected choice:[v1, v2, ...] (a non-empty JSON list)")
        return Param(key, kind, tuple(values))
    if kind not in ("uniform", "loguniform", "int"):
        raise SweepError(f"{where}: unknown distribution {kind!r}; expected {DISTRIBUTIONS}")
    bounds = rest.split(":")
    number = int if kind == "int" else float
    try:
        low, high = (number(b) for b in bounds) if len(bounds) == 2 else (None, None)
    except ValueError:
        low = high = None
    if low is None or not (math.isfinite(low) and math.isfinite(high)):
        raise SweepError(f"{where}: expected {kind}:LOW:HIGH with two {'integers' if kind == 'int' else 'numbers'}")
    if low > high or (kind != "int" and low == high):
        raise SweepError(f"{where}: LOW must be below HIGH")
    if kind == "loguniform" and low <= 0:
        raise SweepError(f"{where}: loguniform needs 0 < LOW")
    return Param(key, kind, (), low, high)


# The sweep names each trial's folder itself (a --set of them moves the whole sweep).
FOLDER_KEYS = ("name", "trainer.save_dir", "trainer.run_id")


def check_space(params: list[Param], fixed: list[str]) -> None:
    seen = {text.partition("=")[0].strip(): "--set" for text in fixed}
    for param in params:
        flag = "--grid" if param.kind == "grid" else "--sample"
        if param.key in FOLDER_KEYS:
            raise SweepError(
                f"{flag} {param.key}: the sweep names each trial's folder; set it with --set to choose "
                f"where the sweep goes"
            )
        if param.key in seen:
            raise SweepError(f"{flag} {param.key}: already given by {seen[param.key]}")
        seen[param.key] = flag


def check_key(config: dict, key: str, source: str) -> None:
    """The key path must exist in the resolved config. A component's argument that the config leaves at its default
    (adam's b1) may be named too: validation checks it against the component's signature."""
    node, parts = config, key.split(".")
    for i, part in enumerate(parts):
        if isinstance(node, dict):
            found, child = part in node, node.get(part)
        elif isinstance(node, list):
            found = is_index(part) and int(part) < len(node)
            child = node[int(part)] if found else None
        else:
            raise SweepError(f"{key}: {'.'.join(parts[:i])} is a value in {source}, not a section")
        if not found:
            if (i == len(parts) - 1 and i > 0 and parts[i - 1] == "args") or (part == "args" and i == len(parts) - 2):
                return
            raise SweepError(
                f"{key}: no such key in {source} ({'.'.join(parts[:i]) or 'the top level'} has no {part!r})"
            )
        node = child


def probes(params: list[Param]) -> list[tuple[Param, Any, dict]]:
    """(param, value, all swept values) for each candidate of each param, the others at their first: every key path
    and every end of every range is validated before a trial starts."""
    first = {p.key: p.candidates[0] for p in params}
    return [(p, value, {**first, p.key: value}) for p in params for value in p.candidates]


def overrides(values: dict) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]
