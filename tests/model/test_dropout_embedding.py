"""Dropout (eval identity, keep statistics, scaling, keys) and Embedding (vs flax.linen.Embed and numpy)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model.modules.dropout import Dropout
from model.modules.embedding import Embedding
from model.modules.sequential import Sequential

RNG = np.random.default_rng(2)
KEY = jax.random.PRNGKey(0)


# Dropout


def test_dropout_is_identity_in_eval_and_at_rate_zero():
    x = jnp.asarray(RNG.standard_normal((4, 5)), jnp.float32)
    layer = Dropout(0.5)
    params, state = layer.init(KEY, x)
    assert params == {} and state == {}
    y, _ = layer(params, state, x, train=False)
    np.testing.assert_array_equal(y, x)
    y, _ = Dropout(0.0)({}, {}, x, train=True)  # no key needed when nothing is dropped
    np.testing.assert_array_equal(y, x)


def test_dropout_needs_a_key_in_training():
    with pytest.raises(ValueError, match="key"):
        Dropout(0.1)({}, {}, jnp.ones(3), train=True)


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_dropout_rejects_invalid_rate(rate):
    with pytest.raises(ValueError, match="rate"):
        Dropout(rate)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
def test_dropout_keep_fraction_and_scaling(rate):
    n = 200_000
    x = jnp.asarray(RNG.uniform(1.0, 2.0, n), jnp.float32)  # never 0, so zeros in y are exactly the drops
    y, _ = Dropout(rate)({}, {}, x, train=True, key=KEY)
    y, x = np.asarray(y), np.asarray(x)
    kept = y != 0
    p = 1 - rate
    assert abs(kept.mean() - p) < 5 * np.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(y[kept], x[kept] / p, rtol=1e-6)
    # Inverted scaling keeps the expectation: mean(y) ~ mean(x).
    assert abs(y.mean() - x.mean()) < 5 * np.sqrt(rate / p * np.mean(x**2) / n)


def test_dropout_rate_one_drops_everything():
    y, _ = Dropout(1.0)({}, {}, jnp.ones((3, 3)), train=True, key=KEY)
    np.testing.assert_array_equal(y, 0.0)


def test_dropout_is_deterministic_per_key_and_differs_across_keys():
    x = jnp.ones((64, 32))
    layer = Dropout(0.5)
    a, _ = layer({}, {}, x, train=True, key=jax.random.PRNGKey(1))
    b, _ = layer({}, {}, x, train=True, key=jax.random.PRNGKey(1))
    c, _ = layer({}, {}, x, train=True, key=jax.random.PRNGKey(2))
    np.testing.assert_array_equal(a, b)
    assert np.mean(np.asarray(a) != np.asarray(c)) > 0.3


def test_dropout_gradient_is_mask_over_keep_probability():
    x = jnp.asarray(RNG.standard_normal((8, 8)), jnp.float32)
    layer = Dropout(0.25)
    y, _ = layer({}, {}, x, train=True, key=KEY)
    g = jax.grad(lambda v: jnp.sum(layer({}, {}, v, train=True, key=KEY)[0]))(x)
    np.testing.assert_allclose(g, (np.asarray(y) != 0) / 0.75, rtol=1e-6)


def test_dropout_layers_in_sequential_get_independent_keys():
    model = Sequential([Dropout(0.5), Dropout(0.0), Dropout(0.5)])
    params, state = model.init(KEY, jax.ShapeDtypeStruct((16, 16), jnp.float32))
    y, _ = model(params, state, jnp.ones((16, 16)), train=True, key=KEY)
    # Two independent masks keep ~1/4 of the entries, each scaled by 2 twice.
    values = set(np.unique(np.asarray(y)).tolist())
    assert values == {0.0, 4.0}
    assert 0.1 < np.mean(np.asarray(y) != 0) < 0.4


# Embedding


def test_embedding_matches_flax_and_numpy():
    layer = Embedding(num_embeddings=11, features=6)
    ids = jnp.asarray(RNG.integers(0, 11, (3, 4)), jnp.int32)
    params, state = layer.init(KEY, ids)
    table = params["embedding"]
    assert table.shape == (11, 6) and table.dtype == jnp.float32 and state == {}
    y, _ = layer(params, state, ids)
    assert y.shape == (3, 4, 6)
    np.testing.assert_array_equal(y, np.asarray(table)[np.asarray(ids)])
    flax_y = nn.Embed(11, 6).apply({"params": {"embedding": np.asarray(table)}}, ids)
    np.testing.assert_array_equal(y, flax_y)


def test_embedding_clamps_out_of_range_ids_and_accepts_float_ids():
    layer = Embedding(5, 3)
    params, _ = layer.init(KEY, jax.ShapeDtypeStruct((4,), jnp.int32))
    ids = np.array([-2, 0, 4, 9])
    y, _ = layer(params, {}, jnp.asarray(ids, jnp.int32))
    expected = np.take(np.asarray(params["embedding"]), ids, axis=0, mode="clip")
    np.testing.assert_array_equal(y, expected)
    assert np.all(np.isfinite(y))
    y_float, _ = layer(params, {}, jnp.asarray([0.0, 3.0]))
    np.testing.assert_array_equal(y_float, np.asarray(params["embedding"])[[0, 3]])


def test_embedding_init_is_deterministic_and_uses_the_named_initializer():
    ids = jax.ShapeDtypeStruct((2,), jnp.int32)
    a, _ = Embedding(400, 50).init(jax.random.PRNGKey(5), ids)
    b, _ = Embedding(400, 50).init(jax.random.PRNGKey(5), ids)
    c, _ = Embedding(400, 50).init(jax.random.PRNGKey(6), ids)
    np.testing.assert_array_equal(a["embedding"], b["embedding"])
    assert not np.array_equal(a["embedding"], c["embedding"])
    # "normal" is N(0, 0.01^2): 20,000 samples pin the std within a few percent.
    assert abs(float(jnp.std(a["embedding"])) - 0.01) < 5e-4
    ones, _ = Embedding(4, 2, weight_init="ones").init(KEY, ids)
    np.testing.assert_array_equal(ones["embedding"], 1.0)


def test_embedding_gradient_scatters_into_used_rows():
    layer = Embedding(7, 3)
    params, _ = layer.init(KEY, jax.ShapeDtypeStruct((5,), jnp.int32))
    ids = np.array([1, 4, 1, 6, 0])
    w = RNG.standard_normal((5, 3)).astype(np.float32)
    g = jax.grad(lambda p: jnp.sum(layer(p, {}, jnp.asarray(ids))[0] * w))(params)["embedding"]
    expected = np.zeros((7, 3), np.float32)
    np.add.at(expected, ids, w)
    np.testing.assert_allclose(g, expected, rtol=1e-6)
    with jax.enable_x64(True):
        table = jnp.asarray(RNG.standard_normal((7, 3)))
        check_grads(lambda t: layer({"embedding": t}, {}, jnp.asarray(ids))[0], (table,), order=1, modes=("fwd", "rev"))


def test_positional_embedding_adds_the_first_rows_of_its_table():
    from model.modules.embedding import PositionalEmbedding

    layer = PositionalEmbedding(10)
    x = jnp.asarray(np.random.default_rng(7).normal(size=(3, 6, 4)), jnp.float32)
    params, _ = layer.init(jax.random.key(1), x)
    table = np.asarray(params["embedding"])
    assert table.shape == (10, 4)
    np.testing.assert_allclose(layer(params, {}, x)[0], np.asarray(x) + table[None, :6], rtol=1e-6)
    check_grads(lambda p, x: layer(p, {}, x)[0], (params, x), order=1, modes=("rev",))
    # the gradient reaches the rows used, and only those
    grad = jax.grad(lambda p: layer(p, {}, x)[0].sum())(params)["embedding"]
    np.testing.assert_allclose(grad[:6], 3.0)
    np.testing.assert_allclose(grad[6:], 0.0)
    with pytest.raises(ValueError, match="exceed the position embedding's context of 10"):
        layer(params, {}, jnp.zeros((1, 11, 4)))


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("rows", [7, 300])  # on a GPU a small table's gradient is a matrix product, else a scatter
def test_embedding_gradient_of_either_form_matches_numpy_with_clamped_ids(rows, platform, monkeypatch):
    from types import SimpleNamespace

    from model.modules import embedding

    if platform == "gpu":  # the layer sees a GPU where it is traced; both forms run on any backend
        monkeypatch.setattr(embedding, "default_device", lambda: SimpleNamespace(platform="gpu"))
    layer = Embedding(rows, 4)
    params, _ = layer.init(KEY, jax.ShapeDtypeStruct((6, 9), jnp.int32))
    ids = RNG.integers(-3, rows + 3, (6, 9))  # out-of-range ids clamp to the first and last rows
    w = RNG.standard_normal((6, 9, 4)).astype(np.float32)
    loss = lambda p: jnp.sum(layer(p, {}, jnp.asarray(ids))[0] * w)  # noqa: E731
    expected = np.zeros((rows, 4), np.float64)
    np.add.at(expected, np.clip(ids, 0, rows - 1), w)
    np.testing.assert_allclose(jax.grad(loss)(params)["embedding"], expected, rtol=1e-5, atol=1e-5)
    lowered = jax.jit(jax.grad(loss)).lower(params).as_text()
    assert ("scatter" in lowered) == (rows > embedding.ONE_HOT_ROWS or platform == "cpu")
    with jax.enable_x64(True):
        table = jnp.asarray(RNG.standard_normal((rows, 4)))
        check_grads(lambda t: layer({"embedding": t}, {}, jnp.asarray(ids))[0], (table,), order=2, modes=("fwd", "rev"))


def test_embedding_gradient_in_bfloat16_sums_in_float32(monkeypatch):
    """On a GPU, a bfloat16 table (the precision policy's cast) gets its gradient summed in float32, then rounded once:
    many ids of one row add up without bfloat16's rounding at every addition."""
    from types import SimpleNamespace

    from model.modules import embedding

    monkeypatch.setattr(embedding, "default_device", lambda: SimpleNamespace(platform="gpu"))
    layer = Embedding(3, 2)
    ids = jnp.zeros((4096,), jnp.int32)  # every id the same row
    table = jnp.ones((3, 2), jnp.bfloat16)
    w = jnp.full((4096, 2), 1.0 + 2.0**-7, jnp.bfloat16)  # exact in bfloat16; a bfloat16 running sum would drift
    grad = jax.grad(lambda t: jnp.sum(layer({"embedding": t}, {}, ids)[0].astype(jnp.float32) * w))(table)
    expected = np.float32(4096 * (1.0 + 2.0**-7))
    np.testing.assert_allclose(np.asarray(grad[0], np.float32), expected, rtol=2**-8)
    np.testing.assert_array_equal(np.asarray(grad[1:], np.float32), 0.0)
