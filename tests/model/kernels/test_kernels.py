"""model/kernels: each formulation for XLA:CPU against the plain convolution (lax) and autodiff, in float64 and
inside a float32 scan, the paths it takes, and how the convolution layer chooses them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

from model.modules.conv import Conv2d, conv2d
from model.modules.cpu_forms import cpu_kernels
from tests.model.test_conv import CONFIGS, _as_pair, _inputs, _random_params, _reference, in_form

# The convolution in model/kernels' formulations on every platform (by default the jaxpr holds both forms, and
# only lowering for the CPU keeps the kernels), and in the plain math.
kernel_conv2d, plain_conv2d = in_form(True, conv2d), in_form(False, conv2d)


@pytest.mark.parametrize("name", CONFIGS)
def test_custom_vjp_equals_autodiff_float64(name):
    kernel, stride, padding, dilation, groups = CONFIGS[name][:5]
    with jax.enable_x64(True):
        x, w = _inputs(CONFIGS[name], np.float64, seed=1)
        y = _reference(x, w, kernel, stride, padding, dilation, groups)
        cotangent = np.random.default_rng(2).normal(size=y.shape)

        def loss(conv):
            return lambda x, w: jnp.vdot(conv(x, w), cotangent)

        ours = jax.jit(jax.grad(loss(lambda x, w: kernel_conv2d(x, w, stride, padding, dilation, groups)), (0, 1)))(
            x, w
        )
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
            lambda x, w, c: grads(lambda x, w: kernel_conv2d(x, w, stride, padding, dilation, groups), x, w, c)
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
        custom = jax.jit(lambda x: kernel_conv2d(x, params["weight"], stride, padding, dilation, groups))
        with pytest.raises(TypeError):
            jax.jvp(custom, (x,), (x,))
        # The plain path (used off the CPU) supports both modes.
        plain = jax.jit(lambda x: plain_conv2d(x, params["weight"], stride, padding, dilation, groups))
        check_grads(plain, (x,), order=1, modes=("fwd", "rev"))


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
        ours = lambda x, w: kernel_conv2d(x, w, 1, padding, 1, 3)
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

    ours = grads(lambda x, w: kernel_conv2d(x, w, groups=3))
    ref = grads(lambda x, w: _reference(x, w, 3, 1, "SAME", 1, 3))
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))


def test_depthwise_layers_take_the_shifted_slice_path():
    def jaxpr(fn, *args):
        with cpu_kernels(True):  # the jaxpr of the CPU path (the default holds both paths)
            return jax.make_jaxpr(fn)(*args)

    def primitives(fn, *args):
        return {eqn.primitive.name for eqn in jaxpr(fn, *args).eqns}

    x = jax.ShapeDtypeStruct((2, 9, 9, 4), jnp.float32)
    depthwise = Conv2d(4, 7, groups=4)
    params, _ = jax.eval_shape(depthwise.init, jax.random.key(0), x)
    assert "conv_general_dilated" not in primitives(lambda p, x: depthwise(p, {}, x)[0], params, x)
    assert "custom_vjp_call" in primitives(lambda p, x: depthwise(p, {}, x)[0], params, x)
    # Off the fast path: channel multipliers, strides, dilation, the plain math.
    for layer in (Conv2d(8, 3, groups=4), Conv2d(4, 3, stride=2, groups=4), Conv2d(4, 3, dilation=2, groups=4)):
        params, _ = jax.eval_shape(layer.init, jax.random.key(0), x)
        assert "conv_general_dilated" in str(jaxpr(lambda p, x: layer(p, {}, x)[0], params, x)), layer
    w = jax.ShapeDtypeStruct((7, 7, 1, 4), jnp.float32)
    assert "conv_general_dilated" in primitives(lambda x, w: plain_conv2d(x, w, groups=4), x, w)


def test_weight_gradient_path_by_width():
    # The weight gradient's own jaxpr: one convolution (the input gradient) when it is kh * kw matrix products,
    # two when it is a convolution too (over 32 output channels, groups, dilation).
    def convolutions_in_grad(cout, **kw):
        x = jnp.ones((2, 8, 8, 3), jnp.float32)
        w = jnp.ones((3, 3, 3 // kw.get("groups", 1), cout), jnp.float32)
        jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: kernel_conv2d(x, w, **kw).sum(), (0, 1)))(x, w)
        return str(jaxpr).count("conv_general_dilated")

    assert convolutions_in_grad(32) == convolutions_in_grad(32, stride=2) == 2  # forward + input gradient
    assert convolutions_in_grad(33) == convolutions_in_grad(8, dilation=2) == convolutions_in_grad(6, groups=3) == 3


def test_the_platform_lowered_for_chooses_the_form_and_cpu_kernels_forces_one():
    """The XLA:CPU formulations where the code is lowered for the CPU (whatever JAX's default backend), the plain math
    for every other platform; ``cpu_kernels`` forces one form for what is traced inside it, the innermost winning."""
    x, w = jnp.ones((2, 8, 8, 3), jnp.float32), jnp.ones((3, 3, 3, 32), jnp.float32)

    def uses_kernels():  # a new function each time: JAX reuses a function's trace, whatever the form then
        return "custom_vjp_call" in str(jax.make_jaxpr(lambda x, w: conv2d(x, w))(x, w))

    def lowered(platform, conv=conv2d):
        """The gradient as lowered for `platform`: its convolutions and optimization barriers (the kernels' marks)."""
        text = jax.jit(jax.grad(lambda x, w: conv(x, w).sum(), (0, 1))).trace(x, w)
        text = text.lower(lowering_platforms=(platform,)).as_text()
        return text.count("stablehlo.convolution"), text.count("optimization_barrier")

    assert lowered("cpu") == lowered("cpu", kernel_conv2d) != lowered("cpu", plain_conv2d)
    for platform in ("cuda", "tpu"):
        assert lowered(platform) == lowered(platform, plain_conv2d) != lowered(platform, kernel_conv2d)
    with cpu_kernels(False):
        assert not uses_kernels()
        with cpu_kernels(True):
            assert uses_kernels()
        assert not uses_kernels()
    assert lowered("cpu") == lowered("cpu", kernel_conv2d)  # the default again after the block


@pytest.mark.parametrize("padding, hw", [("SAME", (6, 7)), ("VALID", (5, 6)), (((2, 0), (1, 3)), (4, 5))])
def test_single_channel_conv_training_path_equals_autodiff_float64(padding, hw):
    """One input channel, stride 1: the training forward (shifted-slice products) and the weight gradient (one
    matrix product over taps) give the plain convolution's values and autodiff's gradients."""
    from jax import lax

    from model.kernels import conv as cpu_conv
    from model.modules import conv

    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        x, w = rng.normal(size=(3, *hw, 1)), rng.normal(size=(3, 2, 1, 4))
        pads = conv.explicit_padding(padding, hw, (3, 2), (1, 1))
        assert cpu_conv.is_single_channel(x, (1, 1), pads, (1, 1), (1, 1), 1)
        reference = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), pads, dimension_numbers=conv.DIMS)
        cotangent = rng.normal(size=reference(x, w).shape)
        ours_y, ours_vjp = jax.vjp(lambda x, w: kernel_conv2d(x, w, padding=padding), x, w)
        ref_y, ref_vjp = jax.vjp(reference, x, w)
        np.testing.assert_allclose(ours_y, ref_y, rtol=1e-12, atol=1e-12)
        for ours, ref in zip(ours_vjp(cotangent), ref_vjp(cotangent)):
            assert ours.dtype == np.float64
            np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


def test_single_channel_conv_inside_scan_float32_and_check_grads():
    from jax import lax
    from jax.test_util import check_grads

    from model.modules import conv

    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 8, 8, 1)).astype(np.float32), rng.normal(size=(3, 3, 1, 5)).astype(np.float32)
    cotangent = rng.normal(size=(4, 8, 8, 5)).astype(np.float32)

    def grads_in_scan(fn):
        body = lambda carry, _: (carry, jax.grad(lambda x, w: jnp.vdot(fn(x, w), cotangent), (0, 1))(x, w))
        return jax.jit(lambda: lax.scan(body, 0.0, None, length=2)[1])()

    ours = grads_in_scan(kernel_conv2d)
    ref = grads_in_scan(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=conv.DIMS))
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
    with jax.enable_x64(True):
        check_grads(
            lambda x, w: kernel_conv2d(x, w, padding=1),
            (x[:2, :5, :5].astype(np.float64), w.astype(np.float64)),
            order=1,
            modes=("rev",),
        )
    # Inference (and so every export) keeps the plain convolution.
    assert "conv_general_dilated" in str(jax.make_jaxpr(lambda x: kernel_conv2d(x, w))(x))
