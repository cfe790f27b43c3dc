"""Metrics built from sufficient statistics that add up across batches.

A metric's ``stats(outputs, targets, mask)`` returns a dict of sums for one batch (jittable; ``mask`` is 1 for real
examples and 0 for padding, per example (batch,) or per element, e.g. (batch, positions)). Stats of several batches
combine with ``merge``, and ``result`` turns the summed stats into the value, so an epoch value is exact whatever the
batch sizes and padding:

    total = None
    for outputs, targets, mask in batches:
        total = merge(total, metric.stats(outputs, targets, mask))
    value = metric.result(total)

Classification metrics take logits (B, ..., C) and targets as integer class ids (B, ...) or one-hot/probabilities
(B, ..., C); the class count is ``outputs.shape[-1]``. A single logit (C = 1) is a binary classifier: class 1 when
the logit is positive, targets 0/1 of shape (B, ...) or (B, ..., 1). Counts are float32 sums, exact up to 2**24.
``perplexity`` takes the same logits and targets as a language model's cross-entropy, a token per position.

Multi-label metrics (``binary_accuracy``, ``multilabel_*``) take logits and 0/1 targets of the same shape, e.g.
attributes (B, L) or segmentation masks (B, H, W, 1); an element is predicted positive when its probability
exceeds ``threshold`` (0.5: a positive logit), and the labels are the last axis. A per-element mask covers the
leading axes of the outputs, e.g. (B, H, W) for masks (B, H, W, 1). ``roc_auc`` and ``pr_auc`` take the same logits
and targets and judge the ranking, no threshold: their stats are histograms of the logits (``AUC_BINS``).

Zero division gives 0, as sklearn's ``zero_division=0``: a class never predicted has precision 0, a class with no
true examples has recall 0. Macro averages, like sklearn's default, run over the classes that occur in the targets
or the predictions seen so far; a class absent from both has no defined score and is left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from model.registry import register

# What a config can name under "metrics"; merge and values are the training loop's helpers, compute a single
# batch's value.

Stats = dict


class Metric(NamedTuple):
    name: str  # key used in logs
    stats: Callable[..., Stats]  # (outputs, targets, mask) -> dict of per-batch sums
    result: Callable[[Stats], jax.Array]  # summed stats -> value (scalar, or a vector per class)


def merge(a: Stats | None, b: Stats) -> Stats:
    """Sum of two batches' stats; ``a`` may be None, meaning nothing accumulated yet."""
    return b if a is None else jax.tree.map(jnp.add, a, b)


def compute(metric: Metric, outputs, targets, mask=None):
    """The metric of a single batch."""
    return metric.result(metric.stats(outputs, targets, mask))


def _divide(numerator, denominator):
    """numerator / denominator, 0 where the denominator is 0."""
    nonzero = denominator > 0
    return jnp.where(nonzero, numerator / jnp.where(nonzero, denominator, 1), 0.0)


def _weights(mask, like: jax.Array) -> jax.Array:
    """The mask, per example (B,) or per element (B, T, ...), broadcast to the shape of ``like`` (B, ...); all
    ones when mask is None."""
    if mask is None:
        return jnp.ones(like.shape, jnp.float32)
    mask = jnp.asarray(mask, jnp.float32)
    if mask.shape != like.shape[: mask.ndim]:
        raise ValueError(f"mask of shape {mask.shape} does not match the leading axes of {like.shape}")
    return jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim)), like.shape)


def _masked_sum(values: jax.Array, mask) -> jax.Array:
    # where, not a bare product: padding may hold anything, NaN included, and must add exactly 0.
    w = _weights(mask, values)
    return jnp.where(w > 0, w * values, 0.0).sum()


def _logit_threshold(threshold) -> float:
    """The logit at which the sigmoid equals ``threshold``: comparing logits stays exact where the sigmoid of a large
    logit would round to 1."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) or not 0 < threshold < 1:
        raise ValueError(f"threshold: must be a probability in (0, 1), exclusive, got {threshold!r}")
    return math.log(threshold) - math.log1p(-threshold)


def _thresholded_name(name: str, threshold) -> str:
    # a distinct log name per threshold, so two thresholds of one metric can be configured side by side
    return name if threshold == 0.5 else f"{name}@{threshold:g}"


def _classes(outputs: jax.Array, targets: jax.Array, logit_threshold: float = 0.0):
    """(predicted ids, true ids, number of classes) from logits and ids / one-hot targets; ``logit_threshold`` is
    where a single logit turns to class 1."""
    if outputs.shape[-1] == 1:
        predicted = (outputs[..., 0] > logit_threshold).astype(jnp.int32)
        return predicted, (targets.reshape(predicted.shape) > 0.5).astype(jnp.int32), 2
    return jnp.argmax(outputs, axis=-1), _true_ids(outputs, targets), outputs.shape[-1]


def _true_ids(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    """Integer class ids (B, ...) from ids or from one-hot / probability targets shaped like the logits."""
    return jnp.argmax(targets, axis=-1) if targets.shape == outputs.shape else targets.astype(jnp.int32)


def _class_counts(outputs, targets, mask, logit_threshold: float = 0.0) -> Stats:
    """Per-class true positives, predicted counts and actual (support) counts, each of shape (C,)."""
    predicted, true, num_classes = _classes(outputs, targets, logit_threshold)
    w = _weights(mask, true)
    w = jnp.where(w > 0, w, 0.0).reshape(-1, 1)
    p = jax.nn.one_hot(predicted.reshape(-1), num_classes)
    t = jax.nn.one_hot(true.reshape(-1), num_classes)
    return {"true_positives": (w * p * t).sum(0), "predicted": (w * p).sum(0), "actual": (w * t).sum(0)}


def _check_same_shape(outputs, targets) -> None:
    if outputs.shape != targets.shape:
        raise ValueError(f"outputs of shape {outputs.shape} and targets of shape {targets.shape} differ")


def _binary_elements(outputs, targets, logit_threshold: float):
    """(predicted, true) as booleans of the outputs' shape; NaN (padding) compares False, never propagates."""
    _check_same_shape(outputs, targets)
    return outputs > logit_threshold, targets > 0.5


def _label_counts(logit_threshold: float) -> Callable[..., Stats]:
    """Stats of per-label counts, the labels being the last axis; every other axis (batch, spatial) is pooled."""

    def stats(outputs, targets, mask=None):
        predicted, true = _binary_elements(outputs, targets, logit_threshold)
        num_labels = outputs.shape[-1]
        w = _weights(mask, outputs)
        w = jnp.where(w > 0, w, 0.0).reshape(-1, num_labels)
        p = predicted.reshape(-1, num_labels).astype(jnp.float32)
        t = true.reshape(-1, num_labels).astype(jnp.float32)
        return {"true_positives": (w * p * t).sum(0), "predicted": (w * p).sum(0), "actual": (w * t).sum(0)}

    return stats


def _averaged(
    name: str,
    per_class: Callable[[Stats], jax.Array],
    average: str,
    stats_fn: Callable[..., Stats] = _class_counts,
    per_class_name: str | None = None,
) -> Metric:
    if average not in ("macro", "none"):
        raise ValueError(f"average: must be 'macro' or 'none', got {average!r}")

    def result(stats):
        scores = per_class(stats)
        if average == "none":
            return scores
        present = (stats["actual"] + stats["predicted"]) > 0
        return _divide(jnp.where(present, scores, 0.0).sum(), present.sum())

    # a distinct log name per averaging, so "f1" and per-class "f1" can both be configured
    return Metric(name if average == "macro" else per_class_name or f"{name}_per_class", stats_fn, result)


@register("metrics")
def accuracy() -> Metric:
    """Fraction of examples (or positions) whose argmax matches the target class."""

    def stats(outputs, targets, mask=None):
        predicted, true, _ = _classes(outputs, targets)
        return {
            "correct": _masked_sum((predicted == true).astype(jnp.float32), mask),
            "count": _masked_sum(jnp.ones(true.shape, jnp.float32), mask),
        }

    return Metric("accuracy", stats, lambda s: _divide(s["correct"], s["count"]))


@register("metrics")
def top_k_accuracy(k: int = 5) -> Metric:
    """Fraction whose target class is among the k highest logits; ties with the target's logit count in its favour.
    ``k`` is an integer from 1 to the class count."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k: must be an integer >= 1, got {k!r}")

    def stats(outputs, targets, mask=None):
        # the class count is known only from the outputs, at trace time
        if k > outputs.shape[-1]:
            raise ValueError(
                f"top_k_accuracy: k = {k} exceeds the {outputs.shape[-1]} classes of the outputs "
                f"(k must be from 1 to {outputs.shape[-1]})"
            )
        true = _true_ids(outputs, targets)
        target_logit = jnp.take_along_axis(outputs, true[..., None], axis=-1)
        rank = (outputs > target_logit).sum(axis=-1)  # how many classes beat the target
        return {
            "correct": _masked_sum((rank < k).astype(jnp.float32), mask),
            "count": _masked_sum(jnp.ones(true.shape, jnp.float32), mask),
        }

    return Metric(f"top_{k}_accuracy", stats, lambda s: _divide(s["correct"], s["count"]))


@register("metrics")
def precision(average: str = "macro") -> Metric:
    """tp / predicted per class; ``average`` "macro" (mean over classes) or "none" (vector of shape (C,))."""
    return _averaged("precision", lambda s: _divide(s["true_positives"], s["predicted"]), average)


@register("metrics")
def recall(average: str = "macro") -> Metric:
    """tp / actual per class; ``average`` "macro" or "none"."""
    return _averaged("recall", lambda s: _divide(s["true_positives"], s["actual"]), average)


@register("metrics")
def f1(average: str = "macro") -> Metric:
    """Per-class F1 = 2 tp / (predicted + actual); macro F1 is the mean of these, as in sklearn."""
    return _averaged("f1", lambda s: _divide(2 * s["true_positives"], s["predicted"] + s["actual"]), average)


@register("metrics")
def confusion_matrix() -> Metric:
    """Counts of shape (C, C): row = true class, column = predicted class."""

    def stats(outputs, targets, mask=None):
        predicted, true, num_classes = _classes(outputs, targets)
        w = _weights(mask, true)
        w = jnp.where(w > 0, w, 0.0)
        matrix = jnp.zeros((num_classes, num_classes), jnp.float32)
        return {"matrix": matrix.at[true.reshape(-1), predicted.reshape(-1)].add(w.reshape(-1))}

    return Metric("confusion_matrix", stats, lambda s: s["matrix"])


@register("metrics")
def perplexity() -> Metric:
    """exp of the mean cross-entropy per position (every real token of every example, not a mean of per-example
    perplexities). Logits (B, ..., V); targets are token ids (B, ...) or probabilities / one-hot (B, ..., V), in
    which case the cross-entropy is against that distribution. An empty epoch gives exp(0) = 1."""

    def stats(outputs, targets, mask=None):
        if outputs.shape[-1] < 2:
            raise ValueError(f"perplexity needs a logit per vocabulary entry, got outputs of shape {outputs.shape}")
        # float32 even for bfloat16 logits: the epoch's sum of log-likelihoods would lose most of its digits
        log_probs = jax.nn.log_softmax(outputs.astype(jnp.float32), axis=-1)
        if targets.shape == outputs.shape:
            nll = -(targets.astype(jnp.float32) * log_probs).sum(axis=-1)
        elif targets.shape == outputs.shape[:-1]:
            nll = -jnp.take_along_axis(log_probs, targets.astype(jnp.int32)[..., None], axis=-1)[..., 0]
        else:
            raise ValueError(
                f"targets of shape {targets.shape} fit neither token ids nor probabilities for logits "
                f"of shape {outputs.shape}"
            )
        return {"nll_sum": _masked_sum(nll, mask), "count": _masked_sum(jnp.ones(nll.shape, jnp.float32), mask)}

    return Metric("perplexity", stats, lambda s: jnp.exp(_divide(s["nll_sum"], s["count"])))


@register("metrics")
def binary_accuracy(threshold: float = 0.5) -> Metric:
    """Fraction of elements whose prediction (probability > ``threshold``) equals the 0/1 target, over every element
    of logits and targets of the same shape: per attribute for (B, L), per pixel for masks (B, H, W, 1), i.e. the
    pixel accuracy of a segmentation."""
    logit_threshold = _logit_threshold(threshold)

    def stats(outputs, targets, mask=None):
        predicted, true = _binary_elements(outputs, targets, logit_threshold)
        return {
            "correct": _masked_sum((predicted == true).astype(jnp.float32), mask),
            "count": _masked_sum(jnp.ones(outputs.shape, jnp.float32), mask),
        }

    return Metric(_thresholded_name("binary_accuracy", threshold), stats, lambda s: _divide(s["correct"], s["count"]))


def _multilabel(name: str, per_label: Callable[[Stats], jax.Array], average: str, threshold) -> Metric:
    logit_threshold = _logit_threshold(threshold)
    return _averaged(
        _thresholded_name(name, threshold),
        per_label,
        average,
        _label_counts(logit_threshold),
        _thresholded_name(f"{name}_per_label", threshold),
    )


@register("metrics")
def multilabel_precision(average: str = "macro", threshold: float = 0.5) -> Metric:
    """tp / predicted per label (last axis); ``average`` "macro" (mean over labels present in the targets or the
    predictions) or "none" (vector (L,))."""
    return _multilabel(
        "multilabel_precision", lambda s: _divide(s["true_positives"], s["predicted"]), average, threshold
    )


@register("metrics")
def multilabel_recall(average: str = "macro", threshold: float = 0.5) -> Metric:
    """tp / actual per label (last axis); ``average`` "macro" or "none"."""
    return _multilabel("multilabel_recall", lambda s: _divide(s["true_positives"], s["actual"]), average, threshold)


@register("metrics")
def multilabel_f1(average: str = "macro", threshold: float = 0.5) -> Metric:
    """Per-label F1 = 2 tp / (predicted + actual), the labels being the last axis and every other axis pooled (for
    one mask channel (B, H, W, 1) this is the Dice score of the foreground); ``average`` "macro" (mean over labels
    present in the targets or the predictions) or "none" (vector (L,), logged as ``multilabel_f1_per_label``)."""
    return _multilabel(
        "multilabel_f1", lambda s: _divide(2 * s["true_positives"], s["predicted"] + s["actual"]), average, threshold
    )


@register("metrics")
def multilabel_confusion_matrix(threshold: float = 0.5) -> Metric:
    """Per label (the last axis; every other axis pooled), the counts [[true negatives, false positives], [false
    negatives, true positives]] at ``threshold``, shape (L, 2, 2), as sklearn's ``multilabel_confusion_matrix``;
    ``test.py`` reports a binary or multi-label run's per-label table from it."""
    counts = _label_counts(_logit_threshold(threshold))

    def stats(outputs, targets, mask=None):
        w = _weights(mask, outputs)
        total = jnp.where(w > 0, w, 0.0).reshape(-1, outputs.shape[-1]).sum(0)
        return {**counts(outputs, targets, mask), "count": total}

    def result(s):
        tp, predicted, actual = s["true_positives"], s["predicted"], s["actual"]
        negatives = s["count"] - actual
        rows = [jnp.stack([negatives - (predicted - tp), predicted - tp], -1), jnp.stack([actual - tp, tp], -1)]
        return jnp.stack(rows, axis=-2)

    return Metric(_thresholded_name("multilabel_confusion_matrix", threshold), stats, result)


@register("metrics")
def mean_iou(average: str = "macro", threshold: float = 0.5) -> Metric:
    """Intersection over union per class, tp / (predicted + actual - tp), averaged over the classes present in the
    targets or the predictions (sklearn's ``jaccard_score(average="macro")``); "none" gives the vector (C,).

    Logits (B, ..., C) with class ids (B, ...) or one-hot targets (B, ..., C) score the C classes (argmax); a single
    logit channel (B, ..., 1) with 0/1 targets (B, ..., 1) or (B, ...) scores background and foreground (2 classes),
    foreground where the probability exceeds ``threshold``. A per-element mask has the shape (B, ...) of the ids.
    """
    logit_threshold = _logit_threshold(threshold)

    def stats(outputs, targets, mask=None):
        if threshold != 0.5 and outputs.shape[-1] > 1:
            raise ValueError(
                f"mean_iou: threshold applies to a single logit channel only; the outputs have "
                f"{outputs.shape[-1]} classes, scored by argmax (leave threshold at 0.5)"
            )
        return _class_counts(outputs, targets, mask, logit_threshold)

    return _averaged(
        _thresholded_name("mean_iou", threshold),
        lambda s: _divide(s["true_positives"], s["predicted"] + s["actual"] - s["true_positives"]),
        average,
        stats,
        _thresholded_name("iou_per_class", threshold),
    )


# ROC-AUC and PR-AUC need every score of the split, ranked; stats that add up across batches hold a histogram of the
# logits per label instead: AUC_BINS equal bins of the logit over [-AUC_LOGIT_RANGE, AUC_LOGIT_RANGE] (probabilities
# 1e-7 to 1 - 1e-7; logits beyond go to the end bins), positives and negatives counted apart. The result is the exact
# AUC of the logits rounded to their bins: it differs from the unbinned AUC only through pairs of a positive and a
# negative in one bin (width 1/64 of a logit), counted as ties (half). Logit bins, not probability bins, keep that
# resolution where a confident model puts most of its scores (probabilities near 0 or 1).
AUC_BINS = 2048
AUC_LOGIT_RANGE = 16.0


def _score_histograms(outputs, targets, mask=None) -> Stats:
    """Per label (the last axis; every other axis pooled): the weights of the negatives and of the positives
    (target > 0.5) in each logit bin, each (L, AUC_BINS) in rising order of the logit."""
    _check_same_shape(outputs, targets)
    num_labels = outputs.shape[-1]
    w = _weights(mask, outputs)
    w = jnp.where(w > 0, w, 0.0).reshape(-1, num_labels)
    x = outputs.astype(jnp.float32).reshape(-1, num_labels)
    x = jnp.where(jnp.isnan(x), 0.0, x)  # padding may hold NaN: its weight is 0, its bin any valid one
    scaled = (x + AUC_LOGIT_RANGE) * (AUC_BINS / (2 * AUC_LOGIT_RANGE))
    bins = jnp.clip(jnp.floor(scaled), 0, AUC_BINS - 1).astype(jnp.int32)
    positive = (targets.reshape(-1, num_labels) > 0.5).astype(jnp.int32)
    labels = jnp.broadcast_to(jnp.arange(num_labels), bins.shape)
    counts = jnp.zeros((2, num_labels, AUC_BINS), jnp.float32).at[positive, labels, bins].add(w)
    return {"negatives": counts[0], "positives": counts[1]}


def _roc_auc(stats: Stats) -> tuple[jax.Array, jax.Array]:
    """(per-label ROC-AUC, whether it is defined): the Mann-Whitney U over positives x negatives, a pair in one bin
    counting half."""
    positives, negatives = stats["positives"], stats["negatives"]
    below = jnp.cumsum(negatives, axis=-1) - negatives  # negatives in lower bins than each bin
    wins = (positives * (below + 0.5 * negatives)).sum(-1)
    total_p, total_n = positives.sum(-1), negatives.sum(-1)
    return _divide(wins, total_p * total_n), (total_p > 0) & (total_n > 0)


def _average_precision(stats: Stats) -> tuple[jax.Array, jax.Array]:
    """(per-label average precision, whether it is defined), as sklearn's ``average_precision_score``: the sum over
    thresholds (the bins, highest first) of the recall gained times the precision there."""
    positives, negatives = stats["positives"][..., ::-1], stats["negatives"][..., ::-1]
    true_positives = jnp.cumsum(positives, axis=-1)
    precision = _divide(true_positives, true_positives + jnp.cumsum(negatives, axis=-1))
    total_p = positives.sum(-1)
    return _divide((positives * precision).sum(-1), total_p), total_p > 0


def _ranking(name: str, per_label: Callable[[Stats], tuple], average: str) -> Metric:
    if average not in ("macro", "none"):
        raise ValueError(f"average: must be 'macro' or 'none', got {average!r}")

    def result(stats):
        scores, defined = per_label(stats)
        if average == "none":
            return scores
        return _divide(jnp.where(defined, scores, 0.0).sum(), defined.sum())

    return Metric(name if average == "macro" else f"{name}_per_label", _score_histograms, result)


@register("metrics")
def roc_auc(average: str = "macro") -> Metric:
    """Area under the ROC curve per label of sigmoid logits (B, ..., L) against 0/1 targets of the same shape (a
    binary classifier: L = 1): the chance that a random positive scores above a random negative, ties half. No
    threshold: it judges the ranking. Binned (``AUC_BINS``, above), so exact across batches up to pairs within a
    bin. ``average`` "macro": the mean over labels that have both positives and negatives; "none": the vector (L,)
    (0 for a label without both), logged as ``roc_auc_per_label``."""
    return _ranking("roc_auc", _roc_auc, average)


@register("metrics")
def pr_auc(average: str = "macro") -> Metric:
    """Area under the precision-recall curve as average precision (sklearn's ``average_precision_score``: the
    precision at each threshold weighed by the recall it adds, no interpolation), per label of sigmoid logits
    against 0/1 targets of the same shape; binned as ``roc_auc``. A random ranking scores the share of positives,
    so it says more than ROC-AUC about a rare class. ``average`` "macro": the mean over labels with positives;
    "none": the vector (L,), logged as ``pr_auc_per_label``."""
    return _ranking("pr_auc", _average_precision, average)


def _regression_stats(error_fn: Callable[[jax.Array], jax.Array], key: str):
    def stats(outputs, targets, mask=None):
        _check_same_shape(outputs, targets)
        # float32 sums even for bfloat16 outputs, which would lose most of an epoch's total.
        error = error_fn(outputs.astype(jnp.float32) - targets.astype(jnp.float32))
        return {key: _masked_sum(error, mask), "count": _masked_sum(jnp.ones(error.shape, jnp.float32), mask)}

    return stats


@register("metrics")
def mae() -> Metric:
    """Mean absolute error over every element of every real example."""
    return Metric("mae", _regression_stats(jnp.abs, "abs_error"), lambda s: _divide(s["abs_error"], s["count"]))


@register("metrics")
def rmse() -> Metric:
    """Root of the mean squared error over every element of every real example (not a mean of batch RMSEs)."""
    return Metric(
        "rmse",
        _regression_stats(jnp.square, "squared_error"),
        lambda s: jnp.sqrt(_divide(s["squared_error"], s["count"])),
    )


def values(metrics, stats: dict) -> dict[str, float | list]:
    """The results of several metrics from their summed stats (``{metric.name: stats}``) as host numbers for
    logging: scalars as floats, vectors (per class) as lists."""
    out = {}
    for metric in metrics:
        value = np.asarray(metric.result(stats[metric.name]))
        out[metric.name] = float(value) if value.ndim == 0 else value.tolist()
    return out


def metric_results(metrics, stats: dict) -> dict[str, float | list]:
    """The loss and every metric from an evaluation's or epoch's summed statistics (``{"loss_sum", "count",
    "metrics"}``), as host numbers. Reading them waits for the computation that makes them."""
    stats = jax.device_get(stats)
    return {"loss": float(stats["loss_sum"]) / max(float(stats["count"]), 1.0), **values(metrics, stats["metrics"])}
