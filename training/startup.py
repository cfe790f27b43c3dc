"""What a run does before its first step, over a trainer's assembled pieces (its run, placement, optimizer, compiled
calls, checkpoints): the state it starts from (``from_seed``, ``from_checkpoint``, ``from_weights``: a ``Start``,
which ``Trainer.begin`` takes), the memory checks that refuse a run before it writes anything, and the lines the log
opens with (``describe``). Each start begins compiling the training call on another thread while the state loads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jax

from training import state
from training.callbacks import restart_plateau
from training.config.components import schedule_length_note
from training.devices import memory, mesh


@dataclass
class Start:
    """The training state a run starts from and where it came from."""

    train_state: dict
    origin: str  # for the log's "state:" line
    epoch: int = 0  # epochs completed
    position: int = 0  # loader batches of the epoch under way done before a resume
    totals: dict | None = None  # that epoch's statistics so far (a checkpoint saved inside an epoch)
    min_loss: float = math.inf  # the lowest step loss so far, for trainer.divergence_factor
    header: dict | None = None  # the checkpoint's, when resumed
    notes: list[str] = field(default_factory=list)  # what changed since that checkpoint, for the log


def from_seed(trainer) -> Start:
    """A fresh state from the config's seed (the training call compiles on another thread meanwhile)."""
    sharding = trainer.compiled.state_sharding  # one for the whole state, or a tree of them
    abstract = trainer.abstract_state
    shardings = sharding if isinstance(sharding, dict) else jax.tree.map(lambda _: sharding, abstract)
    trainer.compiled.start_compiling(trainer.steps_per_call.k, mesh.with_shardings(abstract, shardings))
    seed = trainer.settings.seed
    train_state, where = state.init(trainer.run, trainer.optimizer, trainer.precision, seed, sharding)
    return Start(train_state, f"fresh state from seed {seed}{where}")


def from_checkpoint(trainer, path: Path) -> Start:
    """Continues from a checkpoint (``Checkpoints.resume``: what it refuses): state, epoch, position, best value;
    the schedules keep counting the checkpoint's run length, so the optimizer and the compiled calls are built
    again for it (``Trainer.build_calls``) where it differs."""
    abstract, mesh_ = trainer.abstract_state, trainer.placement.mesh
    train_state, header, totals = state.restore(path, abstract, trainer.compiled.empty_stats, mesh_)
    length = header.get("schedule_length")
    if length is not None:
        trainer.run.epochs, trainer.run.steps_per_epoch = length["epochs"], length["steps_per_epoch"]
        trainer.build_calls()
    trainer.compiled.start_compiling(trainer.steps_per_call.k, mesh.spec_of(train_state))
    notes = trainer.checkpoints.resume(header, path, int(train_state["step"]))
    if header.get("monitor") not in (None, trainer.settings.monitor):
        train_state, restarted = restart_plateau(train_state)
        notes += restarted
    epoch, position = header["epoch"], header.get("position", 0)
    min_loss = header.get("min_loss") if isinstance(header.get("min_loss"), float) else math.inf
    origin = f"resumed from {path}: epoch {epoch}, step {header['step']}" + (
        f" ({position} step(s) into epoch {epoch + 1})" if position else ""
    )
    origin += schedule_length_note(trainer.run.config, length, trainer.settings.epochs)
    return Start(train_state, origin, epoch, position, totals, min_loss, header, notes)


def from_weights(trainer, path: Path, exclude: Sequence[str] = ()) -> Start:
    """Fine-tuning: params and model state from another checkpoint into a fresh state; optimizer and counters start
    fresh."""
    train_state = state.load_weights(from_seed(trainer).train_state, path, trainer.placement.mesh, exclude)
    kept = f" (kept fresh: {', '.join(exclude)})" if exclude else ""
    return Start(train_state, f"params and model state from {path}{kept}, optimizer fresh")


def check_memory(trainer) -> None:
    """Refuses, before anything is allocated, a run whose state and one call's stacked batches alone exceed the
    memory of the devices (a ValueError naming the numbers): it would otherwise stall or be killed mid-compile."""
    sharding = trainer.compiled.state_sharding
    shardings = sharding if isinstance(sharding, dict) else dict.fromkeys(trainer.abstract_state, sharding)
    batches = trainer.steps_per_call.k * trainer.accumulate  # one call's stack, split over every device
    stack_bytes = -(-batches * memory.nbytes(trainer.train_loader.spec) // trainer.placement.mesh.size)
    local = trainer.placement.local_devices()
    memory.check_fits(trainer.abstract_state, shardings, f"{batches} stacked batch(es)", stack_bytes, local)


def check_compiled_memory(trainer) -> None:
    """Refuses, before the run writes anything, a run whose compiled training call (compiling since a start began
    it, beside the state's loading) needs more memory than the devices have free by XLA's own figures: arguments,
    outputs and the temporaries ``check_memory`` cannot know. Waits for that compilation, which the first call would
    wait for anyway."""
    stats = trainer.compiled.memory_analysis(trainer.steps_per_call.k)
    memory.check_compiled(stats, trainer.placement.local_devices())


def describe(trainer) -> list[str]:
    """What the log says of the run before it trains: the devices and mesh, a batch, where the state came from,
    the model."""
    from model.summary import describe_batch, summary

    run, loader, accumulate = trainer.run, trainer.train_loader, trainer.accumulate
    params, model_state = trainer.train_state["params"], trainer.train_state["state"]
    devices = ", ".join(str(d) for d in jax.devices())
    trainable = trainer.optimizer.trainable  # None unless optimizer.frozen names some parameters
    return [
        f"devices: {devices}; {mesh.describe_processes()}, mesh {dict(trainer.placement.mesh.shape)}",
        f"batch: {describe_batch(loader.spec)}",
        f"step: {loader.batch_size * accumulate} examples per optimizer update"
        + (f" ({accumulate} batches of {loader.batch_size} accumulated)" if accumulate > 1 else "")
        + f"; precision: {trainer.precision.describe()}"
        + (f"; the update: {json.dumps(run.config['step'])}" if "step" in run.config else ""),
        f"state: {trainer.start.origin}",
        *[  # what is evaluated and saved is not what the optimizer updates: said once, here
            f"weights: evaluation, model_best, test.py and the export use {callback.name}'s parameters "
            f"(callbacks: {json.dumps(spec)}), not the trained ones"
            for spec, callback in zip(run.config["callbacks"], run.callbacks)
            if callback.evaluated
        ],
        summary(run.model, params, model_state, run.model_input_spec(), trainable and trainable(params)),
    ]
