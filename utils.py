"""The config's schema (every section's defaults and checks: ``validate``) and the one assembly of a run from it
(``assemble``), with what the scripts import of the rest: reading and overrides (training/config_file.py), components
by name (training/components.py), the command line (training/cli.py).

Every component in `config.json` has the form {"name": ..., "args": {...}}; `name` is looked up among the
functions registered for that kind of component (``model/registry.py``), and `args` must bind to that function's
signature. All of this is checked before any data is read or anything is compiled, and
every problem is reported as one line that names its place in the file: `config.json: optimizer.args.lr: ...`.
"""

from __future__ import annotations

import copy
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The config API in one place for the scripts: reading (training/config_file.py), components by name
# (training/components.py) and the command-line helpers (training/cli.py), with the schema and the assembly here.
from training.cli import ArgumentParser, fail, setup_logging  # noqa: F401
from training.components import (  # noqa: F401
    CLASS_COUNT_ARGUMENTS,
    COMPONENT_MODULES,
    available,
    build,
    build_optimizer,
    check_component,
    components_text,
    default_of,
)
from training.config_file import (  # noqa: F401
    ConfigError,
    check_values,
    closest,
    config_hash,
    parse_override,
    read_json,
    set_path,
    show,
)
from training.monitor import Monitor

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
WANDB_DEFAULTS = {
    "enabled": False,
    "project": "jax-template",
    "entity": None,
    "group": None,
    "tags": [],
    "mode": "offline",
    "id": None,
}
TENSORBOARD_DEFAULTS = {"enabled": False}
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
    "wandb",
    "tensorboard",
    "mesh",
    "callbacks",
}
LOADER_SPLITS = ("train", "validation", "test")


# Bounds past which a value is a typo, not a setting: a run that never ends, a step counter (int32) that wraps, a seed
# numpy refuses, a folder name the file system refuses, a config nested or numbered past anything JSON carries.
MAX_EPOCHS = 10**6
MAX_STEPS = 2**31 - 1
MAX_SEED = 2**32 - 1
MAX_BATCH = 2**24
MAX_NAME = 100


# ---------------------------------------------------------------------------------------------------------- reading


# ------------------------------------------------------------------------------------------------------ resolution


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


def validate(config: dict, source: str = "config.json") -> dict:
    """Checks the whole config and fills defaults; returns the resolved config (what gets saved)."""
    check_values(config, source)  # read_json did for the file; this covers configs built in Python
    config = copy.deepcopy(config)
    unknown = set(config) - TOP_LEVEL
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(
            f"{source}: unknown section {key!r}.{closest(key, TOP_LEVEL)} Sections: {', '.join(sorted(TOP_LEVEL))}"
        )
    for key in ("name", "model", "loss", "optimizer", "data_loader"):
        if key not in config:
            raise ConfigError(f"{source}: missing section {key!r}")
    check_folder_name(config["name"], f"{source}: name")
    config.setdefault("seed", 0)
    check_number(config, "seed", f"{source}: ", int, 0, maximum=MAX_SEED)

    model_fn, model_args = check_component(config["model"], "model", f"{source}: model")
    check_component(config["loss"], "loss", f"{source}: loss")
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

    if isinstance(config["optimizer"], str):
        config["optimizer"] = {"name": config["optimizer"]}
    optimizer = config["optimizer"]
    scheduled = isinstance(optimizer, dict) and "schedule" in optimizer
    _, optimizer_args = check_component(
        optimizer, "optimizer", f"{source}: optimizer", supplied=("lr",) if scheduled else ()
    )
    for key, value in optimizer_args.items():
        if isinstance(value, dict):
            check_schedule(value, f"{source}: optimizer.args.{key}")
    if "schedule" in optimizer:
        check_schedule(optimizer["schedule"], f"{source}: optimizer.schedule")
    elif "lr" in optimizer_args and not isinstance(optimizer_args["lr"], dict):
        check_number(optimizer_args, "lr", f"{source}: optimizer.args.", float, 0.0)
    transforms = optimizer.get("transforms", [])
    if not isinstance(transforms, list):
        raise ConfigError(f"{source}: optimizer.transforms: expected a list of components")
    for i, spec in enumerate(transforms):
        check_component(spec, "transforms", f"{source}: optimizer.transforms.{i}")

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
        if split != "train" and isinstance(spec, dict) and "augment" in spec:
            raise ConfigError(
                f"{source}: data_loader.{split}.augment: augmentation belongs to the train split; "
                "evaluation applies the train list's deterministic ops (normalize) by itself"
            )

    build_augment(config, source)  # every op's name and arguments, before any data is read

    trainer = section(config, "trainer", source, {})
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

    wandb = section(config, "wandb", source, {})
    for key in wandb:
        if key not in WANDB_DEFAULTS:
            raise ConfigError(f"{source}: wandb.{key}: unknown setting.{closest(key, WANDB_DEFAULTS)}")
    for key, value in WANDB_DEFAULTS.items():
        wandb.setdefault(key, value)
    if wandb["mode"] not in ("online", "offline", "disabled"):
        raise ConfigError(f"{source}: wandb.mode: expected online, offline or disabled, got {show(wandb['mode'])}")
    check_tracker_settings(config, source)
    try:  # the device mesh: {"data": D, "fsdp": F}; the device count is checked when the devices are known
        from training.distributed import check_mesh_section

        config["mesh"] = check_mesh_section(config.get("mesh", {}), f"{source}: mesh")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return config


def check_class_count(config: dict, model_fn: Callable, model_args: dict, source: str) -> None:
    """A metric's `k` above the model's class count (num_classes, or vocab_size of a language model) would fail
    only once the step is traced, after the data is read; both are in the config."""
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
    for i, spec in enumerate(config["metrics"]):
        name = spec if isinstance(spec, str) else spec["name"]
        fn = available("metrics")[name]
        args = {} if isinstance(spec, str) else spec.get("args") or {}
        k = args.get("k", default_of(fn, "k", None))
        if isinstance(k, int) and k > classes:
            raise ConfigError(f"{source}: metrics.{i}.args.k: must be at most the model's {classes} classes, got {k}")


def check_schedule(spec: Any, where: str) -> None:
    """A schedule component; its step counts may be given in epochs ({"epochs": 2.5}) or as "all" (the run)."""
    from training.schedules import STEP_COUNT_ARGUMENTS

    if not isinstance(spec, dict):
        raise ConfigError(f'{where}: expected {{"name": ..., "args": {{...}}}}, got {show(spec)}')
    args = {} if spec.get("args") is None else spec["args"]
    if not isinstance(args, dict):
        raise ConfigError(f"{where}.args: expected an object, got {show(args)}")
    plain = {k: v for k, v in args.items() if not (k in STEP_COUNT_ARGUMENTS and (v == "all" or isinstance(v, dict)))}
    check_component({**spec, "args": plain}, "schedule", where, supplied=tuple(k for k in args if k not in plain))
    for key in STEP_COUNT_ARGUMENTS:
        value = args.get(key)
        if isinstance(value, dict):
            if set(value) != {"epochs"}:
                raise ConfigError(
                    f'{where}.args.{key}: expected a number of steps, {{"epochs": N}} or "all", got {show(value)}'
                )
            check_number(value, "epochs", f"{where}.args.{key}.", float, 0.0, maximum=MAX_EPOCHS)
        elif value is not None and value != "all":
            check_number(args, key, f"{where}.args.", int, 0, maximum=MAX_STEPS)


def check_tracker_settings(config: dict, source: str) -> None:
    """Types of the wandb and tensorboard sections and the shape of trainer.profile."""
    wandb = config["wandb"]
    if not isinstance(wandb["enabled"], bool):
        raise ConfigError(f"{source}: wandb.enabled: expected true or false, got {show(wandb['enabled'])}")
    for key in ("project", "entity", "group", "id"):
        if wandb[key] is not None and (not isinstance(wandb[key], str) or not wandb[key]):
            raise ConfigError(f"{source}: wandb.{key}: expected a non-empty string or null, got {show(wandb[key])}")
    if not isinstance(wandb["tags"], list) or not all(isinstance(t, str) for t in wandb["tags"]):
        raise ConfigError(f"{source}: wandb.tags: expected a list of strings, got {show(wandb['tags'])}")
    # the id becomes part of the run folder's name
    run_id = wandb["id"]
    if run_id is not None and (len(run_id) > MAX_NAME or not all(c.isalnum() or c in "-_" for c in run_id)):
        raise ConfigError(
            f"{source}: wandb.id: letters, digits, '-' and '_' only, at most {MAX_NAME}, got {show(wandb['id'])}"
        )

    tensorboard = section(config, "tensorboard", source, {})
    for key in tensorboard:
        if key not in TENSORBOARD_DEFAULTS:
            raise ConfigError(
                f"{source}: tensorboard.{key}: unknown setting.{closest(key, TENSORBOARD_DEFAULTS)} "
                f"Settings: {', '.join(TENSORBOARD_DEFAULTS)}"
            )
    for key, value in TENSORBOARD_DEFAULTS.items():
        tensorboard.setdefault(key, value)
    if not isinstance(tensorboard["enabled"], bool):
        raise ConfigError(f"{source}: tensorboard.enabled: expected true or false, got {show(tensorboard['enabled'])}")

    profile = config["trainer"].get("profile")
    if profile is not None:
        where = f"{source}: trainer.profile"
        if not isinstance(profile, dict) or set(profile) != set(PROFILE_KEYS):
            raise ConfigError(f'{where}: expected {{"start_step": N, "num_steps": K}} or null, got {show(profile)}')
        check_number(profile, "start_step", f"{where}.", int, 1, maximum=MAX_STEPS)
        check_number(profile, "num_steps", f"{where}.", int, 1, maximum=MAX_STEPS)


def metric_names(config: dict, source: str = "config.json") -> list[str]:
    """The log names of the configured metrics, built without touching data."""
    return [build(spec, "metrics", f"{source}: metrics.{i}").name for i, spec in enumerate(config.get("metrics", []))]


def monitored_names(config: dict, names: list[str] | None = None) -> list[str]:
    names = metric_names(config) if names is None else names
    logged = ["train/loss"] + [f"train/{m}" for m in names]
    if "validation" in config["data_loader"]:
        logged += ["val/loss"] + [f"val/{m}" for m in names]
    return logged


def build_augment(config: dict, source: str = "config.json"):
    """The train loader's ``augment`` list built and checked (op names, arguments, ranges) without reading data;
    None when there is none. Raises ConfigError naming the place: ``config.json: data_loader.train.augment.1...``."""
    from data_loader.augment import Augment  # JAX: config errors are reported before it loads

    spec = config.get("data_loader", {}).get("train")
    ops = spec.get("augment") if isinstance(spec, dict) else None
    if ops is None:
        return None
    where = f"{source}: data_loader.train.augment"
    if not isinstance(ops, list):
        raise ConfigError(f'{where}: expected a list of {{"name": ..., "args": {{...}}}} ops, got {show(ops)}')
    built = [build(op, "augment", f"{where}.{i}") for i, op in enumerate(ops)]
    if not built:
        return None
    try:
        return Augment(built, where)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def monitor_of(config: dict):
    """``trainer.monitor`` parsed once (validated by ``validate``): a ``Monitor``, or None when "off"."""
    text = config["trainer"]["monitor"]
    return None if text == "off" else Monitor(*text.split(" ", 1))


# ------------------------------------------------------------------------------------------------------- assembly
@dataclass
class Run:
    """Everything one run is made of, built from one validated config by ``assemble``: train.py, test.py, sample.py,
    the export and the benchmarks all start here, and nothing else builds a component from a config section.

    The loaders come second (``load_data``, or ``use_data`` with loaders of your own), once the config has passed:
    nothing is read before that. Schedules count the steps of the data given then.
    """

    config: dict
    source: str
    model: Any
    loss_fn: Callable
    metrics: list
    callbacks: list
    augment: Any  # the train split's augmentation (its deterministic part also applies in evaluation), or None
    monitor: Any  # trainer.monitor parsed: a Monitor, or None when "off"
    loaders: dict = field(default_factory=dict)
    steps_per_epoch: int | None = None  # optimizer steps in an epoch of the train loader (None before the data)
    epochs: int | None = None  # the run's length in epochs, fixed with the data (debug modes shorten the loop only)

    def load_data(self, splits=None) -> dict:
        """Builds the loaders of ``splits`` (default: every split of the config) and reads each one's first batch
        now (its ``spec``: every shape and dtype the run compiles for), not mid-run."""
        loaders = {}
        for split in splits or self.config["data_loader"]:
            loaders[split] = build(
                self.config["data_loader"][split],
                "data_loader",
                f"{self.source}: data_loader.{split}",
                seed=self.config["seed"],
            )
            loaders[split].spec  # noqa: B018
        return self.use_data(loaders)

    def use_data(self, loaders: dict) -> dict:
        self.loaders.update(loaders)
        if "train" in loaders:  # a step is trainer.accumulate_steps loader batches: schedules count steps
            self.steps_per_epoch = -(-len(loaders["train"]) // self.config["trainer"]["accumulate_steps"])
            self.epochs = self.config["trainer"]["epochs"]
            self.optimizer()  # its schedules' lengths in this data's steps are checked now, with the data
        return self.loaders

    def check_data(self) -> None:
        """The train data against the run before anything compiles (a ConfigError naming what to change): a model
        that cannot take its input or has fewer outputs than it has classes, more accumulated batches than it has."""
        from training.tasks import check_model_fits_data  # JAX: config errors are reported before it loads

        loader = self.loaders["train"]
        check_model_fits_data(self.config, self.model, loader, self.augment, self.source)
        accumulate = self.config["trainer"]["accumulate_steps"]
        if accumulate > len(loader):  # each step stacks that many batches, padding what the epoch lacks
            raise ConfigError(
                f"{self.source}: trainer.accumulate_steps: {accumulate:,} batches per step, but an "
                f"epoch of the train split has {len(loader)}; at most {len(loader)}"
            )

    def optimizer(self, lr: Callable | None = None):
        """(optimizer, its learning rate as a function of the step): the config's, or with ``lr`` instead of the
        config's rate and schedule (the lr_finder callback's range)."""
        return build_optimizer(self.config, self.steps_per_epoch, self.source, lr, self.epochs)


def assemble(config: dict, source: str = "config.json") -> Run:
    """Every component of a validated config built (errors as ConfigError naming their place), the optimizer's
    hyperparameters checked; no data read."""
    run = Run(
        config,
        source,
        model=build(config["model"], "model", f"{source}: model"),
        loss_fn=build(config["loss"], "loss", f"{source}: loss"),
        metrics=[build(m, "metrics", f"{source}: metrics.{i}") for i, m in enumerate(config["metrics"])],
        callbacks=[build(c, "callbacks", f"{source}: callbacks.{i}") for i, c in enumerate(config["callbacks"])],
        augment=build_augment(config, source),
        monitor=monitor_of(config),
    )
    run.optimizer()  # its schedules' checks, with nominal epochs, before the data
    return run


def fit(config: dict, run_dir: str | Path | None = None, source: str = "config") -> list[dict]:
    """Trains from a config in this process, as a notebook would (Keras' ``fit``): validated, assembled and loaded
    as train.py does, the state initialised from the seed, checkpoints written to ``run_dir`` (default: a new
    temporary folder). Returns the rows train.py logs, one per epoch (``train/loss``, ``val/accuracy``, ``lr``...)."""
    import tempfile

    from training.trackers import History
    from training.trainer import Trainer

    config = validate(config, source)
    run = assemble(config, source)
    run.load_data()
    run.check_data()
    run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix=f"{config['name']}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    history = History()
    trainer = Trainer(run, run_dir, trackers=[history], config_hash=config_hash(config))
    trainer.init_state()
    trainer.fit()
    return history.rows


def load_config(path: str | Path, overrides: list[str] = (), source: str | None = None) -> dict:
    source = source or str(path)
    config = read_json(path, source)
    for text in overrides:
        key, value = parse_override(text)
        set_path(config, key, value, f"--set {key}")
    return validate(config, source)


# -------------------------------------------------------------------------------------------------------- logging


if __name__ == "__main__":  # python utils.py plot saved/<name>/<run_id>: the run-folder tools live with what they draw
    from training.plots import main

    sys.exit(main())
