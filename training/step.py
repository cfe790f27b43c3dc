"""The update step and the evaluation step: pure functions of explicit state, jitted once by the trainer.

A training state is a dict ``{"params", "state", "opt_state", "step", "rng"}``. A batch is a dict with ``input`` (an
array or a dict of arrays), ``target`` (optional: without one, losses and metrics compare the outputs with the
input, as an autoencoder does) and ``mask`` (0 on padding; (B,) per example or per element, e.g. (B, T)). Each step
also returns the batch's metric statistics (sums and counts), so epoch metrics are exact whatever the batch sizes.

The update step is a component (``"step"`` in the config; ``supervised``, ``train_step``, by default): a step of
your own receives the ``Update`` and ``(train_state, batch)`` and returns what ``train_step`` returns; one with an
``init`` keeps state of its own in ``train_state["step_state"]`` (docs/steps.md: the contract, and what the loop
keeps for it).

``train_call`` runs K steps in one `lax.scan` over a stack of K batches: one dispatch for K steps removes the
fixed cost each jitted call pays on CPU. Stack entries with ``active`` = 0 (completing an epoch's last stack) leave
the state unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from model.registry import register
from training.metrics import merge
from training.optimizers import apply_updates, global_norm, only_trainable
from training.precision import Policy


def target_of(batch: dict):
    return batch["target"] if "target" in batch else batch["input"]


def declares_mask(model) -> bool:
    """Whether the model's call takes the batch's ``mask`` (a padding mask, say) besides its input."""
    return "mask" in inspect.signature(model.__call__).parameters


def model_kwargs(model, batch: dict) -> dict:
    """What a model's call declares of the batch besides its input: the ``mask`` (a padding mask, say)."""
    return {"mask": batch["mask"]} if declares_mask(model) else {}


def loss_mask(batch: dict):
    """The batch's mask as losses and metrics take it. A per-element mask the targets do not have (padded tokens of
    a sequence classified as a whole, which the model took) counts each example with any unmasked element."""
    mask, target = batch["mask"], target_of(batch)
    if mask.ndim > 1 and hasattr(target, "shape") and tuple(target.shape[: mask.ndim]) != mask.shape:
        return jnp.any(mask.reshape(mask.shape[0], -1) != 0, axis=1).astype(mask.dtype)
    return mask


def example_losses(loss_fn: Callable, outputs, batch: dict):
    """(per-example losses, their weights). A per-element mask goes to the loss, which averages each example over
    its unmasked elements; the example then weighs as many elements as it kept, so the weighted mean is the mean
    over every unmasked element (every real token of a padded batch of sequences, say)."""
    mask = loss_mask(batch)
    if mask.ndim == 1:
        return loss_fn(outputs, target_of(batch)), mask
    return loss_fn(outputs, target_of(batch), mask=mask), mask.reshape(mask.shape[0], -1).sum(axis=1)


def batch_stats(metrics: Sequence, outputs, batch, per_example_loss, weights) -> dict:
    # where, not a bare product: a padded example may hold anything, and must add exactly 0
    return {
        "loss_sum": jnp.sum(jnp.where(weights > 0, per_example_loss * weights, 0.0)),
        "count": jnp.sum(weights),
        "metrics": {m.name: m.stats(outputs, target_of(batch), loss_mask(batch)) for m in metrics},
    }


AUGMENT_STREAM = 0x61756700  # augmentation draws from the run's key folded with this, never from dropout's keys
# Each step's logs, the columns of the one float32 array a call returns them in: the host reads a call's logs in one
# transfer, not one per name. "lr" is NaN when the step was given no schedule; "skipped" is 1 where float16's loss
# scaling skipped the step (its gradients overflowed).
LOGS = ("loss", "grad_norm", "lr", "skipped")


def output_spec(model, params, model_state, batch: dict, augment=None):
    """The model's abstract output for `batch` (as evaluation would prepare it), computed without running it."""

    def forward(params, model_state, batch):
        if augment is not None:
            batch = augment(batch, None, train=False, outputs=None)
        return model(params, model_state, batch["input"], train=False, **model_kwargs(model, batch))[0]

    return jax.eval_shape(forward, params, model_state, batch)


@dataclass(frozen=True)
class Update:
    """What one optimizer update is made of; ``train_call``, ``train_step`` and ``micro_step`` take it first (the
    jitted call binds it with ``functools.partial``). ``augment(batch, key, train=True, outputs=...)`` prepares the
    batch on the device before the forward pass, keyed by (run seed, step). With ``accumulate`` = N a step's batch
    has a leading axis of N micro-batches: their gradients are summed (weighted by their unmasked examples) and
    applied as one update, the model state (batch norm statistics) passing from one micro-batch to the next.
    ``policy``: the mixed-precision policy. ``callbacks`` with an ``update`` advance their state in
    ``train_state["callbacks"]`` after the update (an average of the parameters, say). ``lr_fn`` given, the logs
    carry each step's learning rate (read with its loss)."""

    model: Any
    loss_fn: Callable
    optimizer: Any
    metrics: Sequence
    augment: Any = None
    accumulate: int = 1
    policy: Policy = Policy()
    callbacks: Sequence = ()
    lr_fn: Callable | None = None
    step: Callable | None = None  # the run's step (``"step"`` in the config): None, ``supervised``'s train_step


def train_call(update: Update, train_state: dict, totals: dict, stack: dict):
    """(train_state, epoch_stats, stack of K x N batches) -> (train_state, epoch_stats, the K steps' logs as one
    array (K, len(LOGS)): ``log_columns`` names them): K steps in one ``lax.scan``.

    N = ``accumulate`` loader batches make one step. An inactive loader batch (completing the epoch's last stack)
    adds nothing: with N = 1 its step leaves the state unchanged; with N > 1 its mask is zeroed, and a step with no
    active batch at all leaves the state unchanged."""
    n = update.accumulate

    def body(carry, batch):
        train_state, totals = carry
        if n > 1:
            batch["mask"] = batch["mask"] * batch["active"].reshape((n,) + (1,) * (batch["mask"].ndim - 1))
        active = jnp.max(batch.pop("active")) > 0
        updated, stats, logs = (update.step or train_step)(update, train_state, batch)
        keep = lambda new, old: jnp.where(active, new, old)
        updated = jax.tree.map(keep, updated, train_state)
        totals = jax.tree.map(lambda a, s: a + jnp.where(active, s, jnp.zeros_like(s)), totals, stats)
        return (updated, totals), logs

    if n > 1:  # (K x N, ...) -> (K, N, ...): the loader's batches grouped into steps
        stack = jax.tree.map(lambda a: a.reshape(-1, n, *a.shape[1:]), stack)
    (train_state, totals), logs = jax.lax.scan(body, (train_state, totals), stack)
    return train_state, totals, jnp.stack([logs[name].astype(jnp.float32) for name in LOGS], axis=-1)


def log_columns(logs) -> dict:
    """``train_call``'s logs (K, len(LOGS)), on the device or read, by name: each (K,)."""
    return {name: logs[..., i] for i, name in enumerate(LOGS)}


def train_step(update: Update, train_state: dict, batch: dict):
    """(train_state, batch) -> (train_state, stats, per-step log values): one optimizer update."""
    policy, optimizer, accumulate = update.policy, update.optimizer, update.accumulate
    key = jax.random.fold_in(train_state["rng"], train_state["step"])
    augment_key = jax.random.fold_in(jax.random.fold_in(train_state["rng"], AUGMENT_STREAM), train_state["step"])
    scale = train_state["loss_scale"]["scale"] if policy.scaled else jnp.float32(1.0)
    params = train_state["params"]
    if accumulate == 1:
        new_model_state, grads, stats = micro_step(update, params, train_state["state"], batch, key, augment_key, scale)
    else:

        def body(carry, xs):
            model_state, total = carry
            micro, i = xs
            keys = jax.random.fold_in(key, i), jax.random.fold_in(augment_key, i)
            model_state, grads, stats = micro_step(update, params, model_state, micro, *keys, scale)
            return (model_state, jax.tree.map(jnp.add, total, grads)), stats

        zeros, micro_batches = jax.tree.map(jnp.zeros_like, params), (batch, jnp.arange(accumulate))
        (new_model_state, grads), stats = jax.lax.scan(body, (train_state["state"], zeros), micro_batches)
        stats = jax.tree.map(lambda s: s.sum(axis=0), stats)
    # the mean over every unmasked example of the update, whatever the micro-batches held
    count = jnp.maximum(stats["count"], jnp.finfo(jnp.float32).tiny)
    grads = jax.tree.map(lambda g: g / (count * scale), grads)
    # frozen leaves (optimizer.frozen) are no part of what trains: not of the norm either
    grad_norm = global_norm(grads if optimizer.trainable is None else only_trainable(grads, optimizer.trainable(grads)))
    updates, opt_state = optimizer.update(grads, train_state["opt_state"], params)
    updated = {
        **train_state,
        "params": apply_updates(params, updates),
        "state": new_model_state,
        "opt_state": opt_state,
        "step": train_state["step"] + 1,
    }
    lr = jnp.nan if update.lr_fn is None else update.lr_fn(train_state["step"])
    logs = {"loss": stats["loss_sum"] / count, "grad_norm": grad_norm, "lr": jnp.asarray(lr, jnp.float32)}
    logs["skipped"] = jnp.zeros((), bool)
    if policy.scaled:  # an overflowed step changes nothing but the scale
        finite = jnp.isfinite(grad_norm)
        updated = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old), updated, {**train_state, "step": train_state["step"] + 1}
        )
        updated["loss_scale"] = policy.next_scale(train_state["loss_scale"], finite)
        logs["skipped"] = ~finite
    return with_callbacks(update, train_state, updated), stats, logs


def with_callbacks(update: Update, train_state: dict, updated: dict) -> dict:
    """`updated` with the state of each callback that updates inside the step (``Update.callbacks``: an average of
    the parameters, say) advanced past it: what a step of its own calls last, as ``train_step`` does."""
    if not update.callbacks:
        return updated
    states = {
        c.name: c.update(train_state["callbacks"][c.name], updated["params"], updated["step"]) for c in update.callbacks
    }
    return {**updated, "callbacks": states}


@register("step")
def supervised() -> Callable:
    """The default step: one loss of the model's outputs, its gradient over every trainable parameter, one update of
    the optimizer (each of its groups)."""
    return train_step


def micro_step(update: Update, params, model_state, batch: dict, key, augment_key, scale):
    """(new model state, gradients of the weighted loss sum, the micro-batch's statistics)."""
    model, augment = update.model, update.augment
    if augment is not None:
        outputs = output_spec(model, params, model_state, batch, augment)
        batch = augment(batch, augment_key, train=True, outputs=outputs)
    (_, (outputs, new_model_state, per_example, weights)), grads = jax.value_and_grad(
        objective, argnums=1, has_aux=True
    )(update, params, model_state, batch, key, scale)
    return new_model_state, grads, batch_stats(update.metrics, outputs, batch, per_example, weights)


def objective(update: Update, params, model_state, batch: dict, key, scale):
    """The micro-batch's weighted loss sum (times the loss scale), its gradient taken in float32."""
    model = update.model
    outputs, new_model_state = update.policy.apply(
        model, params, model_state, batch["input"], train=True, key=key, **model_kwargs(model, batch)
    )
    per_example, weights = example_losses(update.loss_fn, outputs, batch)
    total = jnp.sum(jnp.where(weights > 0, per_example * weights, 0.0))
    return total * scale, (outputs, new_model_state, per_example, weights)


def make_train_step(*parts, **named) -> Callable:
    """(train_state, batch) -> (train_state, stats, per-step log values), of an ``Update(*parts, **named)``."""
    return functools.partial(train_step, Update(*parts, **named))


def make_train_call(*parts, **named) -> Callable:
    """(train_state, epoch_stats, stack) -> (train_state, epoch_stats, logs), of an ``Update(*parts, **named)``."""
    return functools.partial(train_call, Update(*parts, **named))


def make_eval_stats(model, loss_fn: Callable, metrics: Sequence, augment=None, policy: Policy = Policy()) -> Callable:
    """(params, model state, batch) -> the batch's statistics, the model in evaluation mode (``augment`` applies
    only its deterministic part, e.g. normalisation)."""

    def eval_stats(params, model_state, batch):
        if augment is not None:
            batch = augment(batch, None, train=False, outputs=output_spec(model, params, model_state, batch, augment))
        outputs, _ = policy.apply(model, params, model_state, batch["input"], train=False, **model_kwargs(model, batch))
        return batch_stats(metrics, outputs, batch, *example_losses(loss_fn, outputs, batch))

    return eval_stats


def make_eval_step(model, loss_fn: Callable, metrics: Sequence, augment=None, policy: Policy = Policy()) -> Callable:
    """(params, model state, epoch_stats, batch) -> epoch_stats with the batch added."""
    eval_stats = make_eval_stats(model, loss_fn, metrics, augment, policy)

    def eval_step(params, model_state, totals, batch):
        return merge(totals, eval_stats(params, model_state, batch))

    return eval_step


def empty_stats(model, loss_fn, metrics, params, model_state, batch_spec: dict, augment=None) -> dict:
    """Zeros shaped like one batch's statistics (computed abstractly, no compile)."""
    shapes = jax.eval_shape(make_eval_stats(model, loss_fn, metrics, augment), params, model_state, batch_spec)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
