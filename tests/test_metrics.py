"""Metrics against numpy references (sklearn definitions, zero_division=0) on random, masked and ragged batches."""
import jax
import numpy as np
import pytest

from training import metrics

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
    "accuracy": metrics.accuracy, "top_2_accuracy": lambda: metrics.top_k_accuracy(2),
    "precision": metrics.precision, "recall": metrics.recall, "f1": metrics.f1,
    "precision_none": lambda: metrics.precision("none"), "recall_none": lambda: metrics.recall("none"),
    "f1_none": lambda: metrics.f1("none"), "confusion_matrix": metrics.confusion_matrix,
    "mae": metrics.mae, "rmse": metrics.rmse,
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
    p, r, f = (np.asarray(metrics.compute(m("none"), outputs, targets))
               for m in (metrics.precision, metrics.recall, metrics.f1))
    np.testing.assert_array_equal(p, [0.25, 0, 0, 0])  # classes 1-3 never predicted
    np.testing.assert_array_equal(r, [1, 0, 0, 0])  # classes 1, 2 missed; class 3 has no support
    _close(f, [0.4, 0, 0, 0])
    # Macro runs over classes 0-2 (seen in targets or predictions), like sklearn's default labels.
    _close(metrics.compute(metrics.f1(), outputs, targets), 0.4 / 3)


def test_summarize_names_and_errors():
    outputs, targets = _batch("f1", 12)
    stats = metrics.f1("none").stats(outputs, targets, None)
    summary = metrics.summarize(metrics.f1("none"), stats)
    assert list(summary) == [f"f1_per_class/{c}" for c in range(C)]
    assert metrics.f1().name == "f1" and metrics.precision("none").name == "precision_per_class"
    _close(list(summary.values()), np_metric("f1_none", outputs, targets))
    assert all(type(v) is float for v in summary.values())
    assert set(metrics.summarize(metrics.accuracy(), metrics.accuracy().stats(outputs, targets, None))) == {"accuracy"}
    matrix = metrics.summarize(metrics.confusion_matrix(), metrics.confusion_matrix().stats(outputs, targets, None))
    assert len(matrix) == C * C and "confusion_matrix/3/2" in matrix
    assert metrics.top_k_accuracy(3).name == "top_3_accuracy"
    assert all(isinstance(getattr(metrics, name)(), metrics.Metric) for name in metrics.__all__)
    with pytest.raises(ValueError):
        metrics.f1("micro")
    with pytest.raises(ValueError):  # (B, 1) against (B,) must not broadcast
        metrics.mae().stats(outputs[:, :1], outputs[:, 0], None)


def test_zeros_like_is_identity_for_merge():
    outputs, targets = _batch("precision", 6)
    stats = metrics.precision().stats(outputs, targets, None)
    merged = metrics.merge(metrics.zeros_like(stats), stats)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), merged, stats)
