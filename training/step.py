"""The update step and the evaluation step: pure functions of explicit state, jitted once by the trainer.

A training state is a dict ``{"params", "state", "opt_state", "step", "rng"}``. A batch is a dict with ``input`` (an
array or a dict of arrays), ``target`` (optional: without one, losses and metrics compare the outputs with the
input, as an autoencoder does) and ``mask`` (0 on padding; (B,) per example or per element, e.g. (B, T)). Each step
also returns the batch's metric statistics (sums and counts), so epoch metrics are exact whatever the batch sizes.

``make_train_chunk`` runs K steps in one `lax.scan` over a stack of K batches: one dispatch for K steps removes the
fixed cost each jitted call pays on CPU. Stack entries with ``active`` = 0 (completing an epoch's last stack) leave
the state unchanged.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from training.losses import weighted_mean
from training.metrics import merge
from training.optimizers import apply_updates, global_norm


def target_of(batch: dict):
    return batch["target"] if "target" in batch else batch["input"]


def example_losses(loss_fn: Callable, outputs, batch: dict):
    """(per-example losses, their weights). A per-element mask goes to the loss, which averages each example over
    its unmasked elements; the example then weighs as many elements as it kept, so the weighted mean is the mean
    over every unmasked element (every real token of a padded batch of sequences, say)."""
    mask = batch["mask"]
    if mask.ndim == 1:
        return loss_fn(outputs, target_of(batch)), mask
    return loss_fn(outputs, target_of(batch), mask=mask), mask.reshape(mask.shape[0], -1).sum(axis=1)


def batch_stats(metrics: Sequence, outputs, batch, per_example_loss, weights) -> dict:
    # where, not a bare product: a padded example may hold anything, and must add exactly 0
    return {"loss_sum": jnp.sum(jnp.where(weights > 0, per_example_loss * weights, 0.0)), "count": jnp.sum(weights),
            "metrics": {m.name: m.stats(outputs, target_of(batch), batch["mask"]) for m in metrics}}


def make_train_step(model, loss_fn: Callable, optimizer, metrics: Sequence) -> Callable:
    """(train_state, batch) -> (train_state, stats, per-step log values)."""

    def train_step(ts: dict, batch: dict):
        key = jax.random.fold_in(ts["rng"], ts["step"])

        def objective(params):
            outputs, new_state = model(params, ts["state"], batch["input"], train=True, key=key)
            per_example, weights = example_losses(loss_fn, outputs, batch)
            return weighted_mean(per_example, weights), (outputs, new_state, per_example, weights)

        (loss, (outputs, new_state, per_example, weights)), grads = jax.value_and_grad(objective, has_aux=True)(
            ts["params"])
        updates, opt_state = optimizer.update(grads, ts["opt_state"], ts["params"])
        new_ts = {"params": apply_updates(ts["params"], updates), "state": new_state, "opt_state": opt_state,
                  "step": ts["step"] + 1, "rng": ts["rng"]}
        stats = batch_stats(metrics, outputs, batch, per_example, weights)
        return new_ts, stats, {"loss": loss, "grad_norm": global_norm(grads)}

    return train_step


def make_train_chunk(model, loss_fn: Callable, optimizer, metrics: Sequence) -> Callable:
    """(train_state, epoch_stats, stack of K batches) -> (train_state, epoch_stats, per-step log values (K,))."""
    train_step = make_train_step(model, loss_fn, optimizer, metrics)

    def body(carry, batch):
        ts, totals = carry
        active = batch["active"] > 0
        new_ts, stats, logs = train_step(ts, batch)
        keep = lambda new, old: jnp.where(active, new, old)
        new_ts = jax.tree.map(keep, new_ts, ts)
        totals = jax.tree.map(lambda a, s: a + jnp.where(active, s, jnp.zeros_like(s)), totals, stats)
        return (new_ts, totals), logs

    def train_chunk(ts, totals, stack):
        (ts, totals), logs = jax.lax.scan(body, (ts, totals), stack)
        return ts, totals, logs

    return train_chunk


def make_eval_stats(model, loss_fn: Callable, metrics: Sequence) -> Callable:
    """(params, model state, batch) -> the batch's statistics, the model in evaluation mode."""

    def eval_stats(params, state, batch):
        outputs, _ = model(params, state, batch["input"], train=False)
        return batch_stats(metrics, outputs, batch, *example_losses(loss_fn, outputs, batch))

    return eval_stats


def make_eval_step(model, loss_fn: Callable, metrics: Sequence) -> Callable:
    """(params, model state, epoch_stats, batch) -> epoch_stats with the batch added."""
    eval_stats = make_eval_stats(model, loss_fn, metrics)

    def eval_step(params, state, totals, batch):
        return merge(totals, eval_stats(params, state, batch))

    return eval_step


def empty_stats(model, loss_fn, metrics, params, state, batch_spec: dict) -> dict:
    """Zeros shaped like one batch's statistics (computed abstractly, no compile)."""
    shapes = jax.eval_shape(make_eval_stats(model, loss_fn, metrics), params, state, batch_spec)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
