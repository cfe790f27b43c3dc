"""Loss functions: ``loss(outputs, targets, **hyperparameters) -> per-example loss of shape (batch,)``.

Each loss reduces over every non-batch axis itself; the training step weights and averages the per-example values
(``training/step.py``: the sum of weight x loss over the batch, over the sum of the weights), so a padded last batch
only needs zero weights on its padding. A per-element ``mask`` (e.g.
(B, T) for padded sequences, given by the training step when the batch has one) makes each example's value the mean
over its unmasked positions. Elementwise losses (mse, l1,
huber, binary cross-entropy) take the mean over all non-batch axes. Distribution losses (cross-entropy, KL) sum over
the class axis, the last one, and take the mean over any axes in between, e.g. the positions of a sequence.

Hyperparameters are keyword-only with defaults, so a config can set them by name:
``{"name": "cross_entropy", "args": {"label_smoothing": 0.1}}``.

A loss may register a ``check=`` function (``@register("loss", check=...)``): the config resolver calls it with the
hyperparameters before any data exists, since a loss itself runs only once the step is traced.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from model.checks import check_range
from model.registry import register


def _mean_over_examples(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean over every axis but the first: (B, ...) -> (B,); with a mask of x's leading shape (B, ...), the mean
    over the unmasked positions (0 for an example with none)."""
    if mask is None:
        return x.reshape(x.shape[0], -1).mean(axis=1)
    if mask.shape != x.shape[: mask.ndim]:
        raise ValueError(f"mask of shape {mask.shape} does not match the leading axes of the loss's {x.shape}")
    w = jnp.broadcast_to(mask.astype(x.dtype).reshape(mask.shape + (1,) * (x.ndim - mask.ndim)), x.shape)
    total = jnp.where(w != 0, w * x, 0).reshape(x.shape[0], -1).sum(axis=1)
    return total / jnp.maximum(w.reshape(x.shape[0], -1).sum(axis=1), jnp.finfo(x.dtype).tiny)


def _check_same_shape(outputs: jax.Array, targets: jax.Array) -> None:
    # (B, 1) against (B,) would otherwise broadcast to (B, B) and train on the wrong loss without a word.
    if outputs.shape != targets.shape:
        raise ValueError(f"outputs of shape {outputs.shape} and targets of shape {targets.shape} differ")


def _check_class_weights(class_weights) -> None:
    if class_weights is None:
        return
    if not isinstance(class_weights, (list, tuple)) or not class_weights:
        raise ValueError(f"class_weights: expected a list of one weight per class, got {class_weights!r}")
    for i, weight in enumerate(class_weights):
        check_range(weight, f"class_weights.{i}")


def _check_cross_entropy(label_smoothing: float = 0.0, class_weights: list | None = None) -> None:
    # 1 or more leaves nothing of the labels; below 0 rewards confidence in others
    check_range(label_smoothing, "label_smoothing", 0, 1, open_high=True)
    _check_class_weights(class_weights)


def _check_focal(gamma: float = 2.0, class_weights: list | None = None) -> None:
    check_range(gamma, "gamma")
    _check_class_weights(class_weights)


def _class_weight_vector(class_weights, num_classes: int, dtype) -> jax.Array | None:
    """The config's per-class weights as an array; their count must be the logits' class count."""
    if class_weights is None:
        return None
    if len(class_weights) != num_classes:
        raise ValueError(f"class_weights: {len(class_weights)} weights for logits of {num_classes} classes")
    return jnp.asarray(class_weights, dtype)


def _targets(labels: jax.Array, logits: jax.Array) -> tuple[jax.Array | None, jax.Array | None]:
    """(integer class ids (B, ...), None) or (None, class probabilities shaped like ``logits``)."""
    if labels.ndim == logits.ndim - 1:
        return labels.astype(jnp.int32), None
    if labels.shape == logits.shape:
        return None, labels.astype(logits.dtype)
    raise ValueError(
        f"labels of shape {labels.shape} fit neither class ids nor probabilities for logits of shape {logits.shape}"
    )


def _check_huber(delta: float = 1.0) -> None:
    if not 0 < delta < math.inf:
        raise ValueError(f"delta: must be > 0, got {delta!r}")


@register("loss", task="classification", check=_check_cross_entropy)
def cross_entropy(
    logits: jax.Array,
    labels: jax.Array,
    *,
    label_smoothing: float = 0.0,
    class_weights: list | None = None,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Softmax cross-entropy over the last axis of ``logits`` (B, ..., C).

    ``labels`` are either integer class ids of shape (B, ...) or class probabilities / one-hot vectors of the same
    shape as ``logits``. With ``label_smoothing`` a, the target becomes ``(1 - a) * labels + a / C``, as in
    ``optax.smooth_labels``. ``class_weights`` (one per class) weigh each class's term ``-w_c * y_c * log p_c``, as
    PyTorch's ``cross_entropy(weight=...)`` with ``reduction="none"``: a rare class's examples count more. The
    training step then takes the plain mean of these per-example values (PyTorch's "mean" would divide by the sum
    of the weights of the batch's labels instead, which changes the loss's scale from batch to batch).
    """
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    num_classes = logits.shape[-1]
    weights = _class_weight_vector(class_weights, num_classes, log_probs.dtype)
    ids, probs = _targets(labels, logits)
    weighted = log_probs if weights is None else log_probs * weights
    if ids is not None:
        nll = -jnp.take_along_axis(weighted, ids[..., None], axis=-1)[..., 0]
        # Smoothing with integer labels never builds the one-hot matrix: the uniform part is the mean log-prob.
        loss = (1.0 - label_smoothing) * nll - label_smoothing * weighted.mean(axis=-1)
    else:
        probs = (1.0 - label_smoothing) * probs + label_smoothing / num_classes
        loss = -(probs * weighted).sum(axis=-1)
    return _mean_over_examples(loss, mask)


@register("loss", task="classification", check=_check_focal)
def focal_loss(
    logits: jax.Array,
    labels: jax.Array,
    *,
    gamma: float = 2.0,
    class_weights: list | None = None,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Softmax focal loss (Lin et al., 2017): ``-w_c * (1 - p_c) ** gamma * log p_c`` of the true class c, summed
    over the classes for probability targets; ``gamma`` 0 is the cross-entropy. Well-classified examples
    (``p_c`` near 1) weigh little, so the hard ones, often of the rare classes, dominate the gradient.
    ``class_weights``: the paper's alpha, one per class. Labels as ``cross_entropy`` takes them.
    """
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    weights = _class_weight_vector(class_weights, logits.shape[-1], log_probs.dtype)
    ids, probs = _targets(labels, logits)
    # (1 - p) ** gamma through expm1: exact near p = 1, where 1 - exp(log p) loses every digit
    focus = jnp.power(jnp.maximum(-jnp.expm1(log_probs), 0.0), gamma) if gamma else 1.0
    terms = -focus * log_probs if weights is None else -focus * log_probs * weights
    if ids is not None:
        loss = jnp.take_along_axis(terms, ids[..., None], axis=-1)[..., 0]
    else:
        loss = (probs * terms).sum(axis=-1)
    return _mean_over_examples(loss, mask)


def _check_binary_cross_entropy(pos_weight: float | list = 1.0) -> None:
    # a list is one weight per label (the last axis); its length is checked against the logits once they exist
    if isinstance(pos_weight, (list, tuple)):
        if not pos_weight:
            raise ValueError("pos_weight: expected a number or a list of one weight per label, got []")
        for i, weight in enumerate(pos_weight):
            check_range(weight, f"pos_weight.{i}")
    else:
        check_range(pos_weight, "pos_weight")


@register("loss", task="multilabel", check=_check_binary_cross_entropy)
def binary_cross_entropy(
    logits: jax.Array, labels: jax.Array, *, pos_weight: float | list = 1.0, mask: jax.Array | None = None
) -> jax.Array:
    """Sigmoid cross-entropy of ``logits`` against labels in [0, 1] of the same shape (multi-label allowed).

    ``pos_weight`` p (a number, or one per label: the last axis) weighs the positive term, as PyTorch's
    ``BCEWithLogitsLoss(pos_weight=...)``: ``-(p * y * log sigmoid(x) + (1 - y) * log(1 - sigmoid(x)))``. For a
    rare positive class, p = negatives / positives (9 for a 1:9 imbalance) makes both classes weigh alike.
    """
    _check_same_shape(logits, labels)
    labels = labels.astype(logits.dtype)
    if isinstance(pos_weight, (list, tuple)):
        if len(pos_weight) != logits.shape[-1]:
            raise ValueError(f"pos_weight: {len(pos_weight)} weights for logits of {logits.shape[-1]} labels")
        pos_weight = jnp.asarray(pos_weight, logits.dtype)
    # -log sigmoid(x) = softplus(-x) and -log sigmoid(-x) = x + softplus(-x): no overflow at large |x|
    weight = 1.0 + (pos_weight - 1.0) * labels
    return _mean_over_examples((1.0 - labels) * logits + weight * jax.nn.softplus(-logits), mask)


@register("loss", task="regression")
def mse(outputs: jax.Array, targets: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Mean squared error over the non-batch axes."""
    _check_same_shape(outputs, targets)
    return _mean_over_examples(jnp.square(outputs - targets), mask)


@register("loss", task="regression")
def l1(outputs: jax.Array, targets: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Mean absolute error over the non-batch axes."""
    _check_same_shape(outputs, targets)
    return _mean_over_examples(jnp.abs(outputs - targets), mask)


@register("loss", task="regression", check=_check_huber)
def huber(outputs: jax.Array, targets: jax.Array, *, delta: float = 1.0, mask: jax.Array | None = None) -> jax.Array:
    """Huber loss: ``0.5 e^2`` for ``|e| <= delta``, ``delta * (|e| - 0.5 delta)`` beyond; mean over non-batch axes."""
    _check_same_shape(outputs, targets)
    error = jnp.abs(outputs - targets)
    quadratic = jnp.minimum(error, delta)
    return _mean_over_examples(0.5 * jnp.square(quadratic) + delta * (error - quadratic), mask)


@register("loss")
def kl_divergence(log_predictions: jax.Array, targets: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """``KL(targets || predictions)`` over the last axis.

    ``log_predictions`` are the model's log-probabilities (e.g. a log_softmax output); ``targets`` are
    probabilities, not logs, and may contain exact zeros (``0 log 0 = 0``). Same argument order as optax.
    """
    _check_same_shape(log_predictions, targets)
    targets = targets.astype(log_predictions.dtype)
    positive = targets > 0
    # Double where keeps log(0) out of both the value and the gradient.
    log_targets = jnp.where(positive, jnp.log(jnp.where(positive, targets, 1.0)), 0.0)
    loss = (targets * (log_targets - log_predictions)).sum(axis=-1)
    return _mean_over_examples(loss, mask)


@register("loss")
def kl_divergence_with_logits(logits: jax.Array, targets: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """``kl_divergence(log_softmax(logits), targets)``: KL from target probabilities to the model's softmax."""
    return kl_divergence(jax.nn.log_softmax(logits, axis=-1), targets, mask=mask)


class OutputLosses(dict):
    """The type of ``weighted_sum``'s ``losses``: ``{output name: {"name": loss, "args": {...}, "weight": w}}`` in
    a config; the config resolver (training/config/components.py) checks each entry as a loss of its own and builds it
    into ``{output name: (loss function, weight)}``."""


@register("loss")
def weighted_sum(outputs: dict, targets: dict, *, losses: OutputLosses, mask: jax.Array | None = None) -> jax.Array:
    """A model of named outputs (a dict, like ``Heads`` gives) against targets of the same names: per example,
    ``sum over outputs of weight * loss(outputs[name], targets[name])``, each output's loss and weight named in
    the config::

        "loss": {"name": "weighted_sum", "args": {"losses": {
            "digit": {"name": "cross_entropy", "weight": 1.0},
            "ink": {"name": "mse", "args": {}, "weight": 0.5}}}}

    ``weight`` defaults to 1. Each output keeps its own task (``test.py`` and the export judge each by it).
    """
    total = None
    for name, (loss_fn, weight) in losses.items():
        for kind, tree in (("outputs", outputs), ("targets", targets)):
            if not isinstance(tree, dict) or name not in tree:
                found = f"names {sorted(tree)}" if isinstance(tree, dict) else "one array"
                raise ValueError(f"weighted_sum: a loss for the output {name!r}, but the {kind} have {found}")
        value = loss_fn(outputs[name], targets[name], **({} if mask is None else {"mask": mask}))
        total = weight * value if total is None else total + weight * value
    return total
