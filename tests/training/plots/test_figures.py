"""Run figures: the curves drawn are the numbers in metrics.jsonl, the PNGs have the expected size and are not blank,
and `python -m training.plots` writes curves.png or fails with one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PIL import Image

from tests.end_to_end.test_train import run
from tests.end_to_end.test_untrusted_folders import VICTIM_BYTES, one_error_line, victim
from tests.end_to_end.test_untrusted_inputs import one_line
from training.plots.figures import (
    IMAGE_ROWS,
    confusion_figure,
    curve_names,
    curves_figure,
    image_grid_figure,
    lr_per_step,
    main,
    plot_run,
    read_metrics,
    save_confusion_matrix,
    save_curves,
)


def make_rows(epochs: int = 4, validation: bool = True, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for epoch in range(1, epochs + 1):
        row = {
            "epoch": epoch,
            "step": 9 * epoch,
            "train/loss": float(rng.uniform(0, 2)),
            "train/accuracy": float(rng.uniform()),
            "train/top_3_accuracy": float(rng.uniform()),
        }
        if validation:
            row.update(
                {
                    "val/loss": float(rng.uniform(0, 2)),
                    "val/accuracy": float(rng.uniform()),
                    "val/top_3_accuracy": float(rng.uniform()),
                    "val/recall": rng.uniform(size=3).tolist(),
                }
            )
        row.update({"time/epoch_s": 1.0, "time/examples_per_s": 300.0, "lr": 0.1 / epoch})
        rows.append(row)
    return rows


def lines_by_label(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}


def test_one_panel_per_quantity_holding_the_logged_values():
    rows = make_rows()
    assert curve_names(rows) == ["loss", "accuracy", "top_3_accuracy", "lr"]  # per-class vectors are not drawn
    fig = curves_figure(rows)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["loss", "accuracy", "top_3_accuracy", "learning rate"]
    epochs = [r["epoch"] for r in rows]
    for ax, name in zip(axes[:3], ["loss", "accuracy", "top_3_accuracy"]):
        lines = lines_by_label(ax)
        assert lines["train"] == (epochs, [r[f"train/{name}"] for r in rows])
        assert lines["validation"] == (epochs, [r[f"val/{name}"] for r in rows])
    assert lines_by_label(axes[3])["learning rate"] == (epochs, [r["lr"] for r in rows])


def test_runs_without_validation_or_without_any_curve():
    rows = make_rows(3, validation=False)
    fig = curves_figure(rows)
    loss_ax = next(ax for ax in fig.axes if ax.get_title() == "loss")
    assert set(lines_by_label(loss_ax)) == {"train"}
    with pytest.raises(ValueError, match="no train/ or val/ values"):
        curves_figure([{"epoch": 1, "step": 3, "lr": 0.1}])


@pytest.mark.parametrize("panels, size", [(4, (1200, 600)), (2, (800, 300)), (7, (1200, 900))])
def test_curves_png_has_the_expected_size_and_is_drawn(tmp_path, panels, size):
    metrics = [f"m{i}" for i in range(panels - 1)]  # + the loss panel (no lr in these rows)
    rows = [
        {"epoch": e, "train/loss": 1.0 / e, **{f"val/{m}": math.sin(e + i) for i, m in enumerate(metrics)}}
        for e in range(1, 6)
    ]
    path = save_curves(rows, tmp_path / "curves.png")
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[1::-1] == size
    dark = (image.sum(axis=2) < 300).mean()  # text, axes and lines; a blank canvas has none
    coloured = (np.ptp(image.astype(int), axis=2) > 60).mean()  # the plotted lines are coloured
    assert 0.005 < dark < 0.5 and coloured > 0.001


def test_confusion_matrix_figure_shows_counts_coloured_by_row(tmp_path):
    rng = np.random.default_rng(1)
    matrix = rng.integers(0, 20, (6, 6))
    matrix[2] = 0  # a class absent from the data: its row stays at 0, not NaN
    fig = confusion_figure(matrix, class_names=list("abcdef"))
    ax = fig.axes[0]
    rows = matrix.sum(axis=1, keepdims=True)
    expected = np.where(rows > 0, matrix / np.maximum(rows, 1), 0.0)
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), expected)
    counts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert counts == {(i, j): str(matrix[i, j]) for i in range(6) for j in range(6)}
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcdef")

    path = save_confusion_matrix(matrix, tmp_path / "cm.png")
    width, height = Image.open(path).size
    assert height >= 400 and width == height + 100  # square cells, one inch more for the colour bar
    assert np.asarray(Image.open(path).convert("L")).std() > 10


def test_plot_run_reads_metrics_jsonl(tmp_path):
    rows = make_rows(2)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert read_metrics(tmp_path / "metrics.jsonl") == rows
    assert plot_run(tmp_path) == tmp_path / "curves.png" and (tmp_path / "curves.png").stat().st_size > 10_000
    with pytest.raises(FileNotFoundError, match="metrics.jsonl: no such file"):
        plot_run(tmp_path / "elsewhere")


def test_the_plot_command(tmp_path):
    run_dir = tmp_path / "saved" / "tiny" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(3)))
    result = run("-m", "training.plots", run_dir, "-o", tmp_path / "out.png")
    assert result.returncode == 0, result.stderr
    assert Image.open(tmp_path / "out.png").size == (1200, 600)
    result = run("-m", "training.plots", tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_curves_draw_the_learning_rate_of_every_step():
    rows = [{"epoch": e, "step": 10 * e, "train/loss": 1.0 / e} for e in (1, 2, 3)]
    cyclic = lambda step: 0.1 * (step % 10) / 9  # noqa: E731 (a saw-tooth within each epoch)
    epochs, rates = lr_per_step(rows, cyclic)
    assert len(rates) == 30 and epochs[0] == pytest.approx(0.1) and epochs[-1] == pytest.approx(3.0)
    assert rates[:10] == pytest.approx([0.1 * s / 9 for s in range(10)])
    # the logged value alone (one per epoch, at its last step) would be 0.1 three times
    fig = curves_figure([{**r, "lr": cyclic(r["step"] - 1)} for r in rows], cyclic)
    panel = next(ax for ax in fig.axes if ax.get_title() == "learning rate")
    (line,) = panel.get_lines()
    assert len(line.get_xdata()) == 30 and min(line.get_ydata()) == 0.0


def test_image_grid_has_a_row_per_example_and_a_column_per_image():
    rng = np.random.default_rng(0)
    x, target, predicted = rng.random((12, 8, 8, 3)), rng.random((12, 8, 8, 1)), rng.normal(size=(12, 8, 8, 1))
    fig = image_grid_figure(x, target, predicted)
    assert len(fig.axes) == 3 * IMAGE_ROWS
    assert [ax.get_title() for ax in fig.axes[:3]] == ["input", "target", "prediction"]
    # a vector input (features) is no image: target and prediction only
    assert len(image_grid_figure(rng.random((4, 5)), target[:4], predicted[:4]).axes) == 2 * 4


@pytest.mark.slow
def test_test_py_draws_every_output_of_a_vector_regression(tmp_path):
    x = np.random.default_rng(0).standard_normal((60, 6)).astype(np.float32)
    np.savez(tmp_path / "rows.npz", x=x, y=np.concatenate([x, x[:, :1]], axis=1))  # 7 outputs, one more than 6
    data = {"path": str(tmp_path / "rows.npz"), "input": "x", "target": "y", "test_fraction": 0.25}
    config = {
        "name": "vectors",
        "model": {"name": "mlp", "args": {"num_classes": 7, "hidden": [8]}},
        "loss": {"name": "mse"},
        "metrics": [],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {
            s: {"name": "arrays", "args": {**data, "split": s, "batch_size": 16}} for s in ("train", "test")
        },
        "trainer": {"epochs": 1, "save_dir": str(tmp_path / "saved"), "monitor": "min train/loss"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert run("train.py", "-c", tmp_path / "config.json", "--run-id", "r").returncode == 0
    tested = run("test.py", "--run", tmp_path / "saved" / "vectors" / "r")
    assert tested.returncode == 0, tested.stderr
    assert "predictions.png (all 7 outputs)" in tested.stdout


@pytest.mark.parametrize("line", ["[1, 2]", "3", '"text"', "[" * 100_000, "{"])
def test_the_plot_command_on_a_metrics_line_that_is_not_an_object_is_one_line(tmp_path, capsys, line):
    """Before: [1, 2] or 3 was an AttributeError (row.items()), deep nesting a RecursionError, each a traceback."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "train/loss": 1.0}) + "\n" + line + "\n")
    assert "metrics.jsonl: line 2 is " in one_line(capsys, main, tmp_path)


def test_the_plot_command_refuses_a_link_at_curves_png(tmp_path):
    rows = [{"epoch": e, "train/loss": 1.0 / e, "val/loss": 1.2 / e} for e in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = victim(tmp_path)
    (tmp_path / "curves.png").symlink_to(target)
    result = run("-m", "training.plots", tmp_path)
    one_error_line(result, str(tmp_path / "curves.png"), "symbolic link")
    assert target.read_bytes() == VICTIM_BYTES
    (tmp_path / "curves.png").unlink()
    assert run("-m", "training.plots", tmp_path).returncode == 0 and (tmp_path / "curves.png").is_file()


def test_curves_draw_the_logged_learning_rate_where_the_schedule_disagrees_with_it():
    """An extended or re-stretched run: the schedule of its final config is not what it trained at; the figure draws
    the values metrics.jsonl logged, never the recomputation."""
    rows = [{"epoch": e, "step": 10 * e, "train/loss": 1.0 / e} for e in (1, 2, 3, 4)]
    logged = [0.001, 0.0005, 0.0, 0.0]  # a 2-epoch decay, then extended at its end value
    rows = [{**r, "lr": lr} for r, lr in zip(rows, logged)]
    stretched = lambda step: 0.001 * (1 - step / 40)  # noqa: E731 (the final config's schedule over 4 epochs)
    fig = curves_figure(rows, stretched)
    panel = next(ax for ax in fig.axes if ax.get_title() == "learning rate")
    (line,) = panel.get_lines()
    assert list(line.get_ydata()) == logged
    agreeing = lambda step: [0.001, 0.0005, 0.0, 0.0][min((step + 1) // 10 - 1, 3)]  # noqa: E731
    (line,) = next(ax for ax in curves_figure(rows, agreeing).axes if ax.get_title() == "learning rate").get_lines()
    assert len(line.get_xdata()) == 40  # per step, where it gives every logged value
