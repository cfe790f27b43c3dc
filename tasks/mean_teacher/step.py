"""The mean teacher's update, a step of its own (``"step": {"name": "mean_teacher", "args": {...}}``) (Tarvainen &
Valpola, 2017): the student sees one noised view of each example, the teacher another, and the student learns

    cross_entropy(student(view_1), labels) + consistency * |softmax(student(view_1)) - softmax(teacher(view_2))|^2

by one update of the optimizer; then the teacher's parameters move towards the student's,

    teacher <- decay * teacher + (1 - decay) * student   (after every step)

The teacher is the template's ``ema`` callback (``"callbacks": [{"name": "ema", "args": {"decay": 0.99, "warmup":
false}}]``): its average, kept in the training state (``train_state["callbacks"]["ema"]["params"]``), checkpointed
and resumed with everything else, is what this step reads as the teacher and advances last
(``training.step.with_callbacks``). Evaluation, ``model_best``, ``test.py`` and the export use the teacher (the ema
callback is ``evaluated``), as the paper reports it; the student is the checkpoint's ``params``.

The statistics (``train/loss``, the metrics) are the student's, of the config's loss on its view: what validation
reports of the teacher, on clean inputs; the logged step loss is the whole objective. Noise is drawn from the run's
key and the step (the same at a resume). Accumulated batches and float16's loss scaling are the supervised step's:
this one takes neither (trainer.accumulate_steps 1, precision float32 or bfloat16).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from model.registry import register
from training.optimizers import apply_updates, global_norm
from training.step import AUGMENT_STREAM, Update, batch_stats, example_losses, model_kwargs, output_spec, with_callbacks

TEACHER = "ema"  # the callback whose average is the teacher


def _number(value, name: str, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
        raise ValueError(f"{name}: must be a number >= {low:g}, got {value!r}")


@register("step")
def mean_teacher(consistency: float = 1.0, noise: float = 0.3) -> Callable:
    """The student's cross-entropy plus ``consistency`` times the squared distance of its softmax from the
    teacher's (the ema callback's average), each on its own view of the input with Gaussian noise of standard
    deviation ``noise``."""
    _number(consistency, "consistency", 0)
    _number(noise, "noise", 0)
    return functools.partial(mean_teacher_step, consistency=float(consistency), noise=float(noise))


def consistency_cost(student_logits: jax.Array, teacher_logits: jax.Array) -> jax.Array:
    """Per example (B,): the squared distance between the two softmax distributions, summed over the classes."""
    difference = jax.nn.softmax(student_logits, axis=-1) - jax.nn.softmax(teacher_logits, axis=-1)
    return jnp.sum(jnp.square(difference), axis=-1)


def teacher_of(update: Update, train_state: dict):
    """The teacher's parameters: the ema callback's average before this step."""
    if not any(c.name == TEACHER for c in update.callbacks):
        raise ValueError(
            'the mean_teacher step reads its teacher from the ema callback: add {"name": "ema", "args": {"decay": '
            '0.99, "warmup": false}} to the config\'s callbacks'
        )
    return train_state["callbacks"][TEACHER]["params"]


def mean_teacher_step(update: Update, train_state: dict, batch: dict, *, consistency: float, noise: float):
    """(train_state, batch) -> (train_state, stats, logs), as ``training.step.train_step``."""
    if update.accumulate != 1 or update.policy.scaled:
        raise ValueError("the mean_teacher step takes neither trainer.accumulate_steps > 1 nor float16's loss scaling")
    model, policy, optimizer = update.model, update.policy, update.optimizer
    teacher = teacher_of(update, train_state)
    params, state, step = train_state["params"], train_state["state"], train_state["step"]
    if update.augment is not None:  # the config's augmentation first, as the supervised step applies it
        augment_key = jax.random.fold_in(jax.random.fold_in(train_state["rng"], AUGMENT_STREAM), step)
        outputs = output_spec(model, params, state, batch, update.augment)
        batch = update.augment(batch, augment_key, train=True, outputs=outputs)
    x, extra = batch["input"], model_kwargs(model, batch)
    student_noise, teacher_noise, student_key, teacher_key = jax.random.split(
        jax.random.fold_in(train_state["rng"], step), 4
    )
    student_view = x + noise * jax.random.normal(student_noise, x.shape, x.dtype)
    teacher_view = x + noise * jax.random.normal(teacher_noise, x.shape, x.dtype)
    teacher_logits, _ = policy.apply(model, teacher, state, teacher_view, train=True, key=teacher_key, **extra)
    teacher_logits = jax.lax.stop_gradient(teacher_logits)

    def objective(p):
        outputs, new_state = policy.apply(model, p, state, student_view, train=True, key=student_key, **extra)
        per_example, weights = example_losses(update.loss_fn, outputs, batch)
        total = per_example + consistency * consistency_cost(outputs, teacher_logits)
        count = jnp.maximum(weights.sum(), 1.0)
        return jnp.sum(jnp.where(weights > 0, total * weights, 0.0)) / count, (outputs, new_state, per_example, weights)

    (loss, (outputs, new_state, per_example, weights)), grads = jax.value_and_grad(objective, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, train_state["opt_state"], params)
    updated = {
        **train_state,
        "params": apply_updates(params, updates),
        "state": new_state,
        "opt_state": opt_state,
        "step": step + 1,
    }
    lr = jnp.nan if update.lr_fn is None else update.lr_fn(step)
    logs = {
        "loss": loss,
        "grad_norm": global_norm(grads),
        "lr": jnp.asarray(lr, jnp.float32),
        "skipped": jnp.zeros((), bool),
    }
    stats = batch_stats(update.metrics, outputs, batch, per_example, weights)
    return with_callbacks(update, train_state, updated), stats, logs
