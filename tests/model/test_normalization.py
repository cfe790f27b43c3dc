"""LayerNorm, RMSNorm, GroupNorm and BatchNorm against flax.linen (params copied) and numpy, in both modes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model.modules.normalization import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from model.modules.sequential import Sequential

RNG = np.random.default_rng(1)
X2 = (RNG.standard_normal((6, 10)) * 2 + 0.5).astype(np.float32)
X4 = (RNG.standard_normal((3, 4, 5, 8)) * 1.5 - 0.3).astype(np.float32)
TOL = dict(rtol=2e-5, atol=2e-5)


def _random_affine(params):
    """Non-trivial scale and bias, so the test sees whether they are applied per feature."""
    keys = iter(jax.random.split(jax.random.PRNGKey(7), 8))
    return {k: v + 0.5 * jax.random.normal(next(keys), v.shape) for k, v in params.items()}


def _np_norm(x, axes, eps, center=True):
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True) if center else 0.0
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def _flax_params(params):
    return {"params": {k: np.asarray(v) for k, v in params.items()}}


@pytest.mark.parametrize("x", [X2, X4], ids=["rank2", "rank4"])
def test_layer_norm_matches_flax_and_numpy(x):
    layer = LayerNorm()
    params, state = layer.init(jax.random.PRNGKey(0), x)
    assert set(params) == {"scale", "bias"} and state == {}
    params = _random_affine(params)
    y, _ = layer(params, state, jnp.asarray(x))
    flax_y = nn.LayerNorm(epsilon=1e-5).apply(_flax_params(params), x)
    np.testing.assert_allclose(y, flax_y, **TOL)
    ref = _np_norm(x, -1, 1e-5) * np.asarray(params["scale"]) + np.asarray(params["bias"])
    np.testing.assert_allclose(y, ref, **TOL)


def test_layer_norm_without_scale_or_bias():
    layer = LayerNorm(use_scale=False, use_bias=False)
    params, _ = layer.init(jax.random.PRNGKey(0), X2)
    assert params == {}
    y, _ = layer(params, {}, jnp.asarray(X2))
    np.testing.assert_allclose(y, _np_norm(X2, -1, 1e-5), **TOL)
    flax_y = nn.LayerNorm(epsilon=1e-5, use_scale=False, use_bias=False).apply({}, X2)
    np.testing.assert_allclose(y, flax_y, **TOL)


def test_layer_norm_large_mean_is_accurate():
    # E[x^2] - E[x]^2 loses the variance at this offset in float32; the two-pass variance does not.
    x = (RNG.standard_normal((4, 64)) + 3000.0).astype(np.float32)
    y, _ = LayerNorm(use_scale=False, use_bias=False)({}, {}, jnp.asarray(x))
    np.testing.assert_allclose(y, _np_norm(x, -1, 1e-5), atol=2e-3)


def test_rms_norm_matches_flax_and_numpy():
    layer = RMSNorm()
    params, _ = layer.init(jax.random.PRNGKey(0), X4)
    assert set(params) == {"scale"}
    params = _random_affine(params)
    y, _ = layer(params, {}, jnp.asarray(X4))
    np.testing.assert_allclose(y, nn.RMSNorm(epsilon=1e-6).apply(_flax_params(params), X4), **TOL)
    ref = _np_norm(X4, -1, 1e-6, center=False) * np.asarray(params["scale"])
    np.testing.assert_allclose(y, ref, **TOL)


@pytest.mark.parametrize("x", [X4, X4[:, 0]], ids=["nhwc", "nlc"])
def test_group_norm_matches_flax_and_numpy(x):
    groups = 4
    layer = GroupNorm(num_groups=groups)
    params, _ = layer.init(jax.random.PRNGKey(0), x)
    params = _random_affine(params)
    y, _ = layer(params, {}, jnp.asarray(x))
    flax_y = nn.GroupNorm(num_groups=groups, epsilon=1e-5).apply(_flax_params(params), x)
    np.testing.assert_allclose(y, flax_y, **TOL)
    grouped = x.reshape(x.shape[0], -1, groups, x.shape[-1] // groups)
    ref = _np_norm(grouped, (1, 3), 1e-5).reshape(x.shape) * np.asarray(params["scale"]) + np.asarray(params["bias"])
    np.testing.assert_allclose(y, ref, **TOL)


def test_group_norm_rejects_indivisible_channels():
    with pytest.raises(ValueError, match="groups"):
        GroupNorm(num_groups=3).init(jax.random.PRNGKey(0), X4)


@pytest.mark.parametrize("x", [X2, X4], ids=["rank2", "rank4"])
def test_batch_norm_train_matches_flax_and_numpy(x):
    layer = BatchNorm(momentum=0.9, eps=1e-5)
    params, state = layer.init(jax.random.PRNGKey(0), x)
    assert set(state) == {"mean", "var"}
    np.testing.assert_array_equal(state["mean"], 0.0)
    np.testing.assert_array_equal(state["var"], 1.0)
    params = _random_affine(params)
    state = {
        "mean": jnp.asarray(RNG.standard_normal(x.shape[-1]), jnp.float32),
        "var": jnp.asarray(RNG.uniform(0.5, 2.0, x.shape[-1]), jnp.float32),
    }
    y, new_state = layer(params, state, jnp.asarray(x), train=True)

    flax_bn = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
    variables = {**_flax_params(params), "batch_stats": {k: np.asarray(v) for k, v in state.items()}}
    flax_y, flax_updates = flax_bn.apply(variables, x, mutable=["batch_stats"])
    np.testing.assert_allclose(y, flax_y, **TOL)
    for k in ("mean", "var"):
        np.testing.assert_allclose(new_state[k], flax_updates["batch_stats"][k], **TOL)

    axes = tuple(range(x.ndim - 1))
    x64 = x.astype(np.float64)
    ref = _np_norm(x, axes, 1e-5) * np.asarray(params["scale"]) + np.asarray(params["bias"])
    np.testing.assert_allclose(y, ref, **TOL)
    np.testing.assert_allclose(new_state["mean"], 0.9 * np.asarray(state["mean"]) + 0.1 * x64.mean(axes), **TOL)
    np.testing.assert_allclose(new_state["var"], 0.9 * np.asarray(state["var"]) + 0.1 * x64.var(axes), **TOL)


def test_batch_norm_eval_uses_running_stats_and_keeps_state():
    layer = BatchNorm()
    params, _ = layer.init(jax.random.PRNGKey(0), X4)
    params = _random_affine(params)
    state = {
        "mean": jnp.asarray(RNG.standard_normal(8), jnp.float32),
        "var": jnp.asarray(RNG.uniform(0.5, 2.0, 8), jnp.float32),
    }
    y, same_state = layer(params, state, jnp.asarray(X4), train=False)
    assert same_state is state
    variables = {**_flax_params(params), "batch_stats": {k: np.asarray(v) for k, v in state.items()}}
    flax_y = nn.BatchNorm(use_running_average=True, epsilon=1e-5).apply(variables, X4)
    np.testing.assert_allclose(y, flax_y, **TOL)
    ref = (X4 - np.asarray(state["mean"])) / np.sqrt(np.asarray(state["var"]) + 1e-5)
    np.testing.assert_allclose(y, ref * np.asarray(params["scale"]) + np.asarray(params["bias"]), **TOL)


def test_batch_norm_state_threads_through_sequential():
    model = Sequential({"bn": BatchNorm(momentum=0.5)})
    params, state = model.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct(X2.shape, jnp.float32))
    _, state = model(params, state, jnp.asarray(X2), train=True)
    _, state = model(params, state, jnp.asarray(X2), train=True)
    # After two identical batches with momentum 0.5: 0.25 * init + 0.75 * batch statistic.
    np.testing.assert_allclose(state["bn"]["mean"], 0.75 * X2.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["bn"]["var"], 0.25 + 0.75 * X2.astype(np.float64).var(0), rtol=1e-5)


NORMS = {
    "layer": (LayerNorm(), X2),
    "rms": (RMSNorm(), X2),
    "group": (GroupNorm(num_groups=2), X4[:2, :2, :3]),
    "batch": (BatchNorm(), X4[:2, :2, :3]),
}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_gradients_float64(name):
    layer, x = NORMS[name]
    with jax.enable_x64(True):
        x = jnp.asarray(x, jnp.float64)
        params, state = layer.init(jax.random.PRNGKey(0), x)
        params = _random_affine(params)
        # Weighted sum: the plain sum of a normalised output has zero gradient with respect to x.
        w = jnp.asarray(RNG.standard_normal(x.shape))

        def loss(p, v):
            return jnp.sum(layer(p, state, v, train=True)[0] * w)

        check_grads(jax.jit(loss), (params, x), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("name", sorted(NORMS))
def test_init_is_deterministic_and_keeps_dtype(name):
    layer, x = NORMS[name]
    a = layer.init(jax.random.PRNGKey(3), jax.ShapeDtypeStruct(x.shape, jnp.float32))
    b = layer.init(jax.random.PRNGKey(4), x)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    y, _ = layer(*a, jnp.asarray(x, jnp.bfloat16), train=True)
    assert y.dtype == jnp.bfloat16 and y.shape == x.shape


def test_normalize_derivative_equals_autodiff_of_the_two_pass_formula_float64():
    # The written-out JVP (and the VJP JAX transposes from it) against plain autodiff, for every output,
    # over the axes batch, layer and group norm use.
    from model.modules.normalization import _mean_var, normalize

    def plain(x, axes, eps):
        mean, var = _mean_var(x, axes)
        return (x - mean) * jax.lax.rsqrt(var + eps), mean, var

    with jax.enable_x64():
        rng = np.random.default_rng(3)
        x = jnp.asarray(rng.standard_normal((4, 5, 3, 6)) * 3 + 2)
        cot = [jnp.asarray(rng.standard_normal(s)) for s in ((4, 5, 3, 6), (1, 1, 1, 6), (1, 1, 1, 6))]
        tangent = jnp.asarray(rng.standard_normal(x.shape))
        for axes in ((0, 1, 2), (3,), (1, 2)):
            cots = [
                c
                if c.shape == x.shape
                else jnp.asarray(rng.standard_normal(tuple(1 if a in axes else d for a, d in enumerate(x.shape))))
                for c in cot
            ]
            for f in (normalize, plain):
                assert all(np.isfinite(np.asarray(v)).all() for v in f(x, axes, 1e-5))
            ours = jax.vjp(lambda x: normalize(x, axes, 1e-5), x)[1](tuple(cots))[0]
            ref = jax.vjp(lambda x: plain(x, axes, 1e-5), x)[1](tuple(cots))[0]
            np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)
            ours_t = jax.jvp(lambda x: normalize(x, axes, 1e-5), (x,), (tangent,))[1]
            ref_t = jax.jvp(lambda x: plain(x, axes, 1e-5), (x,), (tangent,))[1]
            for a, b in zip(ours_t, ref_t):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
