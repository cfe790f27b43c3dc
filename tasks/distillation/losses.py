"""The distillation loss: the KL divergence from the teacher's distribution softened at temperature T to the
student's, scaled by T^2 so that its gradients keep their size whatever T (Hinton et al., 2015, section 2)::

    p = softmax(teacher_logits / T),  q = softmax(student_logits / T)
    loss = T^2 * sum_c p_c (log p_c - log q_c)

A batch of class ids instead (a validation or test split with the true labels) gives the plain cross-entropy of the
student, unsoftened: what the student is finally judged by. Registered as a classification loss, so test.py and the
export treat the student as the classifier it is.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from model.registry import register


def _check_distillation(temperature: float = 4.0) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature: must be a number > 0, got {temperature!r}")


def soft_targets(teacher_logits: jax.Array, temperature: float) -> jax.Array:
    """The teacher's distribution softened at ``temperature``: softmax(logits / T) over the last axis."""
    return jax.nn.softmax(teacher_logits / temperature, axis=-1)


@register("loss", task="classification", check=_check_distillation)
def distillation(logits: jax.Array, targets: jax.Array, *, temperature: float = 4.0, mask=None) -> jax.Array:
    """Per example (B,): ``T^2 KL(softmax(targets / T) || softmax(logits / T))`` where ``targets`` are the teacher's
    logits (B, C) (the loader ``teacher_outputs`` gives them); the cross-entropy of ``logits`` where ``targets`` are
    class ids (B,)."""
    if mask is not None:
        raise ValueError("distillation: a per-element mask is not taken (one value per example)")
    if targets.ndim == logits.ndim - 1:  # true labels: the student's own cross-entropy
        log_q = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(log_q, targets.astype(jnp.int32)[..., None], axis=-1)[..., 0]
    if targets.shape != logits.shape:
        raise ValueError(
            f"targets of shape {targets.shape} are neither class ids nor the teacher's logits for the student's "
            f"{logits.shape}"
        )
    targets = targets.astype(logits.dtype)
    log_p = jax.nn.log_softmax(targets / temperature, axis=-1)
    log_q = jax.nn.log_softmax(logits / temperature, axis=-1)
    return temperature**2 * (jnp.exp(log_p) * (log_p - log_q)).sum(axis=-1)
