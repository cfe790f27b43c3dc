"""Export a trained model to TFLite, ONNX and a native JAX artifact, each checked against the JAX model (TFLite
where the project has `inference/formats/tflite/`: the formats are those of `inference/formats/`).

    python inference/convert_tflite.py --run saved/<name>/<run_id> --name jax_mnist
    python inference/convert_tflite.py -c config.json -w saved/.../model_best.params --input 1 28 28 1 --name jax_mnist

Writes exports/<name>/ (ignored by git): <name>.tflite, <name>.onnx, <name>.jax (`jax.export`, StableHLO),
config.json, a copy of model/, predict.py with preprocessing.json (the data's preprocessing, class names or
vocabulary, the inputs and the task), and report.json (report.md: the table printed at the end, with what was not
checked and which axes are fixed). The inputs' names, dtypes and shapes come from the data (one array is "input"; a
dict's arrays keep their names); a model whose call declares `mask` takes the data's padding mask as one more named
input, "mask" (per example as the batches hold it, e.g. (context,) for tokens). Each file is run in its own runtime
(LiteRT, onnxruntime, jax.export.deserialize) on random inputs and on real validation examples, at its batch size
and, where the batch is symbolic, at 1 and a larger size, with the agreement its task calls for (see
inference/exporter.py).
Any failure exits non-zero and leaves nothing (Ctrl-C or SIGTERM too, within about a second): the folder is
assembled in a temporary folder and renamed into place at the end (with --force swapped with the old one in one
step), under a lock on the name (docs/export.md).

Batch: each format's own default (TFLite fixed at the first --input dimension, default 1: LiteRT runs a fixed batch
much faster; ONNX and JAX symbolic). --batch N fixes every format at N, --dynamic-batch makes every one symbolic.

Every option is checked against the model and the data before anything is exported, and a bad one is one `error:`
line (exit status 2): an --input example shape or dtype other than the data's is refused while the data validates
the export (--val-examples 0 exports it on random inputs alone), and one the model cannot take is refused always.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: the repo's packages must be importable
    sys.path.insert(0, str(REPO))

from signals import stops  # noqa: E402

if __name__ == "__main__":  # before the heavy imports: a stop during them ends the command at once too
    stops.watch()

import numpy as np  # noqa: E402

from data_loader.augment.pipeline import Prepared  # noqa: E402
from files.writes import BEST, CONFIG, LATEST, PREPROCESSING  # noqa: E402
from inference import exporter, verify  # noqa: E402
from inference.exporter import FORMATS, ExportError, Options, first_line  # noqa: E402
from inference.inputs import MASK, Inputs, Outputs, with_mask, without_mask  # noqa: E402
from inference.predict import decision_threshold, read_preprocessing  # noqa: E402
from inference.routes import FORMATS as DECLARED  # noqa: E402
from inference.routes import OUTPUT_NAME, routes_of  # noqa: E402
from inference.trained_run import ModelInputError, load_run  # noqa: E402
from training.assembly import assemble  # noqa: E402
from training.buckets import store as buckets  # noqa: E402 [feature: buckets]
from training.config.components import labels_of  # noqa: E402
from training.config.file import ConfigError  # noqa: E402
from training.config.schema import MAX_BATCH  # noqa: E402
from training.config.validation import load_config  # noqa: E402
from training.devices import compilation_cache  # noqa: E402
from training.run.checkpoint import check_checkpoint_file, of_run  # noqa: E402
from training.run.cli import ArgumentParser, add_run, command, fail  # noqa: E402
from training.run.location import check_config_writes  # noqa: E402
from training.step import declares_mask  # noqa: E402


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run(parser, "run folder saved/<name>/<run_id> (config, best checkpoint, input spec)")
    parser.add_argument("-c", "--config", help="config file (default: the checkpoint's run folder's config.json)")
    parser.add_argument("-w", "--weights", help="checkpoint file, e.g. saved/<name>/<run_id>/model_best.params")
    parser.add_argument(
        "--input",
        type=int,
        nargs="+",
        metavar="DIM",
        help="one input's shape with batch first, e.g. 1 28 28 1 (default: the data's, batch 1)",
    )
    parser.add_argument("--input-dtype", default="float32", help="with --input: its dtype (default float32)")
    parser.add_argument("--name", required=True, help="export name: writes <output-dir>/<name>/<name>.*")
    parser.add_argument(
        "--output-dir",
        default=str(REPO / "exports"),
        help="where the <name> folder goes (default: exports/, which git ignores)",
    )
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated subset of {','.join(FORMATS)}")
    quantizable = [f for f in FORMATS if DECLARED[f].quantizations]
    parser.set_defaults(quantize=None)
    if quantizable:  # a format that offers quantization (TFLite's folder)
        choices = tuple(dict.fromkeys(q for f in quantizable for q in DECLARED[f].quantizations))
        parser.add_argument("--quantize", choices=choices, help=f"quantize the {'/'.join(quantizable)} model")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=int, help="fix the batch of every format at N")
    batch.add_argument("--dynamic-batch", action="store_true", help="symbolic batch in every format")
    parser.add_argument(
        "--onnx-via",
        choices=routes_of("onnx"),
        default="jax2onnx",
        help="ONNX route: jax2onnx (default) or, with TFLite's folder, tflite (tf2onnx from the .tflite)",
    )
    parser.add_argument("--atol", type=float, default=verify.ATOL, help=f"absolute tolerance (default {verify.ATOL})")
    parser.add_argument("--rtol", type=float, default=verify.RTOL, help=f"relative tolerance (default {verify.RTOL})")
    parser.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=0.5,
        help="a quantized model: allowed loss of the task's accuracy in points (default 0.5)",
    )
    parser.add_argument(
        "--val-examples",
        type=int,
        default=None,
        help="validation examples to check (default: the whole split; 0: random inputs only)",
    )
    parser.add_argument(
        "--outputs",
        metavar="NAME,...",
        help="a model of named outputs: export these alone (a GAN's image without its discriminator's score)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing <output-dir>/<name>")
    return parser.parse_args(argv)


def chosen_outputs(asked: str | None, forward, spec) -> list[str] | None:
    """``--outputs``: the named outputs to export, each one the model gives (None: every output)."""
    if asked is None:
        return None
    import jax

    names = [n.strip() for n in asked.split(",") if n.strip()]
    given = jax.eval_shape(forward, spec)
    if not isinstance(given, dict):
        fail(f"--outputs {asked}: the model gives one output, not named ones; leave --outputs out")
    unknown = [n for n in names if n not in given]
    if not names or unknown:
        fail(f"--outputs {asked}: expected names of the model's outputs: {', '.join(sorted(given))}")
    return names


def resolve_run(args) -> tuple[Path, Path]:
    """(config path, checkpoint path) from --run, or -c/-w."""
    if args.run:
        args.run = buckets.fetched(args.run)  # [feature: buckets] a run in a bucket, read from a local copy
        checkpoint = of_run(args.run)
        if checkpoint.name == LATEST and Path(args.run).is_dir():
            print(f"{args.run}: no {BEST} (monitor off?); using {LATEST}")
    elif args.weights:
        checkpoint = Path(args.weights)
    else:
        raise ConfigError("give a run folder (--run saved/<name>/<run_id>) or a checkpoint (-w FILE, with -c config)")
    check_checkpoint_file(checkpoint)
    config = Path(args.config) if args.config else checkpoint.parent / CONFIG
    return config, checkpoint


def split_loader(run, splits=("validation", "test")):
    """(loader, split, None) of the first of `splits` in the run's config, or (None, None, why not)."""
    split = next((s for s in splits if s in run.config["data_loader"]), None)
    if split is None:
        return None, None, f"no {' or '.join(splits)} split in the config"
    try:
        loader = run.load_data([split])[split]
        augment = run.augment
        if augment is not None:  # the model takes what evaluation makes of the data (e.g. uint8 -> normalised)
            loader = Prepared(loader, augment)
        loader.spec  # noqa: B018 (reads the first batch: a data set that cannot be read fails here, clearly)
        return loader, split, None
    except ConfigError as error:
        return None, None, str(error)
    except ValueError as error:  # the data set's own complaint, which does not say which split
        return None, None, f"config.json: data_loader.{split}: {error}"


MAX_NAME = 100  # bytes of --name: room for the longest name the export gives a file (".<name>.old.XXXXXXXX")


def check_arguments(args, formats: list[str]) -> None:
    """Every option on its own, before anything is read or built."""
    if not formats or set(formats) - set(FORMATS):
        raise ConfigError(f"--formats {args.formats}: choose from {','.join(FORMATS)}")
    quantizable = [f for f in FORMATS if args.quantize in DECLARED[f].quantizations]
    if args.quantize and not set(quantizable) & set(formats):
        raise ConfigError(f"--quantize applies to the {'/'.join(quantizable)} model: add it to --formats")
    if not args.name or "/" in args.name or args.name.startswith("."):
        raise ConfigError(f"--name {args.name!r}: expected a plain folder name")
    if len(os.fsencode(args.name)) > MAX_NAME:
        raise ConfigError(
            f"--name {args.name[:40]!r}...: {len(os.fsencode(args.name))} bytes, expected at most {MAX_NAME} (the "
            "export's file names add suffixes to it, and a file name holds 255 bytes)"
        )
    check_writable(Path(args.output_dir))
    if args.input is not None:
        dims = " ".join(map(str, args.input))
        if len(args.input) < 2:
            raise ConfigError(f"--input {dims}: expected a batch and a sample shape, e.g. --input 1 28 28 1")
        for axis, size in enumerate(args.input):
            if size < 1:
                raise ConfigError(
                    f"--input {dims}: axis {axis}{' (the batch)' if axis == 0 else ''} is {size}; "
                    "every size must be a positive integer"
                )
        try:
            kind = np.dtype(args.input_dtype).kind
        except TypeError:
            kind = None
        if kind is None or kind not in "biuf":
            raise ConfigError(f"--input-dtype {args.input_dtype}: expected a numeric dtype (float32, int32, ...)")
    if args.batch is not None and args.batch < 1:
        raise ConfigError(f"--batch {args.batch}: expected a batch size of at least 1")
    for flag, size in (("--batch", args.batch), ("--input", args.input[0] if args.input else None)):
        if size is not None and size > MAX_BATCH:
            raise ConfigError(f"{flag}: a batch of {size:,}, more than the {MAX_BATCH:,} a config's batch may be")
    if args.val_examples is not None and args.val_examples < 0:
        raise ConfigError(f"--val-examples {args.val_examples}: expected 0 (random inputs only) or more")
    for option in ("atol", "rtol", "max_accuracy_drop"):
        value = getattr(args, option)
        if not np.isfinite(value) or value < 0:
            raise ConfigError(f"--{option.replace('_', '-')} {value}: expected a finite number >= 0")


def check_writable(output: Path) -> None:
    """--output-dir where this process can make files: a hidden file is made and removed at once in its nearest
    existing folder. A read-only checkout (the default exports/ inside it), /proc or another user's folder is then one
    line before anything is loaded; the export itself would find out only when it writes, after the converters ran."""
    existing = next(p for p in (output.absolute(), *output.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"--output-dir {output}: {existing} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".export-probe-", dir=existing)
    except OSError as error:
        raise ConfigError(
            f"--output-dir {output}: cannot write in {existing} ({error.strerror or error}); give a folder this "
            "user can write, e.g. --output-dir /tmp/exports"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_batch_fits(args, export_spec, batch: int) -> None:
    """The check runs every format on random inputs of the export's batch (inference/inputs.py: drawn in 64 bits,
    then cast): a batch whose inputs alone exceed the memory this process may take is refused before the model is
    loaded, instead of failing after the converters ran."""
    import jax

    from training.devices import memory

    leaves = jax.tree.leaves(export_spec)
    need = batch * sum(math.prod(leaf.shape[1:]) * (8 + np.dtype(leaf.dtype).itemsize) for leaf in leaves)
    available = memory.host_available()
    if available is not None and need > available[0]:
        flag = f"--batch {batch}" if args.batch is not None else f"--input {' '.join(map(str, args.input))}"
        raise ConfigError(
            f"{flag}: the export is checked on random inputs of batch {batch:,}, {memory.show_bytes(need)} before "
            f"any output, more than the {memory.show_bytes(available[0])} of {available[1]}; choose a smaller batch"
        )


def export_tasks(config: dict, batch_spec: dict, preprocessing: dict, where: str) -> tuple[str, str | dict]:
    """(the task, each named output's task or the one task): what judges each format, known from the data and
    preprocessing.json before anything is loaded, so a task preprocessing.json names wrongly is one line up front."""
    from training.task_kinds import output_tasks, task_of

    try:
        task = task_of(config["loss"], batch_spec, preprocessing)
        return task, output_tasks(config["loss"], batch_spec, preprocessing) or task
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def input_spec(args, spec_loader, problem: str | None):
    """(the input spec, the export batch): --input's one array, else the data's input tree at batch 1."""
    import jax

    if args.input:
        spec, batch = jax.ShapeDtypeStruct(tuple(args.input), np.dtype(args.input_dtype)), args.input[0]
    elif spec_loader is not None:
        spec, batch = spec_loader.spec["input"], 1
    else:
        raise ConfigError(
            f"the input spec comes from the data, which cannot be read ({problem}): "
            "give one input's shape with --input 1 28 28 1 [--input-dtype float32]"
        )
    return spec, (batch if args.batch is None else args.batch)


def described(spec, batch: int) -> str:
    """An input tree at `batch` as text: float32[1,28,28,1], or {a: int32[1,8], b: ...}."""
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k}: {described(v, batch)}" for k, v in sorted(spec.items())) + "}"
    return f"{np.dtype(spec.dtype)}[{','.join(map(str, (batch, *spec.shape[1:])))}]"


def same_examples(spec, data_spec) -> bool:
    """Whether one array spec's examples (all but the batch axis) have the data's shape and dtype."""
    return (
        not isinstance(data_spec, dict)
        and tuple(spec.shape[1:]) == tuple(data_spec.shape[1:])
        and np.dtype(spec.dtype) == np.dtype(data_spec.dtype)
    )


def check_input_against_data(args, spec, data_spec, validating: bool, split: str | None) -> None:
    """--input against the data's inputs: the data's examples can check an export only at their own shape and
    dtype, and --input describes one array."""
    if not args.input or data_spec is None or same_examples(spec, data_spec):
        return
    asked = f"--input {' '.join(map(str, args.input))} ({described(spec, spec.shape[0])})"
    if isinstance(data_spec, dict):
        raise ConfigError(
            f"{asked}: the data has several named inputs ({', '.join(sorted(data_spec))}), which "
            "--input cannot describe; leave --input out to export them"
        )
    if validating:
        fix = " ".join(map(str, (spec.shape[0], *data_spec.shape[1:])))
        if np.dtype(data_spec.dtype) != np.dtype(spec.dtype):
            fix += f" --input-dtype {np.dtype(data_spec.dtype)}"
        raise ConfigError(
            f"{asked}: the {split} data's examples are {described(data_spec, spec.shape[0])}, so they "
            f"cannot check this export; give --input {fix}, or --val-examples 0 to export this input "
            "checked on random inputs only"
        )


def mask_spec(spec, data_spec, data_mask):
    """The "mask" input of a model that declares mask: the data's mask per example; one per element of the input
    (a padded token sequence's) follows --input's shape where that differs from the data's."""
    import jax

    if data_mask is None:
        raise ConfigError(
            "config.json: model: its call declares mask, a named input of the export whose shape comes from the "
            "data's mask, and the data cannot be read"
        )
    example = tuple(data_mask.shape[1:])
    if not isinstance(spec, dict) and not isinstance(data_spec, dict) and example == tuple(data_spec.shape[1:]):
        example = tuple(spec.shape[1:])
    return jax.ShapeDtypeStruct((spec.shape[0] if not isinstance(spec, dict) else 1, *example), data_mask.dtype)


def main(argv=None) -> int:
    args = parse_args(argv)
    compilation_cache.use()  # the machine's: what training compiled, this reads
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    try:
        check_arguments(args, formats)
        target = Path(args.output_dir) / args.name
        if target.exists() and not args.force:
            raise ConfigError(f"{target} exists; pass --force to replace it")
        config_path, checkpoint_path = resolve_run(args)
        config = load_config(config_path, source=config_path.name)
        if not args.config:  # the run folder's own config: where it may write is checked
            check_config_writes(config, checkpoint_path.parent)
        run = assemble(config)
        model = run.model
        loader, split, problem = split_loader(run)
        spec_loader = loader or split_loader(run, ("train",))[0]  # a spec needs one batch of any split
        spec, batch = input_spec(args, spec_loader, problem)
        preprocessing, where = saved_preprocessing(checkpoint_path, spec_loader)
        data_spec = spec_loader.spec["input"] if spec_loader is not None else None
        check_input_against_data(args, spec, data_spec, args.val_examples != 0 and loader is not None, split)
        masked = declares_mask(model)
        if masked and isinstance(spec, dict) and MASK in spec:
            raise ConfigError(
                f"config.json: model: its call declares mask, the export's named input {MASK!r}, and the data "
                f"has an input of that name too"
            )
        data_mask = spec_loader.spec["mask"] if spec_loader is not None else None
        # the export's named inputs: the model's input, and the padding mask where its call declares one
        export_spec = with_mask(spec, mask_spec(spec, data_spec, data_mask)) if masked else spec
        check_batch_fits(args, export_spec, batch)
        batch_spec = spec_loader.spec if spec_loader is not None else {"input": spec}
        # a model of several named outputs: each a named output of every format, judged by its own task
        task, each_task = export_tasks(config, batch_spec, preprocessing, where)
    except ConfigError as error:
        fail(str(error))

    import jax

    from training.run import checkpoint

    # The checkpoint's shapes follow from the data's input where there is data, from --input where there is not.
    asked = f"--input {' '.join(map(str, args.input))}" if args.input else None
    known = spec if data_spec is None else data_spec
    try:
        loaded = load_run(checkpoint_path, config, known)
    except ModelInputError as error:  # the layer's complaint, with where the shape came from
        if data_spec is None:
            fail(
                f"{asked}: the model cannot take {described(spec, spec.shape[0])} ({error.reason}); the data, "
                f"which would give the shape, cannot be read ({problem})"
            )
        fail(f"config.json: model: cannot take the data's input {described(data_spec, 1)} ({error.reason})")
    except (ConfigError, checkpoint.CheckpointError) as error:
        fail(
            str(error)
            + (f" (the model's shapes came from {asked}: the shape it was trained on?)" if data_spec is None else "")
        )
    header = loaded.header
    params, state = jax.device_put((loaded.params, loaded.state))
    single = not isinstance(spec, dict)

    def whole(x):
        if masked:
            x, mask = without_mask(x, single)
            return model(params, state, x, mask=mask, train=False)[0]
        return model(params, state, x, train=False)[0]

    kept = chosen_outputs(args.outputs, whole, export_spec)

    def fn(x):  # what is not kept is never computed: the export holds only what the kept outputs need
        out = whole(x)
        return out if kept is None else {name: out[name] for name in kept}

    if data_spec is not None and not same_examples(spec, data_spec):  # --input of another shape, --val-examples 0
        try:
            jax.eval_shape(fn, export_spec)
        except Exception as error:
            fail(
                f"{asked}: the model cannot take {described(spec, spec.shape[0])} ({first_line(error)}); the "
                f"data's input is {described(data_spec, spec.shape[0])}"
            )

    forward = jax.jit(fn)
    inputs = Inputs(export_spec, batch)
    outputs = Outputs(jax.eval_shape(forward, export_spec), each_task, OUTPUT_NAME)
    options = Options(
        batch=batch,
        quantize=args.quantize,
        onnx_via=args.onnx_via,
        atol=args.atol,
        rtol=args.rtol,
        max_accuracy_drop=args.max_accuracy_drop,
        threshold=decision_threshold(config)[0],
    )
    if args.batch is not None or args.dynamic_batch:
        options.dynamic = {f: args.dynamic_batch for f in FORMATS}

    def model_input(batch):
        """The export's inputs of a batch: its input, with its mask where the model declares one."""
        return with_mask(batch["input"], batch["mask"]) if masked else batch["input"]

    validation, skipped = None, None
    if args.val_examples == 0:
        skipped = "--val-examples 0"
    elif loader is None:
        skipped = problem
    else:
        try:
            validation = exporter.collect_validation(loader, forward, inputs, args.val_examples, model_input)
            # named targets of a classifier of one output (the loss's "labels"): judged on its class ids
            validation.targets = labels_of(validation.targets, config["loss"].get("labels"))
        except ExportError as error:
            fail(f"config.json: data_loader.{split}: {error}")
    if skipped:
        print(
            f"validation: not checked ({skipped}); random inputs only"
            + ("; the quantized model's accuracy is not checked" if args.quantize else "")
        )
    seen = validation.inputs if validation is not None else None
    if seen is None and spec_loader is not None and not args.input:  # ids of a training batch bound random ids
        seen = jax.tree.leaves(model_input(next(spec_loader.batches())))
    id_bound = exporter.id_bounds(inputs, seen, preprocessing)
    qualities = []
    targets = outputs.targets(validation.targets if validation is not None else None)
    for i, name in enumerate(outputs.names):
        each, measure = outputs.tasks[name], exporter.MEASURES.get(outputs.tasks[name])
        if targets[i] is None or measure is None:
            continue
        value = exporter.quality(
            each, outputs.flat(validation.outputs)[i], targets[i], validation.masks, options.threshold
        )
        qualities.append(f"JAX {measure[1]} {100 * value:.2f}%" + ("" if outputs.single else f" ({name})"))
    tasks = task if outputs.single else ", ".join(f"{n} {t}" for n, t in outputs.tasks.items())
    print(
        f"{checkpoint_path} (epoch {header.get('epoch')}), task{'' if outputs.single else 's'} {tasks}: inputs "
        + ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in inputs.described())
        + f", {len(validation) if validation else 0} validation examples"
        + "".join(f", {q}" for q in qualities)
    )

    source = exporter.Source(config, checkpoint_path, preprocessing)
    try:
        report = exporter.export_folder(
            target,
            formats,
            fn,
            forward,
            inputs,
            task,
            options,
            validation,
            skipped,
            id_bound,
            source,
            validation_split=split,
            replace=args.force,
            outputs=None if outputs.single else outputs,
        )
    except ConfigError as error:  # another export of the name at work, or one written meanwhile
        fail(str(error))
    except ExportError as error:
        print(error, file=sys.stderr)
        return 1
    print(exporter.markdown(report), end="")
    print(f"wrote {target}/")
    return 0


def saved_preprocessing(checkpoint_path: Path, loader) -> tuple[dict, str]:
    """The run's preprocessing.json (written by train.py from the training data), else the data's own; with where
    it came from, for messages."""
    saved = checkpoint_path.parent / PREPROCESSING
    if saved.exists():
        try:
            return read_preprocessing(saved), str(saved)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    return (loader.preprocessing if loader is not None else {}), "the data's preprocessing"


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(command(stops.at_once(main)))  # Ctrl-C or SIGTERM at once, the half-made folder removed
