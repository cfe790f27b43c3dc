"""Config files: reading, command-line overrides, validation and the one resolver that builds every component.

Every component in `config.json` has the form {"name": ..., "args": {...}}; `name` is looked up among the public
names of the module that holds that kind of component (`__all__` where the module defines it), and `args` must
bind to that function's signature. All of this is checked before any data is read or anything is compiled, and
every problem is reported as one line that names its place in the file: `config.json: optimizer.args.lr: ...`.
"""
from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import importlib
import inspect
import json
import logging
import logging.config
import sys
from pathlib import Path
from typing import Any, Callable

# Where each kind of component lives, and the list of the names a config may use (the module's __all__ unless
# named). Adding a component = writing a function in that module and listing it.
COMPONENT_MODULES = {
    "model": "model.model",
    "loss": "training.losses",
    "metrics": "training.metrics",
    "optimizer": ("training.optimizers", "OPTIMIZERS"),
    "schedule": "training.schedules",
    "transforms": ("training.optimizers", "TRANSFORMS"),
    "data_loader": "data_loader.data_loaders",
}
# Keys besides "name" and "args" that a kind of component may have.
EXTRA_KEYS = {"optimizer": ("schedule", "transforms")}

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
}
WANDB_DEFAULTS = {"enabled": False, "project": "jax-template", "entity": None, "group": None, "tags": [],
                  "mode": "offline", "id": None}
TENSORBOARD_DEFAULTS = {"enabled": False}
PROFILE_KEYS = ("start_step", "num_steps")
TOP_LEVEL = {"name", "seed", "model", "loss", "metrics", "optimizer", "data_loader", "trainer", "wandb", "tensorboard"}
LOADER_SPLITS = ("train", "validation", "test")
# Kinds whose functions take data first (loss(outputs, targets, **hyperparameters)): the config sets the rest.
DATA_ARGUMENTS = {"loss": 2}
# Keyword arguments the training step fills in itself (a per-element mask), never the config.
STEP_ARGUMENTS = {"loss": ("mask",)}


class ConfigError(Exception):
    """A problem with the user's config: reported as one line, exit status 2."""


def closest(name: str, choices) -> str:
    match = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" Did you mean {match[0]!r}?" if match else ""


# ---------------------------------------------------------------------------------------------------------- reading
def read_json(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the top level must be an object {{...}}")
    return config


def set_path(config: dict, dotted: str, value: Any, source: str) -> None:
    """Sets config[a][b][c] = value for 'a.b.c'; integer parts index lists (metrics.0.args.k)."""
    parts = dotted.split(".")
    node = config
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{source}: {'.'.join(parts[:i + 1])}: no such list index")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"{source}: {'.'.join(parts[:i + 1])} is a value, not a section")
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"{source}: {dotted}: no such list index")
        node[int(last)] = value
    else:
        node[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected key.path=value")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare word is a string: --set model.name=mlp
    return key.strip(), value


def config_hash(config: dict) -> str:
    """Hash of what defines the weights and their training (not paths, epochs or trackers)."""
    keys = ("model", "loss", "optimizer", "seed")
    canonical = json.dumps({k: config.get(k) for k in keys}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------------ resolution
def available(kind: str) -> dict[str, Callable]:
    module_name, list_name = COMPONENT_MODULES[kind] if isinstance(COMPONENT_MODULES[kind], tuple) else (
        COMPONENT_MODULES[kind], "__all__")
    module = importlib.import_module(module_name)
    names = getattr(module, list_name, None)
    if names is None:
        names = [n for n, obj in vars(module).items()
                 if not n.startswith("_") and callable(obj) and getattr(obj, "__module__", None) == module.__name__]
    return {name: getattr(module, name) for name in names}


def signature_text(name: str, fn: Callable) -> str:
    return f"{name}{inspect.signature(fn)}"


def check_component(spec: Any, kind: str, where: str, supplied: tuple[str, ...] = ()) -> tuple[Callable, dict]:
    """Looks up spec['name'] and binds spec['args']; `supplied` are arguments the program fills in itself."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{where}: expected {{\"name\": ..., \"args\": {{...}}}}, got {json.dumps(spec)}")
    allowed = ("name", "args", *EXTRA_KEYS.get(kind, ()))
    extra = set(spec) - set(allowed)
    if extra:
        raise ConfigError(f"{where}: unexpected key {sorted(extra)[0]!r}; a {kind} component has "
                          + ", ".join(f'"{k}"' for k in allowed))
    options = available(kind)
    name = spec["name"]
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: expected a string, got {json.dumps(name)}")
    if name not in options:
        raise ConfigError(f"{where}.name: unknown {kind} {name!r}; available: {', '.join(sorted(options))}."
                          f"{closest(name, options)}")
    fn = options[name]
    args = spec.get("args") or {}
    if not isinstance(args, dict):
        raise ConfigError(f"{where}.args: expected an object, got {json.dumps(args)}")
    params = dict(inspect.signature(fn).parameters)
    for data_arg in list(params)[:DATA_ARGUMENTS.get(kind, 0)]:
        supplied = (*supplied, data_arg)
        params.pop(data_arg)
    supplied = (*supplied, *(a for a in STEP_ARGUMENTS.get(kind, ()) if a in params))
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key, value in args.items():
        if key in supplied:
            raise ConfigError(f"{where}.args.{key}: set by the trainer, not the config")
        if key not in params and not takes_kwargs:
            raise ConfigError(f"{where}.args.{key}: unknown argument{closest(key, params)} "
                              f"Accepted: {signature_text(name, fn)}")
        if key in params:
            check_type(value, params[key].default, f"{where}.args.{key}")
    missing = [p for p, v in params.items()
               if v.default is inspect.Parameter.empty and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)
               and p not in args and p not in supplied]
    if missing:
        raise ConfigError(f"{where}.args: missing argument {missing[0]!r}. Accepted: {signature_text(name, fn)}")
    return fn, dict(args)


def check_type(value: Any, default: Any, where: str) -> None:
    """Type check against the default's type: a number where a number is expected, and so on."""
    if default is inspect.Parameter.empty or default is None or value is None:
        return
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        # a component dict is accepted where a number is: hyperparameters may be schedules
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or isinstance(value, dict)
        if isinstance(default, int) and isinstance(value, float) and not value.is_integer():
            ok = False
    elif isinstance(default, str):
        ok = isinstance(value, (str, dict)) or callable(value)
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
    else:
        return
    if not ok:
        expected = type(default).__name__
        raise ConfigError(f"{where}: expected {expected} (like the default {json.dumps(default)}), "
                          f"got {json.dumps(value)}")


def check_number(section: dict, key: str, where: str, kind=int, minimum=None, allow=()) -> None:
    value = section.get(key)
    if value in allow:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        expected = " or ".join([kind.__name__, *map(json.dumps, allow)])
        raise ConfigError(f"{where}.{key}: expected {expected}, got {json.dumps(value)}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}.{key}: must be >= {minimum}, got {value}")


def validate(config: dict, source: str = "config.json") -> dict:
    """Checks the whole config and fills defaults; returns the resolved config (what gets saved)."""
    config = copy.deepcopy(config)
    unknown = set(config) - TOP_LEVEL
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{source}: unknown section {key!r}.{closest(key, TOP_LEVEL)} "
                          f"Sections: {', '.join(sorted(TOP_LEVEL))}")
    for key in ("name", "model", "loss", "optimizer", "data_loader"):
        if key not in config:
            raise ConfigError(f"{source}: missing section {key!r}")
    if not isinstance(config["name"], str) or not config["name"] or "/" in config["name"]:
        raise ConfigError(f"{source}: name: expected a non-empty run title without '/', got {json.dumps(config['name'])}")
    config.setdefault("seed", 0)
    check_number(config, "seed", source)

    check_component(config["model"], "model", f"{source}: model")
    check_component(config["loss"], "loss", f"{source}: loss")
    metrics = config.setdefault("metrics", [])
    if not isinstance(metrics, list):
        raise ConfigError(f"{source}: metrics: expected a list of components")
    for i, spec in enumerate(metrics):
        check_component(spec, "metrics", f"{source}: metrics.{i}")

    optimizer = config["optimizer"]
    _, optimizer_args = check_component(optimizer, "optimizer", f"{source}: optimizer",
                                        supplied=("lr",) if "schedule" in optimizer else ())
    for key, value in optimizer_args.items():
        if isinstance(value, dict):
            check_schedule(value, f"{source}: optimizer.args.{key}")
    if "schedule" in optimizer:
        check_schedule(optimizer["schedule"], f"{source}: optimizer.schedule")
    elif "lr" in optimizer_args and not isinstance(optimizer_args["lr"], dict):
        check_number(optimizer_args, "lr", f"{source}: optimizer.args", float, 0.0)
    transforms = optimizer.get("transforms", [])
    if not isinstance(transforms, list):
        raise ConfigError(f"{source}: optimizer.transforms: expected a list of components")
    for i, spec in enumerate(transforms):
        check_component(spec, "transforms", f"{source}: optimizer.transforms.{i}")

    loaders = config["data_loader"]
    if not isinstance(loaders, dict) or "train" not in loaders:
        raise ConfigError(f"{source}: data_loader: expected an object with \"train\" (and optionally "
                          f"\"validation\", \"test\") components")
    for split, spec in loaders.items():
        if split not in LOADER_SPLITS:
            raise ConfigError(f"{source}: data_loader.{split}: unknown split{closest(split, LOADER_SPLITS)} "
                              f"Expected: {', '.join(LOADER_SPLITS)}")
        _, args = check_component(spec, "data_loader", f"{source}: data_loader.{split}", supplied=("seed",))
        if "batch_size" in args:
            check_number(args, "batch_size", f"{source}: data_loader.{split}.args", int, 1)

    trainer = config.setdefault("trainer", {})
    for key in trainer:
        if key not in TRAINER_DEFAULTS and key not in ("profile",):
            raise ConfigError(f"{source}: trainer.{key}: unknown setting.{closest(key, TRAINER_DEFAULTS)} "
                              f"Settings: {', '.join(TRAINER_DEFAULTS)}")
    for key, value in TRAINER_DEFAULTS.items():
        trainer.setdefault(key, value)
    where = f"{source}: trainer"
    check_number(trainer, "epochs", where, int, 1)
    check_number(trainer, "save_period", where, int, 1)
    check_number(trainer, "early_stop", where, int, 0)
    check_number(trainer, "log_every", where, int, 1)
    check_number(trainer, "steps_per_call", where, int, 1, allow=("auto",))
    check_number(trainer, "divergence_factor", where, float, 1.0, allow=(None,))
    if not isinstance(trainer["save_dir"], str):
        raise ConfigError(f"{where}.save_dir: expected a path string")
    monitor = trainer["monitor"]
    if monitor != "off":
        mode, _, metric = str(monitor).partition(" ")
        if mode not in ("min", "max") or not metric:
            raise ConfigError(f"{where}.monitor: expected \"off\" or \"min|max <metric>\" such as "
                              f"\"max val/accuracy\", got {json.dumps(monitor)}")
        known = monitored_names(config)
        if metric not in known:
            raise ConfigError(f"{where}.monitor: {metric!r} is not logged.{closest(metric, known)} "
                              f"Logged: {', '.join(known)}")

    wandb = config.setdefault("wandb", {})
    for key in wandb:
        if key not in WANDB_DEFAULTS:
            raise ConfigError(f"{source}: wandb.{key}: unknown setting.{closest(key, WANDB_DEFAULTS)}")
    for key, value in WANDB_DEFAULTS.items():
        wandb.setdefault(key, value)
    if wandb["mode"] not in ("online", "offline", "disabled"):
        raise ConfigError(f"{source}: wandb.mode: expected online, offline or disabled, got {json.dumps(wandb['mode'])}")
    check_tracker_settings(config, source)
    return config


def check_schedule(spec: Any, where: str) -> None:
    """A schedule component; its step counts may be given in epochs ({"epochs": 2.5}) or as "all" (the run)."""
    from training.schedules import STEP_ARGUMENTS

    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected {{\"name\": ..., \"args\": {{...}}}}, got {json.dumps(spec)}")
    args = spec.get("args") or {}
    plain = {k: v for k, v in args.items() if not (k in STEP_ARGUMENTS and (v == "all" or isinstance(v, dict)))}
    check_component({**spec, "args": plain}, "schedule", where, supplied=tuple(k for k in args if k not in plain))
    for key in STEP_ARGUMENTS:
        value = args.get(key)
        if isinstance(value, dict):
            if set(value) != {"epochs"}:
                raise ConfigError(f"{where}.args.{key}: expected a number of steps, {{\"epochs\": N}} or \"all\", "
                                  f"got {json.dumps(value)}")
            check_number(value, "epochs", f"{where}.args.{key}", float, 0.0)
        elif value is not None and value != "all":
            check_number(args, key, f"{where}.args", int, 0)


def steps_of(value: Any, steps_per_epoch: int, epochs: int) -> Any:
    """A schedule's step count from the config: steps, {"epochs": N} or "all" (every step of the run)."""
    if value == "all":
        return steps_per_epoch * epochs
    if isinstance(value, dict):
        return max(1, round(value["epochs"] * steps_per_epoch))
    return value


def check_tracker_settings(config: dict, source: str) -> None:
    """Types of the wandb and tensorboard sections and the shape of trainer.profile."""
    wandb = config["wandb"]
    if not isinstance(wandb["enabled"], bool):
        raise ConfigError(f"{source}: wandb.enabled: expected true or false, got {json.dumps(wandb['enabled'])}")
    for key in ("project", "entity", "group", "id"):
        if wandb[key] is not None and (not isinstance(wandb[key], str) or not wandb[key]):
            raise ConfigError(f"{source}: wandb.{key}: expected a non-empty string or null, got {json.dumps(wandb[key])}")
    if not isinstance(wandb["tags"], list) or not all(isinstance(t, str) for t in wandb["tags"]):
        raise ConfigError(f"{source}: wandb.tags: expected a list of strings, got {json.dumps(wandb['tags'])}")
    if wandb["id"] is not None and not all(c.isalnum() or c in "-_" for c in wandb["id"]):
        raise ConfigError(f"{source}: wandb.id: letters, digits, '-' and '_' only, got {json.dumps(wandb['id'])}")

    tensorboard = config.setdefault("tensorboard", {})
    if not isinstance(tensorboard, dict):
        raise ConfigError(f"{source}: tensorboard: expected an object such as {{\"enabled\": true}}")
    for key in tensorboard:
        if key not in TENSORBOARD_DEFAULTS:
            raise ConfigError(f"{source}: tensorboard.{key}: unknown setting.{closest(key, TENSORBOARD_DEFAULTS)} "
                              f"Settings: {', '.join(TENSORBOARD_DEFAULTS)}")
    for key, value in TENSORBOARD_DEFAULTS.items():
        tensorboard.setdefault(key, value)
    if not isinstance(tensorboard["enabled"], bool):
        raise ConfigError(f"{source}: tensorboard.enabled: expected true or false, "
                          f"got {json.dumps(tensorboard['enabled'])}")

    profile = config["trainer"].get("profile")
    if profile is not None:
        where = f"{source}: trainer.profile"
        if not isinstance(profile, dict) or set(profile) != set(PROFILE_KEYS):
            raise ConfigError(f"{where}: expected {{\"start_step\": N, \"num_steps\": K}} or null, "
                              f"got {json.dumps(profile)}")
        check_number(profile, "start_step", where, int, 1)
        check_number(profile, "num_steps", where, int, 1)


def metric_names(config: dict) -> list[str]:
    """The log names of the configured metrics, built without touching data."""
    return [build(spec, "metrics").name for spec in config.get("metrics", [])]


def monitored_names(config: dict) -> list[str]:
    names = ["train/loss"] + [f"train/{m}" for m in metric_names(config)]
    if "validation" in config["data_loader"]:
        names += ["val/loss"] + [f"val/{m}" for m in metric_names(config)]
    return names


def build(spec: Any, kind: str, where: str = "config.json", **supplied) -> Any:
    """Builds one component; errors its constructor raises (impossible values) are reported at its place."""
    fn, args = check_component(spec, kind, where, tuple(supplied))
    if kind in DATA_ARGUMENTS:
        return functools.partial(fn, **args)
    try:
        return fn(**args, **supplied)
    except (ValueError, TypeError, FileNotFoundError, OSError) as error:
        raise ConfigError(f"{where}: {error}") from None


def build_optimizer(config: dict, steps_per_epoch: int = 1, source: str = "config.json"):
    """(optimizer, learning-rate function step -> lr): the optimizer with its schedule (as `lr`) and gradient
    transforms chained in front. Schedule lengths given in epochs or as "all" become steps of this run."""
    from training import optimizers, schedules

    def schedule(spec, where):
        args = {k: steps_of(v, steps_per_epoch, config["trainer"]["epochs"]) if k in schedules.STEP_ARGUMENTS else v
                for k, v in (spec.get("args") or {}).items()}
        return build({**spec, "args": args}, "schedule", where)

    spec = config["optimizer"]
    supplied = {}
    if "schedule" in spec:
        supplied["lr"] = schedule(spec["schedule"], f"{source}: optimizer.schedule")
    transforms = [build(t, "transforms", f"{source}: optimizer.transforms.{i}")
                  for i, t in enumerate(spec.get("transforms", []))]
    for key, value in (spec.get("args") or {}).items():
        if isinstance(value, dict):  # any schedulable hyperparameter may itself be a schedule component
            supplied[key] = schedule(value, f"{source}: optimizer.args.{key}")
    args = {k: v for k, v in (spec.get("args") or {}).items() if k not in supplied}
    optimizer = build({**spec, "args": args}, "optimizer", f"{source}: optimizer", **supplied)
    lr = supplied.get("lr", args.get("lr", _default(available("optimizer")[spec["name"]], "lr", 0.0)))
    lr_fn = lr if callable(lr) else (lambda step: lr)
    return (optimizers.chain(*transforms, optimizer) if transforms else optimizer), lr_fn


def _default(fn: Callable, name: str, otherwise: Any) -> Any:
    parameter = inspect.signature(fn).parameters.get(name)
    return otherwise if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def monitor_of(config: dict):
    """``trainer.monitor`` parsed once (validated by ``validate``): a ``Monitor``, or None when "off"."""
    from training.trainer import Monitor

    text = config["trainer"]["monitor"]
    return None if text == "off" else Monitor(*text.split(" ", 1))


def load_config(path: str | Path, overrides: list[str] = (), source: str | None = None) -> dict:
    source = source or str(path)
    config = read_json(path)
    for text in overrides:
        key, value = parse_override(text)
        set_path(config, key, value, f"--set {key}")
    return validate(config, source)


# -------------------------------------------------------------------------------------------------------- logging
def setup_logging(run_dir: Path | None, config_path: str | Path = "logger_config.json", verbose: bool = True) -> None:
    """Console + rotating file (`train.log` in the run folder) from logger_config.json."""
    path = Path(config_path)
    if not path.exists():
        path = Path(__file__).parent / "logger_config.json"
    spec = json.loads(path.read_text())
    for handler in spec.get("handlers", {}).values():
        if "filename" in handler:
            if run_dir is None:
                handler["class"], handler["filename"] = "logging.NullHandler", None
                handler.pop("filename"), handler.pop("maxBytes", None), handler.pop("backupCount", None)
                handler.pop("encoding", None)
            else:
                handler["filename"] = str(Path(run_dir) / handler["filename"])
    logging.config.dictConfig(spec)


def fail(message: str, status: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)


# --------------------------------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    """python utils.py plot saved/<name>/<run_id> [-o curves.png]"""
    import argparse

    parser = argparse.ArgumentParser(prog="utils.py", description="Tools for run folders.")
    commands = parser.add_subparsers(dest="command", required=True)
    plot = commands.add_parser("plot", help="draw a run folder's metrics.jsonl as curves.png")
    plot.add_argument("run_dir", help="a run folder, e.g. saved/<name>/<run_id>")
    plot.add_argument("-o", "--out", help="image file (default: <run_dir>/curves.png)")
    args = parser.parse_args(argv)

    from training.plots import plot_run

    try:
        path = plot_run(args.run_dir, args.out)
    except (OSError, ValueError) as error:  # no metrics.jsonl, an unreadable line, nothing to plot
        fail(str(error))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
