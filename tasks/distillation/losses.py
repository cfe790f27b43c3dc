"""The distillation loss (Hinton et al., 2015): the student's cross-entropy on the true labels mixed with the KL
divergence from the teacher's distribution softened at temperature T to the student's, the KL scaled by T^2 so that
its gradients keep their size whatever T (section 2)::

    p = softmax(teacher_logits / T),  q = softmax(student_logits / T)
    loss = alpha * CE(student_logits, label) + (1 - alpha) * T^2 * sum_c p_c (log p_c - log q_c)

Its targets are named, ``{"label": class ids (B,), "teacher": the teacher's logits (B, C)}`` (the loader
``teacher_outputs`` gives them), and the config names the labels beside the loss, ``"labels": "label"``: the run is
then the classifier it is (its accuracy, test.py's confusion matrix, the export's classes), scored on the labels.
The teacher's logits alone (B, C) give the KL term alone; class ids alone (B,) the student's plain cross-entropy.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from model.registry import register
from tasks.distillation.data import LABEL, TEACHER  # the names of its targets, as the loader gives them


def _check_distillation(temperature: float = 4.0, alpha: float = 0.5) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature: must be a number > 0, got {temperature!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha: must be a number in [0, 1] (the weight of the labels' cross-entropy), got {alpha!r}")


def soft_targets(teacher_logits: jax.Array, temperature: float) -> jax.Array:
    """The teacher's distribution softened at ``temperature``: softmax(logits / T) over the last axis."""
    return jax.nn.softmax(teacher_logits / temperature, axis=-1)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per example (B,): the student's cross-entropy on class ids (B,), unsoftened."""
    log_q = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_q, labels.astype(jnp.int32)[..., None], axis=-1)[..., 0]


def softened_kl(logits: jax.Array, teacher_logits: jax.Array, temperature: float) -> jax.Array:
    """Per example (B,): ``T^2 KL(softmax(teacher / T) || softmax(logits / T))``."""
    if teacher_logits.shape != logits.shape:
        raise ValueError(
            f"targets of shape {teacher_logits.shape} are neither class ids nor the teacher's logits for the "
            f"student's {logits.shape}"
        )
    teacher_logits = teacher_logits.astype(logits.dtype)
    log_p = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
    log_q = jax.nn.log_softmax(logits / temperature, axis=-1)
    return temperature**2 * (jnp.exp(log_p) * (log_p - log_q)).sum(axis=-1)


@register("loss", task="classification", check=_check_distillation)
def distillation(logits: jax.Array, targets, *, temperature: float = 4.0, alpha: float = 0.5, mask=None) -> jax.Array:
    """Per example (B,): ``alpha * CE(logits, label) + (1 - alpha) * T^2 KL`` of targets ``{"label": class ids,
    "teacher": the teacher's logits}`` (name the labels beside the loss: ``"labels": "label"``); the teacher's
    logits (B, C) alone give the KL term, class ids (B,) alone the cross-entropy."""
    if mask is not None:
        raise ValueError("distillation: a per-element mask is not taken (one value per example)")
    if isinstance(targets, dict):
        if set(targets) != {LABEL, TEACHER}:
            raise ValueError(f"distillation: expected the targets {LABEL!r} and {TEACHER!r}, got {sorted(targets)}")
        hard = cross_entropy(logits, targets[LABEL])
        return alpha * hard + (1 - alpha) * softened_kl(logits, targets[TEACHER], temperature)
    if targets.ndim == logits.ndim - 1:  # true labels alone: the student's own cross-entropy
        return cross_entropy(logits, targets)
    return softened_kl(logits, targets, temperature)
