"""Exporting a model and proving each file equal to it: the work behind `inference/convert_tflite.py`.

Each file is exported by its route (`inference/routes.py`), reloaded in its own runtime and compared with the JAX
model on random inputs (`inference/inputs.py`; floats: normal noise; integers: uniform ids below the largest id the
data holds, or the vocabulary's size) and on real validation examples, with an agreement that fits the task
(`training/task_kinds.py`): top-1 per example for classification, top-1 per unmasked position for sequences, the sign of
each logit for multi-label outputs; regression is judged by the tolerance alone.

`export_folder` puts it together for the command: every format (with the other ONNX route when one fails), the files a
deployment needs, and the report (`inference/report.py`: what was checked, on what, and what was not), written all at
once or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np

from data_loader.sources import csv_cells
from files import writes
from inference import verify
from inference.inputs import Inputs, Outputs, random_inputs, shape_text
from inference.predict import CONFIG, PREPROCESSING, run_batched
from inference.report import MEASURES, fmt_size, markdown
from inference.routes import FORMATS as DECLARED
from inference.routes import OUTPUT_NAME, ROUTES, export_bytes, load_runner, routes_of
from signals import stops
from training.config.file import ConfigError
from training.run.folder import model_code
from training.step import loss_mask

REPO = Path(__file__).resolve().parents[1]
FORMATS = tuple(DECLARED)  # those of `inference/formats/` (routes.py), in the export's order
SUFFIX = {name: fmt.suffix for name, fmt in DECLARED.items()}
LARGER_BATCH = 16  # the "larger size" a symbolic batch is checked at, besides 1


@dataclass
class Options:
    batch: int = 1
    dynamic: dict = field(default_factory=lambda: {name: fmt.dynamic for name, fmt in DECLARED.items()})
    quantize: str | None = None
    onnx_via: str = "jax2onnx"
    atol: float = verify.ATOL
    rtol: float = verify.RTOL
    max_accuracy_drop: float = 0.5  # percentage points of the task's quality measure, a quantized format only
    seed: int = 0
    threshold: float = 0.5  # a multi-label output decides above this probability (the config's, predict.py's)


class ExportError(Exception):
    """A format that could not be exported or did not match the JAX model."""


# ------------------------------------------------------------------------------------------------------ validation
@dataclass
class Validation:
    """Real examples (inputs flat, in `Inputs.names` order), their targets and masks, and the JAX model's outputs
    (targets and outputs: one array, or a dict of named ones for a model of several outputs)."""

    inputs: list
    targets: np.ndarray | dict | None
    masks: np.ndarray
    outputs: np.ndarray | dict

    def __len__(self):
        return len(self.masks)


def collect_validation(loader, forward, inputs: Inputs, limit: int | None, model_input=None) -> Validation:
    """Examples of the loader with at least one unmasked element, up to `limit`; the model's outputs on them.
    Examples of another shape or dtype than the export's inputs raise ExportError: they could check nothing.
    `model_input`: the export's inputs of a batch (default its input; a model that declares mask: with the mask).
    The masks kept are those the metrics count with: per example where the mask is per token and the output not."""
    flats, targets, masks, outputs = [], [], [], []
    seen = 0
    for batch in loader.batches():
        mask = batch["mask"]
        keep = mask.reshape(len(mask), -1).max(axis=1) > 0
        take = np.flatnonzero(keep)[: None if limit is None else limit - seen]
        x = batch["input"] if model_input is None else model_input(batch)
        flat = jax.tree.leaves(x)
        if not flats:
            got, want = (
                [f"{np.dtype(a.dtype)}{shape_text((None, *a.shape[1:]))}" for a in arrays]
                for arrays in (flat, inputs.specs)
            )
            if got != want:
                raise ExportError(
                    f"the validation examples are {', '.join(got)}, the export's inputs "
                    f"{', '.join(want)}: they cannot check it"
                )
        flats.append([leaf[take] for leaf in flat])
        # targets and outputs may be dicts of named arrays (a model of several outputs): each leaf is taken alike
        targets.append(jax.tree.map(lambda t: np.asarray(t)[take], batch["target"]) if "target" in batch else None)
        masks.append(np.asarray(loss_mask(batch))[take])
        outputs.append(jax.tree.map(lambda o: np.asarray(o)[take], forward(x)))
        seen += len(take)
        if limit is not None and seen >= limit:
            break
    joined = [np.concatenate(parts) for parts in zip(*flats)]
    concatenate = lambda parts: jax.tree.map(lambda *leaves: np.concatenate(leaves), *parts)  # noqa: E731
    target = None if targets[0] is None else concatenate(targets)
    return Validation(joined, target, np.concatenate(masks), concatenate(outputs))


def id_bounds(inputs: Inputs, seen: list[np.ndarray] | None, preprocessing: dict) -> dict:
    """Per integer input, the ids random inputs may use: below the vocabulary's size, else up to the largest id in
    `seen` (real inputs, flat in `Inputs.names` order: the validation examples, or a training batch without them).
    An id the model never saw in training may index past an embedding, where formats legitimately differ."""
    bounds = {}
    for i, (name, spec) in enumerate(zip(inputs.names, inputs.specs)):
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            if preprocessing.get("vocabulary"):
                bounds[name] = len(preprocessing["vocabulary"])
            elif seen is not None and seen[i].size:
                bounds[name] = int(seen[i].max()) + 1
    return bounds


def agreement(
    task: str, got: np.ndarray, want: np.ndarray, mask: np.ndarray | None = None, threshold: float = 0.5
) -> float | None:
    """The fraction of decisions the export shares with JAX: top-1 per example or position, or each label above
    ``threshold`` (0.5: the logit's sign)."""
    if task in ("classification", "sequence"):
        same = np.argmax(got, -1) == np.argmax(want, -1)
    elif task == "multilabel":
        cut = logit_of(threshold)
        same = (got > cut) == (want > cut)
    else:
        return None
    return masked_mean(same, mask)


def quality(
    task: str, outputs: np.ndarray, targets: np.ndarray | None, mask: np.ndarray, threshold: float = 0.5
) -> float | None:
    """The task's accuracy against the real targets (None for regression and other tasks); multi-label at
    ``threshold``."""
    if targets is None or task not in MEASURES:
        return None
    if task == "multilabel":
        return masked_mean((outputs > logit_of(threshold)) == (targets > 0.5), mask)
    ids = np.argmax(targets, -1) if targets.shape == outputs.shape else targets
    return masked_mean(np.argmax(outputs, -1) == ids, mask)


def logit_of(probability: float) -> float:
    """The logit whose sigmoid is ``probability``: decisions compare logits, exact where a sigmoid rounds to 1."""
    return float(np.log(probability) - np.log1p(-probability))


def masked_mean(values: np.ndarray, mask: np.ndarray | None) -> float:
    if mask is None:
        return float(np.mean(values))
    weights = np.broadcast_to(mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim)), values.shape)
    return float((values * weights).sum() / max(weights.sum(), 1e-12))


# ---------------------------------------------------------------------------------------------------------- export
def first_line(error: Exception) -> str:
    """A converter's error in one line (they run to pages of MLIR)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def check(
    runner,
    forward,
    inputs: Inputs,
    validation: Validation | None,
    task: str,
    options: Options,
    quantized: bool,
    id_bound: dict,
    outputs: Outputs | None = None,
) -> dict:
    """Runs the loaded artifact against the JAX model; returns its report entry (raises ExportError on failure).
    `outputs`: a model's named outputs (several), each compared and judged by its own task; else its one output is
    judged by `task`."""
    got_inputs = {i["name"]: i for i in runner.inputs}
    if sorted(got_inputs) != sorted(inputs.names):
        raise ExportError(f"inputs {sorted(got_inputs)}, expected {sorted(inputs.names)}")
    fixed = runner.inputs[0]["shape"][0]
    for name, spec in zip(inputs.names, inputs.specs):
        expected = (None if fixed is None else spec.shape[0], *spec.shape[1:])
        if tuple(got_inputs[name]["shape"]) != expected or got_inputs[name]["dtype"] != np.dtype(spec.dtype):
            raise ExportError(
                f"input {name!r}: {got_inputs[name]['dtype']}{shape_text(got_inputs[name]['shape'])}, "
                f"expected {np.dtype(spec.dtype)}{shape_text(expected)}"
            )
    single = outputs is None or outputs.single
    if single:
        outputs = Outputs(None, task, runner.output_name)
    elif sorted(o["name"] for o in runner.outputs) != outputs.names:
        raise ExportError(f"outputs {sorted(o['name'] for o in runner.outputs)}, expected {outputs.names}")
    sizes = [fixed] if fixed else sorted({1, options.batch, LARGER_BATCH})
    rng = np.random.default_rng(options.seed)
    tolerance = dict(atol=options.atol, rtol=options.rtol)
    comparisons = {name: [] for name in outputs.names}
    agreements = {name: [] for name in outputs.names}
    for n in sizes:
        flat = random_inputs(inputs, n, rng, id_bound)
        want = [np.asarray(w) for w in outputs.flat(forward(inputs.tree(flat)))]
        got = outputs.of(runner(inputs.feed(flat)))
        for name, g, w in zip(outputs.names, got, want):
            comparisons[name].append(
                verify.compare(g, w, **tolerance, what=f"output {name!r}, random inputs, batch {n}")
            )
            agreements[name].append(agreement(outputs.tasks[name], g, w, threshold=options.threshold))
    per_random = {}
    for name in outputs.names:
        result = verify.merge(comparisons[name])
        agree = agreements[name]
        per_random[name] = {**result.to_dict(), "agreement": None if agree[0] is None else float(np.mean(agree))}
    random_result = verify.merge([c for name in outputs.names for c in comparisons[name]])
    shapes = {o["name"]: shape_text(o["shape"]) for o in runner.outputs}
    entry = {
        "inputs": [
            {"name": i["name"], "shape": shape_text(i["shape"]), "dtype": str(i["dtype"])} for i in runner.inputs
        ],
        **(
            {"output": {"name": runner.output_name, "shape": shape_text(runner.output_shape)}}
            if single
            else {"outputs": [{"name": n, "shape": shapes[n], "task": outputs.tasks[n]} for n in outputs.names]}
        ),
        "random": {"batch_sizes": sizes, **random_result.to_dict()},
    }
    if single:
        entry["random"]["agreement"] = per_random[runner.output_name]["agreement"]
    else:
        entry["random"]["outputs"] = per_random
    failures = [] if quantized or random_result.ok else [random_result.failure]
    if validation is None:
        entry["validation"] = None
    else:
        got_all = outputs.of(run_batched(runner, inputs.feed(validation.inputs)))
        want_all = outputs.flat(validation.outputs)
        targets = outputs.targets(validation.targets)
        per_validation, results = {}, []
        for name, got, want, target in zip(outputs.names, got_all, want_all, targets):
            each = outputs.tasks[name]
            result = verify.compare(got, want, **tolerance, what=f"output {name!r}, validation inputs")
            results.append(result)
            measured, reference = (quality(each, o, target, validation.masks, options.threshold) for o in (got, want))
            per_validation[name] = {
                **result.to_dict(),
                "agreement": agreement(each, got, want, validation.masks, options.threshold),
                "quality": measured,
                "jax_quality": reference,
            }
            if quantized:
                if measured is not None and 100.0 * (reference - measured) > options.max_accuracy_drop:
                    failures.append(
                        ("" if single else f"output {name!r}: ")
                        + f"quantized {MEASURES[each][1]} {100 * measured:.2f}% is "
                        f"{100 * (reference - measured):.2f} points below the JAX model's "
                        f"{100 * reference:.2f}% (allowed: {options.max_accuracy_drop})"
                    )
                if not np.isfinite(got).all():
                    failures.append("quantized model gives non-finite outputs" + ("" if single else f" ({name})"))
            elif not result.ok:
                failures.append(result.failure)
        if single:
            entry["validation"] = {"examples": len(got_all[0]), **per_validation[outputs.names[0]]}
        else:
            entry["validation"] = {
                "examples": len(got_all[0]),
                **verify.merge(results).to_dict(),
                "outputs": per_validation,
            }
    if failures:
        raise ExportError("; ".join(failures))
    return entry


def export_format(
    fmt: str,
    fn,
    forward,
    inputs: Inputs,
    folder,
    name: str,
    validation,
    task: str,
    options: Options,
    id_bound: dict,
    log=print,
    threads: int | None = None,
    outputs: Outputs | None = None,
) -> dict:
    """Exports one format into `folder`, reloads it and checks it; tries the other ONNX route if one fails.
    `outputs`: the model's named outputs when it has several (each a named output of the file)."""
    routes = routes_of(fmt, options.onnx_via if fmt == "onnx" else None)
    quantize = options.quantize if options.quantize in DECLARED[fmt].quantizations else None
    path = folder / f"{name}{SUFFIX[fmt]}"
    errors = []
    for route in routes:
        start = time.perf_counter()
        try:
            path.write_bytes(export_bytes(route, fn, inputs, options.dynamic[fmt], quantize, outputs))
            seconds = time.perf_counter() - start
            runner = load_runner(path, inputs.names, threads, outputs)
            entry = check(runner, forward, inputs, validation, task, options, quantize is not None, id_bound, outputs)
        except Exception as error:  # any converter or runtime error: report it, try the other route if any
            message = f"{ROUTES[route].describes}: {first_line(error)}"
            errors.append(message)
            path.unlink(missing_ok=True)
            if route != routes[-1]:
                log(f"{fmt}: {message}\n{fmt}: trying {ROUTES[routes[routes.index(route) + 1]].describes} instead")
            continue
        entry = {
            "format": fmt,
            "file": path.name,
            "bytes": path.stat().st_size,
            "route": ROUTES[route].describes,
            "dynamic_batch": options.dynamic[fmt],
            "quantize": quantize,
            "export_seconds": round(seconds, 2),
            **entry,
        }
        if fmt == "jax":
            entry["platforms"] = list(runner.platforms)
        if errors:
            entry["failed_routes"] = errors
        return entry
    raise ExportError(" | ".join(errors))


# ---------------------------------------------------------------------------------------------------------- folder
def fixed_axes(inputs: Inputs) -> dict[str, list[int]]:
    """Per input, the axes after the batch: fixed at the data's in every format (a sequence length included)."""
    return {name: [int(d) for d in spec.shape[1:]] for name, spec in zip(inputs.names, inputs.specs)}


@dataclass
class Source:
    """Where the exported model comes from: what its folder carries besides the artifacts."""

    config: dict
    checkpoint: Path
    preprocessing: dict


def export_folder(
    target: Path,
    formats,
    fn,
    forward,
    inputs: Inputs,
    task: str,
    options: Options,
    validation: Validation | None,
    skipped: str | None,
    id_bound: dict,
    source: Source,
    validation_split: str | None = None,
    log=print,
    warn=None,
    replace: bool = False,
    outputs: Outputs | None = None,
) -> dict:
    """Writes `target` (<output-dir>/<name>): each of `formats` exported, reloaded and checked (`export_format`),
    then config.json, a copy of model/, predict.py and csv_cells.py, preprocessing.json, report.json and report.md.
    Returns the report.

    The folder is built as a hidden sibling and renamed into place (``replace``: swapped with an existing `target` in
    one step, writes.replace_folder) only once every format has passed, under a lock on the name (a second export of
    it is a ConfigError naming the first), so a failure leaves nothing behind: ExportError then names each failed
    format and what still works. `skipped` says why there is no `validation` (the report carries it; random inputs
    alone are no pass on real data)."""
    warn = warn or (lambda text: print(text, file=sys.stderr))
    try:  # the command checked that it can write there; this guards every other caller, and a folder made read-only
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{target.parent}: cannot make the folder ({error.strerror or error})") from None
    made = {}  # the lock and the hidden folder, once taken; ``undo`` removes them once, from either thread

    def undo():
        if (folder := made.pop("folder", None)) is not None:
            writes.remove_folder(folder)
        if (lock := made.pop("lock", None)) is not None:
            writes.unlock(lock_path(target), lock)

    with stops.undone_on_stop(undo):  # a stop signal ends the command at once (stops.stop_at_once), undoing this
        try:
            with stops.finishing():  # taken with a stop signal held off, so that the undo knows of both
                made["lock"] = hold(target, replace)
                made["folder"] = folder = writes.temporary_folder(target)
            report = export_into(
                folder, target, formats, fn, forward, inputs, task, options, validation, skipped, id_bound, source,
                validation_split, log, warn, outputs,
            )  # fmt: skip
            with stops.finishing():  # a stop signal now is too late: the export is in place, and the command says so
                writes.replace_folder(folder, target)
                stops.finished()
        finally:
            with stops.finishing():  # a stop signal while a half-made folder is removed: acted on once it is gone
                undo()
    return report


def export_into(
    folder, target, formats, fn, forward, inputs, task, options, validation, skipped, id_bound, source,
    validation_split, log, warn, outputs,
) -> dict:  # fmt: skip
    """``write_export``'s work inside the hidden ``folder``: each format exported and checked, then the extras."""
    name = target.name
    entries, failed = [], []
    for fmt in formats:
        try:
            entry = export_format(
                fmt, fn, forward, inputs, folder, name, validation, task, options, id_bound, log=log, outputs=outputs
            )
        except ExportError as error:
            failed.append(fmt)
            warn(f"{fmt}: FAILED: {error}")
            continue
        entries.append(entry)
        log(
            f"{fmt}: {entry['file']} ({fmt_size(entry['bytes'])}, {entry['route']}): matches the JAX model"
            + ("" if validation else " on random inputs only (no real data checked)")
        )
    if failed:
        others = [f for f in formats if f not in failed]
        hints = [f"--formats {','.join(others)} exports the others"] if others else []
        if any(options.dynamic[f] for f in failed):
            hints.append("a fixed batch (--batch N) avoids the symbolic-shape limits of some converters")
        raise ExportError("export failed, nothing written" + "".join(f"; {h}" for h in hints))
    report = build_report(name, entries, inputs, task, options, validation, skipped, validation_split, source, outputs)
    write_extras(folder, report, inputs, task, source, outputs)
    return report


def hold(target: Path, replace: bool) -> int:
    """Locks the export's name (``<output-dir>/.<name>.lock``, removed when the export ends) for this process: two
    exports of one name never build at once; the second is refused naming the first. Under the lock, what killed
    exports of the name left (hidden ``.<name>.XXXXXXXX/`` folders) is removed, and an existing export is kept
    unless ``replace``."""
    try:
        fd, holder = writes.try_lock(lock_path(target))
    except writes.UnsafeFile as error:
        raise ConfigError(str(error)) from None
    except OSError as error:  # a folder this process cannot write in
        raise ConfigError(f"{target.parent}: cannot write the export there ({error.strerror or error})") from None
    if fd is None:
        raise ConfigError(
            f"{target}: process {holder} is exporting it now; wait for it to end, or choose another --name"
        )
    try:
        writes.remove_stale_folders(target)
        if os.path.lexists(target):
            if os.path.islink(target) or not target.is_dir():
                raise ConfigError(
                    f"{target}: not an export folder (a link or a file); remove it or choose another --name"
                )
            if not replace:
                raise ConfigError(f"{target} exists (written by another export meanwhile?); pass --force to replace it")
    except BaseException:
        writes.unlock(lock_path(target), fd)
        raise
    return fd


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


def build_report(
    name: str,
    entries: list[dict],
    inputs: Inputs,
    task: str,
    options: Options,
    validation: Validation | None,
    skipped: str | None,
    split: str | None,
    source: Source,
    outputs: Outputs | None = None,
) -> dict:
    versions = {"jax": jax.__version__}
    for package in dict.fromkeys(p for route in ROUTES.values() for p in route.packages):
        module = sys.modules.get(package)  # only the converters and runtimes this export used
        if module is not None:
            versions[package] = getattr(module, "__version__", None) or distribution_version(package)
    checked = None if validation is None else {"split": split or "validation", "examples": len(validation)}
    return {
        "name": name,
        "checkpoint": str(source.checkpoint),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "task": task,
        **({} if outputs is None or outputs.single else {"tasks": outputs.tasks}),
        # where multi-label decisions were made: the config's threshold, as predict.py and test.py decide
        **({"threshold": options.threshold} if multilabel(task, outputs) else {}),
        "checked_on": jax.default_backend(),
        "validated_on_real_data": validation is not None,
        "validation": checked,
        **({} if validation is not None else {"validation_skipped": skipped or "unknown"}),
        "inputs": inputs.described(),
        "fixed_axes": fixed_axes(inputs),
        "tolerance": {"atol": options.atol, "rtol": options.rtol},
        "versions": versions,
        "formats": entries,
    }


def multilabel(task: str, outputs: Outputs | None) -> bool:
    return task == "multilabel" or (outputs is not None and "multilabel" in outputs.tasks.values())


def distribution_version(package: str) -> str:
    """A package's installed version when its module does not say (jax2onnx has no __version__)."""
    from importlib import metadata

    try:
        return metadata.version(package.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "?"


def write_extras(
    folder: Path, report: dict, inputs: Inputs, task: str, source: Source, outputs: Outputs | None = None
) -> None:
    """What makes the folder a deployable unit: config.json, model/, predict.py with the csv_cells.py it imports,
    preprocessing.json (the data's preprocessing, plus the inputs, the output (or each named output and its task)
    and the task that predict.py reads), and the report."""
    (folder / CONFIG).write_text(json.dumps(source.config, indent=2) + "\n")
    for code in model_code(source.config):  # model/, and a model's own folder where a file of your own defines it
        shutil.copytree(REPO / code, folder / code, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(Path(__file__).with_name("predict.py"), folder / "predict.py")
    shutil.copy2(csv_cells.__file__, folder / "csv_cells.py")  # the CSV cell rules predict.py imports from beside it
    named = (
        {"output_name": OUTPUT_NAME}
        if outputs is None or outputs.single
        else {"output_names": outputs.names, "tasks": outputs.tasks}
    )
    (folder / PREPROCESSING).write_text(
        json.dumps({**source.preprocessing, "task": task, "inputs": inputs.described(), **named}, indent=2) + "\n"
    )
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(markdown(report), encoding="utf-8")
