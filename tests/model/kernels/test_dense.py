"""model/kernels/dense.py: the dense layer's product whose weight gradient multiplies a transposed copy of the input,
against the plain product and autodiff (float64, and check_grads inside a float32 scan), which products take it, and
how the Linear layer chooses it by the platform it is lowered for."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

from model.kernels import dense
from model.modules.cpu_forms import cpu_kernels
from model.modules.linear import Linear

DOWN = (96, 256, 64)  # rows, input width, output width: a down projection, the form the copy is taken for


@pytest.mark.parametrize("rows, width, out", [DOWN, (5, 3, 7)])
def test_the_product_and_its_gradients_equal_autodiff_float64(rows, width, out):
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        x, w, cotangent = rng.normal(size=(rows, width)), rng.normal(size=(width, out)), rng.normal(size=(rows, out))
        ours_y, ours_vjp = jax.vjp(dense.copied_transpose_matmul, x, w)
        ref_y, ref_vjp = jax.vjp(lambda x, w: x @ w, x, w)
        np.testing.assert_allclose(ours_y, ref_y, rtol=1e-12, atol=1e-12)
        for ours, ref in zip(ours_vjp(cotangent), ref_vjp(cotangent)):
            assert ours.dtype == np.float64 and ours.shape == ref.shape
            np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
        check_grads(dense.copied_transpose_matmul, (x[:7, :5], w[:5, :3]), order=2, modes=["rev"])


def test_check_grads_inside_a_float32_scan():
    """Where the kernels run in training: the step's body of a `lax.scan`, in float32."""
    rng = np.random.default_rng(1)
    xs = jnp.asarray(rng.normal(size=(3, 8, 256)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(256, 64)) / 16, jnp.float32)

    def summed(w, xs):
        return lax.scan(
            lambda total, x: (total + jnp.sum(jnp.tanh(dense.copied_transpose_matmul(x, w))), None), 0.0, xs
        )[0]

    assert dense.transposes_input(xs[0], w)
    check_grads(summed, (w, xs), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)
    ours = jax.grad(summed)(w, xs)
    plain = jax.grad(lambda w, xs: lax.scan(lambda t, x: (t + jnp.sum(jnp.tanh(x @ w)), None), 0.0, xs)[0])(w, xs)
    np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape, taken",
    [
        (DOWN, True),
        ((768, 512, 128), True),
        ((2048, 128, 32), True),
        ((2049, 512, 128), False),  # more rows: the copy cost what it saved
        ((768, 128, 128), False),  # not a down projection
        ((128, 1568, 64), False),  # a width no multiple of 128
        ((64, 128, 1), False),  # too narrow an output
    ],
)
def test_the_copy_is_taken_for_down_projections_of_at_most_2048_rows(shape, taken):
    rows, width, out = shape
    x, w = jax.ShapeDtypeStruct((rows, width), jnp.float32), jax.ShapeDtypeStruct((width, out), jnp.float32)
    assert dense.transposes_input(x, w) is taken


def test_a_symbolic_batch_takes_the_plain_product():
    """An export's batch is a symbolic dimension: the choice must not compare it (an inconclusive comparison raises)."""
    from jax import export

    (batch,) = export.symbolic_shape("b")
    layer = Linear(64)
    params = layer.init_params(jax.random.PRNGKey(0), jax.ShapeDtypeStruct((2, 256), jnp.float32))
    exported = export.export(jax.jit(lambda x: layer.forward(params, x)))(
        jax.ShapeDtypeStruct((batch, 256), jnp.float32)
    )
    assert exported.out_avals[0].shape[1] == 64


def test_the_linear_layer_takes_the_copy_where_lowered_for_the_cpu_only():
    """Lowered for the CPU, a down projection's gradient holds the copy's barrier (a layer of other shapes is the
    plain program itself); lowered for "cuda" or "tpu", or traced inside ``cpu_kernels(False)``, it is the plain
    math. The gradients agree."""
    rows, width, out = DOWN
    layer = Linear(out)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, rows // 4, width))  # rank 3: the layer flattens the rows
    params = layer.init_params(jax.random.PRNGKey(1), x)

    def grad():  # a new function each time: JAX reuses a function's trace, whatever the form then
        return jax.jit(lambda params, x: jax.grad(lambda p: jnp.sum(jnp.sin(layer.forward(p, x))))(params))

    def barriers(platform):
        return grad().trace(params, x).lower(lowering_platforms=(platform,)).as_text().count("optimization_barrier")

    assert barriers("cpu") == 1
    assert barriers("cuda") == barriers("tpu") == 0
    narrow = Linear(width)  # no form in model/kernels: the plain math alone is traced, as without the folder
    narrow_params = narrow.init_params(jax.random.PRNGKey(1), x)

    def narrow_text():
        step = jax.jit(lambda p: jax.grad(lambda p: jnp.sum(narrow.forward(p, x)))(p))
        return step.trace(narrow_params).lower(lowering_platforms=("cpu",)).as_text()

    with cpu_kernels(False):
        plain_text = narrow_text()
    assert narrow_text() == plain_text
    with cpu_kernels(False):
        plain = grad()(params, x)
        assert barriers("cpu") == 0
    ours = grad()(params, x)
    for name in ("weight", "bias"):
        np.testing.assert_allclose(ours[name], plain[name], rtol=1e-5, atol=1e-5)
