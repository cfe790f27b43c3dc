"""A sweep's trials as the study holds them, whoever ran them: each trial folder's current attempt, the table
`sweep.py` prints, results.csv, best/config.json and the plots (Optuna's, drawn with matplotlib).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import warnings
from pathlib import Path

from optuna.trial import TrialState

from training.files import atomic_output, write_atomic

WAITING, RUNNING, FAIL, PRUNED = TrialState.WAITING, TrialState.RUNNING, TrialState.FAIL, TrialState.PRUNED
STATUS = {
    TrialState.COMPLETE: "done",
    TrialState.PRUNED: "pruned",
    FAIL: "failed",
    RUNNING: "running",
    WAITING: "waiting",
}


def run_of(trial) -> str:
    """The trial's folder: its own number's, or, taken up again, the number of the trial it continues."""
    return f"trial-{trial.system_attrs.get('failed_trial', trial.number):03d}"


def attempts(trials: list, wanted: int) -> dict:
    """The first `wanted` trial folders and each one's current attempt: the first that did not fail (a retry
    queued twice runs once), else the last. Trials told apart as surplus (asked beyond `wanted`) never count."""
    fresh = [t for t in trials if "failed_trial" not in t.system_attrs and not t.user_attrs.get("surplus")]
    runs = {run_of(t): [] for t in sorted(fresh, key=lambda t: t.number)[:wanted]}
    for t in sorted(trials, key=lambda t: t.number):
        if run_of(t) in runs and not t.user_attrs.get("surplus"):
            runs[run_of(t)].append(t)
    return {run: next((t for t in tries if t.state != FAIL), tries[-1]) for run, tries in runs.items()}


def ended(trial) -> bool:
    """Finished for good: done, pruned, or failed for its values (a trial stopped or lost is queued again)."""
    return trial.state.is_finished() and (trial.state != FAIL or "error" in trial.user_attrs)


def curve_of(path: Path, metric: str) -> list[float | None]:
    """The metric per epoch from a run's metrics.jsonl as it stands (maybe mid-write); None where not finite."""
    by_epoch = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("epoch"), int):
            value = row.get(metric)
            by_epoch[row["epoch"]] = value if isinstance(value, (int, float)) and math.isfinite(value) else None
    return [by_epoch.get(e) for e in range(1, max(by_epoch, default=0) + 1)]


def best_of(curve: list, mode: str) -> tuple[float | None, int | None]:
    """The best value and its (first) epoch, as model_best.params follows it."""
    best = epoch = None
    for e, value in enumerate(curve, 1):
        if value is not None and (best is None or (value > best if mode == "max" else value < best)):
            best, epoch = value, e
    return best, epoch


def rows_of(sweep, study) -> list[dict]:
    """One row per trial folder, results.csv's columns, best first: done by value, then pruned, running, stopped,
    waiting, failed."""
    trials, rows = study.get_trials(deepcopy=False), []
    for run, t in attempts(trials, sweep.trials).items():
        steps = t.intermediate_values
        value, epoch = best_of([steps.get(e) for e in range(1, max(steps, default=0) + 1)], sweep.mode)
        if t.state == PRUNED:
            value, epoch = t.value, max(steps, default=None)
        spent = [
            (u.datetime_complete - u.datetime_start).total_seconds()
            for u in trials
            if run_of(u) == run and u.datetime_complete
        ]
        params = {p.key: p.decode(t.params[p.key]) for p in sweep.params if p.key in t.params}
        status = STATUS[t.state] if ended(t) or t.state != FAIL else "stopped"
        row = {"trial": int(run[6:]), "status": status, **params, sweep.metric: value, "best_epoch": epoch}
        error = t.user_attrs.get("error", "")
        rows.append(row | {"epochs": len(steps), "seconds": round(sum(spent), 1), "run": run, "error": error})
    order, sign = ["done", "pruned", "running", "stopped", "waiting", "failed"], -1 if sweep.mode == "max" else 1
    best = lambda r: math.inf if r[sweep.metric] is None else sign * r[sweep.metric]
    return sorted(rows, key=lambda r: (order.index(r["status"]), best(r), r["trial"]))


def short_names(keys: list[str]) -> list[str]:
    """The shortest dotted suffix of each key path that tells it from the others: peak_value, args.lr."""
    ends = lambda key, n: ".".join(key.split(".")[-n:])
    unique = lambda key, n: sum(k == ends(key, n) or k.endswith("." + ends(key, n)) for k in keys) == 1
    return [ends(key, next(n for n in range(1, key.count(".") + 2) if unique(key, n))) for key in keys]


def table(rows: list[dict], keys: list[str], metric: str) -> str:
    show = lambda v: (
        "" if v is None else f"{v:.4g}" if isinstance(v, float) else v if isinstance(v, str) else json.dumps(v)
    )
    header = ["trial", "status", *short_names(keys), metric, "epoch", "time"]
    value = lambda r: "" if r[metric] is None else f"{r[metric]:.4f}"
    cells = [
        [
            str(r["trial"]),
            r["status"],
            *(show(r.get(k)) for k in keys),
            value(r),
            show(r["best_epoch"]),
            f"{r['seconds']:.0f} s",
        ]
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cs, widths)).rstrip() for cs in [header, *cells]]
    failed = [f"  trial {r['trial']}: {r['error']}" for r in rows if r["status"] == "failed"]
    return "\n".join(lines + (["failed:", *failed] if failed else []))


def write_csv(path: Path, rows: list[dict], keys: list[str], metric: str) -> None:
    text = io.StringIO(newline="")
    columns = ["trial", "status", *keys, metric, "best_epoch", "epochs", "seconds", "run", "error"]
    writer = csv.DictWriter(text, columns)
    writer.writeheader()
    writer.writerows({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()} for r in rows)
    write_atomic(path, text.getvalue().encode())


def plot(folder: Path, study, metric: str) -> list[Path]:
    """Optuna's plots: the metric per epoch of every trial, the best value as trials end, which values mattered
    and every trial's values side by side. One that cannot be drawn (too few trials) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import optuna.visualization.matplotlib as vis

    written = []
    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return written
    for name, draw in (
        ("curves", vis.plot_intermediate_values),
        ("history", vis.plot_optimization_history),
        ("importance", vis.plot_param_importances),
        ("parallel", vis.plot_parallel_coordinate),
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = draw(study)
            figure = getattr(axes, "flat", [axes])[0].figure
            if name == "curves":  # Optuna's steps are the epochs, its values the monitored metric
                axes.set(xlabel="epoch", ylabel=metric)
                axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            figure.set_size_inches(7, 4.5)
            figure.tight_layout()
            with atomic_output(folder / f"{name}.png") as f:
                figure.savefig(f, format="png", dpi=110)
            plt.close(figure)
            written.append(folder / f"{name}.png")
        except Exception as error:  # a figure must never hide the results
            print(f"{name}.png not drawn: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
    return written


def report(sweep, study) -> dict | None:
    """The table (printed), results.csv and the plots; returns the best row."""
    keys = [p.key for p in sweep.params]
    rows = rows_of(sweep, study)
    print(
        f"\n{sweep.folder}: {sum(r['status'] in ('done', 'pruned', 'failed') for r in rows)} of {sweep.trials} "
        f"trials, {sweep.mode} {sweep.metric}, best first"
    )
    print(table(rows, keys, sweep.metric))
    write_csv(sweep.folder / "results.csv", rows, keys, sweep.metric)
    written = plot(sweep.folder, study, sweep.metric)
    print(f"plots: {', '.join(str(p) for p in written)}")
    return next((r | {"params": {k: r[k] for k in keys}} for r in rows if r["status"] == "done"), None)
