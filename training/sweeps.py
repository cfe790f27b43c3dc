"""Hyperparameter sweeps: the search space, trial draws that a restarted sweep repeats exactly, the ledger that lets
it restart, median pruning, and the results (table, CSV, plots).

`sweep.py` runs each trial as a `train.py` process; everything here is plain Python over the config's key paths and
the run folders' `metrics.jsonl`, so it needs neither JAX nor the trainer.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import random
import statistics
from pathlib import Path
from typing import Any, NamedTuple

from training.files import sync_folder, write_atomic

DISTRIBUTIONS = "uniform:LOW:HIGH, loguniform:LOW:HIGH, int:LOW:HIGH or choice:[v1, v2, ...]"
FINISHED = ("done", "failed", "pruned")


class SweepError(Exception):
    """A bad sweep argument or a sweep folder that cannot be used: reported as one line, exit status 2."""


# ---------------------------------------------------------------------------------------------------- search space
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

    def draw(self, rng: random.Random) -> Any:
        if self.kind == "choice":
            return rng.choice(self.values)
        if self.kind == "int":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "loguniform":
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return min(max(float(f"{value:.4g}"), self.low), self.high)  # 4 digits read well and change nothing


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
            found = part.isdigit() and int(part) < len(node)
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


class RandomSampler:
    """Trial i takes the grid's point i % size (in the order of the product) and draws the rest from its own
    generator, seeded by (seed, i): the same trial gets the same values in any run, restart or longer sweep."""

    def __init__(self, params: list[Param], seed: int):
        self.grid = [p for p in params if p.kind == "grid"]
        self.sampled = [p for p in params if p.kind != "grid"]
        self.points = list(itertools.product(*(p.values for p in self.grid)))
        self.seed = seed

    def params(self, trial: int) -> dict:
        rng = random.Random(f"{self.seed}:{trial}")
        point = self.points[trial % len(self.points)]
        return {**{p.key: v for p, v in zip(self.grid, point)}, **{p.key: p.draw(rng) for p in self.sampled}}

    def resume(self, recorded: int) -> None:
        pass

    def tell(self, trial: int, params: dict, status: str, value: float | None) -> None:
        pass


class OptunaSampler:
    """`--sampler optuna:tpe` (or another Optuna sampler): a grid's values become a categorical choice. Trials the
    ledger holds are told to the study before it is asked for more, so a restarted sweep keeps every recorded trial
    and asks Optuna only for the rest."""

    SAMPLERS = {
        "tpe": "TPESampler",
        "random": "RandomSampler",
        "cmaes": "CmaEsSampler",
        "qmc": "QMCSampler",
        "gp": "GPSampler",
    }

    def __init__(self, algorithm: str, params: list[Param], seed: int, mode: str):
        if algorithm not in self.SAMPLERS:
            raise SweepError(
                f"--sampler optuna:{algorithm}: expected one of {', '.join('optuna:' + a for a in self.SAMPLERS)}"
            )
        try:
            import optuna
        except ImportError:
            raise SweepError(
                "--sampler optuna:...: optuna is not installed (pip install optuna), or use the default sampler"
            ) from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna, self.seed = optuna, seed
        self.make = getattr(optuna.samplers, self.SAMPLERS[algorithm])
        self.study = optuna.create_study(
            direction="maximize" if mode == "max" else "minimize", sampler=self.make(seed=seed)
        )
        d = optuna.distributions
        self.distributions = {
            p.key: (
                d.CategoricalDistribution([json.dumps(v) for v in p.values])
                if p.values
                else d.IntDistribution(int(p.low), int(p.high))
                if p.kind == "int"
                else d.FloatDistribution(p.low, p.high, log=p.kind == "loguniform")
            )
            for p in params
        }
        self.asked = {}

    def resume(self, recorded: int) -> None:
        """After a restart: a generator seeded anew, or the first draws would repeat those of the first run."""
        if recorded:
            self.study.sampler = self.make(seed=self.seed + recorded)

    def params(self, trial: int) -> dict:
        asked = self.study.ask(self.distributions)
        self.asked[trial] = asked
        return {
            k: json.loads(v)
            if isinstance(self.distributions[k], self.optuna.distributions.CategoricalDistribution)
            else v
            for k, v in asked.params.items()
        }

    def tell(self, trial: int, params: dict, status: str, value: float | None) -> None:
        state = self.optuna.trial.TrialState
        state = (
            state.COMPLETE
            if status == "done" and value is not None
            else state.PRUNED
            if status == "pruned"
            else state.FAIL
        )
        if trial in self.asked:
            self.study.tell(self.asked.pop(trial), value if state == state.COMPLETE else None, state=state)
            return
        encoded = {
            k: json.dumps(v)
            if isinstance(self.distributions[k], self.optuna.distributions.CategoricalDistribution)
            else v
            for k, v in params.items()
            if k in self.distributions
        }
        self.study.add_trial(
            self.optuna.trial.create_trial(
                params=encoded,
                distributions={k: self.distributions[k] for k in encoded},
                value=value if state == state.COMPLETE else None,
                state=state,
            )
        )


# ---------------------------------------------------------------------------------------------------------- ledger
class Ledger:
    """The sweep's record, one JSON object per line, only ever appended: each line is one write of a whole line on
    a file opened for appending, fsynced before the sweep goes on. A line cut short by a crash is the last one; it
    is removed before anything else is appended."""

    def __init__(self, path: Path):
        self.path = path
        if path.is_file():
            raw = path.read_bytes()
            if raw and not raw.endswith(b"\n"):
                with open(path, "r+b") as f:
                    f.truncate(raw.rfind(b"\n") + 1)
                    os.fsync(f.fileno())

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        records = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise SweepError(f"{self.path}: line {number} is not JSON; the ledger was edited by hand?") from None
            records.append(record)
        return records

    def append(self, record: dict) -> None:
        new = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:  # the file's name is durable too
            sync_folder(self.path.parent)


class Trial(NamedTuple):
    """A trial as the ledger tells it (the last record about it wins)."""

    index: int
    params: dict
    run: str
    status: str  # running (started, not ended: resumes), done, failed, pruned
    value: float | None = None  # best monitored value (done) or the last one seen (pruned)
    epoch: int | None = None  # the epoch of that value
    epochs: int = 0
    seconds: float = 0.0
    error: str = ""
    curve: tuple = ()  # the monitored value per epoch


def trials_of(records: list[dict]) -> dict[int, Trial]:
    trials = {}
    for record in records:
        event, index = record.get("event"), record.get("trial")
        if event == "start":
            before = trials.get(index)
            trials[index] = Trial(
                index, record["params"], record["run"], "running", seconds=before.seconds if before else 0.0
            )
        elif event == "stopped" and index in trials:  # stopped with the sweep: resumes, its time so far counts
            trials[index] = trials[index]._replace(seconds=trials[index].seconds + record.get("seconds", 0.0))
        elif event == "end" and index in trials:
            before = trials[index]
            trials[index] = before._replace(
                status=record["status"],
                value=record.get("value"),
                epoch=record.get("epoch"),
                epochs=record.get("epochs", 0),
                seconds=before.seconds + record.get("seconds", 0.0),
                error=record.get("error", ""),
                curve=tuple(record.get("curve", ())),
            )
    return trials


# -------------------------------------------------------------------------------------------------------- progress
def read_rows(path: Path) -> list[dict]:
    """A run's metrics.jsonl as it stands (maybe mid-write); the last row per epoch wins."""
    rows = {}
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("epoch"), int):
            rows[row["epoch"]] = row
    return [rows[e] for e in sorted(rows)]


def curve_of(rows: list[dict], metric: str) -> list[float | None]:
    """The metric per epoch from epoch 1 (None where an epoch has no finite value)."""
    by_epoch = {row["epoch"]: row.get(metric) for row in rows}
    return [
        by_epoch.get(e) if isinstance(by_epoch.get(e), (int, float)) and math.isfinite(by_epoch[e]) else None
        for e in range(1, max(by_epoch, default=0) + 1)
    ]


def best_of(curve: list, mode: str) -> tuple[float | None, int | None]:
    """The best value and its (first) epoch, as model_best.params follows it."""
    best = epoch = None
    for e, value in enumerate(curve, 1):
        if value is not None and (best is None or (value > best if mode == "max" else value < best)):
            best, epoch = value, e
    return best, epoch


class MedianPruner(NamedTuple):
    """`--prune median[:WARMUP[:MIN_TRIALS]]`: after epoch e > WARMUP, a trial whose monitored value is worse than
    the median of the earlier trials' values at epoch e (trials not pruned, at least MIN_TRIALS of them) stops."""

    warmup: int = 0
    min_trials: int = 2

    def check(self, epoch: int, value: float | None, earlier: list[float], mode: str) -> float | None:
        """The median the trial lost to, or None if it goes on."""
        if epoch <= self.warmup or len(earlier) < self.min_trials:
            return None
        median = statistics.median(earlier)
        if value is None or (value < median if mode == "max" else value > median):
            return median
        return None


def parse_prune(text: str | None) -> MedianPruner | None:
    if text in (None, "off", "none"):
        return None
    name, *numbers = text.split(":")
    if (
        name != "median"
        or len(numbers) > 2
        or not all(n.isdigit() for n in numbers)
        or (len(numbers) == 2 and int(numbers[1]) < 1)
    ):
        raise SweepError(
            f"--prune {text}: expected median[:WARMUP_EPOCHS[:MIN_TRIALS]] (e.g. median, median:1, median:1:3) or off"
        )
    return MedianPruner(*map(int, numbers))


# --------------------------------------------------------------------------------------------------------- results
def short_names(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix of each key path that tells it from the others: peak_value, args.lr."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[-n:])
            if sum(k == name or k.endswith("." + name) for k in keys) == 1:
                break
        names[key] = name
    return names


def ranked(trials: list[Trial], mode: str) -> list[Trial]:
    """Best first: finished trials by their best value, then pruned ones by theirs, then failed ones."""
    sign = -1 if mode == "max" else 1
    order = {"done": 0, "pruned": 1, "running": 2, "failed": 3}
    return sorted(trials, key=lambda t: (order[t.status], math.inf if t.value is None else sign * t.value, t.index))


def show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if not isinstance(value, str) else value


def table(trials: list[Trial], keys: list[str], metric: str) -> str:
    names = short_names(keys)
    header = ["trial", "status", *(names[k] for k in keys), metric, "epoch", "time"]
    rows = [
        [
            str(t.index),
            t.status,
            *(show(t.params.get(k)) for k in keys),
            "" if t.value is None else f"{t.value:.4f}",
            "" if t.epoch is None else str(t.epoch),
            f"{t.seconds:.0f} s",
        ]
        for t in trials
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    failed = [f"  trial {t.index}: {t.error}" for t in trials if t.status == "failed" and t.error]
    return "\n".join(lines + (["failed:"] + failed if failed else []))


def write_csv(path: Path, trials: list[Trial], keys: list[str], metric: str) -> None:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["trial", "status", *keys, metric, "best_epoch", "epochs", "seconds", "run", "error"])
    for t in trials:
        values = [t.params.get(k) for k in keys]
        writer.writerow(
            [
                t.index,
                t.status,
                *(json.dumps(v) if isinstance(v, (list, dict)) else v for v in values),
                t.value,
                t.epoch,
                t.epochs,
                round(t.seconds, 1),
                t.run,
                t.error,
            ]
        )
    write_atomic(path, text.getvalue().encode())


def plot(folder: Path, trials: list[Trial], params: list[Param], metric: str, mode: str) -> list[Path]:
    """param_<key>.png (the metric against each swept value), curves.png (every trial's metric per epoch) and
    sweep.png (all of them side by side)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    best = next((t for t in ranked(trials, mode) if t.status == "done" and t.value is not None), None)
    styles = {
        "done": dict(marker="o", color="tab:blue"),
        "pruned": dict(marker="x", color="tab:orange"),
        "running": dict(marker="+", color="tab:gray"),
    }

    def draw_param(ax, param: Param):
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in param.candidates)
        labels = [] if numeric else [json.dumps(v) for v in param.candidates]
        for status, style in styles.items():
            shown = [t for t in trials if t.status == status and t.value is not None]
            if not shown:
                continue
            xs = [t.params[param.key] if numeric else labels.index(json.dumps(t.params[param.key])) for t in shown]
            ax.scatter(xs, [t.value for t in shown], label=status, linewidths=1.5, **style)
        if best is not None:
            x = best.params[param.key] if numeric else labels.index(json.dumps(best.params[param.key]))
            ax.scatter(
                [x], [best.value], s=160, facecolors="none", edgecolors="tab:red", label=f"best (trial {best.index})"
            )
        if param.kind == "loguniform" or (
            numeric and param.values and min(param.values) > 0 and max(param.values) / min(param.values) >= 100
        ):
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        if labels:
            ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(param.key)
        ax.set_ylabel(f"best {metric}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    def draw_curves(ax):
        for t in sorted(trials, key=lambda t: t.index):
            points = [(e, v) for e, v in enumerate(t.curve, 1) if v is not None]
            if not points:
                continue
            is_best = best is not None and t.index == best.index
            ax.plot(
                *zip(*points),
                linestyle="--" if t.status == "pruned" else "-",
                marker=".",
                linewidth=2.5 if is_best else 1,
                alpha=1 if is_best else 0.6,
                label=f"trial {t.index}" + (" (best)" if is_best else " (pruned)" if t.status == "pruned" else ""),
            )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if len(trials) <= 12 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    def save(figure, path: Path) -> Path:
        figure.tight_layout()
        FigureCanvasAgg(figure).print_png(str(path))
        return path

    written = []
    for param in params:
        figure = Figure(figsize=(4.5, 3.4), dpi=110)
        draw_param(figure.add_subplot(), param)
        written.append(save(figure, folder / f"param_{param.key}.png"))
    figure = Figure(figsize=(4.5, 3.4), dpi=110)
    draw_curves(figure.add_subplot())
    written.append(save(figure, folder / "curves.png"))
    figure = Figure(figsize=(4.2 * (len(params) + 1), 3.4), dpi=110)
    for i, param in enumerate(params):
        draw_param(figure.add_subplot(1, len(params) + 1, i + 1), param)
    draw_curves(figure.add_subplot(1, len(params) + 1, len(params) + 1))
    written.append(save(figure, folder / "sweep.png"))
    return written
