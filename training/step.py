"""The update step and the evaluation step: pure functions of explicit state, jitted once by the trainer.

A training state is a dict ``{"params", "state", "opt_state", "step", "rng"}``. Batches are dicts with ``input``,
``target`` and ``mask`` (0 on padding). Each step also returns the batch's metric statistics (sums and counts), so
epoch metrics are exact whatever the batch sizes.

``make_train_chunk`` runs K steps in one `lax.scan` over a stack of K batches: one dispatch for K steps removes the
fixed cost each jitted call pays on CPU. Stack entries with ``active`` = 0 (completing an epoch's last stack) leave
the state unchanged.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from training.losses import weighted_mean
from training.optimizers import apply_updates, global_norm


def batch_stats(metrics: Sequence, outputs, batch, per_example_loss) -> dict:
    mask = batch["mask"]
    return {"loss_sum": jnp.sum(per_example_loss * mask), "count": jnp.sum(mask),
            "metrics": {m.name: m.stats(outputs, batch["target"], mask) for m in metrics}}


def make_train_step(model, loss_fn: Callable, optimizer, metrics: Sequence) -> Callable:
    """(train_state, batch) -> (train_state, stats, per-step log values)."""

    def train_step(ts: dict, batch: dict):
        key = jax.random.fold_in(ts["rng"], ts["step"])

        def objective(params):
            outputs, new_state = model(params, ts["state"], batch["input"], train=True, key=key)
            per_example = loss_fn(outputs, batch["target"])
            return weighted_mean(per_example, batch["mask"]), (outputs, new_state, per_example)

        (loss, (outputs, new_state, per_example)), grads = jax.value_and_grad(objective, has_aux=True)(ts["params"])
        updates, opt_state = optimizer.update(grads, ts["opt_state"], ts["params"])
        new_ts = {"params": apply_updates(ts["params"], updates), "state": new_state, "opt_state": opt_state,
                  "step": ts["step"] + 1, "rng": ts["rng"]}
        return new_ts, batch_stats(metrics, outputs, batch, per_example), {"loss": loss, "grad_norm": global_norm(grads)}

    return train_step


def make_train_chunk(model, loss_fn: Callable, optimizer, metrics: Sequence) -> Callable:
    """(train_state, epoch_stats, stack of K batches) -> (train_state, epoch_stats, per-step log values (K,))."""
    train_step = make_train_step(model, loss_fn, optimizer, metrics)

    def body(carry, batch):
        ts, acc = carry
        new_ts, stats, logs = train_step(ts, batch)
        active = batch["active"] > 0
        keep = lambda new, old: jnp.where(active, new, old)
        new_ts = jax.tree.map(keep, new_ts, ts)
        acc = jax.tree.map(lambda a, s: a + jnp.where(active, s, jnp.zeros_like(s)), acc, stats)
        return (new_ts, acc), logs

    def train_chunk(ts, acc, stack):
        (ts, acc), logs = jax.lax.scan(body, (ts, acc), stack)
        return ts, acc, logs

    return train_chunk


def make_eval_step(model, loss_fn: Callable, metrics: Sequence) -> Callable:
    """(params, model state, epoch_stats, batch) -> epoch_stats with the batch added."""

    def eval_step(params, state, acc, batch):
        outputs, _ = model(params, state, batch["input"], train=False)
        stats = batch_stats(metrics, outputs, batch, loss_fn(outputs, batch["target"]))
        return jax.tree.map(jnp.add, acc, stats)

    return eval_step


def empty_stats(model, loss_fn, metrics, params, state, batch_spec) -> dict:
    """Zeros shaped like one batch's statistics (computed abstractly, no compile)."""

    def stats(params, state, batch):
        outputs, _ = model(params, state, batch["input"], train=False)
        return batch_stats(metrics, outputs, batch, loss_fn(outputs, batch["target"]))

    shapes = jax.eval_shape(stats, params, state, batch_spec)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
