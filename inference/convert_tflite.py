"""Export a trained model to TFLite, ONNX and a native JAX artifact, each checked against the JAX model.

    python inference/convert_tflite.py -r saved/<name>/<run_id> --name jax_mnist
    python inference/convert_tflite.py -c config.json -w saved/.../model_best.params --input 1 28 28 1 --name jax_mnist

Writes inference/<name>/: <name>.tflite, <name>.onnx, <name>.jax (`jax.export`, StableHLO), config.json, a copy of
model/, predict.py with preprocessing.json (what it needs to prepare images), and report.json (report.md: the
table printed at the end). Each file is run in its own runtime (LiteRT, onnxruntime, jax.export.deserialize) on
random inputs and on the validation split, at its batch size and, where the batch is symbolic, at 1 and a larger
size. Any failure exits non-zero and leaves nothing: the folder is assembled in a temporary folder and renamed into
place at the end.

Batch: TFLite fixed (the first --input dimension, default 1: LiteRT runs a fixed batch much faster), ONNX and JAX
symbolic. --batch N fixes every format at N, --dynamic-batch makes every one symbolic.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: the repo's packages must be importable
    sys.path.insert(0, str(REPO))

from inference import verify  # noqa: E402
from inference.predict import run_batched  # noqa: E402
from utils import ConfigError, build, fail, load_config  # noqa: E402

FORMATS = ("tflite", "onnx", "jax")
SUFFIX = {"tflite": ".tflite", "onnx": ".onnx", "jax": ".jax"}
ROUTES = {
    "jax2tf": "jax2tf -> TFLiteConverter (builtin ops)",
    "jax2onnx": "jax2onnx (opset 18)",
    "tflite": "tf2onnx from the .tflite (Select as Where)",
    "jax.export": "jax.export (StableHLO)",
}
LARGER_BATCH = 16  # the "larger size" a symbolic batch is checked at, besides 1
INPUT_NAME, OUTPUT_NAME = "input", "logits"


@dataclass
class Options:
    batch: int = 1
    dynamic: dict = field(default_factory=lambda: {"tflite": False, "onnx": True, "jax": True})
    quantize: str | None = None
    onnx_via: str = "jax2onnx"
    atol: float = verify.ATOL
    rtol: float = verify.RTOL
    max_accuracy_drop: float = 0.5  # percentage points, quantized TFLite only
    seed: int = 0


@dataclass
class Validation:
    """Real examples with their targets and the JAX model's logits on them."""
    inputs: np.ndarray
    targets: np.ndarray
    logits: np.ndarray

    @property
    def accuracy(self) -> float:
        return verify.accuracy(self.logits, self.targets)


class ExportError(Exception):
    """A format that could not be exported or did not match the JAX model."""


# ------------------------------------------------------------------------------------------------------- exporting
def export_bytes(route: str, fn, spec, dynamic: bool, quantize: str | None = None, float_tflite=None) -> bytes:
    """One artifact's bytes by `route`; float_tflite() gives the float32 .tflite that route "tflite" converts."""
    if route == "jax2tf":
        from inference.export_tflite import export_tflite

        return export_tflite(fn, spec, dynamic_batch=dynamic, quantize=quantize,
                             input_name=INPUT_NAME, output_name=OUTPUT_NAME)
    if route == "jax2onnx":
        from inference.export_onnx import export_onnx

        return export_onnx(fn, spec, dynamic_batch=dynamic, input_name=INPUT_NAME, output_name=OUTPUT_NAME)
    if route == "tflite":
        from inference.export_onnx import tflite_to_onnx

        return tflite_to_onnx(float_tflite(), input_name=INPUT_NAME, output_name=OUTPUT_NAME)
    if route == "jax.export":
        from inference.export_jax import export_jax

        return export_jax(fn, spec, dynamic_batch=dynamic)
    raise ValueError(f"unknown route {route!r}")


def load_runner(path: Path, threads: int | None = None):
    """The artifact at `path` in its own runtime."""
    if path.suffix == ".jax":
        from inference.export_jax import JaxModel

        return JaxModel(path.read_bytes())
    from inference.predict import load_model

    return load_model(path, threads)


def first_line(error: Exception) -> str:
    """A converter's error in one line (they run to pages of MLIR)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def shape_text(shape) -> str:
    return "[" + ",".join("B" if d is None else str(d) for d in shape) + "]"


# -------------------------------------------------------------------------------------------------------- checking
def check(runner, forward, spec, validation: Validation | None, options: Options, quantized: bool) -> dict:
    """Runs the loaded artifact against the JAX model; returns its report entry (raises ExportError on failure)."""
    fixed = runner.input_shape[0]
    expected_input = (None if fixed is None else spec.shape[0], *spec.shape[1:])
    if tuple(runner.input_shape) != expected_input:
        raise ExportError(f"input shape {shape_text(runner.input_shape)}, expected {shape_text(expected_input)}")
    sizes = [fixed] if fixed else sorted({1, options.batch, LARGER_BATCH})
    rng = np.random.default_rng(options.seed)
    tolerance = dict(atol=options.atol, rtol=options.rtol)
    random_checks = []
    agreements = []
    for n in sizes:
        x = rng.standard_normal((n, *spec.shape[1:])).astype(spec.dtype)
        want = np.asarray(forward(x))
        got = runner(x)
        what = f"output {runner.output_name!r}, random inputs, batch {n}"
        random_checks.append(verify.compare(got, want, **tolerance, what=what))
        agreements.append(np.argmax(got, -1) == np.argmax(want, -1))
    random_result = verify.merge(random_checks)
    entry = {
        "input": {"name": runner.input_name, "shape": shape_text(runner.input_shape), "dtype": str(runner.input_dtype)},
        "output": {"name": runner.output_name, "shape": shape_text(runner.output_shape)},
        "random": {"batch_sizes": sizes, **random_result.to_dict(),
                   "top1_agreement": float(np.mean(np.concatenate(agreements)))},
    }
    failures = [] if quantized or random_result.ok else [random_result.failure]
    if validation is not None:
        got = run_batched(runner, validation.inputs)
        what = f"output {runner.output_name!r}, validation inputs"
        result = verify.compare(got, validation.logits, **tolerance, what=what)
        accuracy = verify.accuracy(got, validation.targets)
        entry["validation"] = {"examples": len(got), **result.to_dict(),
                               "top1_agreement": verify.top1_agreement(got, validation.logits),
                               "accuracy": accuracy, "jax_accuracy": validation.accuracy}
        if quantized:
            drop = 100.0 * (validation.accuracy - accuracy)
            if drop > options.max_accuracy_drop:
                failures.append(f"quantized accuracy {100 * accuracy:.2f}% is {drop:.2f} points below the JAX "
                                f"model's {100 * validation.accuracy:.2f}% (allowed: {options.max_accuracy_drop})")
            if not np.isfinite(got).all():
                failures.append("quantized model gives non-finite outputs")
        elif not result.ok:
            failures.append(result.failure)
    if failures:
        raise ExportError("; ".join(failures))
    return entry


def export_format(fmt: str, fn, forward, spec, folder: Path, name: str, validation, options: Options,
                  log=print, threads: int | None = None) -> dict:
    """Exports one format into `folder`, reloads it and checks it; tries the other ONNX route if one fails."""
    if fmt == "onnx":
        routes = [options.onnx_via, "tflite" if options.onnx_via == "jax2onnx" else "jax2onnx"]
    else:
        routes = {"tflite": ["jax2tf"], "jax": ["jax.export"]}[fmt]
    quantize = options.quantize if fmt == "tflite" else None
    path = folder / f"{name}{SUFFIX[fmt]}"
    float_tflite = lambda: export_bytes("jax2tf", fn, spec, options.dynamic[fmt])  # noqa: E731
    errors = []
    for route in routes:
        start = time.perf_counter()
        try:
            path.write_bytes(export_bytes(route, fn, spec, options.dynamic[fmt], quantize, float_tflite))
            seconds = time.perf_counter() - start
            runner = load_runner(path, threads)
            entry = check(runner, forward, spec, validation, options, quantize is not None)
        except Exception as error:  # any converter or runtime error: report it, try the other route if any
            message = f"{ROUTES[route]}: {first_line(error)}"
            errors.append(message)
            path.unlink(missing_ok=True)
            if route != routes[-1]:
                log(f"{fmt}: {message}\n{fmt}: trying {ROUTES[routes[routes.index(route) + 1]]} instead")
            continue
        entry = {"format": fmt, "file": path.name, "bytes": path.stat().st_size, "route": ROUTES[route],
                 "dynamic_batch": options.dynamic[fmt], "quantize": quantize, "export_seconds": round(seconds, 2),
                 **entry}
        if fmt == "jax":
            entry["platforms"] = list(runner.platforms)
        if errors:
            entry["failed_routes"] = errors
        return entry
    raise ExportError(" | ".join(errors))


# ---------------------------------------------------------------------------------------------------------- report
def fmt_size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def table(entries: list[dict]) -> str:
    """The report as a Markdown table."""
    head = ["format", "route", "size", "input", "output", "max abs diff", "max rel diff", "top-1 agree",
            "accuracy (JAX)"]
    rows = []
    for e in entries:
        val = e.get("validation")
        diffs = [max(e["random"]["max_abs_diff"], val["max_abs_diff"] if val else 0.0),
                 max(e["random"]["max_rel_diff"], val["max_rel_diff"] if val else 0.0)]
        label = e["format"] + (f" ({e['quantize']})" if e.get("quantize") else "")
        rows.append([label, e["route"], fmt_size(e["bytes"]),
                     f"{e['input']['name']} {e['input']['dtype']}{e['input']['shape']}",
                     f"{e['output']['name']} {e['output']['shape']}", f"{diffs[0]:.1e}", f"{diffs[1]:.1e}",
                     f"{100 * val['top1_agreement']:.2f}%" if val else "-",
                     f"{100 * val['accuracy']:.2f}% ({100 * val['jax_accuracy']:.2f}%)" if val else "-"])
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


# ------------------------------------------------------------------------------------------------------ run folder
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-r", "--run", help="run folder saved/<name>/<run_id> (config, best checkpoint, input shape)")
    parser.add_argument("-c", "--config", help="config file (default: the checkpoint's run folder's config.json)")
    parser.add_argument("-w", "--weights", help="checkpoint file, e.g. saved/<name>/<run_id>/model_best.params")
    parser.add_argument("--input", type=int, nargs="+", metavar="DIM",
                        help="input shape with batch first, e.g. 1 28 28 1 (default: the data set's, batch 1)")
    parser.add_argument("--name", required=True, help="export name: writes <output-dir>/<name>/<name>.*")
    parser.add_argument("--output-dir", default=str(Path(__file__).resolve().parent),
                        help="where the <name> folder goes (default: inference/)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of tflite,onnx,jax")
    parser.add_argument("--quantize", choices=("float16", "dynamic-int8"), help="quantize the TFLite model")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=int, help="fix the batch of every format at N")
    batch.add_argument("--dynamic-batch", action="store_true", help="symbolic batch in every format")
    parser.add_argument("--onnx-via", choices=("jax2onnx", "tflite"), default="jax2onnx",
                        help="ONNX route: jax2onnx (default) or tf2onnx from the .tflite")
    parser.add_argument("--atol", type=float, default=verify.ATOL, help=f"absolute tolerance (default {verify.ATOL})")
    parser.add_argument("--rtol", type=float, default=verify.RTOL, help=f"relative tolerance (default {verify.RTOL})")
    parser.add_argument("--max-accuracy-drop", type=float, default=0.5,
                        help="quantized TFLite: allowed validation accuracy loss in points (default 0.5)")
    parser.add_argument("--val-examples", type=int, default=None,
                        help="validation examples to check (default: the whole split; 0: random inputs only)")
    parser.add_argument("--force", action="store_true", help="replace an existing <output-dir>/<name>")
    return parser.parse_args(argv)


def resolve_run(args) -> tuple[Path, Path]:
    """(config path, checkpoint path) from -r, or -c/-w."""
    if args.run:
        run = Path(args.run)
        if run.is_file():
            checkpoint = run
        else:
            checkpoint = run / "model_best.params"
            if not checkpoint.is_file() and (run / "checkpoint-latest.params").is_file():
                checkpoint = run / "checkpoint-latest.params"
                print(f"{run}: no model_best.params (monitor off?); using checkpoint-latest.params")
    elif args.weights:
        checkpoint = Path(args.weights)
    else:
        raise ConfigError("give a run folder (-r saved/<name>/<run_id>) or a checkpoint (-w FILE, with -c config)")
    if not checkpoint.is_file():
        raise ConfigError(f"{checkpoint}: no such checkpoint file")
    config = Path(args.config) if args.config else checkpoint.parent / "config.json"
    return config, checkpoint


def validation_loader(config: dict):
    """The validation split's loader (the test split's when there is none); None when its data cannot be read."""
    split = "validation" if "validation" in config["data_loader"] else "test"
    if split not in config["data_loader"]:
        return None, "no validation or test split in the config"
    try:
        return build(config["data_loader"][split], "data_loader", f"config.json: data_loader.{split}",
                     seed=config["seed"]), None
    except ConfigError as error:
        return None, str(error)


def collect_validation(loader, forward, limit: int | None) -> Validation:
    inputs, targets, logits = [], [], []
    seen = 0
    for batch in loader.batches():
        keep = batch["mask"] > 0
        x, y = batch["input"][keep], batch["target"][keep]
        if limit is not None:
            x, y = x[:limit - seen], y[:limit - seen]
        inputs.append(x)
        targets.append(y)
        logits.append(np.asarray(forward(batch["input"]))[keep][:len(x)])
        seen += len(x)
        if limit is not None and seen >= limit:
            break
    return Validation(np.concatenate(inputs), np.concatenate(targets), np.concatenate(logits))


def main(argv=None) -> int:
    args = parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    try:
        if not formats or set(formats) - set(FORMATS):
            raise ConfigError(f"--formats {args.formats}: choose from {','.join(FORMATS)}")
        if args.quantize and "tflite" not in formats:
            raise ConfigError("--quantize applies to the TFLite model: add tflite to --formats")
        if not args.name or "/" in args.name or args.name.startswith("."):
            raise ConfigError(f"--name {args.name!r}: expected a plain folder name")
        target = Path(args.output_dir) / args.name
        if target.exists() and not args.force:
            raise ConfigError(f"{target} exists; pass --force to replace it")
        config_path, checkpoint_path = resolve_run(args)
        config = load_config(config_path, source=config_path.name)
        model = build(config["model"], "model", "config.json: model")
        loader, loader_problem = validation_loader(config)
        if args.input:
            batch, sample_shape = args.input[0], tuple(args.input[1:])
        elif loader is not None:
            batch, sample_shape = 1, tuple(loader.dataset.sample_shape)
        else:
            raise ConfigError(f"the input shape comes from the data set, which cannot be read ({loader_problem}): "
                              "give it with --input 1 28 28 1")
        if args.batch is not None:
            batch = args.batch
        if batch < 1 or not sample_shape:
            raise ConfigError(f"--input {' '.join(map(str, args.input or []))}: expected a batch and a sample shape")
    except ConfigError as error:
        fail(str(error))

    import jax
    import jax.numpy as jnp

    from training import checkpoint

    spec = jax.ShapeDtypeStruct((batch, *sample_shape), jnp.float32)
    template = jax.eval_shape(lambda: dict(zip(("params", "state"), model.init(jax.random.PRNGKey(0), spec))))
    try:
        tree, header = checkpoint.restore(checkpoint_path, template, only=("params", "state"))
    except checkpoint.CheckpointError as error:
        fail(str(error))
    params, state = jax.device_put((tree["params"], tree["state"]))

    def fn(x):
        return model(params, state, x, train=False)[0]

    forward = jax.jit(fn)
    options = Options(batch=batch, quantize=args.quantize, onnx_via=args.onnx_via, atol=args.atol, rtol=args.rtol,
                      max_accuracy_drop=args.max_accuracy_drop)
    if args.batch is not None or args.dynamic_batch:
        options.dynamic = {f: args.dynamic_batch for f in FORMATS}

    validation = None
    if args.val_examples != 0:
        if loader is None:
            print(f"warning: no validation data ({loader_problem}); checking on random inputs only"
                  + ("; the quantized model's accuracy is not checked" if args.quantize else ""))
        else:
            validation = collect_validation(loader, forward, args.val_examples)
    print(f"{checkpoint_path} (epoch {header.get('epoch')}): input {shape_text(spec.shape)}, "
          f"{len(validation.targets) if validation else 0} validation examples"
          + (f", JAX accuracy {100 * validation.accuracy:.2f}%" if validation else ""))

    target.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{args.name}.", dir=target.parent))
    try:
        entries, failures = [], []
        for fmt in formats:
            try:
                entry = export_format(fmt, fn, forward, spec, folder, args.name, validation, options)
            except ExportError as error:
                failures.append(f"{fmt}: {error}")
                print(f"{fmt}: FAILED: {error}", file=sys.stderr)
                continue
            entries.append(entry)
            print(f"{fmt}: {entry['file']} ({fmt_size(entry['bytes'])}, {entry['route']}): matches the JAX model")
        if failures:
            failed = [f for f in formats if any(x.startswith(f + ":") for x in failures)]
            others = [f for f in formats if f not in failed]
            hints = [f"--formats {','.join(others)} exports the others"] if others else []
            if any(options.dynamic[f] for f in failed):
                hints.append("a fixed batch (--batch N) avoids the symbolic-shape limits of some converters")
            print("export failed, nothing written" + "".join(f"; {h}" for h in hints), file=sys.stderr)
            return 1
        write_extras(folder, config, loader, spec, args, checkpoint_path, entries, options)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{args.name}.old.", dir=target.parent))
            target.rename(old / args.name)
            folder.rename(target)
            shutil.rmtree(old)
        else:
            folder.rename(target)
    finally:
        if folder.exists():
            shutil.rmtree(folder)
    print(table(entries))
    print(f"wrote {target}/")
    return 0


def write_extras(folder: Path, config: dict, loader, spec, args, checkpoint_path: Path, entries: list[dict],
                 options: Options) -> None:
    """config.json, model/, predict.py, preprocessing.json and report.json next to the artifacts."""
    import jax

    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copytree(REPO / "model", folder / "model", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(Path(__file__).with_name("predict.py"), folder / "predict.py")
    if loader is not None:
        dataset = loader.dataset
        (folder / "preprocessing.json").write_text(json.dumps({
            "sample_shape": list(spec.shape[1:]), "layout": "NHWC", "input_name": INPUT_NAME,
            "output_name": OUTPUT_NAME, "pixel_scale": 1.0 / 255.0, "mean": float(getattr(dataset, "mean", 0.0)),
            "std": float(getattr(dataset, "std", 1.0)), "classes": getattr(dataset, "classes", None),
        }, indent=2) + "\n")
    versions = {"jax": jax.__version__}
    for package in ("tensorflow", "ai_edge_litert", "onnxruntime", "jax2onnx", "tf2onnx"):
        module = sys.modules.get(package)
        if module is not None:
            versions[package] = getattr(module, "__version__", "?")
    report = {"name": args.name, "checkpoint": str(checkpoint_path), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
              "checked_on": jax.default_backend(), "tolerance": {"atol": options.atol, "rtol": options.rtol},
              "versions": versions, "formats": entries}
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(table(entries) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
