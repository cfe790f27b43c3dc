"""MultiHeadAttention against a numpy softmax(QK^T/sqrt(d))V and flax.linen.MultiHeadDotProductAttention."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model.modules.attention import MultiHeadAttention
from model.modules.sequential import Sequential

RNG = np.random.default_rng(3)
KEY = jax.random.PRNGKey(0)
B, LQ, LK, F, CF = 2, 5, 3, 12, 10
X = RNG.standard_normal((B, LQ, F)).astype(np.float32)
CTX = RNG.standard_normal((B, LK, CF)).astype(np.float32)
CAUSAL = np.tril(np.ones((LQ, LQ), bool))
TOL = dict(rtol=2e-5, atol=2e-5)


def _init(layer, x, context=None):
    params, state = layer.init(KEY, x, context=context)
    # Non-zero biases, so the reference sees whether each is applied.
    keys = iter(jax.random.split(jax.random.PRNGKey(9), 4))
    for p in params.values():
        if "bias" in p:
            p["bias"] = 0.3 * jax.random.normal(next(keys), p["bias"].shape)
    return params, state


def _np_attention(params, x, context, heads, mask=None):
    """Per-head loop in float64, independent of the einsum/reshape layout of the implementation."""
    p = {k: {n: np.asarray(v, np.float64) for n, v in d.items()} for k, d in params.items()}
    q = x @ p["query"]["weight"] + p["query"]["bias"]
    k = context @ p["key"]["weight"] + p["key"]["bias"]
    v = context @ p["value"]["weight"] + p["value"]["bias"]
    d = q.shape[-1] // heads
    outs = []
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        logits = q[..., cols] @ np.swapaxes(k[..., cols], -1, -2) / np.sqrt(d)
        if mask is not None:
            logits = np.where(np.broadcast_to(mask, (x.shape[0], heads) + logits.shape[1:])[:, h], logits, -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        outs.append((weights / weights.sum(-1, keepdims=True)) @ v[..., cols])
    return np.concatenate(outs, -1) @ p["out"]["weight"] + p["out"]["bias"]


def _flax_attention(params, heads, x, context, mask=None, **config):
    def dense(name, out_shape):
        return {
            "kernel": np.asarray(params[name]["weight"]).reshape(out_shape),
            "bias": np.asarray(params[name]["bias"]).reshape(out_shape[1:] if name != "out" else (-1,)),
        }

    qkv = params["query"]["weight"].shape[1]
    d = qkv // heads
    flax_params = {name: dense(name, (params[name]["weight"].shape[0], heads, d)) for name in ("query", "key", "value")}
    flax_params["out"] = dense("out", (heads, d, -1))
    module = nn.MultiHeadDotProductAttention(num_heads=heads, **config)
    return module.apply({"params": flax_params}, x, context, mask=mask, deterministic=True)


@pytest.mark.parametrize("mask", [None, CAUSAL, CAUSAL[None, None]], ids=["none", "qk", "bhqk"])
def test_self_attention_matches_numpy_and_flax(mask):
    layer = MultiHeadAttention(num_heads=3)
    params, state = _init(layer, X)
    assert set(params) == {"query", "key", "value", "out"}
    assert params["query"]["weight"].shape == (F, F) and params["out"]["weight"].shape == (F, F)
    y, new_state = layer(params, state, jnp.asarray(X), mask=mask)
    assert y.shape == X.shape and new_state == {}
    np.testing.assert_allclose(y, _np_attention(params, X, X, 3, mask), **TOL)
    np.testing.assert_allclose(y, _flax_attention(params, 3, X, X, mask), **TOL)


def test_cross_attention_with_feature_sizes_matches_numpy_and_flax():
    layer = MultiHeadAttention(num_heads=2, qkv_features=8, out_features=7)
    params, _ = _init(layer, jax.ShapeDtypeStruct(X.shape, jnp.float32), context=CTX)
    assert params["query"]["weight"].shape == (F, 8)
    assert params["key"]["weight"].shape == (CF, 8) and params["value"]["weight"].shape == (CF, 8)
    assert params["out"]["weight"].shape == (8, 7)
    # Per-batch key padding mask, broadcast over heads and queries.
    mask = np.array([[True, True, False], [True, True, True]])[:, None, None, :]
    y, _ = layer(params, {}, jnp.asarray(X), context=jnp.asarray(CTX), mask=mask)
    assert y.shape == (B, LQ, 7)
    np.testing.assert_allclose(y, _np_attention(params, X, CTX, 2, mask), **TOL)
    flax_y = _flax_attention(params, 2, X, CTX, mask, qkv_features=8, out_features=7)
    np.testing.assert_allclose(y, flax_y, **TOL)


def test_fully_masked_rows_stay_finite_and_large_logits_are_stable():
    layer = MultiHeadAttention(num_heads=2)
    params, _ = _init(layer, X)
    mask = np.ones((B, 1, LQ, LQ), bool)
    mask[0, :, 1] = False  # query 1 of sample 0 may attend to nothing
    y, _ = layer(params, {}, jnp.asarray(X), mask=mask)
    assert np.all(np.isfinite(y))
    # With every logit at the same floor, that row averages the values uniformly.
    p = {k: {n: np.asarray(a, np.float64) for n, a in d.items()} for k, d in params.items()}
    v_mean = (X[0] @ p["value"]["weight"] + p["value"]["bias"]).mean(0)
    np.testing.assert_allclose(y[0, 1], v_mean @ p["out"]["weight"] + p["out"]["bias"], **TOL)
    np.testing.assert_allclose(y, _flax_attention(params, 2, X, X, mask), **TOL)
    big, _ = layer(params, {}, jnp.asarray(X * 1000.0), mask=CAUSAL)
    assert np.all(np.isfinite(big))
    np.testing.assert_allclose(big, _np_attention(params, X * 1000.0, X * 1000.0, 2, CAUSAL), rtol=1e-3, atol=1e-2)


def test_attention_dropout_train_and_eval():
    layer = MultiHeadAttention(num_heads=3, dropout_rate=0.5)
    params, _ = _init(layer, X)
    x = jnp.asarray(X)
    reference, _ = MultiHeadAttention(num_heads=3)(params, {}, x)
    y_eval, _ = layer(params, {}, x, train=False)
    np.testing.assert_array_equal(y_eval, reference)
    with pytest.raises(ValueError, match="key"):
        layer(params, {}, x, train=True)
    a, _ = layer(params, {}, x, train=True, key=jax.random.PRNGKey(1))
    b, _ = layer(params, {}, x, train=True, key=jax.random.PRNGKey(1))
    c, _ = layer(params, {}, x, train=True, key=jax.random.PRNGKey(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, reference) and not np.allclose(a, c)


def test_gradients_float64():
    layer = MultiHeadAttention(num_heads=2, qkv_features=4)
    with jax.enable_x64(True):
        x = jnp.asarray(RNG.standard_normal((1, 3, 6)))
        ctx = jnp.asarray(RNG.standard_normal((1, 2, 5)))
        params, _ = _init(layer, x, context=ctx)
        mask = np.array([[True, False], [True, True], [False, True]])

        def fn(p, q, c):
            return layer(p, {}, q, context=c, mask=mask)[0]

        check_grads(jax.jit(fn), (params, x, ctx), order=1, modes=("fwd", "rev"))


def test_init_is_deterministic_and_works_in_sequential():
    layer = MultiHeadAttention(num_heads=4)
    a, _ = layer.init(jax.random.PRNGKey(1), X)
    b, _ = layer.init(jax.random.PRNGKey(1), jax.ShapeDtypeStruct(X.shape, jnp.float32))
    c, _ = layer.init(jax.random.PRNGKey(2), X)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a["query"]["weight"], c["query"]["weight"])
    assert not np.array_equal(a["query"]["weight"], a["key"]["weight"])
    model = Sequential({"attn": layer})
    params, state = model.init(jax.random.PRNGKey(1), X)
    y, _ = model(params, state, jnp.asarray(X))
    np.testing.assert_allclose(y, _np_attention(params["attn"], X, X, 4), **TOL)


def test_indivisible_heads_raise():
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(num_heads=5).init(KEY, X)


def test_key_padding_mask_matches_numpy_flax_and_attention_over_the_real_keys():
    """key_mask (B, kv_len): padded keys get no weight; each example's output is attention over its real keys
    alone (a shorter sequence), with the causal mask too."""
    key_mask = np.ones((B, LQ), np.float32)
    key_mask[0, 3:] = 0.0  # example 0 has 3 real positions
    for causal in (False, True):
        layer = MultiHeadAttention(num_heads=3, causal=causal)
        params, state = _init(layer, X)
        y = np.asarray(layer(params, state, jnp.asarray(X), key_mask=jnp.asarray(key_mask))[0])
        full = (key_mask[:, None, None, :] > 0) & (CAUSAL if causal else True)
        np.testing.assert_allclose(y, _np_attention(params, X, X, 3, full), **TOL)
        np.testing.assert_allclose(y, _flax_attention(params, 3, X, X, full), **TOL)
        short = np.asarray(layer(params, state, jnp.asarray(X[:1, :3]))[0])
        np.testing.assert_allclose(y[0, :3], short[0], **TOL)
    check_grads(
        lambda x: layer(params, state, x, key_mask=jnp.asarray(key_mask))[0],
        (jnp.asarray(X),),
        order=1,
        modes=("rev",),
        atol=1e-2,
        rtol=1e-2,
    )
