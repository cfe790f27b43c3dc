"""Initialisers against jax.nn.initializers (same key, same algorithm) or by their statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.modules import initializers

JAX_COUNTERPARTS = {
    "he_normal": jax.nn.initializers.he_normal,
    "he_uniform": jax.nn.initializers.he_uniform,
    "glorot_normal": jax.nn.initializers.glorot_normal,
    "glorot_uniform": jax.nn.initializers.glorot_uniform,
    "lecun_normal": jax.nn.initializers.lecun_normal,
    "lecun_uniform": jax.nn.initializers.lecun_uniform,
    "kaiming_normal": jax.nn.initializers.he_normal,
    "kaiming_uniform": jax.nn.initializers.he_uniform,
    "xavier_normal": jax.nn.initializers.glorot_normal,
    "xavier_uniform": jax.nn.initializers.glorot_uniform,
}


@pytest.mark.parametrize("shape", [(64, 32), (3, 3, 8, 16)], ids=["dense", "hwio"])
@pytest.mark.parametrize("name", JAX_COUNTERPARTS)
def test_variance_scaling_equals_jax(name, shape):
    key = jax.random.key(0)
    ours = initializers.get(name)(key, shape, jnp.float32)
    expected = JAX_COUNTERPARTS[name]()(key, shape, jnp.float32)
    assert ours.dtype == jnp.float32 and ours.shape == shape
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)


def test_fans_of_dense_and_hwio_kernels():
    assert initializers.fans((64, 32)) == (64, 32)
    assert initializers.fans((3, 5, 8, 16)) == (3 * 5 * 8, 3 * 5 * 16)
    assert initializers.fans((7,)) == (7, 7)
    assert initializers.fans(()) == (1, 1)


@pytest.mark.parametrize(
    "name, scale, mode",
    [
        ("he_normal", 2.0, "fan_in"),
        ("he_uniform", 2.0, "fan_in"),
        ("glorot_normal", 1.0, "fan_avg"),
        ("glorot_uniform", 1.0, "fan_avg"),
        ("lecun_normal", 1.0, "fan_in"),
        ("lecun_uniform", 1.0, "fan_in"),
    ],
)
def test_variance_scaling_statistics_on_hwio(name, scale, mode):
    shape = (5, 5, 32, 64)  # 51,200 samples: std estimate within ~1%
    fan_in, fan_out = 5 * 5 * 32, 5 * 5 * 64
    fan = {"fan_in": fan_in, "fan_avg": (fan_in + fan_out) / 2}[mode]
    w = np.asarray(initializers.get(name)(jax.random.key(1), shape, jnp.float32))
    std = np.sqrt(scale / fan)
    assert abs(w.std() / std - 1) < 0.03
    assert abs(w.mean()) < 0.02 * std
    if name.endswith("uniform"):
        assert np.abs(w).max() <= np.sqrt(3) * std * (1 + 1e-6)
    else:  # truncated at two standard deviations of the untruncated normal
        assert np.abs(w).max() <= 2 * std / 0.87962566103423978 * (1 + 1e-6)


def test_normal_equals_jax_and_uniform_statistics():
    key = jax.random.key(2)
    np.testing.assert_allclose(
        initializers.get("normal")(key, (100, 10)), jax.nn.initializers.normal(0.01)(key, (100, 10)), rtol=1e-6
    )
    np.testing.assert_allclose(
        initializers.normal(0.5)(key, (4, 4)), jax.nn.initializers.normal(0.5)(key, (4, 4)), rtol=1e-6
    )
    # jax.nn.initializers.uniform samples [0, scale); ours is symmetric [-scale, scale): compare statistics.
    w = np.asarray(initializers.uniform(0.2)(key, (200, 200)))
    assert w.min() >= -0.2 and w.max() <= 0.2
    assert w.min() < -0.19 and w.max() > 0.19
    assert abs(w.mean()) < 0.005
    assert abs(w.std() / (0.2 / np.sqrt(3)) - 1) < 0.02


def test_constant_initialisers_and_dtype():
    key = jax.random.key(3)
    np.testing.assert_array_equal(initializers.get("zeros")(key, (2, 3), jnp.float32), np.zeros((2, 3)))
    np.testing.assert_array_equal(initializers.get("ones")(key, (4,), jnp.float32), np.ones(4))
    for name in ["he_normal", "glorot_uniform", "normal", "uniform", "zeros"]:
        assert initializers.get(name)(key, (3, 3), jnp.bfloat16).dtype == jnp.bfloat16


def test_determinism():
    for name in ["he_normal", "glorot_uniform", "normal", "uniform"]:
        init = initializers.get(name)
        a, b = init(jax.random.key(4), (8, 8)), init(jax.random.key(4), (8, 8))
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(a, init(jax.random.key(5), (8, 8)))


def test_lookup():
    fn = lambda key, shape, dtype=jnp.float32: jnp.full(shape, 2.0, dtype)
    assert initializers.get(fn) is fn
    with pytest.raises(ValueError) as err:
        initializers.get("he_norml")
    message = str(err.value)
    assert "Did you mean 'he_normal'?" in message
    for name in initializers.INITIALIZERS:
        assert name in message
    with pytest.raises(ValueError, match="available"):
        initializers.get("nonsense_initializer_xyz")
