"""The one validation of a config (``validate``: every section checked in order, their schema and defaults in
training/config/schema.py) and the one assembly of a run from it (``assemble``), with what the scripts import of the
rest: reading and overrides (training/config/file.py), components by name (training/config/components.py), the command
line (training/run/cli.py).

Every component in `config.json` has the form {"name": ..., "args": {...}}; `name` is looked up among the
functions registered for that kind of component (``model/registry.py``), and `args` must bind to that function's
signature. All of this is checked before any data is read or anything is compiled, and
every problem is reported as one line that names its place in the file: `config.json: optimizer.args.lr: ...`.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The config API in one place for the scripts: reading (training/config/file.py), components by name
# (training/config/components.py) and the command-line helpers (training/run/cli.py), with the validation and the
# assembly here.
from data_loader.loader import check_split
from training.config.components import (  # noqa: F401
    CLASS_COUNT_ARGUMENTS,
    COMPONENT_MODULES,
    available,
    build,
    build_optimizer,
    check_component,
    components_text,
    default_of,
)
from training.config.file import (  # noqa: F401
    ConfigError,
    check_values,
    closest,
    config_hash,
    parse_override,
    read_json,
    set_path,
    show,
)
from training.config.schema import (
    check_components,
    check_features,
    check_loaders,
    check_mesh,
    check_optimizer,
    check_top_level,
    check_trainer,
)
from training.config.settings import Monitor
from training.run.cli import ArgumentParser, fail, setup_logging  # noqa: F401


def validate(config: dict, source: str = "config.json") -> dict:
    """Checks the whole config and fills defaults; returns the resolved config (what gets saved). The sections in a
    fixed order, so that a config with several problems reports the same one first every time."""
    check_values(config, source)  # read_json did for the file; this covers configs built in Python
    config = copy.deepcopy(config)
    check_top_level(config, source)
    names = check_components(config, source)
    check_optimizer(config, source)
    check_loaders(config, source)
    build_augment(config, source)  # every op's name and arguments, before any data is read
    check_trainer(config, names, source)
    check_features(config, source)  # the optional features' sections (training/<feature>/config.py)
    check_mesh(config, source)
    return config


def build_augment(config: dict, source: str = "config.json"):
    """The train loader's ``augment`` list built and checked (op names, arguments, ranges) without reading data;
    None when there is none. Raises ConfigError naming the place: ``config.json: data_loader.train.augment.1...``."""
    from data_loader.augment.pipeline import Augment  # JAX: config errors are reported before it loads

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
    built_optimizer: tuple | None = field(default=None, repr=False)  # (schedule length, what ``optimizer`` built)

    def load_data(self, splits=None) -> dict:
        """Builds the loaders of ``splits`` (default: every split of the config) and reads each one's first batch
        now (its ``spec``: every shape and dtype the run compiles for), not mid-run; then every example once."""
        loaders = {}
        for split in splits or self.config["data_loader"]:
            loaders[split] = build(
                self.config["data_loader"][split],
                "data_loader",
                f"{self.source}: data_loader.{split}",
                seed=self.config["seed"],
            )
            loaders[split].spec  # noqa: B018
            check_split(self, split, loaders[split])
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
        """(optimizer, its learning rate as a function of the step): the config's, built once for each schedule
        length (nominal before the data, the data's, a resumed checkpoint's) and shared by everything that asks,
        or with ``lr`` instead of the config's rate and schedule (the lr_finder callback's range)."""
        if lr is not None:
            return build_optimizer(self.config, self.steps_per_epoch, self.source, lr, self.epochs)
        length = (self.steps_per_epoch, self.epochs)
        if self.built_optimizer is None or self.built_optimizer[0] != length:
            self.built_optimizer = length, build_optimizer(self.config, *length[:1], self.source, None, length[1])
        return self.built_optimizer[1]


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


def fit(config: dict, run_dir: str | Path | None = None, source: str = "config", resume: bool = False) -> list[dict]:
    """Trains from a config in this process, as a notebook would (Keras' ``fit``): validated, assembled and loaded
    as train.py does, the state initialised from the seed. Returns the rows train.py logs, one per epoch
    (``train/loss``, ``val/accuracy``, ``lr``...), and prints the epoch lines train.py prints (plain lines, as many
    as trainer.log_every asks for, unless logging is set up already).

    Each call is a new, complete run folder, as train.py writes one: ``run_dir`` (new or empty), or by default a new
    folder under trainer.save_dir/<name>/ named as train.py names it: config.json, a copy of model/,
    preprocessing.json, metrics.jsonl and the checkpoints, so ``test.py --run``, the export and ``load_run`` take it.
    ``resume=True`` continues the run in ``run_dir`` from its checkpoint-latest.params instead. A component registered
    in the notebook itself is recorded (notebook.json): the command-line tools refuse the run in one line, since only
    this kernel knows that component."""
    import os

    from files.writes import LATEST
    from training.run import folder as run_folder
    from training.run import location
    from training.run.history import History
    from training.trainer import Trainer

    config = validate(config, source)
    if resume and (run_dir is None or not (Path(run_dir) / LATEST).is_file()):
        raise ConfigError(f"fit(resume=True): {run_dir}/{LATEST}: no such checkpoint; give the run folder to continue")
    if not resume and run_dir is not None and Path(run_dir).is_dir() and any(Path(run_dir).iterdir()):
        raise ConfigError(
            f"fit: {run_dir} already holds a run; fit(..., resume=True) continues it, another run_dir (or none: a "
            "new folder under trainer.save_dir) starts a new one"
        )
    run = assemble(config, source)
    run.load_data()
    run.check_data()
    if run_dir is not None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        parent = Path(config["trainer"]["save_dir"]) / config["name"]
        run_dir = run_folder.create(parent, location.run_id_of(config))
    lock = run_folder.hold(run_dir)
    try:
        with console_lines():
            history = History()
            trainer = Trainer(run, run_dir, trackers=[history], config_hash=config_hash(config))
            if resume:
                trainer.restore(run_dir / LATEST)
            else:
                trainer.init_state()
            write_run_files(run_dir, config, run, new=not resume)
            logging.getLogger("train").info(f"run folder: {run_dir}")
            trainer.fit()
    finally:
        os.close(lock)  # the kernel lives on: the next fit in this folder (resume=True) takes the lock again
    return history.rows


@contextmanager
def console_lines():
    """The run's log lines ("train") printed as plain lines while it lasts, unless a console handler prints them
    already (train.py's logging set up in this process); a notebook has none, and fit would print nothing."""
    logger = logging.getLogger("train")
    consoles = [
        h
        for h in (*logger.handlers, *logging.getLogger().handlers)
        if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stdout, sys.stderr)
    ]
    if consoles:
        yield
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # a handler of the caller's (a capture, a file) would print them twice
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def run_preprocessing(run: Run) -> dict:
    """preprocessing.json of a run: the training data's preprocessing, the augmentation's normalisation folded in
    (what predict.py computes), and the range of the model's inputs (predict.py's range check)."""
    from data_loader.augment.pipeline import input_range

    loader = run.loaders["train"]
    preprocessing = loader.preprocessing
    if run.augment is not None:
        preprocessing = run.augment.preprocessing(preprocessing, loader.spec)
    preprocessing.update(input_range(loader, run.augment))
    return preprocessing


NOTEBOOK = "notebook.json"  # a run folder's components registered in a notebook's kernel, which no other process has


def write_run_files(run_dir: Path, config: dict, run: Run, new: bool = True) -> None:
    """What makes a folder a run that test.py, sample.py, the export and load_run take, as train.py writes it: the
    resolved config, the training data's preprocessing, a copy of model/ (``new``: the code of the weights), and
    notebook.json naming the components that only this process knows."""
    import json
    import shutil

    from files.writes import CONFIG, PREPROCESSING, replace_folder, temporary_folder, write_atomic

    if new:
        # copied into a folder made here, then swapped in: a folder named model/ in a run folder from elsewhere
        # (a requeued -r auto run) may hold links, and copying over them would write through them
        building = temporary_folder(run_dir / "model")
        try:
            code = Path(__file__).parent / "model"
            shutil.copytree(code, building, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
            replace_folder(building, run_dir / "model")
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    write_atomic(run_dir / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
    preprocessing = run_preprocessing(run)
    if preprocessing:
        write_atomic(run_dir / PREPROCESSING, (json.dumps(preprocessing, indent=2) + "\n").encode())
    local = kernel_components(config)
    if local:
        write_atomic(run_dir / NOTEBOOK, (json.dumps({"registered_in_notebook": local}, indent=2) + "\n").encode())


def kernel_components(config: dict) -> dict[str, list[str]]:
    """The config's components registered by code run in this process's ``__main__`` (a notebook's cells), by
    kind: another process (test.py, the export) cannot import them."""
    from model.registry import entries

    named = set()

    def walk(value, top=False):
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "name" and isinstance(item, str) and not top:
                    named.add(item)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for key, value in config.items():
        if key != "name":
            walk(value)
    local = {}
    for kind in COMPONENT_MODULES:
        names = [n for n, e in entries(kind).items() if n in named and getattr(e.fn, "__module__", "") == "__main__"]
        if names:
            local[kind] = names
    return local


def check_kernel_components(run_dir: Path, source: str) -> None:
    """A run whose notebook.json names a component this process does not know: one line saying why (it lived in a
    notebook's kernel) and what to do."""
    import json

    from model.registry import KINDS

    path = run_dir / NOTEBOOK
    if not path.is_file():
        return
    try:
        local = json.loads(path.read_text()).get("registered_in_notebook") or {}
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return  # what it says is a hint; validation names an unknown component anyway
    for kind, names in local.items():
        if kind not in KINDS or not isinstance(names, list):
            continue
        for name in names:
            if isinstance(name, str) and name not in available(kind):
                module = KINDS[kind].replace(".", "/") + ".py"
                raise ConfigError(
                    f"{source}: {kind} {name!r} was registered in a notebook ({path.name}), so only that kernel "
                    f'knows it: move its function into {module} with @register("{kind}") to use this run here'
                )


def load_config(path: str | Path, overrides: list[str] = (), source: str | None = None) -> dict:
    source = source or str(path)
    check_kernel_components(Path(path).parent, source)
    config = read_json(path, source)
    for text in overrides:
        key, value = parse_override(text)
        set_path(config, key, value, f"--set {key}")
    return validate(config, source)


# ------------------------------------------------------------------------------------------------- a trained run
class ModelInputError(ConfigError):
    """The model cannot take the input it is loaded for; ``reason`` is the first line of the layer's complaint."""

    def __init__(self, reason: str):
        super().__init__(f"config.json: model: cannot take the data's input ({reason})")
        self.reason = reason


@dataclass
class LoadedRun:
    """A trained run ready to use in Python, made by ``load_run``: the model with its trained ``params`` and
    ``state``, the ``config`` it trained with, the ``preprocessing`` a user of it needs (class names, vocabulary,
    normalisation), the components (``run``: loss, metrics, augmentation) and the checkpoint it came from."""

    model: Any
    params: Any
    state: Any
    config: dict
    preprocessing: dict
    run: Run
    checkpoint: Path
    header: dict  # the checkpoint's header: epoch, step, monitored value
    input_spec: Any  # what the model takes (shapes and dtypes, batch first), after the augmentation's eval part
    _forward: Any = field(default=None, repr=False)

    def __call__(self, inputs, mask=None):
        """The model's outputs on a batch of inputs as the run's data loader gives them, in inference mode: the train
        split's deterministic augmentation (normalize...) first, as test.py evaluates. A numpy array. ``mask``: the
        batch's padding mask, for a model whose call declares one (without it, every position is real)."""
        import jax
        import numpy as np

        if self._forward is None:
            augment, model = self.run.augment, self.model

            def forward(params, state, x, mask):
                if augment is not None:
                    x = augment({"input": x}, None, train=False)["input"]
                return model(params, state, x, train=False, **({} if mask is None else {"mask": mask}))[0]

            self._forward = jax.jit(forward)
        return np.asarray(self._forward(self.params, self.state, inputs, mask))


def load_run(path: str | Path, config: dict | None = None, input_spec=None) -> LoadedRun:
    """A run folder (its best checkpoint, else the latest) or a checkpoint file -> a ``LoadedRun`` ready to call.

    ``config``: a validated config (default: the config.json beside the checkpoint). ``input_spec``: what the model
    takes (default: read from one batch of the config's data, the train split first). Bad input raises ConfigError,
    a checkpoint that does not fit the model ``training.run.checkpoint.CheckpointError``; both carry one line."""
    import json

    import jax

    from files.writes import CONFIG, PREPROCESSING
    from training.run import checkpoint

    checkpoint_path = checkpoint.of_run(path)
    checkpoint.check_checkpoint_file(checkpoint_path)
    if config is None:
        config_path = checkpoint_path.parent / CONFIG
        if not config_path.is_file():
            raise ConfigError(f"{config_path}: no such file; pass the run's config as load_run(path, config=...)")
        config = load_config(config_path, source=CONFIG)
    run = assemble(config)
    data_preprocessing = None
    if input_spec is None:
        loader = first_loader(run)
        batch_spec = loader.spec if run.augment is None else run.augment.spec(loader.spec)
        input_spec = batch_spec["input"]
        data_preprocessing = loader.preprocessing
        if run.augment is not None:  # as train.py records it
            data_preprocessing = run.augment.preprocessing(data_preprocessing, loader.spec)
    try:
        template = jax.eval_shape(
            lambda: dict(zip(("params", "state"), run.model.init(jax.random.PRNGKey(0), input_spec)))
        )
    except Exception as error:  # shape errors from deep inside a layer: their first line says what
        raise ModelInputError((str(error).strip() or type(error).__name__).splitlines()[0]) from None
    tree, header = checkpoint.restore(checkpoint_path, template, only=("params", "state"))
    saved = checkpoint_path.parent / PREPROCESSING
    if saved.is_file():  # what train.py recorded of the training data
        try:
            preprocessing = json.loads(saved.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ConfigError(f"{saved}: cannot read it as JSON ({error})") from None
    else:
        preprocessing = data_preprocessing or {}
    return LoadedRun(
        run.model, tree["params"], tree["state"], config, preprocessing, run, checkpoint_path, header, input_spec
    )


def first_loader(run: Run):
    """The loader of the first split of the config that reads (train, validation, test): its first batch gives the
    shapes and dtypes the model takes."""
    splits = [s for s in ("train", "validation", "test") if s in run.config["data_loader"]]
    problem = None
    for split in splits:
        try:
            return run.load_data([split])[split]
        except ConfigError as error:
            problem = str(error)
        except (OSError, ValueError) as error:  # the data set's own complaint, which does not say which split
            problem = f"config.json: data_loader.{split}: {error}"
    raise ConfigError(problem or "config.json: data_loader: no split to read the model's input shape from")


# -------------------------------------------------------------------------------------------------------- logging


if __name__ == "__main__":  # python utils.py plot saved/<name>/<run_id>: the run-folder tools live with what they draw
    from training.run.cli import command
    from training.run.figures import plots

    if plots() is None:
        fail("utils.py: this project has no training/plots/, which draws a run folder's curves")
    sys.exit(command(plots().main))
