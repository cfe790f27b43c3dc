"""Conv2d / ConvTranspose2d against lax and flax.linen, and the custom-VJP gradient against autodiff."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

from model.modules.conv import Conv2d, ConvTranspose2d, conv2d, conv_transpose2d

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


@pytest.mark.parametrize("name", CONFIGS)
def test_custom_vjp_equals_autodiff_float64(name):
    kernel, stride, padding, dilation, groups = CONFIGS[name][:5]
    with jax.enable_x64(True):
        x, w = _inputs(CONFIGS[name], np.float64, seed=1)
        y = _reference(x, w, kernel, stride, padding, dilation, groups)
        cotangent = np.random.default_rng(2).normal(size=y.shape)

        def loss(conv):
            return lambda x, w: jnp.vdot(conv(x, w), cotangent)

        ours = jax.jit(
            jax.grad(loss(lambda x, w: conv2d(x, w, stride, padding, dilation, groups, cpu_kernels=True)), (0, 1))
        )(x, w)
        autodiff = jax.jit(
            jax.grad(loss(lambda x, w: _reference(x, w, kernel, stride, padding, dilation, groups)), (0, 1))
        )(x, w)
    assert ours[0].dtype == jnp.float64
    np.testing.assert_allclose(ours[0], autodiff[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours[1], autodiff[1], rtol=1e-12, atol=1e-12)


def test_custom_vjp_float32_inside_scan():
    # float32 takes XLA:CPU's optimised convolution kernels (float64 does not), and inside a scan is where the
    # custom backward matters: check it there on the configs that exercise strides, negative padding and groups.
    def grads(conv, x, w, cotangent):
        def body(carry, _):
            return carry, jax.grad(lambda x, w: jnp.vdot(conv(x, w), cotangent), (0, 1))(x, w)

        return lax.scan(body, 0.0, None, length=2)[1]

    for name in [
        "k3_s2_same_even",
        "k2x3_s2x1_valid_remainder",
        "k3_s2_explicit_pad",
        "k3_pad4_beyond_kernel",
        "depthwise",
        "depthwise_x2",
        "k3_s3_dil2_groups2_same",
    ]:
        cfg = CONFIGS[name]
        kernel, stride, padding, dilation, groups = cfg[:5]
        x, w = _inputs(cfg, seed=3)
        out = jax.eval_shape(lambda x, w: _reference(x, w, kernel, stride, padding, dilation, groups), x, w)
        cotangent = np.random.default_rng(4).normal(size=out.shape).astype(np.float32)
        ours = jax.jit(
            lambda x, w, c: grads(
                lambda x, w: conv2d(x, w, stride, padding, dilation, groups, cpu_kernels=True), x, w, c
            )
        )(x, w, cotangent)
        ref = jax.jit(
            lambda x, w, c: grads(lambda x, w: _reference(x, w, kernel, stride, padding, dilation, groups), x, w, c)
        )(x, w, cotangent)
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()), err_msg=name)


@pytest.mark.parametrize("name", ["k3_s2_explicit_pad", "depthwise", "k3_s3_dil2_groups2_same"])
def test_conv2d_check_grads(name):
    kernel, stride, padding, dilation, groups, cin, cout, use_bias, hw = cfg = CONFIGS[name]
    layer = Conv2d(cout, kernel, stride, padding, dilation, groups, use_bias=True)
    with jax.enable_x64(True):
        x, _ = _inputs(cfg, np.float64, seed=5)
        shapes, state = jax.eval_shape(layer.init, jax.random.key(1), x)
        params = _random_params(shapes, seed=9)
        # custom_vjp has no forward mode, so the layer is checked in reverse mode only.
        check_grads(jax.jit(lambda p, x: layer(p, state, x)[0]), (params, x), order=1, modes=("rev",))
        custom = jax.jit(lambda x: conv2d(x, params["weight"], stride, padding, dilation, groups, cpu_kernels=True))
        with pytest.raises(TypeError):
            jax.jvp(custom, (x,), (x,))
        # The plain path (used off the CPU) supports both modes.
        plain = jax.jit(lambda x: conv2d(x, params["weight"], stride, padding, dilation, groups, cpu_kernels=False))
        check_grads(plain, (x,), order=1, modes=("fwd", "rev"))


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
            jax.grad(
                lambda x, w: jnp.vdot(conv_transpose2d(x, w, stride, padding, cpu_kernels=True), cotangent), (0, 1)
            )
        )(x, w)
        autodiff = jax.jit(jax.grad(lambda x, w: jnp.vdot(ref(x, w), cotangent), (0, 1)))(x, w)
        layer = ConvTranspose2d(2, kernel, stride, padding, use_bias)
        shapes, state = jax.eval_shape(layer.init, jax.random.key(3), x)
        params = _random_params(shapes, seed=11)
        check_grads(jax.jit(lambda p, x: layer(p, state, x)[0]), (params, x), order=1, modes=("rev",))
    np.testing.assert_allclose(ours[0], autodiff[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours[1], autodiff[1], rtol=1e-12, atol=1e-12)


def test_conv_transpose_rejects_explicit_padding():
    with pytest.raises(ValueError, match="padding"):
        ConvTranspose2d(4, 3, padding=1)


# Depthwise convolutions on the CPU path: (kernel, padding, input hw). Stride 1, one filter per channel.
DEPTHWISE = {
    "k7_same_one_tile": (7, "SAME", (9, 8)),
    # Tiles of 6 x 6 output positions: 3 x 2 of them, the last row and column of tiles padded.
    "k3_same_tiles_with_remainder": (3, "SAME", (13, 8)),
    "k3x2_explicit_asymmetric": ((3, 2), ((0, 2), (1, 0)), (7, 14)),
    # Padding beyond the kernel extent: the input gradient crops g.
    "k3_pad_beyond_kernel": (3, ((4, 1), (0, 3)), (5, 5)),
    "k5_valid": (5, "VALID", (12, 11)),
}


def _depthwise_inputs(name, dtype, seed):
    kernel, padding, hw = DEPTHWISE[name]
    rng = np.random.default_rng(seed)
    return rng.normal(size=(2, *hw, 3)).astype(dtype), rng.normal(size=(*_as_pair(kernel), 1, 3)).astype(dtype)


@pytest.mark.parametrize("name", DEPTHWISE)
def test_depthwise_path_matches_lax_float64(name):
    kernel, padding = DEPTHWISE[name][:2]
    with jax.enable_x64(True):
        x, w = _depthwise_inputs(name, np.float64, seed=12)
        ours = lambda x, w: conv2d(x, w, 1, padding, 1, 3, cpu_kernels=True)
        ref = lambda x, w: _reference(x, w, kernel, 1, padding, 1, 3)
        cotangent = np.random.default_rng(13).normal(size=jax.eval_shape(ref, x, w).shape)
        value_and_grads = lambda conv: jax.jit(
            jax.value_and_grad(lambda x, w: jnp.vdot(conv(x, w), cotangent), (0, 1))
        )(x, w)
        (v, (dx, dw)), (v_ref, (dx_ref, dw_ref)) = value_and_grads(ours), value_and_grads(ref)
        np.testing.assert_allclose(v, v_ref, rtol=1e-12)
        np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dw, dw_ref, rtol=1e-12, atol=1e-12)
        check_grads(jax.jit(ours), (x, w), order=1, modes=("rev",))


def test_depthwise_path_float32_inside_scan():
    # The form the trainer runs: float32, K steps of a lax.scan; the tiled weight gradient and the input gradient.
    x, w = _depthwise_inputs("k3_same_tiles_with_remainder", np.float32, seed=14)
    cotangent = np.random.default_rng(15).normal(size=x.shape).astype(np.float32)

    def grads(conv):
        def body(carry, _):
            return carry, jax.grad(lambda x, w: jnp.vdot(conv(x, w), cotangent), (0, 1))(x, w)

        return jax.jit(lambda: lax.scan(body, 0.0, None, length=2)[1])()

    ours = grads(lambda x, w: conv2d(x, w, groups=3, cpu_kernels=True))
    ref = grads(lambda x, w: _reference(x, w, 3, 1, "SAME", 1, 3))
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))


def test_depthwise_layers_take_the_shifted_slice_path(monkeypatch):
    from model import kernels

    monkeypatch.setattr(kernels, "CPU_KERNELS", True)  # the jaxpr of the CPU path (the default holds both paths)

    def primitives(fn, *args):
        return {eqn.primitive.name for eqn in jax.make_jaxpr(fn)(*args).eqns}

    x = jax.ShapeDtypeStruct((2, 9, 9, 4), jnp.float32)
    depthwise = Conv2d(4, 7, groups=4)
    params, _ = jax.eval_shape(depthwise.init, jax.random.key(0), x)
    assert "conv_general_dilated" not in primitives(lambda p, x: depthwise(p, {}, x)[0], params, x)
    assert "custom_vjp_call" in primitives(lambda p, x: depthwise(p, {}, x)[0], params, x)
    # Off the fast path: channel multipliers, strides, dilation, cpu_kernels=False.
    for layer in (Conv2d(8, 3, groups=4), Conv2d(4, 3, stride=2, groups=4), Conv2d(4, 3, dilation=2, groups=4)):
        params, _ = jax.eval_shape(layer.init, jax.random.key(0), x)
        assert "conv_general_dilated" in str(jax.make_jaxpr(lambda p, x: layer(p, {}, x)[0])(params, x)), layer
    w = jax.ShapeDtypeStruct((7, 7, 1, 4), jnp.float32)
    assert "conv_general_dilated" in primitives(lambda x, w: conv2d(x, w, groups=4, cpu_kernels=False), x, w)


def test_weight_gradient_path_by_width():
    # The weight gradient's own jaxpr: one convolution (the input gradient) when it is kh * kw matrix products,
    # two when it is a convolution too (over 32 output channels, groups, dilation).
    def convolutions_in_grad(cout, **kw):
        x = jnp.ones((2, 8, 8, 3), jnp.float32)
        w = jnp.ones((3, 3, 3 // kw.get("groups", 1), cout), jnp.float32)
        jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: conv2d(x, w, cpu_kernels=True, **kw).sum(), (0, 1)))(x, w)
        return str(jaxpr).count("conv_general_dilated")

    assert convolutions_in_grad(32) == convolutions_in_grad(32, stride=2) == 2  # forward + input gradient
    assert convolutions_in_grad(33) == convolutions_in_grad(8, dilation=2) == convolutions_in_grad(6, groups=3) == 3


def test_cpu_kernels_switch(monkeypatch):
    """One switch picks the XLA:CPU formulations: by default where the code is lowered for the CPU (whatever JAX's
    default backend), off when set so, and a layer call's own ``cpu_kernels`` wins over it."""
    from model import kernels

    x, w = jnp.ones((2, 8, 8, 3), jnp.float32), jnp.ones((3, 3, 3, 32), jnp.float32)

    def uses_kernels(**kw):
        return "custom_vjp_call" in str(jax.make_jaxpr(lambda x, w: conv2d(x, w, **kw))(x, w))

    def lowered(platform, **kw):
        """The gradient as lowered for `platform`: its convolutions and optimization barriers (the kernels' marks)."""
        text = jax.jit(jax.grad(lambda x, w: conv2d(x, w, **kw).sum(), (0, 1))).trace(x, w)
        text = text.lower(lowering_platforms=(platform,)).as_text()
        return text.count("stablehlo.convolution"), text.count("optimization_barrier")

    monkeypatch.setattr(kernels, "CPU_KERNELS", None)
    assert lowered("cpu") == lowered("cpu", cpu_kernels=True) != lowered("cpu", cpu_kernels=False)
    for platform in ("cuda", "tpu"):
        assert lowered(platform) == lowered(platform, cpu_kernels=False) != lowered(platform, cpu_kernels=True)
    monkeypatch.setattr(kernels, "CPU_KERNELS", False)
    assert not uses_kernels() and uses_kernels(cpu_kernels=True)
    monkeypatch.setattr(kernels, "CPU_KERNELS", True)
    assert uses_kernels() and not uses_kernels(cpu_kernels=False)


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
