"""Figures of a run: training curves from `metrics.jsonl` and a confusion matrix, written as PNG files.

Figures are built with `matplotlib.figure.Figure` and the Agg canvas directly, never through pyplot, so nothing
depends on a display or changes matplotlib's global backend. matplotlib is imported only when a figure is made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from files.reads import read_json, read_metrics
from files.writes import CURVES, METRICS, atomic_output
from training.run.cli import ArgumentParser, fail

PANEL_INCHES = (4.0, 3.0)
DPI = 100
COLUMNS = 3


def curve_names(rows: Sequence[dict]) -> list[str]:
    """The quantities with a curve: loss first, then each scalar metric in the order logged, then the learning rate.
    Per-class vectors are not drawn."""
    names = []
    for row in rows:
        for key, value in row.items():
            split, _, name = key.partition("/")
            if split in ("train", "val") and isinstance(value, (int, float)) and name not in names:
                names.append(name)
    names.sort(key=lambda n: n != "loss")  # stable: the metrics keep their order
    if names and any(isinstance(row.get("lr"), (int, float)) for row in rows):
        names.append("lr")
    return names


def grid(panels: int) -> tuple[int, int]:
    columns = min(panels, COLUMNS)
    return math.ceil(panels / columns), columns


LR_POINTS = 500  # steps at which curves.png draws the learning rate, spread over the run


def lr_per_step(rows: Sequence[dict], lr_fn) -> tuple[list[float], list[float]]:
    """(epochs, learning rates) at up to LR_POINTS steps of the run, each step placed by the epochs' ends (the rows'
    ``step``): a cyclic or warm-up schedule shows its shape, not one value per epoch."""
    import numpy as np

    ends = [(r["step"], r["epoch"]) for r in rows if isinstance(r.get("step"), int) and isinstance(r.get("epoch"), int)]
    if ends and ends[0][1] == 1:
        ends.insert(0, (0, 0))  # a resumed run's rows may start later: its steps before them are not placed
    if len(ends) < 2 or ends[-1][0] <= ends[0][0]:
        return [], []
    steps, epochs = (np.asarray(v) for v in zip(*ends))
    count = min(LR_POINTS, int(steps[-1] - steps[0]))
    sampled = np.unique(np.linspace(steps[0], steps[-1] - 1, count).astype(np.int64))
    where = np.interp(sampled + 1, steps, epochs)  # step s (counted from 0) ends with s + 1 steps done
    try:  # a schedule is a jnp function of the step: all at once
        values = np.asarray(lr_fn(sampled), np.float64).reshape(-1)
        if len(values) != len(sampled):
            raise ValueError
    except Exception:
        values = np.array([float(lr_fn(int(step))) for step in sampled])
    return where.tolist(), values.tolist()


def agrees_with_log(rows: Sequence[dict], lr_fn) -> bool:
    """Whether `lr_fn` gives the learning rate every row logged (at the row's last step): a schedule recomputed
    from a config that changed during the run (an extension, a re-stretch, a plateau's scale) does not, and the
    figure then draws what was logged."""
    logged = [(r["step"], r["lr"]) for r in rows if isinstance(r.get("step"), int) and isinstance(r.get("lr"), float)]
    try:
        return all(abs(float(lr_fn(step - 1)) - lr) <= 1e-7 + 1e-4 * abs(lr) for step, lr in logged if step > 0)
    except Exception:  # a schedule that cannot be evaluated here: the logged values
        return False


def curves_figure(rows: Sequence[dict], lr_fn=None):
    """One panel per quantity, train (solid) and validation (dashed) against the epoch; the learning rate at every
    step (``lr_fn``, sampled, where it gives every value the rows logged) or else as the rows logged it at each
    epoch's end."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    names = curve_names(rows)
    if not names:
        raise ValueError("no train/ or val/ values to plot")
    nrows, ncols = grid(len(names))
    fig = Figure(figsize=(PANEL_INCHES[0] * ncols, PANEL_INCHES[1] * nrows), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        if name == "lr" and lr_fn is not None and agrees_with_log(rows, lr_fn):
            epochs, values = lr_per_step(rows, lr_fn)
            ax.plot(epochs, values, "-", label="learning rate (per step)")
            series = []
        elif name == "lr":
            series = [("learning rate", "lr", "-")]
        else:
            series = [("train", f"train/{name}", "-"), ("validation", f"val/{name}", "--")]
        for label, key, style in series:
            points = [(r["epoch"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                epochs, values = zip(*points)
                ax.plot(epochs, values, style, marker="o", markersize=3, label=label)
        ax.set_title("learning rate" if name == "lr" else name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    return fig


def save_figure(fig, path: str | Path, **options) -> Path:
    """Written atomically (a temporary then a rename: never half an image, never through a link at ``path``), in
    the format its suffix names (png by default); ``options`` go to ``savefig``."""
    path = Path(path)
    with atomic_output(path) as f:
        fig.savefig(f, format=path.suffix[1:].lower() or "png", **options)
    return path


def save_lr_finder(rates, smoothed_losses, suggestion: float | None, path: str | Path) -> Path:
    """The lr finder's range test: the smoothed loss against the learning rate (log scale), its steepest fall
    marked."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    axis.plot(rates, smoothed_losses)
    axis.set(xscale="log", xlabel="learning rate", ylabel="smoothed training loss", title="lr finder")
    if suggestion:
        axis.axvline(suggestion, color="tab:red", linestyle="--", label=f"steepest fall: {suggestion:.2g}")
        axis.legend()
    return save_figure(figure, path, dpi=100, bbox_inches="tight")


def save_curves(rows: Sequence[dict], path: str | Path, lr_fn=None) -> Path:
    return save_figure(curves_figure(rows, lr_fn), path)


def plot_run(run_dir: str | Path, path: str | Path | None = None, lr_fn=None) -> Path:
    """`<run_dir>/metrics.jsonl` -> `<run_dir>/curves.png` (or `path`); ``lr_fn``: the run's learning rate by step
    (train.py gives its own; without it, the schedule of the run's config.json, else the logged values)."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS
    if not metrics.is_file():
        raise FileNotFoundError(f"{metrics}: no such file (is {run_dir} a run folder with a finished epoch?)")
    rows = read_metrics(metrics)
    return save_curves(rows, path or run_dir / CURVES, lr_fn or schedule_of(run_dir, rows))


def schedule_of(run_dir: Path, rows: Sequence[dict]):
    """The learning rate by step of the run's config.json, with an epoch's steps as the first logged epoch took
    them; None where that cannot be known (no config, no step counts, a config this version cannot build)."""
    from files.writes import CONFIG

    first = next((r for r in rows if isinstance(r.get("step"), int) and r.get("epoch") == 1), None)
    if first is None or not (run_dir / CONFIG).is_file():
        return None
    try:
        from training.config.components import build_optimizer

        config = read_json(run_dir / CONFIG, CONFIG)  # bounded as every JSON file a tool reads
        return build_optimizer(config, first["step"], CONFIG)[1]
    except Exception:  # a figure is a convenience: the logged values are drawn instead
        return None


def confusion_figure(matrix, class_names: Sequence[str] | None = None):
    """Counts per (true, predicted) class, coloured by the fraction of the true class (its row), so that the
    colours read the same for rare and frequent classes."""
    import numpy as np
    from matplotlib.figure import Figure

    matrix = np.asarray(matrix)
    n = len(matrix)
    names = list(class_names) if class_names is not None else [str(i) for i in range(n)]
    rows = matrix.sum(axis=1, keepdims=True)
    fractions = np.divide(matrix, rows, out=np.zeros(matrix.shape, float), where=rows > 0)
    side = max(4.0, 0.45 * n + 1.5)
    fig = Figure(figsize=(side + 1.0, side), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(fractions, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="fraction of the true class")
    ax.set_xticks(range(n), names, rotation=90 if n > 12 else 0)
    ax.set_yticks(range(n), names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if n <= 30:  # beyond that the numbers no longer fit their cells
        for (i, j), count in np.ndenumerate(matrix):
            ax.text(
                j,
                i,
                f"{count:g}",
                ha="center",
                va="center",
                fontsize=7 if n > 12 else 9,
                color="white" if fractions[i, j] > 0.5 else "black",
            )
    ax.set_title(f"confusion matrix ({matrix.sum():g} examples)")
    return fig


def save_confusion_matrix(matrix, path: str | Path, class_names: Sequence[str] | None = None) -> Path:
    return save_figure(confusion_figure(matrix, class_names), path)


MAX_PANELS = 36  # output columns drawn in predictions.png; test.py says when there are more
IMAGE_ROWS = 8  # examples in an image grid


def predictions_figure(predicted, true, names: Sequence[str] | None = None):
    """Predicted against true values, one panel per output column (the first MAX_PANELS), with the identity line."""
    import numpy as np
    from matplotlib.figure import Figure

    predicted = np.asarray(predicted, np.float64).reshape(len(predicted), -1)
    true = np.asarray(true, np.float64).reshape(len(true), -1)
    panels = min(predicted.shape[1], MAX_PANELS)
    columns = min(panels, 6)
    rows = -(-panels // columns)
    fig = Figure(figsize=(PANEL_INCHES[0] * columns, PANEL_INCHES[0] * rows), dpi=DPI, layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns)).reshape(-1)
    for ax in axes[panels:]:
        ax.set_axis_off()
    for i, ax in enumerate(axes[:panels]):
        lo, hi = min(true[:, i].min(), predicted[:, i].min()), max(true[:, i].max(), predicted[:, i].max())
        ax.plot([lo, hi], [lo, hi], color="0.6", lw=1)
        ax.scatter(true[:, i], predicted[:, i], s=4, alpha=0.5)
        rmse = float(np.sqrt(np.mean((predicted[:, i] - true[:, i]) ** 2)))
        ax.set_title(f"{names[i] if names and i < len(names) else f'output {i}'}: rmse {rmse:.4g}")
        ax.set_xlabel("true")
        ax.set_ylabel("predicted")
    return fig


def save_predictions(predicted, true, path: str | Path, names: Sequence[str] | None = None) -> Path:
    return save_figure(predictions_figure(predicted, true, names), path)


def is_image(array) -> bool:
    """A batch of images: (B, H, W) or (B, H, W, C) with 1, 3 or 4 channels."""
    return array.ndim == 3 or (array.ndim == 4 and array.shape[-1] in (1, 3, 4))


def displayable(image, scale=None):
    """One image for imshow: gray (H, W) or colour (H, W, 3|4), mapped to 0..1 from ``scale`` (lo, hi) or its own
    range (a normalised input or values in any unit are all visible); another channel count shows its first
    channel."""
    import numpy as np

    image = np.asarray(image, np.float64)
    if image.ndim == 3:
        image = image[..., 0] if image.shape[-1] not in (3, 4) else image[..., :3]
    lo, hi = scale if scale is not None else (image.min(), image.max())
    return np.clip((image - lo) / (hi - lo), 0, 1) if hi > lo else np.zeros_like(image)


def image_grid_figure(inputs, targets, predictions, titles: Sequence[str] = ("input", "target", "prediction")):
    """A row per example (the first IMAGE_ROWS): its input, target and prediction side by side, the prediction on
    its target's scale (an error of amplitude shows; a mask's logits show their sign). A column that is not an image
    (a vector input) is left out."""
    import numpy as np
    from matplotlib.figure import Figure

    columns = [(t, np.asarray(a)) for t, a in zip(titles, (inputs, targets, predictions)) if a is not None]
    columns = [(t, a) for t, a in columns if is_image(a)]
    rows = min(len(columns[0][1]), IMAGE_ROWS)
    fig = Figure(figsize=(2.2 * len(columns), 2.2 * rows), dpi=DPI, layout="constrained")
    axes = np.asarray(fig.subplots(rows, len(columns), squeeze=False))
    for r in range(rows):
        target = np.asarray(targets[r], np.float64) if targets is not None else None
        shared = (target.min(), target.max()) if target is not None and target.max() > target.min() else None
        for c, (title, images) in enumerate(columns):
            ax = axes[r, c]
            image = displayable(images[r], shared if title in titles[1:] else None)
            ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(title)
    return fig


def save_image_grid(inputs, targets, predictions, path: str | Path) -> Path:
    return save_figure(image_grid_figure(inputs, targets, predictions), path)


def main(argv=None) -> int:
    """python -m training.plots saved/<name>/<run_id> [-o curves.png] (training/plots/__main__.py)"""
    parser = ArgumentParser(
        prog="python -m training.plots", description="Draws a run folder's metrics.jsonl as curves.png."
    )
    parser.add_argument("run_dir", help="a run folder, e.g. saved/<name>/<run_id>")
    parser.add_argument("-o", "--out", help="image file (default: <run_dir>/curves.png)")
    args = parser.parse_args(argv)

    try:
        path = plot_run(args.run_dir, args.out)
    except (OSError, ValueError) as error:  # no metrics.jsonl, an unreadable line, nothing to plot
        fail(str(error))
    print(f"wrote {path}")
    return 0
