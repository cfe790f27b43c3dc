"""Metrics against numpy references (sklearn definitions, zero_division=0) on random, masked and ragged batches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import expit, log_softmax

from training import metrics
from training.config.components import available

C = 4
rng = np.random.default_rng(0)


# ---- numpy references, written from the definitions on the examples left after masking ----


def np_classes(outputs, targets):
    if outputs.shape[-1] == 1:
        true = targets.reshape(outputs.shape[:-1]) > 0.5
        return (outputs[..., 0] > 0).astype(int).ravel(), true.astype(int).ravel()
    true = targets.argmax(-1) if targets.shape == outputs.shape else targets
    return outputs.argmax(-1).ravel(), np.asarray(true).ravel()


def np_per_class(true, pred, num_classes):
    """Per-class (precision, recall, f1) with 0 for 0/0, and the classes seen in true or pred."""
    scores = np.zeros((3, num_classes))
    for c in range(num_classes):
        tp = np.sum((pred == c) & (true == c))
        p = tp / np.sum(pred == c) if np.any(pred == c) else 0.0
        r = tp / np.sum(true == c) if np.any(true == c) else 0.0
        scores[:, c] = p, r, (2 * p * r / (p + r) if p + r > 0 else 0.0)
    return scores, np.union1d(true, pred)


def np_metric(name, outputs, targets):
    if name in ("mae", "rmse"):
        error = (outputs.astype(np.float64) - targets).ravel()
        return np.abs(error).mean() if name == "mae" else np.sqrt(np.mean(error**2))
    if name == "top_2_accuracy":
        top = np.argsort(-outputs, axis=-1)[..., :2]
        return np.mean(np.any(top == np_classes(outputs, targets)[1].reshape(top.shape[:-1] + (1,)), -1))
    pred, true = np_classes(outputs, targets)
    num_classes = max(outputs.shape[-1], 2)
    if name == "accuracy":
        return np.mean(pred == true)
    if name == "confusion_matrix":
        matrix = np.zeros((num_classes, num_classes))
        np.add.at(matrix, (true, pred), 1)
        return matrix
    scores, present = np_per_class(true, pred, num_classes)
    row = scores[["precision", "recall", "f1"].index(name.split("_")[0])]
    return row if name.endswith("_none") else row[present].mean()


FACTORIES = {
    "accuracy": metrics.accuracy,
    "top_2_accuracy": lambda: metrics.top_k_accuracy(2),
    "precision": metrics.precision,
    "recall": metrics.recall,
    "f1": metrics.f1,
    "precision_none": lambda: metrics.precision("none"),
    "recall_none": lambda: metrics.recall("none"),
    "f1_none": lambda: metrics.f1("none"),
    "confusion_matrix": metrics.confusion_matrix,
    "mae": metrics.mae,
    "rmse": metrics.rmse,
}
REGRESSION = ("mae", "rmse")


def _batch(name, n, num_classes=C, label_high=C):
    if name in REGRESSION:
        return rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32)
    return rng.standard_normal((n, num_classes)).astype(np.float32), rng.integers(0, label_high, n)


def _close(got, expected):
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_ragged_epoch_under_jit(name):
    """Two batches of different sizes, the second padded with garbage under mask 0, merged == whole data."""
    metric = FACTORIES[name]()
    stats = jax.jit(metric.stats)
    # Class C-1 never appears as a label, so the per-class conventions for missing support are exercised too.
    out_a, tgt_a = _batch(name, 9, label_high=C - 1)
    out_b, tgt_b = _batch(name, 4, label_high=C - 1)
    pad_out = np.full((3,) + out_b.shape[1:], np.nan if name in REGRESSION else 1e6, np.float32)
    pad_tgt = np.zeros((3,) + tgt_b.shape[1:], tgt_b.dtype)
    out_b_padded, tgt_b_padded = np.concatenate([out_b, pad_out]), np.concatenate([tgt_b, pad_tgt])
    mask_b = np.array([1, 1, 1, 1, 0, 0, 0], np.float32)

    total = metrics.merge(None, stats(out_a, tgt_a, np.ones(9, np.float32)))
    total = metrics.merge(total, stats(out_b_padded, tgt_b_padded, mask_b))
    expected = np_metric(name, np.concatenate([out_a, out_b]), np.concatenate([tgt_a, tgt_b]))
    _close(metric.result(total), expected)
    _close(metrics.compute(metric, np.concatenate([out_a, out_b]), np.concatenate([tgt_a, tgt_b])), expected)
    assert np.isfinite(np.asarray(metric.result(total))).all()


@pytest.mark.parametrize("name", ["accuracy", "top_2_accuracy", "f1", "recall_none", "confusion_matrix"])
def test_one_hot_targets_and_sequences(name):
    """Logits (B, T, C) with ids (B, T) or one-hot (B, T, C): every position of a real example counts."""
    metric = FACTORIES[name]()
    outputs = rng.standard_normal((5, 3, C)).astype(np.float32)
    ids = rng.integers(0, C, (5, 3))
    mask = np.array([1, 0, 1, 1, 0], np.float32)
    keep = mask > 0
    expected = np_metric(name, outputs[keep].reshape(-1, C), ids[keep].ravel())
    _close(metrics.compute(metric, outputs, ids, mask), expected)
    _close(metrics.compute(metric, outputs, np.eye(C, dtype=np.float32)[ids], mask), expected)


@pytest.mark.parametrize("name", ["accuracy", "precision", "f1_none", "confusion_matrix"])
def test_single_logit_is_binary(name):
    outputs = rng.standard_normal((10, 1)).astype(np.float32)
    targets = rng.integers(0, 2, (10, 1)).astype(np.float32)
    expected = np_metric(name, outputs, targets)
    _close(metrics.compute(FACTORIES[name](), outputs, targets), expected)
    _close(metrics.compute(FACTORIES[name](), outputs, targets[:, 0]), expected)


def test_zero_division_convention():
    # Every example is predicted as class 0; classes 1 and 2 occur only as targets; class 3 occurs nowhere.
    outputs = np.eye(C, dtype=np.float32)[[0, 0, 0, 0]]
    targets = np.array([0, 1, 1, 2])
    p, r, f = (
        np.asarray(metrics.compute(m("none"), outputs, targets))
        for m in (metrics.precision, metrics.recall, metrics.f1)
    )
    np.testing.assert_array_equal(p, [0.25, 0, 0, 0])  # classes 1-3 never predicted
    np.testing.assert_array_equal(r, [1, 0, 0, 0])  # classes 1, 2 missed; class 3 has no support
    _close(f, [0.4, 0, 0, 0])
    # Macro runs over classes 0-2 (seen in targets or predictions), like sklearn's default labels.
    _close(metrics.compute(metrics.f1(), outputs, targets), 0.4 / 3)


def test_values_names_and_errors():
    outputs, targets = _batch("f1", 12)
    chosen = [metrics.f1("none"), metrics.accuracy(), metrics.confusion_matrix()]
    stats = {m.name: m.stats(outputs, targets, None) for m in chosen}
    results = metrics.values(chosen, stats)
    assert list(results) == ["f1_per_class", "accuracy", "confusion_matrix"]
    _close(results["f1_per_class"], np_metric("f1_none", outputs, targets))
    assert type(results["accuracy"]) is float and len(results["confusion_matrix"]) == C
    assert metrics.f1().name == "f1" and metrics.precision("none").name == "precision_per_class"
    assert metrics.top_k_accuracy(3).name == "top_3_accuracy"
    assert all(isinstance(make(), metrics.Metric) for make in available("metrics").values())  # any file's
    with pytest.raises(ValueError):
        metrics.f1("micro")
    with pytest.raises(ValueError):  # (B, 1) against (B,) must not broadcast
        metrics.mae().stats(outputs[:, :1], outputs[:, 0], None)


# ---- perplexity, multi-label / per-element metrics and mean IoU, with per-example and per-element masks ----
# Each reference receives the whole data and a boolean ``keep`` of its unit shape (the ids' shape for perplexity and
# mean_iou, the outputs' shape for the element-wise metrics) and looks at the kept units only, so garbage elsewhere
# never reaches it.


def np_perplexity(outputs, targets, keep):
    log_p = log_softmax(outputs[keep].astype(np.float64), axis=-1)
    t = targets[keep]
    nll = -(t * log_p).sum(-1) if t.ndim == 2 else -log_p[np.arange(len(t)), t]
    return np.exp(nll.mean())


def np_binary_accuracy(outputs, targets, keep, threshold=0.5):
    return np.mean((expit(outputs[keep].astype(np.float64)) > threshold) == (targets[keep] > 0.5))


def np_macro(scores, present):
    return scores[present].mean() if present.any() else 0.0


def np_multilabel(outputs, targets, keep, which, average="macro", threshold=0.5):
    """sklearn's per-label precision / recall / F1 (zero_division=0) on the kept elements, labels on the last axis."""
    num_labels = outputs.shape[-1]
    scores, present = np.zeros(num_labels), np.zeros(num_labels, bool)
    for label in range(num_labels):
        k = keep[..., label]
        pred = (expit(outputs[..., label][k].astype(np.float64)) > threshold).astype(int)
        true = (targets[..., label][k] > 0.5).astype(int)
        scores[label] = np_per_class(true, pred, 2)[0][["precision", "recall", "f1"].index(which), 1]
        present[label] = pred.any() or true.any()
    return scores if average == "none" else np_macro(scores, present)


def np_mean_iou(outputs, targets, keep, average="macro"):
    """sklearn's jaccard_score per class; macro over the classes in the targets or the predictions."""
    out = outputs[keep]
    tgt = targets.reshape(keep.shape)[keep] if outputs.shape[-1] == 1 else targets[keep]
    pred, true = np_classes(out, tgt)
    num_classes = max(outputs.shape[-1], 2)
    scores = np.array(
        [np.sum((pred == c) & (true == c)) / max(np.sum((pred == c) | (true == c)), 1) for c in range(num_classes)]
    )
    present = np.isin(np.arange(num_classes), np.union1d(pred, true))
    return scores if average == "none" else np_macro(scores, present)


def _labels(n):
    """Attributes (n, 2, 5), e.g. 5 labels at 2 positions: label 3 is predicted but never true, label 4 neither (so it
    is left out of macro averages)."""
    outputs = rng.standard_normal((n, 2, 5)).astype(np.float32)
    outputs[..., 4] = -6.0
    targets = (rng.random((n, 2, 5)) < 0.4).astype(np.float32)
    targets[..., 3:] = 0
    return outputs, targets


def _masks(n):
    """Segmentation logits (n, 3, 3, 1) and 0/1 masks of the same shape."""
    return rng.standard_normal((n, 3, 3, 1)).astype(np.float32), rng.integers(0, 2, (n, 3, 3, 1)).astype(np.float32)


def _tokens(n, vocab=6):
    return rng.standard_normal((n, 4, vocab)).astype(np.float32) * 2, rng.integers(0, vocab, (n, 4))


def _soft_tokens(n):
    outputs, _ = _tokens(n)
    return outputs, rng.dirichlet(np.ones(6), (n, 4)).astype(np.float32)


def _segment_ids(n):
    """Logits (n, 4, 5) over 5 classes with ids in 0-2: class 3 is predicted but never true, class 4 neither."""
    outputs = rng.standard_normal((n, 4, 5)).astype(np.float32)
    outputs[..., 4] = -6.0
    return outputs, rng.integers(0, 3, (n, 4))


def _segment_one_hot(n):
    outputs, ids = _segment_ids(n)
    return outputs, np.eye(5, dtype=np.float32)[ids]


def _multilabel_refs(threshold=0.5):
    return [
        (
            lambda which=which, average=average: getattr(metrics, f"multilabel_{which}")(average, threshold),
            lambda o, t, k, which=which, average=average: np_multilabel(o, t, k, which, average, threshold),
        )
        for which in ("precision", "recall", "f1")
        for average in ("macro", "none")
    ]


MEAN_IOU = [
    (metrics.mean_iou, np_mean_iou),
    (lambda: metrics.mean_iou("none"), lambda o, t, k: np_mean_iou(o, t, k, "none")),
]

# data name: (data(n) -> (outputs, targets), unit, [(factory, reference(outputs, targets, keep)), ...]); the unit is
# what a mask entry covers: "ids" the outputs' shape without the class axis, "outputs" every element.
GROUPS = {
    "tokens": (
        _tokens,
        "ids",
        [(metrics.perplexity, np_perplexity), (metrics.accuracy, lambda o, t, k: np_metric("accuracy", o[k], t[k]))],
    ),
    "soft_tokens": (_soft_tokens, "ids", [(metrics.perplexity, np_perplexity)]),
    "labels": (
        _labels,
        "outputs",
        [
            (metrics.binary_accuracy, np_binary_accuracy),
            (lambda: metrics.binary_accuracy(0.7), lambda o, t, k: np_binary_accuracy(o, t, k, 0.7)),
            *_multilabel_refs(),
            *_multilabel_refs(0.3)[-2:],
        ],
    ),
    "segmentation_masks": (
        _masks,
        "outputs",
        [
            (metrics.binary_accuracy, np_binary_accuracy),  # pixel accuracy
            (metrics.multilabel_f1, lambda o, t, k: np_multilabel(o, t, k, "f1")),
        ],
    ),  # Dice of the foreground
    "segmentation_masks_as_classes": (_masks, "ids", MEAN_IOU),  # background and foreground
    "segment_ids": (_segment_ids, "ids", MEAN_IOU),
    "segment_one_hot": (_segment_one_hot, "ids", MEAN_IOU),
}


def _unit_shape(unit, outputs):
    return outputs.shape[:-1] if unit == "ids" else outputs.shape


def _spread(mask, shape):
    return np.broadcast_to(mask.reshape(mask.shape + (1,) * (len(shape) - mask.ndim)), shape)


def _with_garbage(outputs, targets, keep, nan):
    """Masked-out units hold NaN logits and positive targets (or ids out of range), or else huge logits and NaN
    targets: either alone could hide a mask ignored, as NaN compares False."""
    outputs = np.where(_spread(keep, outputs.shape), outputs, np.nan if nan else 1e6).astype(np.float32)
    if np.issubdtype(targets.dtype, np.integer):
        return outputs, np.where(keep, targets, -3 if nan else 10**6)
    keep = _spread(keep.reshape(keep.shape[: targets.ndim]), targets.shape)
    return outputs, np.where(keep, targets, 1.0 if nan else np.nan).astype(np.float32)


@pytest.mark.parametrize("per", ["example", "element"])
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_elementwise_metrics_masked_ragged_epoch_under_jit(group, per):
    """Two batches of different sizes, plus one that is all padding, merged under jit == the kept data."""
    data, unit, cases = GROUPS[group]
    group_metrics = [factory() for factory, _ in cases]
    # one jitted call for all of them, as the training step computes its metrics
    stats = jax.jit(lambda *batch: [m.stats(*batch) for m in group_metrics])
    totals, batches, kept = [None] * len(cases), [], []
    for n, padding, nan in ((5, 0, True), (7, 3, False), (7, 7, True)):
        outputs, targets = data(n)
        shape = _unit_shape(unit, outputs)
        # per element: the unit's shape, or (B, H, W) for masks (B, H, W, 1), fewer axes than the unit
        mask_shape = (n,) if per == "example" else shape[:3] if len(shape) == 4 else shape
        mask = (rng.random(mask_shape) < (1.0 if per == "example" else 0.7)).astype(np.float32)
        mask[n - padding :] = 0
        keep = _spread(mask, shape) > 0
        batches.append((*_with_garbage(outputs, targets, keep, nan), mask))
        kept.append((outputs, targets, keep))
    for batch in batches:
        totals = [metrics.merge(total, s) for total, s in zip(totals, stats(*batch))]
    whole = [np.concatenate(parts) for parts in zip(*kept)]
    for metric, total, (_, reference) in zip(group_metrics, totals, cases):
        value = metric.result(total)
        _close(value, reference(*whole))
        assert np.isfinite(np.asarray(value)).all(), metric.name
    # the all-padding batch adds exactly nothing
    jax.tree.map(lambda a: np.testing.assert_array_equal(np.asarray(a), 0), stats(*batches[2]))


def test_token_accuracy_with_per_position_mask():
    """accuracy() over (B, T) positions with a (B, T) mask is token accuracy; padding holds NaN logits and junk ids."""
    metric = metrics.accuracy()
    stats = jax.jit(metric.stats)
    total, kept_out, kept_ids = None, [], []
    for n, length in ((3, 6), (5, 6)):
        outputs, ids = rng.standard_normal((n, length, C)).astype(np.float32), rng.integers(0, C, (n, length))
        lengths = rng.integers(0, length + 1, n)
        mask = (np.arange(length) < lengths[:, None]).astype(np.float32)
        keep = mask > 0
        kept_out.append(outputs[keep])
        kept_ids.append(ids[keep])
        outputs[~keep] = np.nan
        ids = np.where(keep, ids, 10**6)
        total = metrics.merge(total, stats(outputs, ids, mask))
    _close(metric.result(total), np_metric("accuracy", np.concatenate(kept_out), np.concatenate(kept_ids)))


def test_perplexity_of_uniform_logits_is_the_vocabulary_size():
    vocab = 11
    outputs = jnp.zeros((2, 3, vocab), jnp.bfloat16)
    stats = metrics.perplexity().stats(outputs, np.zeros((2, 3), np.int32), np.array([1.0, 0.0]))
    assert all(v.dtype == jnp.float32 for v in stats.values())
    _close(stats["count"], 3)
    _close(metrics.perplexity().result(stats), vocab)
    empty = jax.tree.map(jnp.zeros_like, stats)
    _close(metrics.perplexity().result(empty), 1.0)  # an empty mean is 0 by the zero-division convention


def test_binary_threshold_compares_logits():
    # sigmoid(40) and sigmoid(30) both round to 1 in float32, yet a threshold just below 1 still separates them.
    outputs = np.array([[40.0, 30.0, -2.0, 0.0]], np.float32)
    targets = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)
    _close(metrics.compute(metrics.binary_accuracy(1 - 1e-15), outputs, targets), 1.0)
    # 0.5 is a logit of exactly 0, and the comparison is strict: a zero logit is negative
    _close(metrics.compute(metrics.binary_accuracy(), outputs, targets), 0.75)
    _close(metrics.compute(metrics.mean_iou(threshold=1 - 1e-15), outputs.reshape(4, 1), targets.reshape(4)), 1.0)


def test_names_of_averages_and_thresholds():
    assert metrics.perplexity().name == "perplexity"
    assert metrics.binary_accuracy().name == "binary_accuracy"
    assert metrics.binary_accuracy(threshold=0.7).name == "binary_accuracy@0.7"
    assert metrics.multilabel_f1().name == "multilabel_f1"
    assert metrics.multilabel_f1("none").name == "multilabel_f1_per_label"
    assert metrics.multilabel_precision("none", 0.3).name == "multilabel_precision_per_label@0.3"
    assert metrics.multilabel_recall().name == "multilabel_recall"
    assert metrics.mean_iou().name == "mean_iou" and metrics.mean_iou("none").name == "iou_per_class"
    outputs, targets = _labels(6)
    per_label = metrics.multilabel_f1("none")
    results = metrics.values([per_label], {per_label.name: per_label.stats(outputs, targets)})
    assert list(results) == ["multilabel_f1_per_label"] and len(results["multilabel_f1_per_label"]) == 5
    for name in (
        "perplexity",
        "binary_accuracy",
        "multilabel_f1",
        "multilabel_precision",
        "multilabel_recall",
        "mean_iou",
    ):
        assert name in available("metrics")


@pytest.mark.parametrize("k", [0, -1, 2.5, True, "3", None])
def test_top_k_rejects_bad_k(k):
    with pytest.raises(ValueError, match="integer >= 1"):
        metrics.top_k_accuracy(k)


def test_top_k_larger_than_the_class_count_fails_at_trace_time():
    outputs, targets = _batch("accuracy", 6)
    _close(metrics.compute(metrics.top_k_accuracy(C), outputs, targets), 1.0)
    with pytest.raises(ValueError, match=f"k = {C + 1} exceeds the {C} classes"):
        jax.jit(metrics.top_k_accuracy(C + 1).stats)(outputs, targets, np.ones(6, np.float32))


THRESHOLDED = [
    metrics.binary_accuracy,
    lambda threshold: metrics.multilabel_f1(threshold=threshold),
    lambda threshold: metrics.multilabel_precision(threshold=threshold),
    lambda threshold: metrics.multilabel_recall(threshold=threshold),
    lambda threshold: metrics.mean_iou(threshold=threshold),
]


@pytest.mark.parametrize("threshold", [0, 1, 0.0, 1.0, -0.2, 1.5, float("nan"), "0.5", True, None])
@pytest.mark.parametrize("factory", range(len(THRESHOLDED)))
def test_thresholds_must_be_probabilities(factory, threshold):
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        THRESHOLDED[factory](threshold)


def test_bad_averages_and_shapes():
    for factory in (metrics.multilabel_f1, metrics.multilabel_precision, metrics.multilabel_recall, metrics.mean_iou):
        with pytest.raises(ValueError, match="'macro' or 'none'"):
            factory("micro")
    outputs, targets = _labels(4)
    for metric in (metrics.binary_accuracy(), metrics.multilabel_f1()):
        with pytest.raises(ValueError, match="differ"):  # (B, L) against (B, L, 1) must not broadcast
            metric.stats(outputs, targets[..., None])
        with pytest.raises(ValueError, match="mask"):
            metric.stats(outputs, targets, np.ones((4, 3), np.float32))
    tokens, ids = _tokens(4)
    with pytest.raises(ValueError, match="fit neither"):
        metrics.perplexity().stats(tokens, ids[:, 0])
    with pytest.raises(ValueError, match="vocabulary"):
        metrics.perplexity().stats(tokens[..., :1], ids)
    with pytest.raises(ValueError, match="single logit"):  # argmax over C classes has no threshold
        metrics.mean_iou(threshold=0.7).stats(*_segment_ids(4))
