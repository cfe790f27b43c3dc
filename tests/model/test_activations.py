"""Activations against scipy/numpy/jax.nn, their gradients, stability at |x| = 1000, and the Activation layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from jax.test_util import check_grads

from model.modules import activations as A
from model.modules.sequential import Sequential

RNG = np.random.default_rng(0)
X = (RNG.standard_normal((4, 33)) * 3).astype(np.float32)
EXTREME = np.array([-1000.0, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1000.0], np.float32)


def _np_softmax(x, axis):
    return scipy.special.softmax(x.astype(np.float64), axis=axis)


def _np_gelu(x):
    x = x.astype(np.float64)
    return x * 0.5 * scipy.special.erfc(-x / np.sqrt(2.0))


def _np_gelu_tanh(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


NUMPY_REFERENCES = {
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _np_gelu,
    "silu": lambda x: x * scipy.special.expit(x.astype(np.float64)),
    "hard_swish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "sigmoid": lambda x: scipy.special.expit(x.astype(np.float64)),
    "tanh": lambda x: np.tanh(x.astype(np.float64)),
    "softmax": lambda x: _np_softmax(x, -1),
    "log_softmax": lambda x: scipy.special.log_softmax(x.astype(np.float64), axis=-1),
}

JAX_NN = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
    "hard_swish": jax.nn.hard_swish,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "softmax": jax.nn.softmax,
    "log_softmax": jax.nn.log_softmax,
}


def test_erf_matches_scipy_float64():
    x = np.concatenate([np.linspace(-7, 7, 20001), [-1e3, -1e-6, 0.0, 1e-6, 1e3]])
    with jax.enable_x64(True):
        ours = np.asarray(A.erf(jnp.asarray(x)))
    assert ours.dtype == np.float64
    assert np.max(np.abs(ours - scipy.special.erf(x))) < 2e-7
    assert ours[-3] == 0.0 and ours[-1] == 1.0 and ours[-5] == -1.0


def test_erf_float32_matches_scipy_and_lax():
    x = np.linspace(-7, 7, 20001).astype(np.float32)
    ours = np.asarray(A.erf(jnp.asarray(x))).astype(np.float64)
    exact = scipy.special.erf(x.astype(np.float64))
    # float32 rounding adds to the 1.2e-7 fit error; lax.erf itself is ~3e-7 from exact here.
    assert np.max(np.abs(ours - exact)) < 6e-7
    np.testing.assert_allclose(ours, np.asarray(jax.lax.erf(jnp.asarray(x))), atol=8e-7)


def test_erf_gradient_is_exact_derivative_including_zero():
    x = jnp.array([-3.0, -0.5, 0.0, 1e-3, 0.7, 2.0])
    grads = jax.vmap(jax.grad(A.erf))(x)
    np.testing.assert_allclose(grads, 2 / np.sqrt(np.pi) * np.exp(-np.square(np.asarray(x))), rtol=1e-6)
    with jax.enable_x64(True):
        check_grads(A.erf, (jnp.asarray(RNG.standard_normal(7)),), order=2, modes=("fwd", "rev"))


def test_normal_cdf_tail_is_relatively_accurate():
    # Where 1 + erf(x / sqrt2) would cancel to 0 in float32, Phi(x) keeps ~1e-6 relative accuracy.
    x = np.linspace(-12, -4, 101).astype(np.float32)
    exact = 0.5 * scipy.special.erfc(-x.astype(np.float64) / np.sqrt(2))
    np.testing.assert_allclose(np.asarray(A.normal_cdf(jnp.asarray(x))), exact, rtol=2e-5)


@pytest.mark.parametrize("name", sorted(NUMPY_REFERENCES))
def test_values_match_numpy_and_jax_nn(name):
    fn = A.get(name)
    ours = np.asarray(fn(jnp.asarray(X)))
    np.testing.assert_allclose(ours, NUMPY_REFERENCES[name](X), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(ours, np.asarray(JAX_NN[name](jnp.asarray(X))), rtol=2e-6, atol=2e-6)


def test_gelu_tanh_approximation_matches_references():
    ours = np.asarray(A.gelu(jnp.asarray(X), approximate=True))
    np.testing.assert_allclose(ours, _np_gelu_tanh(X), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(ours, np.asarray(jax.nn.gelu(jnp.asarray(X), approximate=True)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_axes(axis):
    np.testing.assert_allclose(A.softmax(jnp.asarray(X), axis=axis), _np_softmax(X, axis), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(
        A.log_softmax(jnp.asarray(X), axis=axis),
        scipy.special.log_softmax(X.astype(np.float64), axis=axis),
        rtol=2e-6,
        atol=2e-6,
    )


@pytest.mark.parametrize("name", sorted(NUMPY_REFERENCES) + ["gelu_tanh"])
def test_gradients_match_jax_nn(name):
    if name == "gelu_tanh":
        fn, ref = (lambda x: A.gelu(x, approximate=True)), (lambda x: jax.nn.gelu(x, approximate=True))
    else:
        fn, ref = A.get(name), JAX_NN[name]
    # A random cotangent makes softmax's gradient non-trivial (the gradient of sum(softmax) is 0).
    w = jnp.asarray(RNG.standard_normal(X.shape).astype(np.float32))
    ours = jax.grad(lambda x: jnp.sum(fn(x) * w))(jnp.asarray(X))
    theirs = jax.grad(lambda x: jnp.sum(ref(x) * w))(jnp.asarray(X))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(NUMPY_REFERENCES) + ["gelu_tanh"])
def test_check_grads_float64(name):
    fn = (lambda x: A.gelu(x, approximate=True)) if name == "gelu_tanh" else A.get(name)
    x = RNG.standard_normal((3, 5)) * 2.5
    # Keep finite differences away from the kinks of relu (0) and hard_swish (-3, 3).
    x = np.where(np.min(np.abs(x[..., None] - np.array([-3.0, 0.0, 3.0])), -1) < 0.05, 0.5, x)
    with jax.enable_x64(True):
        check_grads(fn, (jnp.asarray(x),), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("name", sorted(NUMPY_REFERENCES) + ["gelu_tanh"])
def test_stable_at_large_magnitude(name):
    fn = (lambda x: A.gelu(x, approximate=True)) if name == "gelu_tanh" else A.get(name)
    x = jnp.asarray(EXTREME)
    w = np.linspace(-1.0, 1.0, x.size, dtype=np.float32)
    y = np.asarray(fn(x))
    g = np.asarray(jax.grad(lambda v: jnp.sum(fn(v) * w))(x))
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(g)), (y, g)
    if name in ("relu", "gelu", "gelu_tanh", "silu", "hard_swish"):
        # All of these are ~x for large positive x and ~0 for large negative x.
        np.testing.assert_allclose(y[[0, -1]], [0.0, 1000.0], atol=1e-6)
        np.testing.assert_allclose(g[[0, -1]], [0.0, w[-1]], atol=1e-6)
    if name in ("softmax", "log_softmax"):
        ref = NUMPY_REFERENCES[name](EXTREME)
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


def test_activation_layer_in_sequential():
    model = Sequential([A.Activation("gelu", approximate=True), A.Activation("softmax", axis=0)])
    params, state = model.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct(X.shape, jnp.float32))
    assert params == {"0": {}, "1": {}} and state == {"0": {}, "1": {}}
    y, _ = model(params, state, jnp.asarray(X))
    np.testing.assert_allclose(y, _np_softmax(_np_gelu_tanh(X), 0), rtol=1e-5, atol=1e-7)
    assert repr(model.layers["0"]) == "Activation('gelu', approximate=True)"


def test_unknown_activation_lists_names_and_closest_match():
    with pytest.raises(ValueError) as err:
        A.Activation("gleu")
    message = str(err.value)
    assert "Did you mean 'gelu'?" in message
    assert all(name in message for name in A.ACTIVATIONS)
