"""Components by name: what a config's ``{"name": ..., "args": {...}}`` may name (``model/registry.py``), its
arguments checked against the function's signature and its registered ``check``, and the component built; the
optimizer section (optimizer, schedules, gradient transforms) built as one.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any

from model.registry import KINDS, ComponentError
from model.registry import entries as registered
from training.config.file import ConfigError, closest, show

# A model argument that sets the number of classes its outputs score.
CLASS_COUNT_ARGUMENTS = ("num_classes", "vocab_size")
# Each kind of component a config may name (what `python train.py --list` prints).
COMPONENT_MODULES = KINDS


# Keys besides "name" and "args" that a kind of component may have (a loader's "augment": the train split only).
# A metric's "output": the named output (and target) of a model of several outputs that it scores. A loss's "labels":
# the entry of the data's named targets that holds the class ids of a model of one output (a distillation's labels
# beside the teacher's logits): the loss takes every target, the task, the metrics and test.py take that one.
EXTRA_KEYS = {
    "loss": ("labels",),
    "optimizer": ("schedule", "transforms", "frozen"),
    "data_loader": ("augment", "allow_nonfinite"),
    "metrics": ("output",),
}


# Kinds whose functions take data first (loss(outputs, targets, **hyperparameters)): the config sets the rest.
DATA_ARGUMENTS = {"loss": 2}


# Keyword arguments the training step fills in itself (a per-element mask), never the config.
SET_BY_TRAINER = {"loss": ("mask",)}


def entries(kind: str) -> dict:
    """``model.registry.entries``: every registered component of ``kind``, the template's and those in files of your
    own; one of those that cannot be imported, or a name registered twice, is a ConfigError naming the file(s)."""
    try:
        return registered(kind)
    except ComponentError as error:
        raise ConfigError(str(error)) from None


def available(kind: str) -> dict[str, Callable]:
    """The functions a config may name for ``kind``, by name."""
    return {name: entry.fn for name, entry in entries(kind).items()}


# What --list prints besides the kinds a config names: the layers a model is written with (model/modules).
LISTED = (*COMPONENT_MODULES, "layers")


def components_text(kind: str = "all") -> str:
    """Every registered component of ``kind`` (or of every kind) with its config arguments, one per line; "layers":
    every layer class of model/modules (``layers_text``)."""
    kinds = list(LISTED) if kind == "all" else [kind]
    if kind != "all" and kind not in LISTED:
        raise ConfigError(f"--list {kind}: unknown kind.{closest(kind, LISTED)} Kinds: {', '.join(LISTED)}")
    lines = []
    for each in kinds:
        if each == "layers":
            lines.append(layers_text())
            continue
        lines.append(f"{each}:")
        for name, fn in available(each).items():
            task = entries(each)[name].task
            lines.append(f"  {signature_text(name, accepted(each, fn))}" + (f"  [task: {task}]" if task else ""))
    return "\n".join(lines)


def layers() -> dict[str, type]:
    """Every public layer class (a ``Module``) that model/modules defines, by name, file by file."""
    import importlib
    import pkgutil

    import model.modules as modules
    from model.modules.module import Module

    found = {}
    for info in pkgutil.iter_modules(modules.__path__):
        file = importlib.import_module(f"model.modules.{info.name}")
        for name, obj in vars(file).items():
            if inspect.isclass(obj) and issubclass(obj, Module) and obj.__module__ == file.__name__:
                if not name.startswith("_") and obj is not Module:
                    found[name] = obj
    return found


def layers_text() -> str:
    """``--list layers``: each layer class with its constructor's arguments, its file, how many export examples it
    declares (none: not in the export-parity check on its own) and the first paragraph of its docstring (what it
    is), all read from the classes themselves."""
    lines = ["layers (model/modules: what a model in model/model.py is built of):"]
    for name, cls in layers().items():
        own = any("__init__" in vars(c) for c in cls.__mro__[:-1])  # not object's (*args, **kwargs)
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:] if own else []  # without self
        shown = inspect.Signature(
            [
                p.replace(annotation=_Annotation(p.annotation)) if isinstance(p.annotation, str) else p
                for p in parameters
            ]
        )
        # the class's own docstring, else its file's (a file of one layer describes it there)
        text = vars(cls).get("__doc__") or sys.modules[cls.__module__].__doc__ or ""
        doc = " ".join(inspect.cleandoc(text).split("\n\n")[0].split())
        what = doc.rstrip(".") if doc else "(no docstring)"
        # the export-parity check runs what the class declares beside itself (Module.export_examples)
        examples = len(cls.export_examples()) if "export_examples" in vars(cls) else 0
        checked = f"  [export examples: {examples}]" if examples else ""
        lines.append(f"  {name}{shown}  [{cls.__module__.replace('.', '/')}.py]{checked}\n      {what}")
    return "\n".join(lines)


def accepted(kind: str, fn: Callable) -> Callable:
    """``fn`` as a config sees it: without the data arguments and those the trainer fills in."""
    params = list(inspect.signature(fn).parameters.values())[DATA_ARGUMENTS.get(kind, 0) :]
    params = [p for p in params if p.name not in SET_BY_TRAINER.get(kind, ())]

    def shown(*args, **kwargs):
        pass

    shown.__signature__ = inspect.signature(fn).replace(parameters=params)
    return shown


class _Annotation(str):
    """An annotation kept as text (postponed evaluation): shown as written, not as a quoted string."""

    def __repr__(self):
        return str(self)


def signature_text(name: str, fn: Callable) -> str:
    """``adamw(lr: Hyper, b1: float = 0.9, ...)``: the arguments a config may give, without the return type."""
    signature = inspect.signature(fn)
    params = [
        p.replace(annotation=_Annotation(p.annotation)) if isinstance(p.annotation, str) else p
        for p in signature.parameters.values()
    ]
    return f"{name}{signature.replace(parameters=params, return_annotation=inspect.Signature.empty)}"


def check_component(spec: Any, kind: str, where: str, supplied: tuple[str, ...] = ()) -> tuple[Callable, dict]:
    """Looks up spec['name'] and binds spec['args']; `supplied` are arguments the program fills in itself. A component
    may declare a `check` when it registers, called here with the args: the checks of what is never built before the
    data exists (a loss's hyperparameters) or whose building reads files (a data loader's)."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict):
        raise ConfigError(f'{where}: expected {{"name": ..., "args": {{...}}}}, got {show(spec)}')
    if "name" not in spec:
        raise ConfigError(f'{where}: missing "name" (a component is {{"name": ..., "args": {{...}}}})')
    allowed = ("name", "args", *EXTRA_KEYS.get(kind, ()))
    extra = set(spec) - set(allowed)
    if extra:
        raise ConfigError(
            f"{where}: unexpected key {sorted(extra)[0]!r}; a {kind} component has "
            + ", ".join(f'"{k}"' for k in allowed)
        )
    options = available(kind)
    name = spec["name"]
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: expected a string, got {show(name)}")
    if name not in options:
        raise ConfigError(
            f"{where}.name: unknown {kind} {name!r}; available: {', '.join(sorted(options))}.{closest(name, options)}"
        )
    fn = options[name]
    args = {} if spec.get("args") is None else spec["args"]
    if not isinstance(args, dict):
        raise ConfigError(f"{where}.args: expected an object, got {show(args)}")
    params = dict(inspect.signature(fn).parameters)
    for data_arg in list(params)[: DATA_ARGUMENTS.get(kind, 0)]:
        supplied = (*supplied, data_arg)
        params.pop(data_arg)
    supplied = (*supplied, *(a for a in SET_BY_TRAINER.get(kind, ()) if a in params))
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key, value in args.items():
        if key in supplied:
            raise ConfigError(f"{where}.args.{key}: set by the trainer, not the config")
        if key not in params and not takes_kwargs:
            raise ConfigError(
                f"{where}.args.{key}: unknown argument.{closest(key, params)} Accepted: {signature_text(name, fn)}"
            )
        if key in params and kind in ("optimizer", "transforms") and leaf_mask(fn, key) and isinstance(value, list):
            check_key_paths(value, f"{where}.args.{key}")
        elif key in params and kind == "loss" and output_losses(fn, key):
            check_output_losses(value, f"{where}.args.{key}")
        elif key in params:
            check_type(value, params[key].default, f"{where}.args.{key}", kind == "optimizer" and schedulable(fn, key))
    missing = [
        p
        for p, v in params.items()
        if v.default is inspect.Parameter.empty
        and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)
        and p not in args
        and p not in supplied
    ]
    if missing:
        raise ConfigError(f"{where}.args: missing argument {missing[0]!r}. Accepted: {signature_text(name, fn)}")
    if "output" in spec:
        check_output_name(spec["output"], f"{where}.output")
    if "labels" in spec:
        check_labels(spec["labels"], fn, f"{where}.labels")
    check = entries(kind)[name].check
    if check is not None:
        try:
            check(**args)
        except (ValueError, TypeError) as error:
            raise ConfigError(component_error(where, error, args)) from None
    return fn, dict(args)


def schedulable(fn: Callable, argument: str) -> bool:
    """Whether an optimizer's argument may be a schedule component: its type is ``Hyper`` (a number or a function of
    the step; ``training/optimizers.py``). build_optimizer builds schedules for those arguments only."""
    from training.optimizers import Hyper  # JAX: config errors are reported before it loads

    return typing.get_type_hints(fn).get(argument) == Hyper


def leaf_mask(fn: Callable, argument: str) -> bool:
    """Whether an optimizer's or transform's argument is a pytree of bools over the params (type ``LeafMask``), which
    a config gives as a list of key-path prefixes."""
    from training.optimizers import LeafMask  # JAX: config errors are reported before it loads

    return typing.get_type_hints(fn).get(argument) is LeafMask


def check_key_paths(value: Any, where: str) -> None:
    """A list of key-path prefixes of the parameters, as checkpoints name them: ``["params.backbone"]``."""
    if not isinstance(value, list):
        raise ConfigError(f'{where}: expected a list of key paths such as ["params.backbone"], got {show(value)}')
    for i, path in enumerate(value):
        if not isinstance(path, str) or not path.startswith("params.") or not path[7:] or ".." in path:
            raise ConfigError(
                f'{where}.{i}: expected a key path of the parameters such as "params.backbone" (as checkpoints and '
                f"the summary name them), got {show(path)}"
            )


def component_error(where: str, error: Exception, args: dict) -> str:
    """A constructor's "b1: must be in [0, 1), got 1.5" placed at its argument: `cfg.json: optimizer.args.b1: ...`."""
    text = str(error)
    argument, colon, rest = text.partition(": ")
    named = colon and argument.split(".")[0] in args  # "hidden.0: ..." is an entry of the argument hidden
    return f"{where}.args.{argument}: {rest}" if named else f"{where}: {text}"


def check_type(value: Any, default: Any, where: str, schedulable: bool = False) -> None:
    """Type check against the default's type: a number where a number is expected, and so on. null is taken where
    the default is null or a string (a mode such as mask's), never for a number, flag or list."""
    if default is inspect.Parameter.empty or default is None:
        return
    if value is None:
        if isinstance(default, str):
            return
        ok = False
    elif isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = number or (schedulable and isinstance(value, dict))
        if isinstance(default, int) and isinstance(value, float) and not value.is_integer():
            ok = False
    elif isinstance(default, str):
        ok = isinstance(value, (str, dict)) or callable(value)
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
    else:
        return
    if not ok:
        expected = "list" if isinstance(default, tuple) else type(default).__name__
        raise ConfigError(f"{where}: expected {expected} (like the default {show(default)}), got {show(value)}")


def build(spec: Any, kind: str, where: str = "config.json", **supplied) -> Any:
    """Builds one component; errors its constructor raises (impossible values) are reported at its place."""
    fn, args = check_component(spec, kind, where, tuple(supplied))
    if kind in DATA_ARGUMENTS:
        args = {k: build_output_losses(v, f"{where}.args.{k}") if output_losses(fn, k) else v for k, v in args.items()}
        return functools.partial(fn, **args)
    try:
        built = fn(**args, **supplied)
    except (ValueError, TypeError, FileNotFoundError, OSError) as error:
        raise ConfigError(component_error(where, error, args)) from None
    return of_output(built, spec["output"]) if kind == "metrics" and "output" in spec else built


def output_losses(fn: Callable, argument: str) -> bool:
    """Whether a loss's argument is one loss per named output (type ``OutputLosses``: ``weighted_sum``'s)."""
    from training.losses import OutputLosses

    return typing.get_type_hints(fn).get(argument) is OutputLosses


def check_output_name(name: Any, where: str) -> None:
    """The name of one of a model's outputs (a key of the dict it returns), as logs name it: val/<output>/accuracy."""
    if not isinstance(name, str) or not name or "/" in name or name != name.strip():
        raise ConfigError(
            f'{where}: expected the name of one of the model\'s outputs such as "digit", got {show(name)}'
        )


def check_labels(name: Any, fn: Callable, where: str) -> None:
    """A loss's ``labels``: the name of the data's target entry holding the class ids, for a loss of one output."""
    if not isinstance(name, str) or not name or "/" in name or name != name.strip():
        raise ConfigError(f'{where}: expected the name of one of the data\'s targets such as "label", got {show(name)}')
    if any(output_losses(fn, key) for key in inspect.signature(fn).parameters):
        raise ConfigError(
            f"{where}: a loss of one loss per output gives each output its own target; labels names the class ids "
            "of a model of one output"
        )


def of_labels(metric, labels: str | None):
    """``metric`` scoring the data's class ids ``targets[labels]`` where the targets are named (a loss's
    ``labels``: the run is a classifier of those); a target that is one array is scored as it is. Logged under its
    own name (``val/accuracy``)."""
    if labels is None:
        return metric

    def stats(outputs, targets, mask=None):
        return metric.stats(outputs, labels_of(targets, labels), mask)

    return type(metric)(metric.name, stats, metric.result)


def labels_of(target, labels: str | None):
    """The class ids of a batch's (or spec's) target: ``target[labels]`` of named targets, else the target itself."""
    if labels is None or not isinstance(target, dict):
        return target
    if labels not in target:
        raise ValueError(f"loss.labels: the data has no target {labels!r}; its targets are {', '.join(sorted(target))}")
    return target[labels]


def check_output_losses(value: Any, where: str) -> None:
    """``{output name: {"name": loss, "args": {...}, "weight": w}}``: each entry a loss of its own and a weight."""
    example = '{"digit": {"name": "cross_entropy", "weight": 1.0}, "ink": {"name": "mse", "weight": 0.5}}'
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{where}: expected one loss per output such as {example}, got {show(value)}")
    for output, spec in value.items():
        check_output_name(output, f"{where}: output name")
        if not isinstance(spec, dict):
            raise ConfigError(
                f'{where}.{output}: expected {{"name": ..., "args": {{...}}, "weight": w}}, got {show(spec)}'
            )
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
            raise ConfigError(f"{where}.{output}.weight: expected a number >= 0, got {show(weight)}")
        inner = {k: v for k, v in spec.items() if k != "weight"}
        fn = available("loss").get(inner.get("name")) if isinstance(inner.get("name"), str) else None
        if fn is not None and any(output_losses(fn, p) for p in inspect.signature(fn).parameters):
            raise ConfigError(f"{where}.{output}.name: a loss of one output, not another {inner['name']}")
        check_component(inner, "loss", f"{where}.{output}")


def build_output_losses(value: dict, where: str) -> dict:
    """The config's ``{output: {"name", "args", "weight"}}`` as ``{output: (loss function, weight)}``."""
    return {
        output: (
            build({k: v for k, v in spec.items() if k != "weight"}, "loss", f"{where}.{output}"),
            float(spec.get("weight", 1.0)),
        )
        for output, spec in value.items()
    }


def of_output(metric, output: str):
    """``metric`` of one named output of a model of several: it scores ``outputs[output]`` against
    ``targets[output]`` and logs as ``<output>/<metric>`` (``val/digit/accuracy``)."""

    def stats(outputs, targets, mask=None):
        for kind, tree in (("outputs", outputs), ("targets", targets)):
            if not isinstance(tree, dict) or output not in tree:
                found = f"names {sorted(tree)}" if isinstance(tree, dict) else "one array"
                raise ValueError(f"metric {metric.name} of output {output!r}: the {kind} have {found}")
        return metric.stats(outputs[output], targets[output], mask)

    return type(metric)(f"{output}/{metric.name}", stats, metric.result)


# Steps an epoch counts in a schedule checked before the data is read (build_optimizer's steps_per_epoch None).
NOMINAL_STEPS_PER_EPOCH = 2**20


def build_optimizer(
    config: dict, steps_per_epoch: int | None = 1, source: str = "config.json", lr=None, epochs: int | None = None
):
    """(optimizer, learning-rate function step -> lr): the optimizer with its schedule (as `lr`) and gradient
    transforms chained in front. Schedule lengths given in epochs or as "all" become steps of this run.

    steps_per_epoch None: before the data is read, to check the hyperparameters. Lengths in epochs then count
    NOMINAL_STEPS_PER_EPOCH steps, so "all" stays longer than a warm-up of a fixed number of steps (whether it is
    really longer is known, and checked, once the data is). `lr`: a function of the step that replaces the config's
    learning rate and schedule (the lr_finder callback's range; every group's). `epochs`: the run's length that "all"
    counts (default: trainer.epochs now; a run fixes it when its data is loaded, before a debug mode shortens the run).

    With optimizer.groups, one such optimizer per group (``optimizers.partition``); the learning-rate function is the
    first group's (the one "lr" logs), and its ``groups`` attribute holds every group's by name (``lr/<name>``)."""
    from training import optimizers, schedules

    nominal = steps_per_epoch is None
    steps_per_epoch = NOMINAL_STEPS_PER_EPOCH if nominal else steps_per_epoch
    run_epochs = config["trainer"]["epochs"] if epochs is None else epochs

    def schedule(spec, where):
        counts = schedules.step_arguments(available("schedule")[spec["name"]])
        args = {
            k: steps_of(v, nominal, steps_per_epoch, run_epochs) if k in counts else v
            for k, v in (spec.get("args") or {}).items()
        }
        return build({**spec, "args": args}, "schedule", where)

    def one(spec, where):  # the optimizer section, or one group of it, without "frozen"
        supplied = {}
        if lr is not None:
            supplied["lr"] = lr
        elif "schedule" in spec:
            supplied["lr"] = schedule(spec["schedule"], f"{where}.schedule")
        transforms = [
            build_masked(t, "transforms", f"{where}.transforms.{i}") for i, t in enumerate(spec.get("transforms", []))
        ]
        for key, value in (spec.get("args") or {}).items():
            if isinstance(value, dict) and key not in supplied:  # a schedulable hyperparameter may be a schedule
                supplied[key] = schedule(value, f"{where}.args.{key}")
                if hasattr(supplied[key], "plateau"):
                    raise ConfigError(
                        f"{where}.args.{key}: reduce_on_plateau sets the learning rate only; give it as "
                        f"{where.partition(': ')[2]}.schedule"
                    )
        args = {k: v for k, v in (spec.get("args") or {}).items() if k not in supplied}
        spec = {k: v for k, v in spec.items() if k not in ("params", "frozen")}
        optimizer = build_masked({**spec, "args": args}, "optimizer", where, **supplied)
        rate = supplied.get("lr", args.get("lr", default_of(available("optimizer")[spec["name"]], "lr", 0.0)))
        lr_fn = rate if callable(rate) else (lambda step: rate)
        # reduce_on_plateau: its factor, kept in the optimizer's state, scales the updates after everything else
        blocks = [*transforms, optimizer, *([optimizers.scale_by_plateau()] if hasattr(lr_fn, "plateau") else [])]
        return (optimizers.chain(*blocks) if len(blocks) > 1 else optimizer), lr_fn

    spec = config["optimizer"]
    if "groups" not in spec:
        optimizer, lr_fn = one(spec, f"{source}: optimizer")
    else:
        built = {name: one(group, f"{source}: optimizer.groups.{name}") for name, group in spec["groups"].items()}
        for name, (_, fn) in built.items():
            if hasattr(fn, "plateau"):  # its factor follows one metric for one optimizer's rate
                raise ConfigError(
                    f"{source}: optimizer.groups.{name}.schedule: reduce_on_plateau is not supported in a group"
                )
        groups = {name: (spec["groups"][name]["params"], opt) for name, (opt, _) in built.items()}
        optimizer, first = optimizers.partition(groups), next(iter(built.values()))[1]

        def lr_fn(step):
            return first(step)

        lr_fn.groups = {name: fn for name, (_, fn) in built.items()}
    return (optimizers.freeze(optimizer, spec["frozen"]) if spec.get("frozen") else optimizer), lr_fn


def run_length_arguments(config: dict) -> list[str]:
    """The places of the optimizer's schedule arguments given as "all" or {"epochs": N} (each group's too): what the
    run's length decides."""
    from training import schedules

    spec = config["optimizer"]
    sections = [("optimizer", spec)]
    if "groups" in spec:
        sections = [(f"optimizer.groups.{name}", group) for name, group in spec["groups"].items()]
    found, places = [], []
    for where, each in sections:
        places += [(f"{where}.schedule", each.get("schedule"))]
        places += [(f"{where}.args.{k}", v) for k, v in (each.get("args") or {}).items()]
    for place, schedule in places:
        if not isinstance(schedule, dict) or schedule.get("name") not in available("schedule"):
            continue
        counts = schedules.step_arguments(available("schedule")[schedule["name"]])
        for key, value in (schedule.get("args") or {}).items():
            if key in counts and (value == "all" or (isinstance(value, dict) and "epochs" in value)):
                found.append(f"{place}.args.{key}")
    return found


def schedule_length_note(config: dict, length: dict | None, epochs: int) -> str:
    """What a resumed run's start-up line adds when it trains longer than the run length its schedules count (a
    checkpoint's ``schedule_length``), and how to stretch them; "" otherwise."""
    places = run_length_arguments(config)
    if not length or not places or length["epochs"] == epochs:
        return ""
    return (
        f"; the schedule keeps the length the run started with ({', '.join(places)} count {length['epochs']} "
        f"epochs of {length['steps_per_epoch']} steps): past its end the lr stays where it ended. To stretch it over "
        f"{epochs} epochs, give its length in steps (--set {places[0]}=N) or start a new run from these weights "
        f"(--weights)"
    )


def build_masked(spec: Any, kind: str, where: str, **supplied) -> Any:
    """``build`` with each ``LeafMask`` argument given as a list of key-path prefixes made its mask function."""
    from training.optimizers import prefix_mask

    spec = {"name": spec} if isinstance(spec, str) else spec
    fn, args = available(kind).get(spec.get("name")), dict(spec.get("args") or {})
    masks = {
        k: prefix_mask(args.pop(k)) for k, v in list(args.items()) if fn and isinstance(v, list) and leaf_mask(fn, k)
    }
    return build({**spec, "args": args}, kind, where, **supplied, **masks)


def default_of(fn: Callable, name: str, otherwise: Any) -> Any:
    parameter = inspect.signature(fn).parameters.get(name)
    return otherwise if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def steps_of(value: Any, nominal: bool, steps_per_epoch: int, epochs: int) -> Any:
    """A schedule's step count from the config: steps, {"steps": N}, {"epochs": N} or "all" (every step of the run).
    The last two become a ``StepCount``, which errors show as the config wrote it; ``nominal``: ``steps_per_epoch``
    stands in for the data's, unknown yet, so no message names its steps."""
    from training.schedules import StepCount

    if isinstance(value, dict) and "steps" in value:
        return value["steps"]
    if value == "all" or isinstance(value, dict):
        steps = steps_per_epoch * epochs if value == "all" else max(1, round(value["epochs"] * steps_per_epoch))
        return StepCount(steps, value, None if nominal else steps_per_epoch, epochs)
    return value
