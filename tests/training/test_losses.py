"""Losses against optax and numpy on random data, with masks, extreme logits and numerical gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

from training import losses

B, C = 6, 5
rng = np.random.default_rng(0)


def _logits(*shape, scale=3.0):
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def _probs(*shape):
    p = rng.random(shape).astype(np.float32) ** 3  # skewed, some near 0
    return jnp.asarray(p / p.sum(-1, keepdims=True))


def _close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=kw.get("rtol", 1e-5), atol=kw.get("atol", 1e-5))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_integer_labels(smoothing):
    logits, labels = _logits(B, C), jnp.asarray(rng.integers(0, C, B))
    got = losses.cross_entropy(logits, labels, label_smoothing=smoothing)
    assert got.shape == (B,)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, C), smoothing)
    _close(got, optax.softmax_cross_entropy(logits, targets))
    if smoothing == 0.0:
        _close(got, optax.softmax_cross_entropy_with_integer_labels(logits, labels))


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_soft_labels(smoothing):
    logits, probs = _logits(B, C), _probs(B, C)
    _close(
        losses.cross_entropy(logits, probs, label_smoothing=smoothing),
        optax.softmax_cross_entropy(logits, optax.smooth_labels(probs, smoothing)),
    )


def test_cross_entropy_one_hot_equals_ids_and_sequence_is_mean_over_positions():
    logits, labels = _logits(B, 3, C), jnp.asarray(rng.integers(0, C, (B, 3)))
    by_ids = losses.cross_entropy(logits, labels, label_smoothing=0.1)
    by_one_hot = losses.cross_entropy(logits, jax.nn.one_hot(labels, C).astype(jnp.int32), label_smoothing=0.1)
    reference = optax.softmax_cross_entropy(logits, optax.smooth_labels(jax.nn.one_hot(labels, C), 0.1)).mean(1)
    _close(by_ids, reference)
    _close(by_one_hot, reference)


def _torch_cross_entropy(logits, labels, weight, smoothing):
    """PyTorch's documented cross_entropy(weight=w, label_smoothing=a, reduction="none"), in numpy: for class ids y,
    ``(1 - a) * -w_y log p_y + a * sum_c -w_c log p_c / C``; for probabilities q, ``-sum_c w_c q'_c log p_c`` with
    ``q' = (1 - a) q + a / C``."""
    logits = np.asarray(logits, np.float64)
    log_p = logits - logits.max(-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
    c = logits.shape[-1]
    labels = np.asarray(labels)
    if labels.ndim == logits.ndim - 1:
        nll = -weight[labels] * np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
        return (1 - smoothing) * nll + smoothing * (-(weight * log_p).sum(-1) / c)
    q = (1 - smoothing) * labels + smoothing / c
    return -(weight * q * log_p).sum(-1)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("soft", [False, True])
def test_cross_entropy_class_weights_match_pytorchs_formula(smoothing, soft):
    logits = _logits(B, C)
    labels = _probs(B, C) if soft else jnp.asarray(rng.integers(0, C, B))
    weights = rng.uniform(0.1, 3.0, C).astype(np.float32)
    got = losses.cross_entropy(logits, labels, label_smoothing=smoothing, class_weights=list(map(float, weights)))
    _close(got, _torch_cross_entropy(logits, labels, weights.astype(np.float64), smoothing))
    ones = losses.cross_entropy(logits, labels, label_smoothing=smoothing, class_weights=[1.0] * C)
    _close(ones, losses.cross_entropy(logits, labels, label_smoothing=smoothing))


def test_class_weights_of_another_class_count_are_refused():
    with pytest.raises(ValueError, match="class_weights: 3 weights for logits of 5 classes"):
        losses.cross_entropy(_logits(B, C), jnp.zeros(B, jnp.int32), class_weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="class_weights.1"):
        losses._check_cross_entropy(class_weights=[1.0, -2.0])


def _focal_reference(logits, labels, gamma, alpha):
    """Lin et al. (2017), eq. 5, with the softmax probability of each class: -alpha_c (1 - p_c)^gamma log p_c."""
    logits = np.asarray(logits, np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    terms = -alpha * (1 - p) ** gamma * np.log(p)
    labels = np.asarray(labels)
    if labels.ndim == logits.ndim - 1:
        return np.take_along_axis(terms, labels[..., None], -1)[..., 0]
    return (labels * terms).sum(-1)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("soft", [False, True])
def test_focal_loss_matches_the_papers_formula(gamma, soft):
    logits = _logits(B, C)
    labels = _probs(B, C) if soft else jnp.asarray(rng.integers(0, C, B))
    alpha = rng.uniform(0.1, 1.0, C)
    got = losses.focal_loss(logits, labels, gamma=gamma, class_weights=list(map(float, alpha)))
    _close(got, _focal_reference(logits, labels, gamma, alpha))
    if gamma == 0.0:  # no focusing: the cross-entropy
        _close(losses.focal_loss(logits, labels, gamma=0.0), losses.cross_entropy(logits, labels))
    if not soft:  # a sequence: the mean over its unmasked positions
        seq_logits, seq_labels = _logits(B, 4, C), jnp.asarray(rng.integers(0, C, (B, 4)))
        mask = jnp.asarray(rng.random((B, 4)) > 0.3).at[:, 0].set(True)
        per_position = _focal_reference(seq_logits, seq_labels, gamma, 1.0)
        want = (per_position * np.asarray(mask)).sum(1) / np.asarray(mask).sum(1)
        _close(losses.focal_loss(seq_logits, seq_labels, gamma=gamma, mask=mask), want)


def test_cross_entropy_rejects_mismatched_labels():
    with pytest.raises(ValueError):
        losses.cross_entropy(_logits(B, C), jnp.zeros((B, C + 1)))


def test_binary_cross_entropy():
    logits, labels = _logits(B, 4), jnp.asarray(rng.random((B, 4)), jnp.float32)
    _close(losses.binary_cross_entropy(logits, labels), optax.sigmoid_binary_cross_entropy(logits, labels).mean(1))
    hard = (labels > 0.5).astype(jnp.int32)
    _close(
        losses.binary_cross_entropy(logits, hard),
        optax.sigmoid_binary_cross_entropy(logits, hard.astype(jnp.float32)).mean(1),
    )


def _torch_bce_with_logits(logits, labels, pos_weight):
    """PyTorch's BCEWithLogitsLoss(pos_weight=p, reduction="none") as its documentation writes it:
    -(p * y * log sigmoid(x) + (1 - y) * log(1 - sigmoid(x))), in float64, then the mean over the labels."""
    x, y = np.asarray(logits, np.float64), np.asarray(labels, np.float64)
    sigmoid = 1.0 / (1.0 + np.exp(-x))
    return (-(pos_weight * y * np.log(sigmoid) + (1 - y) * np.log(1 - sigmoid))).mean(-1)


@pytest.mark.parametrize("pos_weight", [1.0, 9.0, 0.25, [0.5, 2.0, 9.0, 1.0]])
def test_binary_cross_entropy_pos_weight_matches_pytorchs_formula(pos_weight):
    own = np.random.default_rng(49)  # its own draws: the module's stream feeds the gradient checks below
    logits = jnp.asarray(3.0 * own.standard_normal((B, 4)), jnp.float32)
    labels = jnp.asarray(own.random((B, 4)), jnp.float32)
    hard = (labels > 0.5).astype(jnp.float32)
    for target in (labels, hard):
        got = losses.binary_cross_entropy(logits, target, pos_weight=pos_weight)
        _close(got, _torch_bce_with_logits(logits, target, np.asarray(pos_weight)))
    check_grads(lambda x: losses.binary_cross_entropy(x, labels, pos_weight=pos_weight), (logits / 3,), order=1)
    # stable where sigmoid rounds to 0 or 1: the loss and its gradient stay finite and exact
    big = jnp.asarray(200.0 * own.choice([-1.0, 1.0], (B, 4)), jnp.float32)
    value = losses.binary_cross_entropy(big, hard, pos_weight=pos_weight)
    grad = jax.grad(lambda x: losses.binary_cross_entropy(x, hard, pos_weight=pos_weight).sum())(big)
    weights = np.broadcast_to(np.asarray(pos_weight), (B, 4))
    wrong = np.where(np.asarray(hard) > 0, weights * np.maximum(-np.asarray(big), 0), np.maximum(np.asarray(big), 0))
    _close(value, wrong.mean(-1))
    assert np.isfinite(np.asarray(grad)).all()


def test_binary_cross_entropy_pos_weight_is_checked():
    with pytest.raises(ValueError, match="pos_weight: 2 weights for logits of 4 labels"):
        losses.binary_cross_entropy(jnp.zeros((B, 4)), jnp.zeros((B, 4)), pos_weight=[1.0, 2.0])
    with pytest.raises(ValueError, match="pos_weight.1: must be >= 0"):
        losses._check_binary_cross_entropy(pos_weight=[1.0, -2.0])
    with pytest.raises(ValueError, match="pos_weight: must be >= 0"):
        losses._check_binary_cross_entropy(pos_weight=-1)


def test_regression_losses():
    outputs, targets = _logits(B, 3, 2), _logits(B, 3, 2)
    o, t = np.asarray(outputs, np.float64), np.asarray(targets, np.float64)
    _close(losses.mse(outputs, targets), optax.squared_error(outputs, targets).mean((1, 2)))
    _close(losses.mse(outputs, targets), ((o - t) ** 2).reshape(B, -1).mean(1))
    _close(losses.l1(outputs, targets), np.abs(o - t).reshape(B, -1).mean(1))
    with pytest.raises(ValueError):  # (B, 1) vs (B,) must not broadcast to (B, B)
        losses.mse(outputs[:, 0, :1], targets[:, 0, 0])


@pytest.mark.parametrize("delta", [0.5, 1.0, 4.0])
def test_huber(delta):
    outputs, targets = _logits(B, 7), _logits(B, 7)  # errors of a few units: both branches are exercised
    error = np.abs(np.asarray(outputs - targets, np.float64))
    assert (error < delta).any() and (error > delta).any()
    got = losses.huber(outputs, targets, delta=delta)
    _close(got, optax.huber_loss(outputs, targets, delta=delta).mean(1))
    reference = np.where(error <= delta, 0.5 * error**2, delta * (error - 0.5 * delta)).mean(1)
    _close(got, reference)


def test_kl_divergence():
    log_predictions = jax.nn.log_softmax(_logits(B, C))
    targets = _probs(B, C).at[:, 0].set(0.0)  # exact zeros: 0 log 0 = 0
    targets = targets / targets.sum(1, keepdims=True)
    _close(losses.kl_divergence(log_predictions, targets), optax.kl_divergence(log_predictions, targets))
    t, lp = np.asarray(targets, np.float64), np.asarray(log_predictions, np.float64)
    reference = np.where(t > 0, t * (np.log(np.where(t > 0, t, 1)) - lp), 0).sum(1)
    _close(losses.kl_divergence(log_predictions, targets), reference)
    logits = _logits(B, C)
    _close(losses.kl_divergence_with_logits(logits, targets), optax.kl_divergence(jax.nn.log_softmax(logits), targets))
    _close(losses.kl_divergence(jnp.log(targets + 1e-30), targets), np.zeros(B), atol=1e-6)


def _stability_cases():
    ids = jnp.asarray(rng.integers(0, C, B))
    soft, bits = _probs(B, C), jnp.asarray(rng.integers(0, 2, (B, C)), jnp.float32)
    smoothed = optax.smooth_labels(jax.nn.one_hot(ids, C), 0.1)
    return {  # name: (loss, optax reference)
        "cross_entropy_ids": (
            lambda x: losses.cross_entropy(x, ids, label_smoothing=0.1),
            lambda x: optax.softmax_cross_entropy(x, smoothed),
        ),
        "cross_entropy_soft": (lambda x: losses.cross_entropy(x, soft), lambda x: optax.softmax_cross_entropy(x, soft)),
        "binary_cross_entropy": (
            lambda x: losses.binary_cross_entropy(x, bits),
            lambda x: optax.sigmoid_binary_cross_entropy(x, bits).mean(1),
        ),
        "kl_divergence_with_logits": (
            lambda x: losses.kl_divergence_with_logits(x, soft),
            lambda x: optax.kl_divergence(jax.nn.log_softmax(x), soft),
        ),
    }


_STABILITY = _stability_cases()


@pytest.mark.parametrize("name", sorted(_STABILITY))
def test_stable_at_large_logits(name):
    fn, reference = _STABILITY[name]
    # +-1000 everywhere, with a tie at the top in most rows: exp() would overflow in a naive implementation.
    logits = jnp.asarray(1000.0 * rng.choice([-1.0, 1.0], (B, C)), jnp.float32).at[:, 0].set(1000.0)
    value, grad = fn(logits), jax.grad(lambda x: fn(x).sum())(logits)
    assert np.isfinite(np.asarray(value)).all() and np.isfinite(np.asarray(grad)).all()
    _close(value, reference(logits), rtol=1e-6)
    _close(grad, jax.grad(lambda x: reference(x).sum())(logits))


@pytest.mark.parametrize(
    "name",
    [
        "cross_entropy",
        "cross_entropy_soft",
        "binary_cross_entropy",
        "mse",
        "l1",
        "huber",
        "kl_divergence",
        "kl_divergence_with_logits",
        "cross_entropy_class_weights",
        "focal_loss",
        "focal_loss_soft",
    ],
)
def test_gradients(name):
    x = _logits(4, 3, scale=1.0)
    ids, soft, other = jnp.asarray(rng.integers(0, 3, 4)), _probs(4, 3), _logits(4, 3, scale=1.0)
    fn = {
        "cross_entropy": lambda x: losses.cross_entropy(x, ids, label_smoothing=0.1),
        "cross_entropy_soft": lambda x: losses.cross_entropy(x, soft),
        "binary_cross_entropy": lambda x: losses.binary_cross_entropy(x, soft),
        "mse": lambda x: losses.mse(x, other),
        "l1": lambda x: losses.l1(x, other),
        "huber": lambda x: losses.huber(x, other, delta=0.7),
        "kl_divergence": lambda x: losses.kl_divergence(jax.nn.log_softmax(x), soft),
        "kl_divergence_with_logits": lambda x: losses.kl_divergence_with_logits(x, soft),
        "cross_entropy_class_weights": lambda x: losses.cross_entropy(
            x, ids, label_smoothing=0.1, class_weights=[0.5, 2.0, 1.0]
        ),
        "focal_loss": lambda x: losses.focal_loss(x, ids, gamma=2.0, class_weights=[0.5, 2.0, 1.0]),
        "focal_loss_soft": lambda x: losses.focal_loss(x, soft, gamma=1.5),
    }[name]
    check_grads(fn, (x,), order=1, modes=("fwd", "rev"))


def test_class_weights_of_another_count_than_the_models_classes_are_a_config_error(tmp_path):
    import json

    from tests.end_to_end.test_train import make_config
    from training.config.file import ConfigError
    from training.config.validation import validate

    config = json.loads(make_config(tmp_path, tmp_path / "none", loss={"name": "focal_loss"}).read_text())
    config["loss"]["args"] = {"class_weights": [1.0, 2.0]}
    with pytest.raises(ConfigError, match=r"loss.args.class_weights: 2 weights, but the model scores 10 classes"):
        validate(config, "c.json")
    config["loss"]["args"] = {"class_weights": [1.0] * 10, "gamma": 1.0}
    validate(config, "c.json")
