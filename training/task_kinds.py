"""What kind of problem a run solves: the task its loss declares when it registers (``@register("loss",
task=...)``), refined by the shapes and dtypes of its batch. `test.py` chooses what to report from it, and the export
how to judge agreement with the JAX model.

| task | loss | targets | agreement in the export |
| --- | --- | --- | --- |
| classification | cross_entropy | class ids (B,) or one-hot (B, C) | top-1 per example |
| sequence | cross_entropy | ids (B, T, ...) or one-hot (B, T, ..., C): a class per position | top-1 per position |
| multilabel | binary_cross_entropy | 0/1 of the outputs' shape: labels (B, L), masks (B, H, W, 1) | each logit's sign |
| regression | mse, l1, huber | real values of the outputs' shape | tolerance only |
| other | a loss that declares no task (a loss of your own, KL) | - | tolerance only |

A dataset may override the derived task with ``preprocessing["task"]``.

Named targets and a model of one output (a distillation's ``{"label": class ids, "teacher": logits}``): the loss's
``"labels": "label"`` in the config says which target holds the class ids. The loss takes every target; the task is
judged on that one as a classifier's (classification, or sequence for a class per position), whatever task the loss
registered with, and every metric, ``test.py``'s confusion matrix and the export's classes take it.

A model of several named outputs (a ``weighted_sum`` loss: one loss per output) has a task per output, each
derived as above from that output's loss and target (``output_tasks``); ``preprocessing["outputs"][name]`` is that
output's own preprocessing (its class names, say).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import jax
import numpy as np

from data_loader.loader import check_values
from model.modules.attention import FusedAttentionUnavailable
from model.registry import TASKS
from model.summary import describe_batch
from training.config.components import CLASS_COUNT_ARGUMENTS, available, entries, labels_of, output_losses
from training.config.file import ConfigError
from training.precision import policy_of


def task_of(loss: str | dict, batch_spec: dict, preprocessing: dict | None = None) -> str:
    """The task of a run from its loss's config (or name: the task it registered with; its ``labels``, the target
    of named ones holding the class ids) and its loader's ``spec`` (see the table above)."""
    loss = {"name": loss} if isinstance(loss, str) else loss
    labels = loss.get("labels")
    declared = (preprocessing or {}).get("task")
    if declared is not None:
        if declared not in TASKS:
            raise ValueError(f"preprocessing task {declared!r}: expected one of {', '.join(TASKS)}")
        return declared
    entry = entries("loss").get(loss["name"])
    task = "classification" if labels is not None else (entry.task if entry else None) or "other"
    if task == "classification":
        target = labels_of(batch_spec.get("target", batch_spec["input"]), labels)
        if not hasattr(target, "dtype"):  # named targets (a dict): no one class per example or position to count
            return "other"
        ids = np.issubdtype(np.dtype(target.dtype), np.integer)
        per_example = len(target.shape) == (1 if ids else 2)
        return "classification" if per_example else "sequence"
    return task


def per_output_losses(loss_spec) -> dict | None:
    """``{output name: its loss's config}`` of a loss of one loss per named output (``weighted_sum``); None for a
    model of one output."""
    if not isinstance(loss_spec, dict) or loss_spec.get("name") not in available("loss"):
        return None
    fn = available("loss")[loss_spec["name"]]
    nested = [value for key, value in (loss_spec.get("args") or {}).items() if output_losses(fn, key)]
    return nested[0] if nested else None


def output_preprocessing(preprocessing: dict | None, output: str) -> dict:
    """One named output's preprocessing (``preprocessing["outputs"][output]``, its class names, say)."""
    return dict(((preprocessing or {}).get("outputs") or {}).get(output) or {})


def output_tasks(loss_spec, batch_spec: dict, preprocessing: dict | None = None) -> dict[str, str] | None:
    """``{output name: task}`` of a model of several named outputs, each from its own loss and target; None for a
    model of one output."""
    losses = per_output_losses(loss_spec)
    if losses is None:
        return None
    targets = batch_spec.get("target", batch_spec["input"])
    return {
        name: task_of(
            spec["name"],
            {"input": batch_spec["input"], "target": targets[name]}
            if isinstance(targets, dict) and name in targets
            else {"input": batch_spec["input"]},
            output_preprocessing(preprocessing, name),
        )
        for name, spec in losses.items()
    }


def class_count(preprocessing: dict, targets: Callable[[], np.ndarray]) -> tuple[int, str]:
    """How many outputs a classifier or language model needs, and what says so: the data's class names or
    vocabulary, else the largest id in `targets()` (a batch of them, read only then) plus one."""
    if preprocessing.get("vocabulary"):
        return len(preprocessing["vocabulary"]), "tokens in its vocabulary"
    if preprocessing.get("classes"):
        return len(preprocessing["classes"]), "classes"
    largest = int(targets().max())
    return largest + 1, f"classes (a label {largest} in its first batch)"


def step_spec(loader, augment) -> dict:
    """The batch as the step sees it (after the augmentation's ops); an op that cannot take this data is a
    ConfigError naming its place in the list."""
    try:
        return loader.spec if augment is None else augment.spec(loader.spec)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def model_outputs(config: dict, model, spec: dict, source: str):
    """The model's outputs traced on the batch's input (``jax.ShapeDtypeStruct`` leaves, nothing compiled); a model
    that cannot take the input is a ConfigError naming what to change."""
    policy = policy_of(config["trainer"]["precision"])  # traced in the compute dtype, as the step runs it
    try:
        return jax.eval_shape(lambda x: policy.apply(model, *model.init(jax.random.PRNGKey(0), x), x)[0], spec["input"])
    except FusedAttentionUnavailable as error:
        raise ConfigError(f"{source}: model: {error}") from None
    except (TypeError, ValueError) as error:  # shape and dtype errors from inside a layer: the first line says what
        reason = (str(error).strip() or type(error).__name__).splitlines()[0]
        pixels = any(np.dtype(leaf.dtype).kind == "u" for leaf in jax.tree.leaves(spec["input"]))
        hint = (
            (
                '; integer pixels become float32 with {"name": "normalize"} in data_loader.train.augment (or '
                'the loader\'s "dtype": "float32" where it has one)'
            )
            if pixels
            else ""
        )
        raise ConfigError(
            f"{source}: model: cannot take the data's {describe_batch({'input': spec['input']})} ({reason}){hint}"
        ) from None


def takes_class_ids(config: dict, loader) -> bool:
    """Whether the loader's targets are integer class ids a classifier or language model gathers its outputs by
    (a model of several outputs: each head is checked on its own, ``check_model_fits_data``)."""
    target = labels_of(loader.spec.get("target"), config["loss"].get("labels"))
    if per_output_losses(config["loss"]) is not None or target is None or isinstance(target, dict):
        return False
    task = task_of(config["loss"], loader.spec, loader.preprocessing)
    return task in ("classification", "sequence") and np.issubdtype(np.dtype(target.dtype), np.integer)


def label_bound(config: dict, model, loader, augment, source: str) -> int | None:
    """The class ids the loader's targets may hold, [0, bound): as many as the data names (class names, a
    vocabulary), else as many as the model has outputs; None when its targets are no class ids."""
    if not takes_class_ids(config, loader):
        return None
    preprocessing = loader.preprocessing
    named = preprocessing.get("vocabulary") or preprocessing.get("classes")
    if named:
        return len(named)
    # a label past the outputs in the first batch says more as the model's fault: "set num_classes to ..."
    return check_model_fits_data(config, model, loader, augment, source)


def check_split(run, split: str, loader) -> None:
    """The loader's ``check_values`` on a split of a run (``training.assembly.Run``) as its config describes it:
    class ids up to ``label_bound``; NaN and infinities unless the split's ``allow_nonfinite``. A ConfigError naming
    the split and the example."""
    spec = run.config["data_loader"].get(split, {})
    allow = isinstance(spec, dict) and spec.get("allow_nonfinite", False)
    labels = run.config["loss"].get("labels")
    try:
        named = isinstance(loader.spec.get("target"), dict) and labels is not None
        bound = label_bound(run.config, run.model, loader, run.augment, run.source)
        check_values(loader.dataset, bound, allow, f"target.{labels}" if named else "target")
    except ValueError as error:
        raise ConfigError(f"{run.source}: data_loader.{split}: {error}") from None


def check_model_fits_data(config: dict, model, loader, augment, source: str, loss_fn=None, metrics=()) -> int | None:
    """The model traced on the data's input (nothing compiled): one that cannot take the input, or a classifier or
    language model (or such an output of a model of several) with fewer outputs than the data has classes (its loss
    would be NaN from the first step on), is refused naming what to change; so is a loss or metric (``loss_fn``,
    ``metrics``: the run's) that cannot take the outputs with the data's targets (``check_loss_takes_data``).
    Returns a classifier's number of outputs (None for other tasks and for models of several outputs)."""
    spec = step_spec(loader, augment)
    outputs = model_outputs(config, model, spec, source)
    check_outputs_named(config, outputs, loader.spec.get("target"), source)
    tasks = output_tasks(config["loss"], loader.spec, loader.preprocessing)
    width = None
    if tasks is None:
        target, labels = loader.spec.get("target"), config["loss"].get("labels")
        if labels is not None:  # the class ids among named targets, for a model of one output
            if not isinstance(target, dict) or labels not in target:
                has = f"targets {', '.join(sorted(target))}" if isinstance(target, dict) else "one target, not named"
                raise ConfigError(f"{source}: loss.labels: the data has no target {labels!r}; it has {has}")
            target = target[labels]
        # named targets and one loss: a loss that declares a task takes one array (its task is judged on it), unless
        # the config names the target of its labels; one that declares none (a loss of your own) may take them all,
        # traced on them below
        entry = entries("loss").get(config["loss"]["name"])
        if isinstance(target, dict) and entry is not None and entry.task is not None:
            names = ", ".join(sorted(target))
            route = (
                f"a model of one output whose loss takes them all (labels and a teacher's logits) is a classifier "
                f'when the loss names the target of its class ids: "loss": {{"name": "{config["loss"]["name"]}", '
                f'"labels": "<one of {names}>"}}'
                if not isinstance(outputs, dict)
                else "give each output its own loss (weighted_sum with args.losses per name)"
            )
            raise ConfigError(
                f"{source}: loss: {config['loss']['name']} takes one target, but the data has named targets "
                f"{names}: {route}"
            )
        task = task_of(config["loss"], loader.spec, loader.preprocessing)
        width = check_class_width(config, task, outputs, target, loader.preprocessing, loader, source)
    for output, task in (tasks or {}).items():  # each classifier head against its own target's classes
        target = loader.spec.get("target", {})
        check_class_width(
            config,
            task,
            outputs[output],
            target.get(output) if isinstance(target, dict) else None,
            output_preprocessing(loader.preprocessing, output),
            loader,
            source,
            output,
        )
    if loss_fn is not None:
        check_loss_takes_data(config, outputs, spec, loss_fn, metrics, source)
    return width


def check_loss_takes_data(config: dict, outputs, spec: dict, loss_fn, metrics, source: str) -> None:
    """The loss and each metric traced (nothing compiled) on the model's outputs and the data's targets as the step
    gives them: one that cannot take them (labels of shape (B, 1) against two logits, a regression CSV's float
    targets given to cross_entropy) is refused naming it, before the run folder exists; not a traceback from the
    first step, after it."""
    from training.step import example_losses, loss_mask, target_of  # the step's own calls, traced as it makes them

    checks = [("loss", config["loss"]["name"], lambda o, b: example_losses(loss_fn, o, b))]
    checks += [
        (f"metrics.{i}", metric.name, lambda o, b, m=metric: m.stats(o, target_of(b), loss_mask(b)))
        for i, metric in enumerate(metrics)
    ]
    for where, name, traced in checks:
        try:
            jax.eval_shape(traced, outputs, spec)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
            reason = (str(error).strip() or type(error).__name__).splitlines()[0]
            target = {"target": target_of(spec)}
            raise ConfigError(
                f"{source}: {where}: {name} cannot take the model's "
                f"{describe_batch({'outputs': outputs})} with the data's {describe_batch(target)} ({reason})"
            ) from None


def check_class_width(
    config: dict, task: str, outputs, target, preprocessing: dict, loader, source: str, output: str | None = None
) -> int | None:
    """A classifier or language model (or such an output of a model of several) with fewer outputs than the data
    has classes is refused naming what to change. Returns its number of outputs (None for other tasks)."""
    if task in ("classification", "sequence") and isinstance(target, dict):  # a loader's declared task (task_of)
        raise ConfigError(
            f"{source}: the data declares the task {task!r}, but its targets are named ({', '.join(sorted(target))}): "
            f"a classifier is reported on one array of class ids; name the target that holds them beside the loss's "
            f'name ("loss": {{"name": ..., "labels": "<one of them>"}}), or leave the task out (the run is then '
            f'reported as "other")'
        )
    if (
        task not in ("classification", "sequence")
        or target is None
        or not np.issubdtype(np.dtype(target.dtype), np.integer)
        or not hasattr(outputs, "shape")
    ):
        return None
    labels = config["loss"].get("labels")
    pick = (lambda b: labels_of(b["target"], labels)) if output is None else (lambda b: b["target"][output])
    classes, origin = class_count(preprocessing, lambda: pick(next(loader.batches(whole=True))))
    width = outputs.shape[-1]
    if width < classes:
        parameters = inspect.signature(available("model")[config["model"]["name"]]).parameters
        name = next((n for n in CLASS_COUNT_ARGUMENTS if n in parameters), None)
        where = f"model.args.{name}" if name else "model"
        per = "position" if task == "sequence" else "example"
        gives = "the model gives" if output is None else f"the model's output {output!r} gives"
        raise ConfigError(
            f"{source}: {where}: {gives} {width} outputs per {per}, but the data has {classes} "
            f"{origin}; " + (f"set it to {classes}" if name else f"give the model {classes} outputs")
        )
    return width


def check_outputs_named(config: dict, outputs, target, source: str) -> None:
    """Each output a per-output loss or metric names is one the model gives and the data has a target for."""
    places = [(f"loss.args.losses.{name}", name) for name in per_output_losses(config["loss"]) or {}]
    places += [
        (f"metrics.{i}.output", spec["output"])
        for i, spec in enumerate(config.get("metrics", []))
        if isinstance(spec, dict) and "output" in spec
    ]
    for where, name in places:
        if not isinstance(outputs, dict) or name not in outputs:
            has = f"outputs {', '.join(sorted(outputs))}" if isinstance(outputs, dict) else "one output, not named"
            raise ConfigError(f"{source}: {where}: the model has no output {name!r}; it has {has}")
        if isinstance(target, dict) and name not in target:
            raise ConfigError(
                f"{source}: {where}: the data has no target {name!r}; its targets are {', '.join(sorted(target))}"
            )
