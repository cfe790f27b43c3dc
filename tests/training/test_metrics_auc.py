"""ROC-AUC and PR-AUC (training/metrics.py) against numpy written from the published definitions: the Mann-Whitney U
statistic for ROC-AUC, sklearn's average precision for PR-AUC (sklearn itself is not a dependency)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training import metrics
from training.config.components import available


def mann_whitney_auc(scores, positive, weights=None):
    """P(score of a positive > score of a negative) + P(tie) / 2 over every (positive, negative) pair."""
    w = np.ones(len(scores)) if weights is None else weights
    p, n = positive & (w > 0), ~positive & (w > 0)
    sp, sn, wp, wn = scores[p][:, None], scores[n][None, :], w[p][:, None], w[n][None, :]
    pairs = wp * wn
    return float((pairs * ((sp > sn) + 0.5 * (sp == sn))).sum() / pairs.sum())


def average_precision(scores, positive):
    """sklearn's average_precision_score: sum over distinct thresholds, highest first, of (R_n - R_{n-1}) P_n."""
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], positive[order].astype(float)
    last_of_each = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # a threshold per distinct score
    tp = np.cumsum(y)[last_of_each]
    fp = (last_of_each + 1) - tp
    precision, recall = tp / (tp + fp), tp / y.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def binned(logits):
    """The logits rounded to the metric's bins (a bin's index stands for all of it)."""
    scaled = (np.asarray(logits, np.float64) + metrics.AUC_LOGIT_RANGE) * metrics.AUC_BINS
    return np.clip(np.floor(scaled / (2 * metrics.AUC_LOGIT_RANGE)), 0, metrics.AUC_BINS - 1)


def same_bin_pairs(logits, positive):
    """The share of (positive, negative) pairs that fall in one bin: the most binning can move ROC-AUC is half of it."""
    b = binned(logits)
    bp, bn = b[positive][:, None], b[~positive][None, :]
    return float((bp == bn).mean())


def scores_of(rng, n, labels=1, separation=1.5, share=0.1):
    """Imbalanced 0/1 targets (about ``share`` positive) and logits that separate them partly."""
    y = rng.random((n, labels)) < share
    y[0], y[1] = True, False  # both classes in every label
    logits = rng.normal(0, 2, (n, labels)) + separation * y - 2.0
    return logits.astype(np.float32), y


def epoch(metric, logits, targets, batch=37, mask=None):
    """The metric over ragged batches under jit, stats merged as the training loop merges them."""
    stats = jax.jit(metric.stats)
    total = None
    for start in range(0, len(logits), batch):
        part = slice(start, start + batch)
        m = None if mask is None else jnp.asarray(mask[part])
        total = metrics.merge(total, stats(jnp.asarray(logits[part]), jnp.asarray(targets[part], jnp.float32), m))
    return np.asarray(metric.result(total))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_auc_and_pr_auc_match_the_definitions(seed):
    rng = np.random.default_rng(seed)
    logits, y = scores_of(rng, 1000)
    roc, ap = epoch(metrics.roc_auc(), logits, y), epoch(metrics.pr_auc(), logits, y)
    x, positive = logits[:, 0], y[:, 0]
    # exactly the definitions on the binned scores (float32 sums: 1e-5)
    np.testing.assert_allclose(roc, mann_whitney_auc(binned(x), positive), rtol=1e-5)
    np.testing.assert_allclose(ap, average_precision(binned(x), positive), rtol=1e-5)
    # and near the unbinned scores': binning moves ROC-AUC by at most half the share of (positive, negative) pairs
    # in one bin (they count as ties); AP has no such closed bound, and moves less than that here (about 1e-4 of
    # 1e-3: a bin of 1/64 logit holds a handful of the 1,000 scores)
    bound = 0.5 * same_bin_pairs(x, positive)
    assert abs(roc - mann_whitney_auc(x.astype(np.float64), positive)) <= bound + 1e-6
    assert abs(ap - average_precision(x.astype(np.float64), positive)) <= bound
    assert 0.6 < roc < 0.9 and ap > positive.mean()  # better than chance, not perfect: a real test of both


def test_perfect_reversed_and_tied_rankings():
    y = np.array([[1], [1], [0], [0], [0]], bool)
    good = np.array([[3.0], [2.0], [-1.0], [-2.0], [-3.0]], np.float32)
    assert epoch(metrics.roc_auc(), good, y) == 1.0 and epoch(metrics.pr_auc(), good, y) == 1.0
    assert epoch(metrics.roc_auc(), -good, y) == 0.0
    tied = np.zeros((5, 1), np.float32)  # one score for all: ROC-AUC 0.5, AP the share of positives
    np.testing.assert_allclose(epoch(metrics.roc_auc(), tied, y), 0.5)
    np.testing.assert_allclose(epoch(metrics.pr_auc(), tied, y), 0.4)
    # beyond the binned range: still ranked at the ends, not wrapped or dropped
    far = np.array([[1e4], [50.0], [-50.0], [-1e4], [-1e4]], np.float32)
    assert epoch(metrics.roc_auc(), far, y) == 1.0


def test_padding_and_per_example_weights_are_left_out():
    rng = np.random.default_rng(3)
    logits, y = scores_of(rng, 300)
    mask = (rng.random(300) > 0.3).astype(np.float32)
    mask[:2] = 1
    garbage = np.where(mask[:, None] > 0, logits, np.nan).astype(np.float32)  # padding may hold NaN
    got = epoch(metrics.roc_auc(), garbage, y, mask=mask)
    np.testing.assert_allclose(got, mann_whitney_auc(binned(logits[:, 0]), y[:, 0], mask), rtol=1e-5)
    kept = mask > 0
    np.testing.assert_allclose(
        epoch(metrics.pr_auc(), garbage, y, mask=mask),
        average_precision(binned(logits[kept, 0]), y[kept, 0]),
        rtol=1e-5,
    )


def test_multilabel_per_label_and_macro():
    rng = np.random.default_rng(4)
    logits, y = scores_of(rng, 600, labels=3)
    y[:, 2] = False  # a label without positives: undefined, left out of the macro average
    for name, reference in (("roc_auc", mann_whitney_auc), ("pr_auc", average_precision)):
        per = epoch(available("metrics")[name](average="none"), logits, y)
        want = [reference(binned(logits[:, k]), y[:, k]) for k in range(2)]
        np.testing.assert_allclose(per, want + [0.0], rtol=1e-5)
        np.testing.assert_allclose(epoch(available("metrics")[name](), logits, y), np.mean(want), rtol=1e-5)
        # pooled over the axes before the labels: (B, H, W, L) masks score like their flattened pixels
        image = epoch(available("metrics")[name](), logits.reshape(60, 5, 2, 3), y.reshape(60, 5, 2, 3), batch=7)
        np.testing.assert_allclose(image, np.mean(want), rtol=1e-5)


def test_names_and_refusals():
    assert metrics.roc_auc().name == "roc_auc" and metrics.pr_auc(average="none").name == "pr_auc_per_label"
    with pytest.raises(ValueError, match="average: must be 'macro' or 'none'"):
        metrics.roc_auc(average="micro")
    with pytest.raises(ValueError, match=r"outputs of shape \(4, 2\) and targets of shape \(4,\) differ"):
        metrics.roc_auc().stats(jnp.zeros((4, 2)), jnp.zeros(4))


def test_multilabel_confusion_matrix_counts_each_label_at_its_threshold():
    rng = np.random.default_rng(5)
    logits, y = scores_of(rng, 200, labels=2)
    mask = (rng.random(200) > 0.2).astype(np.float32)
    got = epoch(metrics.multilabel_confusion_matrix(threshold=0.3), logits, y, mask=mask)
    kept = mask > 0
    predicted, true = 1 / (1 + np.exp(-logits[kept])) > 0.3, y[kept]
    for k in range(2):  # sklearn's layout: [[tn, fp], [fn, tp]]
        p, t = predicted[:, k], true[:, k]
        want = [[np.sum(~p & ~t), np.sum(p & ~t)], [np.sum(~p & t), np.sum(p & t)]]
        np.testing.assert_array_equal(got[k], want)
    assert metrics.multilabel_confusion_matrix(threshold=0.3).name == "multilabel_confusion_matrix@0.3"
