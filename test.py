"""Evaluate a checkpoint:  python test.py -r saved/<name>/<run>/model_best.params  (or -r the run folder)
[-c config.json] [--split test|validation] [--out DIR]. Prints the loss, every configured metric, the confusion
matrix and per-class precision/recall; writes confusion_matrix.png and per_class.csv next to the checkpoint (or in
DIR), with the split in the names when it is not the test split."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from utils import ConfigError, build, fail, load_config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-r", "--resume", required=True, help="checkpoint file or run folder (uses model_best.params)")
    parser.add_argument("-c", "--config", help="config file (default: the run folder's config.json)")
    parser.add_argument("--split", default="test", choices=("test", "validation"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--out", help="folder for confusion_matrix.png and per_class.csv (default: the checkpoint's)")
    return parser.parse_args(argv)


def per_class(matrix: np.ndarray) -> dict[str, np.ndarray]:
    """Precision, recall, F1 and support of each class from a confusion matrix (rows: true, columns: predicted);
    0 where a class is never predicted or never present, as the metrics do."""
    tp = np.diag(matrix).astype(np.float64)
    predicted, actual = matrix.sum(axis=0), matrix.sum(axis=1)
    ratio = lambda a, b: np.divide(a, b, out=np.zeros(len(tp)), where=b > 0)
    return {"precision": ratio(tp, predicted), "recall": ratio(tp, actual), "f1": ratio(2 * tp, predicted + actual),
            "support": actual}


def main(argv=None) -> int:
    args = parse_args(argv)
    path = Path(args.resume)
    checkpoint_path = path / "model_best.params" if path.is_dir() else path
    config_path = Path(args.config) if args.config else checkpoint_path.parent / "config.json"
    try:
        config = load_config(config_path, args.overrides, source=config_path.name)
        if args.split not in config["data_loader"]:
            raise ConfigError(f"data_loader.{args.split}: not in the config; "
                              f"splits: {', '.join(config['data_loader'])}")
        if not checkpoint_path.is_file():
            raise ConfigError(f"{checkpoint_path}: no such checkpoint file")
        model = build(config["model"], "model", "config.json: model")
        loss_fn = build(config["loss"], "loss", "config.json: loss")
        metrics = [build(m, "metrics", f"config.json: metrics.{i}") for i, m in enumerate(config["metrics"])]
        loader = build(config["data_loader"][args.split], "data_loader", f"config.json: data_loader.{args.split}",
                       seed=config["seed"])
    except ConfigError as error:
        fail(str(error))

    import jax
    import jax.numpy as jnp

    from training import checkpoint
    from training.metrics import confusion_matrix
    from training.step import empty_stats, make_eval_step
    from training.trainer import metric_results

    # The confusion matrix is always reported, whatever the config lists.
    if not any(m.name == "confusion_matrix" for m in metrics):
        metrics = [*metrics, confusion_matrix()]
    spec = jax.ShapeDtypeStruct((loader.batch_size, *loader.dataset.sample_shape), jnp.float32)
    template = jax.eval_shape(lambda: dict(zip(("params", "state"), model.init(jax.random.PRNGKey(0), spec))))
    try:
        tree, header = checkpoint.restore(checkpoint_path, template, only=("params", "state"))
    except checkpoint.CheckpointError as error:
        fail(str(error))

    eval_step = jax.jit(make_eval_step(model, loss_fn, metrics), donate_argnums=(2,))
    batch_spec = {"input": spec, "target": jax.ShapeDtypeStruct((loader.batch_size,), jnp.int32),
                  "mask": jax.ShapeDtypeStruct((loader.batch_size,), jnp.float32)}
    acc = empty_stats(model, loss_fn, metrics, tree["params"], tree["state"], batch_spec)
    for batch in loader.batches():
        acc = eval_step(tree["params"], tree["state"], acc, batch)
    results = metric_results(metrics, acc)

    print(f"{checkpoint_path} (epoch {header.get('epoch')}, step {header.get('step')}), "
          f"{args.split} split, {loader.num_examples} examples")
    for name, value in results.items():
        if isinstance(value, float):
            print(f"  {name:<20} {value:.4f}")
    matrix = np.asarray(results["confusion_matrix"], dtype=np.int64)
    print("confusion matrix (rows: true class, columns: predicted):")
    width = max(len(str(matrix.max())), 3)
    print("      " + " ".join(f"{c:>{width}}" for c in range(len(matrix))))
    for i, row in enumerate(matrix):
        print(f"  {i:>3} " + " ".join(f"{v:>{width}}" for v in row))

    table = per_class(matrix)
    lines = ["class,precision,recall,f1,support"]
    print("per class:\n  class  precision  recall      f1  support")
    for c in range(len(matrix)):
        p, r, f, n = (table[k][c] for k in ("precision", "recall", "f1", "support"))
        print(f"  {c:>5}  {p:>9.4f}  {r:>6.4f}  {f:>6.4f}  {n:>7}")
        lines.append(f"{c},{p:.6f},{r:.6f},{f:.6f},{n}")
    out = Path(args.out) if args.out else checkpoint_path.parent
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.split == "test" else f"_{args.split}"
    (out / f"per_class{suffix}.csv").write_text("\n".join(lines) + "\n")
    from training.plots import save_confusion_matrix

    image = save_confusion_matrix(matrix, out / f"confusion_matrix{suffix}.png")
    print(f"wrote {image} and {out / f'per_class{suffix}.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
