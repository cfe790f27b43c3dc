"""MaxPool2d / AvgPool2d / GlobalAvgPool against flax.linen's reduce_window pools and numpy."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model.modules.pooling import AvgPool2d, GlobalAvgPool, MaxPool2d

# (kernel, stride, padding, input hw); stride == kernel takes the reshape path, the rest the strided-slice path.
CONFIGS = [
    (2, 2, "VALID", (6, 8)),
    (2, 2, "VALID", (7, 9)),  # odd remainder is cropped
    (2, 2, "SAME", (7, 9)),
    (3, 3, "SAME", (7, 8)),
    ((2, 3), (2, 3), ((1, 0), (2, 1)), (5, 7)),
    (3, 2, "VALID", (7, 8)),
    (3, 2, "SAME", (6, 7)),
    (3, 1, "SAME", (5, 6)),
    (2, 3, "VALID", (8, 7)),  # stride > kernel: gaps between windows
    ((3, 2), (1, 2), ((1, 1), (0, 1)), (5, 6)),
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _flax_padding(padding):
    return padding if isinstance(padding, str) else [tuple(p) for p in padding]


def _run(layer, flax_fn, x):
    # One compilation per comparison: our output, the reference, and both gradients for a random cotangent.
    @jax.jit
    def run(x, cotangent):
        ours = lambda x: layer({}, {}, x)[0]
        return (
            ours(x),
            flax_fn(x),
            jax.grad(lambda x: jnp.vdot(ours(x), cotangent))(x),
            jax.grad(lambda x: jnp.vdot(flax_fn(x), cotangent))(x),
        )

    shape = jax.eval_shape(flax_fn, x).shape
    return run(x, np.random.default_rng(1).normal(size=shape).astype(x.dtype))


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_max_pool_matches_flax(cfg):
    kernel, stride, padding, hw = cfg
    x = np.random.default_rng(0).normal(size=(2, *hw, 3)).astype(np.float32)
    layer = MaxPool2d(kernel, stride, padding)
    y, expected, grad, expected_grad = _run(
        layer, lambda x: nn.max_pool(x, _pair(kernel), _pair(stride), _flax_padding(padding)), x
    )
    assert y.shape == expected.shape
    np.testing.assert_array_equal(y, expected)
    # Random inputs have no ties, so every window's gradient goes to its single maximum in both.
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_avg_pool_matches_flax(cfg, count_include_pad):
    kernel, stride, padding, hw = cfg
    x = np.random.default_rng(2).normal(size=(2, *hw, 3)).astype(np.float32)
    layer = AvgPool2d(kernel, stride, padding, count_include_pad=count_include_pad)
    y, expected, grad, expected_grad = _run(
        layer,
        lambda x: nn.avg_pool(
            x, _pair(kernel), _pair(stride), _flax_padding(padding), count_include_pad=count_include_pad
        ),
        x,
    )
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)


def test_avg_pool_same_counts_only_valid_elements():
    # A numpy loop as a second reference: 3x3 windows, stride 2, SAME on 5x5 pads one pixel on every side.
    x = np.random.default_rng(3).normal(size=(1, 5, 5, 2)).astype(np.float32)
    y = AvgPool2d(3, 2, "SAME")({}, {}, x)[0]
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=np.nan)
    expected = np.array(
        [
            [
                [np.nanmean(padded[0, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3], axis=(0, 1)) for j in range(3)]
                for i in range(3)
            ]
        ]
    )
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_max_pool_numpy_loop_and_finite_padding():
    x = np.random.default_rng(4).normal(size=(2, 5, 5, 3)).astype(np.float32) - 1e3
    y = MaxPool2d(3, 2, "SAME")({}, {}, x)[0]
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    expected = np.stack(
        [
            np.stack([padded[:, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max((1, 2)) for j in range(3)], 1)
            for i in range(3)
        ],
        1,
    )
    np.testing.assert_array_equal(y, expected)
    # Padding uses the dtype's lowest finite value, never -inf (-inf * 0 becomes NaN in some exporters).
    jaxpr = str(jax.make_jaxpr(lambda x: MaxPool2d(3, 2, "SAME")({}, {}, x)[0])(x))
    assert "-inf" not in jaxpr


def test_default_stride_is_kernel_and_no_reduce_window():
    x = np.random.default_rng(5).normal(size=(1, 6, 6, 2)).astype(np.float32)
    for layer, flax_fn in [
        (MaxPool2d(3), lambda x: nn.max_pool(x, (3, 3), (3, 3))),
        (AvgPool2d(2), lambda x: nn.avg_pool(x, (2, 2), (2, 2))),
    ]:
        np.testing.assert_allclose(layer({}, {}, x)[0], flax_fn(x), rtol=1e-6)
    # reduce_window / select_and_scatter are slow to differentiate on XLA:CPU and break exporters.
    for layer in [MaxPool2d(2), MaxPool2d(3, 2, "SAME"), AvgPool2d(3, 1, "SAME")]:
        jaxpr = str(jax.make_jaxpr(jax.grad(lambda x: layer({}, {}, x)[0].sum()))(x))
        assert "reduce_window" not in jaxpr and "select_and_scatter" not in jaxpr, layer


@pytest.mark.parametrize(
    "layer",
    [MaxPool2d(2), MaxPool2d(3, 2, "SAME"), AvgPool2d(2, padding="SAME"), AvgPool2d(3, 2, "SAME"), GlobalAvgPool()],
    ids=repr,
)
def test_pool_check_grads(layer):
    with jax.enable_x64(True):
        # Distinct, well separated values keep max pooling away from ties, where it is not differentiable.
        x = np.random.default_rng(6).permutation(2 * 5 * 5 * 2).reshape(2, 5, 5, 2) / 10.0
        check_grads(jax.jit(lambda x: layer({}, {}, x)[0]), (x,), order=1, modes=("fwd", "rev"), eps=1e-3)


def test_global_avg_pool():
    x = np.random.default_rng(7).normal(size=(2, 4, 5, 3)).astype(np.float32)
    params, state = GlobalAvgPool().init(jax.random.key(0), x)
    assert params == {} and state == {}
    np.testing.assert_allclose(GlobalAvgPool()({}, {}, x)[0], x.mean((1, 2)), rtol=1e-6)
    y = GlobalAvgPool(keepdims=True)({}, {}, x)[0]
    assert y.shape == (2, 1, 1, 3)
    np.testing.assert_allclose(y[:, 0, 0], x.mean((1, 2)), rtol=1e-6)


def test_pool_rejects_bad_padding():
    with pytest.raises(ValueError, match="padding"):
        MaxPool2d(2, padding="FULL")
    with pytest.raises(ValueError, match="kernel_size"):
        AvgPool2d(0)


# (kernel, stride, padding, length)
CONFIGS_1D = [(2, None, "VALID", 9), (3, 2, "SAME", 8), (3, 1, (1, 2), 6), (4, 3, 1, 10)]


@pytest.mark.parametrize("kernel, stride, padding, length", CONFIGS_1D)
def test_pools_1d_match_flax(kernel, stride, padding, length):
    from model.modules.pooling import AvgPool1d, MaxPool1d

    x = jnp.asarray(np.random.default_rng(5).normal(size=(2, length, 3)), jnp.float32)
    window, strides = (kernel,), (kernel if stride is None else stride,)
    pads = padding if isinstance(padding, str) else [padding if isinstance(padding, tuple) else (padding,) * 2]
    for layer, reference in (
        (MaxPool1d(kernel, stride, padding), lambda x: nn.max_pool(x, window, strides, pads)),
        (AvgPool1d(kernel, stride, padding), lambda x: nn.avg_pool(x, window, strides, pads, count_include_pad=False)),
        (
            AvgPool1d(kernel, stride, padding, count_include_pad=True),
            lambda x: nn.avg_pool(x, window, strides, pads, count_include_pad=True),
        ),
    ):
        ours = lambda x: layer({}, {}, x)[0]
        np.testing.assert_allclose(ours(x), reference(x), rtol=1e-6, atol=1e-6)
        check_grads(ours, (x,), order=1, modes=("rev",))


def test_global_avg_pool_over_a_sequence():
    x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 7, 3)), jnp.float32)
    np.testing.assert_allclose(GlobalAvgPool()({}, {}, x)[0], np.asarray(x).mean(1), rtol=1e-6)
    assert GlobalAvgPool(keepdims=True)({}, {}, x)[0].shape == (2, 1, 3)
