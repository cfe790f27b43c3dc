"""Evaluate a checkpoint:  python test.py --run saved/<name>/<run>  (its model_best.params, or
checkpoint-latest.params when the run monitors nothing) or --run a checkpoint file, [-c config.json]
[--split test|validation] [--out DIR]; the split is the config's test split, or its validation split when it has none.

Prints the loss and every configured metric, then what fits the task (derived from the loss and the data, see
training/task_kinds.py): for classification the confusion matrix and a per-class table (confusion_matrix.png,
per_class.csv); for binary and multi-label outputs (B, L) a per-label table and confusion counts at the
decision threshold (per_label.csv; the first threshold the config's metrics name, else 0.5, as predict.py decides;
`--set metrics.N.args.threshold=0.3` re-scores at another, whatever trainer.monitor names); for a language model
(a class per position) perplexity and token accuracy; for regression a predicted-vs-true plot of every output
column (predictions.png); for outputs that are images (regression, masks) a grid of input / target / prediction of
the first examples instead; for a run of no known task (a GAN's, a VAE's), each output that is a batch of images in
a grid beside its input (images_<output>.png). A model of several named outputs has each reported
by its own task under its name (digit/accuracy, confusion_matrix_digit.png, predictions_ink.png). Files go next to the
checkpoint (or to DIR), with the split in their names when it is not the test split.

Exit status: 0 done; 1 the results were printed but a file could not be written (one `error:` line names it), or
standard output could not take them (a full disk); 2 bad input (arguments, config, data, checkpoint, stdout closed),
reported in one `error:` line before anything is evaluated."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from files.writes import CONFIG, UnsafeFile, refuse_unsafe, write_atomic
from inference.trained_run import load_run
from training.assembly import assemble
from training.buckets import store as buckets  # [feature: buckets]
from training.config.file import ConfigError
from training.config.validation import load_config
from training.devices import compilation_cache
from training.run.checkpoint import check_checkpoint_file
from training.run.cli import ArgumentParser, add_run, command, fail
from training.run.figures import plots
from training.run.location import check_config_writes

# An evaluation monitors nothing, so the run's trainer.monitor is set aside: it may name a metric that --set renamed
# (a threshold re-scored: multilabel_f1@0.3). train/loss is logged by every run and, unlike "off", is accepted beside
# a reduce_on_plateau schedule.
EVALUATION_MONITOR = "trainer.monitor=min train/loss"


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run(parser, "run folder or a checkpoint file", required=True)
    parser.add_argument("-c", "--config", help="config file (default: the run folder's config.json)")
    parser.add_argument(
        "--split",
        choices=("test", "validation"),
        help="the split to evaluate (default: test, or validation when the config has no test split)",
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--out", help="folder for the figures and tables (default: the checkpoint's)")
    return parser.parse_args(argv)


def per_class(matrix: np.ndarray) -> dict[str, np.ndarray]:
    """Precision, recall, F1 and support of each class from a confusion matrix (rows: true, columns: predicted);
    0 where a class is never predicted or never present, as the metrics do."""
    tp = np.diag(matrix).astype(np.float64)
    predicted, actual = matrix.sum(axis=0), matrix.sum(axis=1)
    ratio = lambda a, b: np.divide(a, b, out=np.zeros(len(tp)), where=b > 0)
    return {
        "precision": ratio(tp, predicted),
        "recall": ratio(tp, actual),
        "f1": ratio(2 * tp, predicted + actual),
        "support": actual,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    compilation_cache.use()  # the machine's: what training compiled, this reads
    from data_loader.augment.pipeline import Prepared
    from training.run.checkpoint import of_run

    args.run = buckets.local_copy(args.run)  # [feature: buckets] a run in a bucket, read from a local copy
    checkpoint_path = of_run(args.run)
    config_path = Path(args.config) if args.config else checkpoint_path.parent / CONFIG
    out = Path(args.out) if args.out else checkpoint_path.parent
    try:
        check_checkpoint_file(checkpoint_path)
        if not args.config and not config_path.exists():
            raise ConfigError(f"{config_path}: no such file; give the run's config with -c CONFIG")
        config = load_config(config_path, [*args.overrides, EVALUATION_MONITOR], source=config_path.name)
        if not args.config:  # the run folder's own config: where it may write is checked
            check_config_writes(config, checkpoint_path.parent)
    except ConfigError as error:
        fail(str(error))
    except (OSError, UnicodeDecodeError) as error:  # permission denied, a folder, not text
        fail(f"{config_path}: cannot read it ({getattr(error, 'strerror', None) or error})")
    try:
        if args.split is None:  # a run without a test split (a language model's) is judged on its validation split
            args.split = (
                "test" if "test" in config["data_loader"] or "validation" not in config["data_loader"] else "validation"
            )
        if args.split not in config["data_loader"]:
            raise ConfigError(
                f"data_loader.{args.split}: not in the config; splits: {', '.join(config['data_loader'])}"
            )
        # the figures are written after the evaluation: an --out that cannot be a folder is refused before it
        existing = next(p for p in (out, *out.parents) if p.exists())
        if not existing.is_dir():
            raise ConfigError(f"--out {out}: {existing} is a file, not a folder")
        run = assemble(config)
        # the train split's augmentation list: its deterministic part (normalize) applies in evaluation too
        model, loss_fn, metrics, augment = run.model, run.loss_fn, run.metrics, run.augment
        loader = run.load_data([args.split])[args.split]
        raw_spec = loader.spec  # what the loader yields; `spec` below is what the model sees
    except ConfigError as error:
        fail(str(error))
    except (OSError, ValueError) as error:  # the data set's own complaint, which does not say which split
        fail(f"config.json: data_loader.{args.split}: {error}")
    try:
        spec = raw_spec if augment is None else augment.spec(raw_spec)
    except ValueError as error:  # an op that cannot take this data (names its place in the list)
        fail(str(error))

    import jax

    from inference.predict import decision_threshold
    from training.config.components import of_labels, of_output
    from training.metrics import accuracy, confusion_matrix, metric_results, multilabel_confusion_matrix
    from training.run import checkpoint
    from training.step import empty_stats, make_eval_step
    from training.task_kinds import output_preprocessing, output_tasks, task_of

    preprocessing = loader.preprocessing
    task = task_of(config["loss"], spec, preprocessing)
    # each output of a model of several named outputs is reported by its own task, under its name
    tasks = output_tasks(config["loss"], spec, preprocessing)
    heads = (
        [(name, each, output_preprocessing(preprocessing, name)) for name, each in tasks.items()]
        if tasks
        else [(None, task, preprocessing)]
    )
    suffixes = {
        output: ("" if output is None else f"_{output}") + ("" if args.split == "test" else f"_{args.split}")
        for output, _, _ in heads
    }
    try:  # the folder may come from elsewhere: a link or a pipe where a file goes is refused before the evaluation
        for output, each, _ in heads:
            for name in OUTPUTS.get(each, ()):
                refuse_unsafe(out / name.format(suffix=suffixes[output]))
    except UnsafeFile as error:
        fail(str(error))
    threshold, origin = decision_threshold(config)
    labels = multilabel_confusion_matrix(threshold)  # per label, for the table of a run of labels (B, L)
    names = {m.name for m in metrics}
    for output, each, _ in heads:
        prefix = "" if output is None else f"{output}/"
        named = (
            (lambda m: of_labels(m, config["loss"].get("labels")))  # named targets: the class ids the loss names
            if output is None
            else (lambda m, output=output: of_output(m, output))
        )
        if each == "classification" and f"{prefix}confusion_matrix" not in names:
            metrics = [*metrics, named(confusion_matrix())]
        if each == "sequence" and f"{prefix}accuracy" not in names:
            metrics = [*metrics, named(accuracy())]
        if each == "multilabel" and f"{prefix}{labels.name}" not in names:
            metrics = [*metrics, named(labels)]
    try:
        loaded = load_run(checkpoint_path, config, spec["input"])
    except (ConfigError, checkpoint.CheckpointError) as error:
        fail(str(error))
    params, state, header = loaded.params, loaded.state, loaded.header

    eval_step = jax.jit(make_eval_step(model, loss_fn, metrics, augment), donate_argnums=(2,))
    totals = empty_stats(model, loss_fn, metrics, params, state, raw_spec, augment)
    for batch in loader.batches():
        totals = eval_step(params, state, totals, batch)
    results = metric_results(metrics, totals)

    described = ", ".join(f"{name} {each}" for name, each, _ in heads) if tasks else task
    print(
        f"{checkpoint_path} (epoch {header.get('epoch')}, step {header.get('step')}), "
        f"{args.split} split, {loader.num_examples} examples, task{'s' if tasks else ''}: {described}"
    )
    if header.get("eval_params"):  # an ema callback's average, say: what the run evaluated and saved as best
        print(f"  weights: {header['eval_params']} (the run evaluated these, not the trained parameters)")
    tokens = {f"{'' if o is None else o + '/'}accuracy" for o, each, _ in heads if each == "sequence"}
    # per-class or per-label vectors named by the data's classes, or by a CSV's target columns (one label each)
    classes_of = {f"{'' if o is None else o + '/'}": p.get("classes") or p.get("targets") for o, _, p in heads}
    for name, value in results.items():
        if isinstance(value, float):
            label = f"{name[: -len('accuracy')]}token accuracy" if name in tokens else name
            print(f"  {label:<20} {value:.4f}")
        elif not name.endswith("confusion_matrix") and np.ndim(value) == 1:  # per class or label ("none")
            print(f"  {name}:")
            print_per_class(value, classes_of.get(name[: name.rfind("/") + 1]))
    try:
        for output, each, info in heads:
            prefix = "" if output is None else f"{output}/"
            suffix = suffixes[output]
            if output is not None:
                print(f"output {output} ({each}):")
            if each == "classification":
                matrix = np.asarray(results[f"{prefix}confusion_matrix"], dtype=np.int64)
                report_classes(matrix, info.get("classes"), out, suffix)
            elif each == "multilabel" and len(target_shape(spec, output)) == 2:
                counts = np.asarray(results[f"{prefix}{labels.name}"], dtype=np.int64)
                report_labels(counts, info, threshold, origin, out, suffix)
            elif each == "sequence" and tasks is None and config["loss"]["name"] == "cross_entropy":
                if "perplexity" not in results:
                    perplexity = math.exp(min(results["loss"], 700.0))
                    print(f"  {'perplexity':<20} {perplexity:.4f}   (exp of the loss per position)")
            elif each == "regression" or (
                each == "multilabel" and output is None and len(spec.get("target", spec["input"]).shape) >= 3
            ):
                report_predictions(
                    model,
                    params,
                    state,
                    loader if augment is None else Prepared(loader, augment),
                    info,
                    out,
                    suffix,
                    output,
                )
            elif each == "other" and tasks is None:
                prepared = loader if augment is None else Prepared(loader, augment)
                report_images(model, params, state, prepared, out, suffix)
    except OSError as error:  # a read-only or full disk: the results above stand, the files do not
        fail(
            f"cannot write {error.filename or out} ({error.strerror or error}); the results above are complete, "
            "--out DIR writes the files elsewhere",
            1,
        )
    return 0


# The files each task writes (every one atomically: a temporary renamed over the name, never through a link).
OUTPUTS = {
    "classification": ("per_class{suffix}.csv", "confusion_matrix{suffix}.png"),
    "multilabel": ("per_label{suffix}.csv",),
    "regression": ("predictions{suffix}.png",),
}


def target_shape(spec: dict, output: str | None) -> tuple:
    """The shape of the batch's target (of a named output's), (B, L) for labels, more axes for masks."""
    target = spec.get("target", spec["input"])
    return tuple((target[output] if output is not None else target).shape)


def report_labels(counts: np.ndarray, preprocessing: dict, threshold: float, origin: str, out: Path, suffix: str):
    """Per label (counts (L, 2, 2): [[tn, fp], [fn, tp]]) precision, recall, F1 and support at the decision
    threshold, printed and written to per_label.csv; a single label (a binary classifier) also as its 2 x 2 table."""
    from inference.predict import label_names

    names = label_names(preprocessing, len(counts))
    print(f"labels predicted above probability {threshold:g} ({origin}):")
    if len(counts) == 1:
        (tn, fp1), (fn1, tp1) = counts[0]
        width = max(len(str(counts.max())), 8)
        print(f"  {'':<10} {'predicted 0':>{width + 3}} {'predicted 1':>{width + 3}}")
        print(f"  {'true 0':<10} {tn:>{width + 3}} {fp1:>{width + 3}}")
        print(f"  {'true 1':<10} {fn1:>{width + 3}} {tp1:>{width + 3}}")
    name_width = max(*map(len, names), len("label"))
    print(f"  {'label':<{name_width}}  precision  recall      f1  support")
    lines = ["label,precision,recall,f1,support,threshold"]
    for k, name in enumerate(names):
        table = per_class(counts[k])  # a label's 2 x 2 matrix: its scores are those of class 1, the positives
        p, r, f, n = (table[key][1] for key in ("precision", "recall", "f1", "support"))
        print(f"  {name:<{name_width}}  {p:>9.4f}  {r:>6.4f}  {f:>6.4f}  {n:>7}")
        lines.append(f"{json.dumps(name) if ',' in name else name},{p:.6f},{r:.6f},{f:.6f},{n},{threshold:g}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / OUTPUTS["multilabel"][0].format(suffix=suffix)
    write_atomic(path, ("\n".join(lines) + "\n").encode())
    print(f"wrote {path}")


def class_names(classes, count: int) -> list[str]:
    """The data's class names, unless the model's classes are not the data's (a head of another size)."""
    return [str(c) for c in classes] if classes and len(classes) == count else [str(c) for c in range(count)]


def print_per_class(values, classes) -> None:
    names = class_names(classes, len(values))
    width = max(map(len, names))
    for name, value in zip(names, values):
        print(f"    {name:<{width}}  {value:.4f}")


def report_classes(matrix: np.ndarray, classes, out: Path, suffix: str) -> None:
    """The confusion matrix and the per-class table, printed and written."""
    names = class_names(classes, len(matrix))
    # columns as wide as the counts (names cut to fit), rows and the table as wide as the longest name
    width = max(len(str(matrix.max())), 3)
    row_width = max(map(len, names))
    print("confusion matrix (rows: true class, columns: predicted):")
    print(f"  {'':<{row_width}} " + " ".join(f"{c[:width]:>{width}}" for c in names))
    for name, row in zip(names, matrix):
        print(f"  {name:<{row_width}} " + " ".join(f"{v:>{width}}" for v in row))
    table = per_class(matrix)
    lines = ["class,precision,recall,f1,support"]
    name_width = max(row_width, len("class"))
    print(f"per class:\n  {'class':<{name_width}}  precision  recall      f1  support")
    for c, name in enumerate(names):
        p, r, f, n = (table[k][c] for k in ("precision", "recall", "f1", "support"))
        print(f"  {name:<{name_width}}  {p:>9.4f}  {r:>6.4f}  {f:>6.4f}  {n:>7}")
        lines.append(f"{json.dumps(name) if ',' in name else name},{p:.6f},{r:.6f},{f:.6f},{n}")
    out.mkdir(parents=True, exist_ok=True)
    table_path, image_path = (out / name.format(suffix=suffix) for name in OUTPUTS["classification"])
    write_atomic(table_path, ("\n".join(lines) + "\n").encode())
    figures = plots()
    image = figures and figures.save_confusion_matrix(matrix, image_path, names)
    print(f"wrote {image} and {table_path}" if image else f"wrote {table_path}")


def report_images(model, params, state, loader, out: Path, suffix: str) -> None:
    """A run of no task the template knows (a GAN's, a VAE's): each output that is a batch of images, its first
    examples in a grid beside their input where that is an image too (images_<output>.png), so that what a
    generative model makes is seen, not only its loss."""
    import jax

    from training.step import model_kwargs

    figures = plots()
    if figures is None:
        return
    batch = next(loader.batches())
    real = batch["mask"].reshape(len(batch["mask"]), -1).max(axis=1) > 0
    outputs = jax.jit(lambda b: model(params, state, b["input"], train=False, **model_kwargs(model, b))[0])(batch)
    x = batch["input"]
    inputs = None if isinstance(x, dict) or not figures.is_image(np.asarray(x)) else np.asarray(x)[real]
    for name, images in (outputs if isinstance(outputs, dict) else {"output": outputs}).items():
        images = np.asarray(images)[real]
        if not figures.is_image(images) or not re.fullmatch(r"\w[\w.-]*", str(name)):  # a file name of its own
            continue
        out.mkdir(parents=True, exist_ok=True)
        grid = figures.image_grid_figure(inputs, None, images, ("input", "", str(name)))
        path = figures.save_figure(grid, out / f"images_{name}{suffix}.png")
        print(f"wrote {path} ({name} of the first {min(len(images), figures.IMAGE_ROWS)} examples)")


def report_predictions(
    model, params, state, loader, preprocessing: dict, out: Path, suffix: str, output: str | None = None
) -> None:
    """Predicted against true values of every real example (predictions.png; of the named ``output`` of a model of
    several): a scatter per output column, or, for outputs that are images, a grid of input / target / prediction of
    the first examples."""
    import jax

    from training.step import model_kwargs, target_of

    figures = plots()
    if figures is None:  # predictions.png is all this writes
        return

    pick = (lambda tree: tree) if output is None else (lambda tree: tree[output])
    forward = jax.jit(
        lambda batch: pick(model(params, state, batch["input"], train=False, **model_kwargs(model, batch))[0])
    )
    inputs, predicted, true = [], [], []
    for batch in loader.batches():
        real = batch["mask"].reshape(len(batch["mask"]), -1).max(axis=1) > 0
        predicted.append(np.asarray(forward(batch))[real])
        true.append(np.asarray(pick(target_of(batch)))[real])
        x = batch["input"]
        inputs.append(None if isinstance(x, dict) else np.asarray(x)[real])
    predicted, true = np.concatenate(predicted), np.concatenate(true)
    out.mkdir(parents=True, exist_ok=True)
    path = out / OUTPUTS["regression"][0].format(suffix=suffix)
    if figures.is_image(predicted):
        shown = inputs[0] is not None and figures.is_image(inputs[0])
        image = figures.save_image_grid(np.concatenate(inputs) if shown else None, true, predicted, path)
        what = "input / target / prediction" if shown else "target / prediction"
        rows = min(len(predicted), figures.IMAGE_ROWS)
        print(f"wrote {image} ({what} of the first {rows} of {len(predicted)} examples)")
        return
    image = figures.save_predictions(predicted, true, path, preprocessing.get("targets"))
    outputs, most = int(np.prod(predicted.shape[1:])), figures.MAX_PANELS
    shown = f"all {outputs} outputs" if outputs <= most else f"the first {most} of {outputs} outputs"
    print(f"wrote {image} ({shown})")


if __name__ == "__main__":
    sys.exit(command(main))
