"""Linear against numpy on rank-1, rank-2 and rank-3 inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model.modules.linear import Linear


@pytest.mark.parametrize("lead", [(), (5,), (2, 3)], ids=["rank1", "rank2", "rank3"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_matches_numpy(lead, use_bias):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(*lead, 4)).astype(np.float32)
    layer = Linear(3, use_bias=use_bias, bias_init="normal")
    params, state = layer.init(jax.random.key(0), x)
    assert state == {}
    assert params["weight"].shape == (4, 3)
    assert set(params) == ({"weight", "bias"} if use_bias else {"weight"})
    y, _ = layer(params, state, x)
    expected = np.einsum("...i,io->...o", x, np.asarray(params["weight"]))
    if use_bias:
        expected = expected + np.asarray(params["bias"])
    assert y.shape == (*lead, 3)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_linear_check_grads():
    with jax.enable_x64(True):
        x = np.random.default_rng(1).normal(size=(2, 3, 4))
        layer = Linear(3, bias_init="normal")
        params, state = layer.init(jax.random.key(1), x)
        assert params["weight"].dtype == jnp.float64
        check_grads(jax.jit(lambda p, x: layer(p, state, x)[0]), (params, x), order=2, modes=("fwd", "rev"))


def test_linear_init():
    layer = Linear(256)
    x = jax.ShapeDtypeStruct((8, 512), jnp.float32)
    a, _ = layer.init(jax.random.key(0), x)
    b, _ = layer.init(jax.random.key(0), x)
    c, _ = layer.init(jax.random.key(1), x)
    np.testing.assert_array_equal(a["weight"], b["weight"])
    assert not np.allclose(a["weight"], c["weight"])
    np.testing.assert_array_equal(a["bias"], np.zeros(256))
    # Default lecun_normal: std 1 / sqrt(fan_in) = 1 / sqrt(512); 131k samples put the estimate within ~1%.
    assert abs(float(a["weight"].std()) * np.sqrt(512) - 1) < 0.03
    assert abs(float(a["weight"].mean())) * np.sqrt(512) < 0.01


def test_linear_initialiser_by_name_and_function():
    x = jax.ShapeDtypeStruct((1, 3), jnp.float32)
    params, _ = Linear(2, weight_init="ones", bias_init=lambda k, s, d: jnp.full(s, 0.5, d)).init(jax.random.key(0), x)
    np.testing.assert_array_equal(params["weight"], np.ones((3, 2)))
    np.testing.assert_array_equal(params["bias"], np.full(2, 0.5))
