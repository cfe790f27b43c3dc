"""Conv2d / ConvTranspose2d / Conv1d against lax and flax.linen (the CPU formulations: tests/model/kernels/)."""

import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

from model.modules.conv import Conv2d, ConvTranspose2d, conv2d, conv_transpose2d
from model.modules.cpu_forms import cpu_kernels

DIMS = ("NHWC", "HWIO", "NHWC")

# (kernel, stride, padding, dilation, groups, in_channels, out_channels, use_bias, input hw)
CONFIGS = {
    "k3_same": (3, 1, "SAME", 1, 1, 3, 4, True, (6, 7)),
    "k3_s2_same_even": (3, 2, "SAME", 1, 1, 3, 4, True, (6, 8)),
    "k2x3_s2x1_valid_remainder": ((2, 3), (2, 1), "VALID", 1, 1, 3, 4, True, (7, 6)),
    "k3_int_pad_dilated": (3, 1, 2, 2, 1, 3, 4, True, (7, 7)),
    # Padding beyond the kernel extent (top 3, bottom 4, left 4): the input gradient needs negative padding.
    "k3_s2_explicit_pad": (3, 2, ((3, 4), (4, 1)), 1, 1, 3, 4, True, (7, 7)),
    "k3_pad4_beyond_kernel": (3, 1, 4, 1, 1, 2, 3, True, (5, 5)),
    "groups2": (3, 1, "SAME", 1, 2, 4, 6, True, (6, 6)),
    "depthwise": (3, 1, "SAME", 1, 4, 4, 4, True, (6, 5)),
    "depthwise_x2": (3, 2, "SAME", 1, 4, 4, 8, True, (7, 6)),
    "k1_valid_no_bias": (1, 1, "VALID", 1, 1, 3, 5, False, (4, 5)),
    "k1_s2_projection": (1, 2, "SAME", 1, 1, 4, 6, False, (7, 6)),
    # Over 32 output channels: the weight gradient as a convolution, not one matrix product per tap.
    "k3_s2_wide": (3, 2, "SAME", 1, 1, 3, 40, True, (6, 7)),
    "k3_s3_dil2_groups2_same": (3, 3, "SAME", 2, 2, 4, 4, False, (9, 8)),
}


def in_form(use: bool, conv):
    """`conv` traced in model/kernels' formulations (True, where the folder is there) or in the plain math (False),
    whatever the platform, wherever it is called: inside a jit, a grad or a scan."""

    def forced(*args, **kwargs):
        with cpu_kernels(use):
            return conv(*args, **kwargs)

    return forced


def _lax_padding(padding):
    # lax takes the strings itself; ints and pairs are spelled out here, not by the code under test.
    if isinstance(padding, str):
        return padding
    if isinstance(padding, int):
        return [(padding, padding)] * 2
    return [tuple(p) for p in padding]


def _as_pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _reference(x, w, kernel, stride, padding, dilation, groups):
    return lax.conv_general_dilated(
        x,
        w,
        _as_pair(stride),
        _lax_padding(padding),
        rhs_dilation=_as_pair(dilation),
        dimension_numbers=DIMS,
        feature_group_count=groups,
    )


def _inputs(cfg, dtype=np.float32, seed=0):
    kernel, stride, padding, dilation, groups, cin, cout, use_bias, hw = cfg
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, *hw, cin)).astype(dtype)
    w = rng.normal(size=(*_as_pair(kernel), cin // groups, cout)).astype(dtype)
    return x, w


def _random_params(layer_params, seed):
    # Random values in the layer's own param structure; random bias too, so that it is tested. (Real inits are
    # tested below and in test_initializers.py; compiling one per config would dominate this file's run time.)
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), layer_params)


@pytest.mark.parametrize("name", CONFIGS)
def test_conv2d_matches_lax_and_flax(name):
    kernel, stride, padding, dilation, groups, cin, cout, use_bias, hw = cfg = CONFIGS[name]
    layer = Conv2d(cout, kernel, stride, padding, dilation, groups, use_bias)
    x, _ = _inputs(cfg)
    shapes, state = jax.eval_shape(layer.init, jax.random.key(0), x)
    assert shapes["weight"].shape == (*_as_pair(kernel), cin // groups, cout)
    assert set(shapes) == ({"weight", "bias"} if use_bias else {"weight"})
    params = _random_params(shapes, seed=8)

    flax_conv = nn.Conv(
        cout,
        _as_pair(kernel),
        _as_pair(stride),
        _lax_padding(padding),
        kernel_dilation=dilation,
        feature_group_count=groups,
        use_bias=use_bias,
    )
    flax_params = {"kernel": params["weight"], **({"bias": params["bias"]} if use_bias else {})}

    @jax.jit  # one compilation per config instead of one per eager op
    def run(params, flax_params, x):
        expected = _reference(x, params["weight"], kernel, stride, padding, dilation, groups)
        if use_bias:
            expected = expected + params["bias"]
        return layer(params, {}, x)[0], expected, flax_conv.apply({"params": flax_params}, x)

    y, expected, flax_y = run(params, flax_params, x)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, flax_y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [Conv2d(8, 3, groups=2), ConvTranspose2d(8, 3, 2)], ids=repr)
def test_init_is_deterministic(layer):
    x = jax.ShapeDtypeStruct((1, 5, 5, 4), jnp.float32)
    keys = jnp.stack([jax.random.key_data(jax.random.key(i)) for i in (0, 0, 1)])
    # One compilation for all three keys.
    params, _ = jax.jit(jax.vmap(lambda k: layer.init(jax.random.wrap_key_data(k), x)))(keys)
    np.testing.assert_array_equal(params["weight"][0], params["weight"][1])
    assert not np.allclose(params["weight"][0], params["weight"][2])
    np.testing.assert_array_equal(params["bias"], np.zeros((3, 8)))
    # he_normal by default: std sqrt(2 / fan_in), fan_in = kh * kw * (in_channels / groups).
    fan_in = 9 * params["weight"].shape[-2]
    assert 0.7 < float(params["weight"].std()) / np.sqrt(2 / fan_in) < 1.3


def test_conv2d_rejects_bad_arguments():
    with pytest.raises(ValueError, match="in_channels"):
        Conv2d(4, 3, groups=2).init(jax.random.key(0), jax.ShapeDtypeStruct((1, 5, 5, 3), jnp.float32))
    with pytest.raises(ValueError, match="out_channels"):
        Conv2d(5, 3, groups=2)
    with pytest.raises(ValueError, match="padding"):
        Conv2d(4, 3, padding="FULL")
    with pytest.raises(ValueError, match="padding"):
        Conv2d(4, 3, padding=-1)
    with pytest.raises(ValueError, match="stride"):
        Conv2d(4, 3, stride=0)


# (kernel, stride, padding, use_bias, input hw)
TRANSPOSE_CONFIGS = [
    (3, 2, "SAME", True, (4, 5)),
    (3, 2, "VALID", True, (4, 5)),
    (2, 2, "SAME", False, (3, 4)),
    (4, 2, "SAME", True, (3, 3)),
    ((3, 1), (1, 3), "SAME", True, (4, 3)),
    (1, 3, "VALID", True, (3, 2)),
    (5, 3, "VALID", False, (2, 3)),
]


@pytest.mark.parametrize("cfg", TRANSPOSE_CONFIGS, ids=str)
def test_conv_transpose_matches_flax(cfg):
    kernel, stride, padding, use_bias, hw = cfg
    layer = ConvTranspose2d(5, kernel, stride, padding, use_bias)
    x = np.random.default_rng(6).normal(size=(2, *hw, 3)).astype(np.float32)
    shapes, state = jax.eval_shape(layer.init, jax.random.key(2), x)
    assert shapes["weight"].shape == (*_as_pair(kernel), 3, 5)
    params = _random_params(shapes, seed=10)
    flax_layer = nn.ConvTranspose(5, _as_pair(kernel), _as_pair(stride), padding, use_bias=use_bias)
    flax_params = {"kernel": params["weight"], **({"bias": params["bias"]} if use_bias else {})}
    y, expected = jax.jit(lambda p, fp, x: (layer(p, state, x)[0], flax_layer.apply({"params": fp}, x)))(
        params, flax_params, x
    )
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", TRANSPOSE_CONFIGS[:2] + TRANSPOSE_CONFIGS[4:5], ids=str)
def test_conv_transpose_gradients(cfg):
    kernel, stride, padding, use_bias, hw = cfg
    with jax.enable_x64(True):
        rng = np.random.default_rng(7)
        x = rng.normal(size=(2, *hw, 3))
        w = rng.normal(size=(*_as_pair(kernel), 3, 2))
        ref = lambda x, w: lax.conv_transpose(x, w, _as_pair(stride), padding, dimension_numbers=DIMS)
        cotangent = rng.normal(size=ref(x, w).shape)
        ours = jax.jit(
            jax.grad(lambda x, w: jnp.vdot(in_form(True, conv_transpose2d)(x, w, stride, padding), cotangent), (0, 1))
        )(x, w)
        autodiff = jax.jit(jax.grad(lambda x, w: jnp.vdot(ref(x, w), cotangent), (0, 1)))(x, w)
        layer = ConvTranspose2d(2, kernel, stride, padding, use_bias)
        shapes, state = jax.eval_shape(layer.init, jax.random.key(3), x)
        params = _random_params(shapes, seed=11)
        check_grads(jax.jit(lambda p, x: layer(p, state, x)[0]), (params, x), order=1, modes=("rev",))
    np.testing.assert_allclose(ours[0], autodiff[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours[1], autodiff[1], rtol=1e-12, atol=1e-12)


def test_without_model_kernels_every_convolution_is_the_plain_math(monkeypatch):
    """A project made --without kernels: the convolution finds no model.kernels and lowers the plain math for the
    CPU too, forced or not."""
    monkeypatch.setitem(sys.modules, "model.kernels", None)  # an import of it fails as if the folder were deleted
    x, w = jnp.ones((2, 8, 8, 3), jnp.float32), jnp.ones((3, 3, 3, 32), jnp.float32)

    def lowered(conv):
        traced = jax.jit(jax.grad(lambda x, w: conv(x, w).sum(), (0, 1))).trace(x, w)
        return traced.lower(lowering_platforms=("cpu",)).as_text()

    plain = lowered(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DIMS))
    assert lowered(conv2d) == lowered(in_form(True, conv2d)) == plain


def test_conv_transpose_rejects_explicit_padding():
    with pytest.raises(ValueError, match="padding"):
        ConvTranspose2d(4, 3, padding=1)


# (kernel, stride, padding, dilation, groups, in_channels, out_channels, length)
CONFIGS_1D = {
    "k3_same": (3, 1, "SAME", 1, 1, 3, 4, 9),
    "k4_s2_valid": (4, 2, "VALID", 1, 1, 2, 5, 11),
    "k3_pad_before_after_dilated": (3, 1, (3, 1), 2, 1, 3, 4, 8),
    "k5_int_pad_s3": (5, 3, 2, 1, 1, 2, 3, 10),
    "depthwise": (3, 1, "SAME", 1, 4, 4, 4, 7),
}


@pytest.mark.parametrize("name", CONFIGS_1D)
def test_conv1d_matches_flax_and_its_gradients_are_right(name):
    from model.modules.conv import Conv1d

    kernel, stride, padding, dilation, groups, cin, cout, length = CONFIGS_1D[name]
    layer = Conv1d(cout, kernel, stride, padding, dilation, groups)
    x = np.random.default_rng(3).normal(size=(2, length, cin)).astype(np.float32)
    shapes, _ = jax.eval_shape(layer.init, jax.random.key(0), x)
    assert shapes["weight"].shape == (kernel, cin // groups, cout)
    params = _random_params(shapes, seed=4)
    flax_padding = padding if isinstance(padding, str) else [padding if isinstance(padding, tuple) else (padding,) * 2]
    flax_conv = nn.Conv(cout, (kernel,), (stride,), flax_padding, kernel_dilation=dilation, feature_group_count=groups)
    flax_params = {"kernel": params["weight"], "bias": params["bias"]}
    y = jax.jit(lambda p, x: layer(p, {}, x)[0])(params, x)
    np.testing.assert_allclose(y, flax_conv.apply({"params": flax_params}, x), rtol=1e-5, atol=1e-5)
    check_grads(lambda p, x: layer(p, {}, x)[0], (params, x), order=1, modes=("rev",), atol=1e-2, rtol=1e-2)


def test_conv1d_refuses_other_ranks_and_bad_arguments():
    from model.modules.conv import Conv1d

    with pytest.raises(ValueError, match=r"\(batch, length, channels\)"):
        Conv1d(4, 3).init(jax.random.key(0), jax.ShapeDtypeStruct((2, 5, 5, 3), jnp.float32))
    with pytest.raises(ValueError, match="stride must be an int"):
        Conv1d(4, 3, stride=(1, 2))
