"""The config's schema: every section's defaults and bounds (an optional feature's sections: its folder's config.py,
FEATURE_CONFIGS below), and a check per section that fills its defaults in place and reports the first problem as
one ConfigError naming its place (`config.json: trainer.epochs: ...`).

``training.config.validation.validate`` runs the checks in a fixed order, so a config with several problems reports
the same one first every time; the train split's augmentation is checked there too, between the loaders and the
trainer.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.config.components import (
    CLASS_COUNT_ARGUMENTS,
    available,
    build,
    check_component,
    check_key_paths,
    default_of,
)
from training.config.file import ConfigError, closest, show
from training.devices import compilation_cache

log = logging.getLogger("train")

TRAINER_DEFAULTS = {
    "epochs": 10,
    "save_dir": "saved/",
    "save_period": 5,
    "monitor": "max val/accuracy",
    "early_stop": 0,
    "log_every": 50,
    "steps_per_call": "auto",
    "run_id": None,
    "divergence_factor": None,
    "checkpoint_every": None,
    "async_checkpoints": True,
    "accumulate_steps": 1,
    "precision": None,
}
PROFILE_KEYS = ("start_step", "num_steps")
CHECKPOINT_EVERY_KEYS = ("steps", "minutes", "keep")
TOP_LEVEL = {
    "name",
    "seed",
    "model",
    "loss",
    "metrics",
    "optimizer",
    "data_loader",
    "trainer",
    "mesh",
    "callbacks",
    "step",
}
DEFAULT_STEP = {"name": "supervised"}  # training/step.py's; a config without "step" takes it (and keeps its hash)
LOADER_SPLITS = ("train", "validation", "test")
GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # an optimizer group's
# The optional features' parts of the config: each module declares SECTIONS (a top-level section's name -> its
# defaults) and check(config, source), and is found while its folder is there. A project made without a feature
# (new_project.py --without) loses its line here with its folder: its sections are then unknown ones.
FEATURE_CONFIGS = (
    "training.tracking.config",  # [feature: tracking]
)


# Bounds past which a value is a typo, not a setting: a run that never ends, a step counter (int32) that wraps, a seed
# numpy refuses, a folder name the file system refuses, a config nested or numbered past anything JSON carries.
MAX_EPOCHS = 10**6
MAX_STEPS = 2**31 - 1
MAX_SEED = 2**32 - 1
MAX_BATCH = 2**24
MAX_NAME = 100


def check_number(section: dict, key: str, where: str, kind=int, minimum=None, allow=(), maximum=None) -> None:
    """section[key] as a number of `kind` in [minimum, maximum] (or one of `allow`); `where` is the section's place
    ending in ": " or "." (`cfg.json: ` for the top level). An integer written as 5.0 is stored as 5."""
    value = section.get(key)
    if any(value is a or (type(value) is type(a) and value == a) for a in allow):
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and isinstance(value, float) and not value.is_integer())
    ):
        expected = " or ".join([kind.__name__, *map(json.dumps, allow)])
        raise ConfigError(f"{where}{key}: expected {expected}, got {show(value)}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}{key}: must be >= {minimum}, got {show(value)}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where}{key}: must be at most {maximum:,}, got {show(value)}")
    if kind is int:
        section[key] = int(value)


def check_folder_name(value: Any, where: str) -> None:
    """A run title or id names one folder under save_dir: one plain path component, so that no config can put a
    run anywhere else or name a folder the file system refuses."""
    # a leading '-' reads as an option to every shell tool given the path; blanks around it are invisible in a listing
    if (
        not isinstance(value, str)
        or not value
        or value in (".", "..")
        or len(value) > MAX_NAME
        or "/" in value
        or "\\" in value
        or not value.isprintable()
        or value != value.strip()
        or value.startswith("-")
    ):
        raise ConfigError(
            f"{where}: expected a folder name (1 to {MAX_NAME} printable characters, no '/' or '\\', "
            f"not '.' or '..', not starting with '-', no space at either end), got {show(value)}"
        )


def check_save_dir(trainer: dict, name: str, where: str) -> None:
    """save_dir must be a path in which a run folder can be made: no part of it that exists may be a file."""
    save_dir = trainer["save_dir"]
    if not isinstance(save_dir, str) or not save_dir or "\0" in save_dir:
        raise ConfigError(f"{where}save_dir: expected a folder path, got {show(save_dir)}")
    path = Path(save_dir) / name
    for folder in (path, *path.parents):
        try:
            if folder.exists() and not folder.is_dir():
                raise ConfigError(f"{where}save_dir: {folder} is a file, so no run folder can be made under it")
        except OSError as error:
            raise ConfigError(f"{where}save_dir: {folder}: {error.strerror or error}") from None


def section(config: dict, key: str, source: str, default: Any) -> Any:
    """config[key] (set to `default` when absent), which must be of the default's type."""
    value = config.setdefault(key, default)
    if not isinstance(value, type(default)):
        expected = "an object {...}" if isinstance(default, dict) else "a list [...]"
        raise ConfigError(f"{source}: {key}: expected {expected}, got {show(value)}")
    return value


def feature_configs() -> list:
    """The modules of FEATURE_CONFIGS whose feature's folder the project has."""
    found = []
    for name in FEATURE_CONFIGS:
        if importlib.util.find_spec(name.rpartition(".")[0]) is not None and importlib.util.find_spec(name) is not None:
            found.append(importlib.import_module(name))
    return found


def check_top_level(config: dict, source: str) -> None:
    """The sections a config may have and must have, its name and its seed."""
    sections = TOP_LEVEL | {name for feature in feature_configs() for name in feature.SECTIONS}
    unknown = set(config) - sections
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(
            f"{source}: unknown section {key!r}.{closest(key, sections)} Sections: {', '.join(sorted(sections))}"
        )
    for key in ("name", "model", "loss", "optimizer", "data_loader"):
        if key not in config:
            raise ConfigError(f"{source}: missing section {key!r}")
    check_folder_name(config["name"], f"{source}: name")
    config.setdefault("seed", 0)
    check_number(config, "seed", f"{source}: ", int, 0, maximum=MAX_SEED)


def check_components(config: dict, source: str) -> list[str]:
    """The model, the loss, the metrics and the callbacks; returns the metrics' log names (the trainer's monitor
    names one of them). A bare name (``"loss": "cross_entropy"``) becomes {"name": ...}, as the optimizer's does:
    what reads the config later reads one form."""
    for key in ("model", "loss", "step"):
        if isinstance(config.get(key), str):
            config[key] = {"name": config[key]}
    model_fn, model_args = check_component(config["model"], "model", f"{source}: model")
    check_component(config["loss"], "loss", f"{source}: loss")
    if "step" in config:
        check_component(config["step"], "step", f"{source}: step")
    metrics = section(config, "metrics", source, [])
    names = [build(spec, "metrics", f"{source}: metrics.{i}").name for i, spec in enumerate(metrics)]
    callbacks = [
        build(spec, "callbacks", f"{source}: callbacks.{i}")
        for i, spec in enumerate(section(config, "callbacks", source, []))
    ]
    for i, callback in enumerate(callbacks):
        if callback.name in [c.name for c in callbacks[:i]]:
            raise ConfigError(f"{source}: callbacks.{i}: {callback.name} is listed twice")
    if sum(callback.evaluated for callback in callbacks) > 1:
        raise ConfigError(
            f"{source}: callbacks: only one callback may choose the parameters to evaluate "
            f"({', '.join(c.name for c in callbacks if c.evaluated)} do)"
        )
    check_class_count(config, model_fn, model_args, source)
    return names


def check_optimizer(config: dict, source: str) -> None:
    """The optimizer (a bare name becomes {"name": ...}), its schedules and its gradient transforms; or its groups,
    each checked so, and the frozen key paths."""
    if isinstance(config["optimizer"], str):
        config["optimizer"] = {"name": config["optimizer"]}
    optimizer = config["optimizer"]
    if isinstance(optimizer, dict) and "groups" in optimizer:
        check_groups(optimizer, f"{source}: optimizer")
    else:
        check_one_optimizer(optimizer, f"{source}: optimizer")
    if "frozen" in optimizer:
        check_key_paths(optimizer["frozen"], f"{source}: optimizer.frozen")


def check_groups(optimizer: dict, where: str) -> None:
    """``{"groups": {name: {"params": [key paths], "name": ..., "args": ..., ...}}, "frozen": [...]}``."""
    extra = sorted(set(optimizer) - {"groups", "frozen"})
    if extra:
        raise ConfigError(
            f'{where}.{extra[0]}: with "groups", each group has its own (optimizer.groups.<name>.{extra[0]}); the '
            f'section holds only "groups" and "frozen"'
        )
    groups = optimizer["groups"]
    example = '{"head": {"params": ["params.head"], "name": "adam", "args": {"lr": 0.001}}}'
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}.groups: expected an object of named groups such as {example}, got {show(groups)}")
    for name, group in groups.items():
        if not GROUP_NAME.fullmatch(name):  # it names the group's state in checkpoints and its lr/<name> column
            raise ConfigError(
                f"{where}.groups: group name {name!r}: expected letters, digits and _, starting with a letter"
            )
        place = f"{where}.groups.{name}"
        if not isinstance(group, dict) or "params" not in group:
            raise ConfigError(
                f'{place}: expected {{"params": ["params.head"], "name": "adam", "args": {{...}}}}, got {show(group)}'
            )
        if "frozen" in group:
            raise ConfigError(f"{place}.frozen: frozen applies to every group: give it as optimizer.frozen")
        check_key_paths(group["params"], f"{place}.params")
        if not group["params"]:
            raise ConfigError(f'{place}.params: expected at least one key path such as "params.backbone"')
        check_one_optimizer({k: v for k, v in group.items() if k != "params"}, place)


def check_one_optimizer(optimizer: Any, where: str) -> None:
    """One optimizer (the section, or a group of it) with its schedules and gradient transforms."""
    scheduled = isinstance(optimizer, dict) and "schedule" in optimizer
    _, optimizer_args = check_component(optimizer, "optimizer", where, supplied=("lr",) if scheduled else ())
    for key, value in optimizer_args.items():
        if isinstance(value, dict):
            check_schedule(value, f"{where}.args.{key}")
    if "schedule" in optimizer:
        check_schedule(optimizer["schedule"], f"{where}.schedule")
    elif "lr" in optimizer_args and not isinstance(optimizer_args["lr"], dict):
        check_number(optimizer_args, "lr", f"{where}.args.", float, 0.0)
    transforms = optimizer.get("transforms", [])
    if not isinstance(transforms, list):
        raise ConfigError(f"{where}.transforms: expected a list of components")
    for i, spec in enumerate(transforms):
        check_component(spec, "transforms", f"{where}.transforms.{i}")


def check_loaders(config: dict, source: str) -> None:
    """The data loaders by split; augmentation only on the train split."""
    loaders = config["data_loader"]
    if not isinstance(loaders, dict) or "train" not in loaders:
        raise ConfigError(
            f'{source}: data_loader: expected an object with "train" (and optionally "validation", "test") components'
        )
    for split, spec in loaders.items():
        if split not in LOADER_SPLITS:
            raise ConfigError(
                f"{source}: data_loader.{split}: unknown split{closest(split, LOADER_SPLITS)} "
                f"Expected: {', '.join(LOADER_SPLITS)}"
            )
        _, args = check_component(spec, "data_loader", f"{source}: data_loader.{split}", supplied=("seed",))
        if "batch_size" in args:
            check_number(spec["args"], "batch_size", f"{source}: data_loader.{split}.args.", int, 1, maximum=MAX_BATCH)
        if isinstance(spec, dict) and not isinstance(spec.get("allow_nonfinite", False), bool):
            raise ConfigError(
                f"{source}: data_loader.{split}.allow_nonfinite: expected true (train on NaN and infinite inputs) "
                f"or false (refuse them: the default), got {show(spec['allow_nonfinite'])}"
            )
        if split != "train" and isinstance(spec, dict) and "augment" in spec:
            raise ConfigError(
                f"{source}: data_loader.{split}.augment: augmentation belongs to the train split; "
                "evaluation applies the train list's deterministic ops (normalize) by itself"
            )


def check_trainer(config: dict, names: list[str], source: str) -> None:
    """The trainer's settings; ``names``: the metrics' log names, which the monitor may name."""
    trainer = section(config, "trainer", source, {})
    cache = trainer.pop("compilation_cache", None)  # a setting of configs before it became the machine's
    if cache is not None:
        log.warning(
            f"{source}: trainer.compilation_cache {show(cache)} is not used: the compilation cache is the machine's "
            f"({compilation_cache.WHERE}), since a config, which a run folder hands on, must not choose which "
            f"compiled programs run"
        )
    for key in trainer:
        if key not in TRAINER_DEFAULTS and key not in ("profile",):
            raise ConfigError(
                f"{source}: trainer.{key}: unknown setting.{closest(key, TRAINER_DEFAULTS)} "
                f"Settings: {', '.join(TRAINER_DEFAULTS)}"
            )
    for key, value in TRAINER_DEFAULTS.items():
        trainer.setdefault(key, value)
    where = f"{source}: trainer."
    check_number(trainer, "epochs", where, int, 1, maximum=MAX_EPOCHS)
    check_number(trainer, "save_period", where, int, 1, maximum=MAX_EPOCHS)
    check_number(trainer, "early_stop", where, int, 0, maximum=MAX_EPOCHS)
    check_number(trainer, "log_every", where, int, 1, maximum=MAX_STEPS)
    check_number(trainer, "steps_per_call", where, int, 1, allow=("auto",), maximum=MAX_STEPS)
    check_number(trainer, "divergence_factor", where, float, 1.0, allow=(None,))
    every = trainer["checkpoint_every"]
    if every is not None:
        if not isinstance(every, dict) or not every or set(every) - set(CHECKPOINT_EVERY_KEYS):
            raise ConfigError(
                f'{where}checkpoint_every: expected null or an object of "steps", "minutes" and '
                f'"keep", got {show(every)}'
            )
        if "steps" in every:
            check_number(every, "steps", f"{where}checkpoint_every.", int, 1, maximum=MAX_STEPS)
        if "minutes" in every:
            check_number(every, "minutes", f"{where}checkpoint_every.", float, 0.0, maximum=MAX_EPOCHS)
        if "keep" in every:
            check_number(every, "keep", f"{where}checkpoint_every.", int, 0, maximum=MAX_EPOCHS)
    check_number(trainer, "accumulate_steps", where, int, 1, maximum=MAX_STEPS)
    try:
        from training.precision import policy_of

        policy_of(trainer["precision"])
    except ValueError as error:
        raise ConfigError(f"{where}precision: {error}") from None
    if not isinstance(trainer["async_checkpoints"], bool):
        raise ConfigError(f"{where}async_checkpoints: expected true or false, got {show(trainer['async_checkpoints'])}")
    check_save_dir(trainer, config["name"], where)
    if trainer["run_id"] is not None:
        check_folder_name(trainer["run_id"], f"{where}run_id")
    monitor = trainer["monitor"]
    schedule = config["optimizer"].get("schedule")
    if monitor == "off" and isinstance(schedule, dict) and schedule.get("name") == "reduce_on_plateau":
        raise ConfigError(
            f'{where}monitor: "off", but optimizer.schedule reduce_on_plateau follows the monitored metric; '
            f'name one, such as "min val/loss"'
        )
    if monitor != "off":
        mode, _, metric = monitor.partition(" ") if isinstance(monitor, str) else ("", "", "")
        if mode not in ("min", "max") or not metric:
            raise ConfigError(
                f'{where}monitor: expected "off" or "min|max <metric>" such as "max val/accuracy", got {show(monitor)}'
            )
        known = monitored_names(config, names)
        if metric not in known:
            raise ConfigError(
                f"{where}monitor: {metric!r} is not logged.{closest(metric, known)} Logged: {', '.join(known)}"
            )
    check_profile(config, source)


def check_profile(config: dict, source: str) -> None:
    """The shape of trainer.profile: the steps a profiler trace covers."""
    profile = config["trainer"].get("profile")
    if profile is not None:
        where = f"{source}: trainer.profile"
        if not isinstance(profile, dict) or set(profile) != set(PROFILE_KEYS):
            raise ConfigError(f'{where}: expected {{"start_step": N, "num_steps": K}} or null, got {show(profile)}')
        check_number(profile, "start_step", f"{where}.", int, 1, maximum=MAX_STEPS)
        check_number(profile, "num_steps", f"{where}.", int, 1, maximum=MAX_STEPS)


def check_features(config: dict, source: str) -> None:
    """The sections of the optional features the project has (FEATURE_CONFIGS), each by its own check."""
    for feature in feature_configs():
        feature.check(config, source)


def check_mesh(config: dict, source: str) -> None:
    """The device mesh: {"data": D, "fsdp": F}; the device count is checked when the devices are known."""
    try:
        from training.devices.mesh import check_mesh_section

        config["mesh"] = check_mesh_section(config.get("mesh", {}), f"{source}: mesh")
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_class_count(config: dict, model_fn: Callable, model_args: dict, source: str) -> None:
    """A metric's `k` above the model's class count (num_classes, or vocab_size of a language model), or a loss's
    class_weights of another count, would fail only once the step is traced, after the data is read; both are in the
    config."""
    classes = next(
        (
            model_args.get(n, default_of(model_fn, n, None))
            for n in CLASS_COUNT_ARGUMENTS
            if n in inspect.signature(model_fn).parameters
        ),
        None,
    )
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
        return  # the model's own check reports it
    loss = config["loss"] if isinstance(config["loss"], dict) else {}
    weights = (loss.get("args") or {}).get("class_weights")
    if isinstance(weights, list) and len(weights) != classes:
        raise ConfigError(
            f"{source}: loss.args.class_weights: {len(weights)} weights, but the model scores {classes} classes"
        )
    for i, spec in enumerate(config["metrics"]):
        name = spec if isinstance(spec, str) else spec["name"]
        fn = available("metrics")[name]
        args = {} if isinstance(spec, str) else spec.get("args") or {}
        k = args.get("k", default_of(fn, "k", None))
        if isinstance(k, int) and k > classes:
            raise ConfigError(f"{source}: metrics.{i}.args.k: must be at most the model's {classes} classes, got {k}")


def check_schedule(spec: Any, where: str) -> None:
    """A schedule component; an argument it annotates as a step count (``training/schedules.py``: ``Steps``) may be
    a number of steps, {"steps": N}, {"epochs": N} (2.5 allowed) or "all" (the run)."""
    from training.schedules import step_arguments

    if not isinstance(spec, dict):
        raise ConfigError(f'{where}: expected {{"name": ..., "args": {{...}}}}, got {show(spec)}')
    args = {} if spec.get("args") is None else spec["args"]
    if not isinstance(args, dict):
        raise ConfigError(f"{where}.args: expected an object, got {show(args)}")
    name = spec.get("name")
    fn = available("schedule").get(name) if isinstance(name, str) else None
    counts = step_arguments(fn) if fn is not None else ()
    plain = {k: v for k, v in args.items() if k not in counts}
    check_component({**spec, "args": plain}, "schedule", where, supplied=tuple(k for k in args if k not in plain))
    for key in counts:
        if key in args:
            check_step_count(args, key, f"{where}.args.")


def check_step_count(args: dict, key: str, prefix: str) -> None:
    """One of a schedule's step counts as a config gives it (``prefix``: its place up to the key)."""
    value, where = args[key], f"{prefix}{key}"
    expected = f'expected a number of steps, {{"steps": N}}, {{"epochs": N}} or "all", got {show(value)}'
    if value == "all":
        return
    if isinstance(value, dict):
        if len(value) != 1 or set(value) - {"steps", "epochs"}:
            raise ConfigError(f"{where}: {expected}")
        if "epochs" in value:
            check_number(value, "epochs", f"{where}.", float, 0.0, maximum=MAX_EPOCHS)
            if value["epochs"] <= 0:
                raise ConfigError(f"{where}.epochs: must be > 0, got {show(value['epochs'])}")
        else:
            check_number(value, "steps", f"{where}.", int, 0, maximum=MAX_STEPS)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: {expected}")
    check_number(args, key, prefix, int, 0, maximum=MAX_STEPS)


def metric_names(config: dict, source: str = "config.json") -> list[str]:
    """The log names of the configured metrics, built without touching data."""
    return [build(spec, "metrics", f"{source}: metrics.{i}").name for i, spec in enumerate(config.get("metrics", []))]


def monitored_names(config: dict, names: list[str] | None = None) -> list[str]:
    names = metric_names(config) if names is None else names
    logged = ["train/loss"] + [f"train/{m}" for m in names]
    if "validation" in config["data_loader"]:
        logged += ["val/loss"] + [f"val/{m}" for m in names]
    return logged
