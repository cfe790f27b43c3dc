"""The one assembly of a run from a validated config (``assemble``): its model, loss, metrics, callbacks,
augmentation and optimizer, each built by name from its section (training/config/components.py), into a ``Run``.
train.py, test.py, sample.py, the export, ``fit`` and ``load_run`` all start here, and nothing else builds a component
from a config section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.config.components import build, build_optimizer, of_labels
from training.config.file import ConfigError
from training.config.schema import DEFAULT_STEP
from training.config.settings import Monitor
from training.config.validation import build_augment


@dataclass
class Run:
    """Everything one run is made of, built from one validated config by ``assemble``.

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
    step: Callable  # (update, train_state, batch) -> (train_state, stats, logs): training/step.py says what each is
    loaders: dict = field(default_factory=dict)
    steps_per_epoch: int | None = None  # optimizer steps in an epoch of the train loader (None before the data)
    epochs: int | None = None  # the run's length in epochs, fixed with the data (debug modes shorten the loop only)
    built_optimizer: tuple | None = field(default=None, repr=False)  # (schedule length, what ``optimizer`` built)

    def load_data(self, splits=None) -> dict:
        """Builds the loaders of ``splits`` (default: every split of the config) and reads each one's first batch
        now (its ``spec``: every shape and dtype the run compiles for), not mid-run; then every example once."""
        from training.task_kinds import check_split  # JAX: config errors are reported before it loads

        loaders = {}
        for split in splits or self.config["data_loader"]:
            loaders[split] = build(
                self.config["data_loader"][split],
                "data_loader",
                f"{self.source}: data_loader.{split}",
                seed=self.config["seed"],
            )
            check_batch_size(split, loaders[split], f"{self.source}: data_loader.{split}")
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
        from training.task_kinds import check_model_fits_data  # JAX: config errors are reported before it loads

        loader = self.loaders["train"]
        check_model_fits_data(self.config, self.model, loader, self.augment, self.source, self.loss_fn, self.metrics)
        accumulate = self.config["trainer"]["accumulate_steps"]
        if accumulate > len(loader):  # each step stacks that many batches, padding what the epoch lacks
            raise ConfigError(
                f"{self.source}: trainer.accumulate_steps: {accumulate:,} batches per step, but an "
                f"epoch of the train split has {len(loader)}; at most {len(loader)}"
            )

    def in_step_callbacks(self) -> list:
        """The callbacks that keep a state inside the training state (updated by the step itself)."""
        return [c for c in self.callbacks if c.update is not None]

    def evaluated_callback(self):
        """The callback whose parameters evaluation uses instead of the trained ones (e.g. an average), or None."""
        return next((c for c in self.callbacks if c.evaluated), None)

    def model_input_spec(self):
        """The input as the model sees it: the training loader's, after the deterministic part of the augmentation
        (e.g. uint8 images converted and normalised)."""
        spec = self.loaders["train"].spec
        if self.augment is None:
            return spec["input"]
        import jax  # here: the assembly reports a config's errors before JAX loads

        return jax.eval_shape(lambda b: self.augment(b, None, train=False, outputs=None), spec)["input"]

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


def check_batch_size(split: str, loader, where: str) -> None:
    """A batch larger than its split is padded to its size: the epoch is one batch of batch_size rows, allocated whole
    on the host for each batch the loader prefetches (1,000,000 rows for 3,000 examples was killed for memory). Before
    any batch is read, one example's bytes say whether those rows fit in what the host has free: refused in one line
    where they do not; a small split in a larger batch (96 examples in 128) trains as one padded batch."""
    from training.devices import memory  # JAX: config errors are reported before it loads

    examples = len(loader.dataset)
    available = memory.host_available()
    if loader.batch_size <= examples or available is None:
        return
    one = memory.nbytes(loader.dataset.get_batch(np.arange(1)))
    need = one * loader.batch_size * (loader.prefetch + 1)  # the batch the loop holds, and those prefetched
    if need > available[0]:
        raise ConfigError(
            f"{where}.args.batch_size: {loader.batch_size:,} rows of {memory.show_bytes(one)} take "
            f"{memory.show_bytes(need)} with the batches prefetched, more than the {memory.show_bytes(available[0])} "
            f"of {available[1]}, for a {split} split of {examples:,} examples: at most {examples:,}"
        )


def assemble(config: dict, source: str = "config.json") -> Run:
    """Every component of a validated config built (errors as ConfigError naming their place), the optimizer's
    hyperparameters checked; no data read."""
    run = Run(
        config,
        source,
        model=build(config["model"], "model", f"{source}: model"),
        loss_fn=build(config["loss"], "loss", f"{source}: loss"),
        # a loss's "labels" (named targets, one output): every metric scores the class ids of that target
        metrics=[
            of_labels(build(m, "metrics", f"{source}: metrics.{i}"), config["loss"].get("labels"))
            for i, m in enumerate(config["metrics"])
        ],
        callbacks=[build(c, "callbacks", f"{source}: callbacks.{i}") for i, c in enumerate(config["callbacks"])],
        augment=build_augment(config, source),
        monitor=monitor_of(config),
        step=build(config.get("step", DEFAULT_STEP), "step", f"{source}: step"),
    )
    run.optimizer()  # its schedules' checks, with nominal epochs, before the data
    return run


def monitor_of(config: dict):
    """``trainer.monitor`` parsed once (validated by ``validate``): a ``Monitor``, or None when "off"."""
    text = config["trainer"]["monitor"]
    return None if text == "off" else Monitor(*text.split(" ", 1))
