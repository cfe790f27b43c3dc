"""A sweep's results: the trials ranked, the table `sweep.py` prints, results.csv and the plots (the metric against
each swept value, every trial's curve).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from training.files import write_atomic
from training.sweep_space import Param
from training.sweeps import Trial


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
