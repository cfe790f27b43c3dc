"""The GAN's update, a step of its own (``"step": {"name": "gan", "args": {"d_steps": 1}}``): the players take
turns, ``d_steps`` updates of the discriminator, then one of the generator, each by its own optimizer (the groups
``discriminator`` and ``generator`` of ``optimizer.groups``, their own learning rates and betas), each on the loss of
its own; the other player, and its optimizer's state, stay as they were. The loop around it is the template's:
steps per call, checkpoints and exact resume, logs, evaluation (the generator's loss on the split's fixed latent
vectors), callbacks.

Each update draws fresh latent vectors from the run's key and the step; the batch's real images are the
discriminator's "real" class. Accumulated batches and float16's loss scaling are the supervised step's: this one
takes neither (trainer.accumulate_steps 1, precision float32 or bfloat16).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from model.checks import check_integer
from model.registry import register
from tasks.gan.losses import discriminator_loss
from training.optimizers import apply_updates, global_norm
from training.step import Update, batch_stats, with_callbacks

PLAYERS = ("discriminator", "generator")  # the optimizer's groups this step updates, by these names


@register("step")
def gan(d_steps: int = 1) -> Callable:
    """Alternating GAN updates: ``d_steps`` of the discriminator, then one of the generator (non-saturating)."""
    check_integer(d_steps, "d_steps", 1, 1000)
    return functools.partial(gan_step, d_steps=d_steps)


def gan_step(update: Update, train_state: dict, batch: dict, *, d_steps: int):
    """(train_state, batch) -> (train_state, stats, logs), as ``training.step.train_step``: stats are the
    generator's loss and the metrics of this batch's images before the update; logs its loss, the updated player's
    gradient norm and the (first group's) learning rate."""
    model, groups = update.model, update.optimizer.groups
    if groups is None or set(PLAYERS) - set(groups):
        raise ValueError(
            f"the gan step updates the optimizer's groups {', '.join(PLAYERS)}: give them in optimizer.groups"
        )
    params, opt_state, step = train_state["params"], train_state["opt_state"], train_state["step"]
    z = jax.random.normal(jax.random.fold_in(train_state["rng"], step), batch["input"].shape, batch["input"].dtype)
    real, weights = batch["target"], batch["mask"].astype(jnp.float32)
    count = jnp.maximum(weights.sum(), 1.0)

    def mean(per_example):
        return jnp.sum(jnp.where(weights > 0, per_example * weights, 0.0)) / count

    def discriminator(p):
        fake = jax.lax.stop_gradient(model.generate(p, z))
        return mean(discriminator_loss(model.discriminate(p, real), model.discriminate(p, fake)))

    def generator(p):
        outputs, _ = model(p, train_state["state"], z, train=True)
        return mean(update.loss_fn(outputs, real))

    def turn(player: str, objective: Callable) -> Callable:
        def take(_):
            grads = jax.grad(objective)(params)
            updates, state = groups[player].update(grads, opt_state[player], params)
            return apply_updates(params, updates), {**opt_state, player: state}, global_norm(grads[player])

        return take

    discriminator_turn = step % (d_steps + 1) < d_steps
    new_params, new_opt_state, grad_norm = jax.lax.cond(
        discriminator_turn, turn("discriminator", discriminator), turn("generator", generator), None
    )
    outputs, _ = model(params, train_state["state"], z, train=True)
    stats = batch_stats(update.metrics, outputs, batch, update.loss_fn(outputs, real), weights)
    updated = {**train_state, "params": new_params, "opt_state": new_opt_state, "step": step + 1}
    lr = jnp.nan if update.lr_fn is None else update.lr_fn(step)
    logs = {
        "loss": stats["loss_sum"] / count,
        "grad_norm": grad_norm,
        "lr": jnp.asarray(lr, jnp.float32),
        "skipped": jnp.zeros((), bool),
    }
    return with_callbacks(update, train_state, updated), stats, logs
