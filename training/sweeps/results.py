"""A sweep's trials as the study holds them, whoever ran them: each trial folder's current attempt, the table
`sweep.py` prints, results.csv and the plots (Optuna's, drawn with matplotlib).
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

from files.reads import read_metrics
from files.writes import atomic_output, write_atomic

WAITING, RUNNING, FAIL, PRUNED = TrialState.WAITING, TrialState.RUNNING, TrialState.FAIL, TrialState.PRUNED
ORDER = ["done", "pruned", "running", "stopped", "waiting", "failed"]  # the table's, best first


def run_of(trial) -> str:
    """The trial's folder: its own number's, or, taken up again, the number of the trial it continues."""
    return f"trial-{trial.system_attrs.get('failed_trial', trial.number):03d}"


def attempts(trials: list, wanted: int) -> dict:
    """The first `wanted` trial folders and each one's current attempt: the first that did not fail (a retry
    queued twice runs once), else the last. Trials told apart as surplus (asked beyond `wanted`) never count."""
    trials = sorted((t for t in trials if not t.user_attrs.get("surplus")), key=lambda t: t.number)
    runs = {run_of(t): [] for t in [t for t in trials if "failed_trial" not in t.system_attrs][:wanted]}
    for t in trials:
        runs.get(run_of(t), []).append(t)
    return {run: next((t for t in tries if t.state != FAIL), tries[-1]) for run, tries in runs.items()}


def ended(trial) -> bool:
    """Finished for good: done, pruned, or failed for its values (a trial stopped or lost is queued again)."""
    return trial.state.is_finished() and (trial.state != FAIL or "error" in trial.user_attrs)


def curve_of(path: Path, metric: str) -> list[float | None]:
    """The metric per epoch from a run's metrics.jsonl (none while a line is half written); None where not finite."""
    try:
        by_epoch = {r["epoch"]: r.get(metric) for r in read_metrics(path) if isinstance(r.get("epoch"), int)}
    except (OSError, ValueError):
        return []
    finite = lambda v: v if isinstance(v, (int, float)) and math.isfinite(v) else None
    return [finite(by_epoch.get(e)) for e in range(1, max(by_epoch, default=0) + 1)]


def best_of(curve: list, mode: str) -> tuple[float | None, int | None]:
    """The best value and its (first) epoch, as model_best.params follows it."""
    sign = 1 if mode == "max" else -1
    best = max(((sign * v, -e) for e, v in enumerate(curve, 1) if v is not None), default=None)
    return (sign * best[0], -best[1]) if best else (None, None)


def rows_of(sweep, study) -> list[dict]:
    """One row per trial folder, results.csv's columns, best first: done by value, then the ORDER of the others."""
    trials, rows = study.get_trials(deepcopy=False), []
    for run, t in attempts(trials, sweep.trials).items():
        steps = t.intermediate_values
        value, epoch = best_of([steps.get(e) for e in range(1, max(steps, default=0) + 1)], sweep.mode)
        if t.state == PRUNED:
            value, epoch = t.value, max(steps, default=None)
        spent = sum(
            (u.datetime_complete - u.datetime_start).total_seconds()
            for u in trials
            if run_of(u) == run and u.datetime_complete
        )
        status = {"COMPLETE": "done", "FAIL": "failed"}.get(t.state.name, t.state.name.lower())
        row = {"trial": int(run[6:]), "status": status if ended(t) or t.state != FAIL else "stopped"}
        row |= {p.key: p.decode(t.params[p.key]) for p in sweep.params if p.key in t.params}
        row |= {sweep.metric: value, "best_epoch": epoch, "epochs": len(steps), "seconds": round(spent, 1)}
        rows.append(row | {"run": run, "error": t.user_attrs.get("error", "")})
    sign = -1 if sweep.mode == "max" else 1
    best = lambda r: math.inf if r[sweep.metric] is None else sign * r[sweep.metric]
    return sorted(rows, key=lambda r: (ORDER.index(r["status"]), best(r), r["trial"]))


def table(rows: list[dict], keys: list[str], metric: str) -> str:
    """The swept values under the shortest dotted suffix of their key path that tells them apart (peak_value,
    args.lr); the failed trials' errors under it."""
    ends = lambda key, n: ".".join(key.split(".")[-n:])
    unique = lambda key, n: sum(k == ends(key, n) or k.endswith("." + ends(key, n)) for k in keys) == 1
    names = [ends(key, next(n for n in range(1, key.count(".") + 2) if unique(key, n))) for key in keys]

    def show(v, form="{:.4g}"):
        return (
            "" if v is None else form.format(v) if isinstance(v, float) else v if isinstance(v, str) else json.dumps(v)
        )

    cells = [["trial", "status", *names, metric, "epoch", "time"]]
    for r in rows:
        cells.append([str(r["trial"]), r["status"], *(show(r.get(k)) for k in keys), show(r[metric], "{:.4f}")])
        cells[-1] += [show(r["best_epoch"]), f"{r['seconds']:.0f} s"]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cs, widths)).rstrip() for cs in cells]
    failed = [f"  trial {r['trial']}: {r['error']}" for r in rows if r["status"] == "failed"]
    return "\n".join(lines + (["failed:", *failed] if failed else []))


def plot(folder: Path, study, metric: str) -> list[Path]:
    """Optuna's plots: the metric per epoch of every trial, the best value as trials end, which values mattered
    and every trial's values side by side. One that cannot be drawn (too few trials) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis

    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return []
    plots = {"curves": vis.plot_intermediate_values, "history": vis.plot_optimization_history}
    plots |= {"importance": vis.plot_param_importances, "parallel": vis.plot_parallel_coordinate}
    written = []
    for name, draw in plots.items():
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
    keys, rows = [p.key for p in sweep.params], rows_of(sweep, study)
    finished = sum(r["status"] in ("done", "pruned", "failed") for r in rows)
    print(f"\n{sweep.folder}: {finished} of {sweep.trials} trials, {sweep.mode} {sweep.metric}, best first")
    print(table(rows, keys, sweep.metric))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(
        text, ["trial", "status", *keys, sweep.metric, "best_epoch", "epochs", "seconds", "run", "error"]
    )
    writer.writeheader()
    writer.writerows({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()} for r in rows)
    write_atomic(sweep.folder / "results.csv", text.getvalue().encode())
    print(f"plots: {', '.join(str(p) for p in plot(sweep.folder, study, sweep.metric))}")
    return next((r | {"params": {k: r[k] for k in keys}} for r in rows if r["status"] == "done"), None)
