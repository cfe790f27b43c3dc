"""The one validation of a config (``validate``: every section checked in order, their schema and defaults in
training/config_schema.py) and the one assembly of a run from it (``assemble``), with what the scripts import of the
rest: reading and overrides (training/config_file.py), components by name (training/components.py), the command line
(training/cli.py).

Every component in `config.json` has the form {"name": ..., "args": {...}}; `name` is looked up among the
functions registered for that kind of component (``model/registry.py``), and `args` must bind to that function's
signature. All of this is checked before any data is read or anything is compiled, and
every problem is reported as one line that names its place in the file: `config.json: optimizer.args.lr: ...`.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The config API in one place for the scripts: reading (training/config_file.py), components by name
# (training/components.py) and the command-line helpers (training/cli.py), with the validation and the assembly here.
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
from training.config_schema import (
    check_components,
    check_loaders,
    check_mesh,
    check_optimizer,
    check_top_level,
    check_trackers,
    check_trainer,
)
from training.monitor import Monitor


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
    check_trackers(config, source)
    check_mesh(config, source)
    return config


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

    def __call__(self, inputs):
        """The model's outputs on a batch of inputs as the run's data loader gives them, in inference mode: the train
        split's deterministic augmentation (normalize...) first, as test.py evaluates. A numpy array."""
        import jax
        import numpy as np

        if self._forward is None:
            augment, model = self.run.augment, self.model

            def forward(params, state, x):
                if augment is not None:
                    x = augment({"input": x}, None, train=False)["input"]
                return model(params, state, x, train=False)[0]

            self._forward = jax.jit(forward)
        return np.asarray(self._forward(self.params, self.state, inputs))


def load_run(path: str | Path, config: dict | None = None, input_spec=None) -> LoadedRun:
    """A run folder (its best checkpoint, else the latest) or a checkpoint file -> a ``LoadedRun`` ready to call.

    ``config``: a validated config (default: the config.json beside the checkpoint). ``input_spec``: what the model
    takes (default: read from one batch of the config's data, the train split first). Bad input raises ConfigError,
    a checkpoint that does not fit the model ``training.checkpoint.CheckpointError``; both carry one line."""
    import json

    import jax

    from training import checkpoint
    from training.files import CONFIG, PREPROCESSING, check_checkpoint_file

    checkpoint_path = checkpoint.of_run(path)
    check_checkpoint_file(checkpoint_path)
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
    from training.plots import main

    sys.exit(main())
