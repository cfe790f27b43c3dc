"""A sweep's search space: the swept key paths (`--grid`, `--sample`) parsed and checked against the config before
any trial starts, as Optuna's distributions, and the `--set` overrides that give a trial its values.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from files.reads import NotJson, parse_json
from training.config.file import is_index


class SweepError(Exception):
    """A bad sweep argument or a study that cannot be used: reported as one line, exit status 2."""


DISTRIBUTIONS = "uniform:LOW:HIGH, loguniform:LOW:HIGH, int:LOW:HIGH or choice:[v1, v2, ...]"
FOLDER_KEYS = ("name", "trainer.save_dir", "trainer.run_id")  # the sweep names each trial's folder itself


class Param(NamedTuple):
    """One swept key path: its flag, the values a config must accept (every listed one, or both ends of a range)
    and its distribution. Optuna's choices are None, bool, int, float or str: a list or object goes as JSON text."""

    key: str
    flag: str
    candidates: list
    distribution: Any

    def decode(self, value: Any) -> Any:
        return json.loads(value) if any(isinstance(v, (list, dict)) for v in self.candidates) else value


def parse(flag: str, text: str) -> Param:
    """A --grid KEY.PATH=[...] or --sample KEY.PATH=DISTRIBUTION argument."""
    key, sep, raw = (part.strip() for part in text.partition("="))
    kind, rest = ("grid", raw) if flag == "--grid" else raw.partition(":")[::2]
    form = "KEY.PATH=[v1, v2, ...]" if flag == "--grid" else f"KEY.PATH=DISTRIBUTION ({DISTRIBUTIONS})"

    def bad(why: str) -> SweepError:
        return SweepError(f"{flag} {text}: {why}")

    if not sep or not raw or "" in key.split("."):
        raise bad(f"expected {form}")
    if kind in ("grid", "choice"):
        try:
            values = parse_json(rest, flag)  # held to the JSON depth bound: nested past it, no RecursionError
        except NotJson:
            values = None
        if not isinstance(values, list) or not values:
            raise bad(f"expected {form if kind == 'grid' else 'choice:[v1, v2, ...]'} (a non-empty JSON list)")
        encoded = any(isinstance(v, (list, dict)) for v in values)
        return Param(key, flag, values, CategoricalDistribution([json.dumps(v) if encoded else v for v in values]))
    if kind not in ("uniform", "loguniform", "int"):
        raise bad(f"unknown distribution {kind!r}; expected {DISTRIBUTIONS}")
    try:
        low, high = map(int if kind == "int" else float, rest.split(":"))
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError
    except ValueError:
        raise bad(f"expected {kind}:LOW:HIGH with two {'integers' if kind == 'int' else 'numbers'}") from None
    if low > high or (kind != "int" and low == high):
        raise bad("LOW must be below HIGH")
    if kind == "loguniform" and low <= 0:
        raise bad("loguniform needs 0 < LOW")
    distribution = IntDistribution(low, high) if kind == "int" else FloatDistribution(low, high, log=kind != "uniform")
    return Param(key, flag, [low, high], distribution)


def check_key(config: dict, param: Param, fixed: dict, source: str) -> None:
    """The key path must exist in the resolved config, not be a folder's, and not be swept or set twice. A
    component's argument the config leaves at its default (adam's b1) may be named too: validation checks it."""
    key, node, parts = param.key, config, param.key.split(".")
    if key in FOLDER_KEYS:
        raise SweepError(f"{param.flag} {key}: the sweep names each trial's folder; --set it to move the sweep")
    if key in fixed:
        raise SweepError(f"{param.flag} {key}: already given by {fixed[key]}")
    fixed[key] = param.flag
    for i, part in enumerate(parts):
        if not isinstance(node, (dict, list)):
            raise SweepError(f"{key}: {'.'.join(parts[:i])} is a value in {source}, not a section")
        found = part in node if isinstance(node, dict) else is_index(part) and int(part) < len(node)
        if not found:
            if (i == len(parts) - 1 and i > 0 and parts[i - 1] == "args") or (part == "args" and i == len(parts) - 2):
                return
            where = ".".join(parts[:i]) or "the top level"
            raise SweepError(f"{key}: no such key in {source} ({where} has no {part!r})")
        node = node[part if isinstance(node, dict) else int(part)]


def probes(params: list[Param]) -> list[tuple[Param, Any, dict]]:
    """(param, value, all swept values) for each candidate of each param, the others at their first: every key path
    and every end of every range is validated before a trial starts."""
    first = {p.key: p.candidates[0] for p in params}
    return [(p, value, {**first, p.key: value}) for p in params for value in p.candidates]


def overrides(values: dict) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]
