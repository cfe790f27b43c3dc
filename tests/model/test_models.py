"""Sample models, Sequential/Residual combinators, summaries and init determinism."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model import model as models
from model.modules.flatten import Flatten
from model.modules.linear import Linear
from model.modules.residual import Residual
from model.modules.sequential import Sequential
from model.summary import summary, summary_rows

SPEC = jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)


def leaves_with_paths(tree):
    from model.modules.module import key_path_str

    return {key_path_str(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("name", ["mnist_convnext", "mnist_cnn", "mlp", "mnist_attention"])
def test_sample_models_init_forward_and_determinism(name):
    net = getattr(models, name)()
    params, state = net.init(jax.random.PRNGKey(0), SPEC)
    again, _ = net.init(jax.random.PRNGKey(0), SPEC)
    other, _ = net.init(jax.random.PRNGKey(1), SPEC)
    a, b, c = leaves_with_paths(params), leaves_with_paths(again), leaves_with_paths(other)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    weights = [k for k in a if k.endswith("weight")]
    assert weights and all(not np.array_equal(a[k], c[k]) for k in weights)
    # no two weight tensors of the same shape are equal: every layer draws from its own stream
    for i, k1 in enumerate(weights):
        for k2 in weights[i + 1 :]:
            if a[k1].shape == a[k2].shape:
                assert not np.allclose(a[k1], a[k2]), (k1, k2)
    x = jax.random.normal(jax.random.PRNGKey(2), SPEC.shape)
    logits, _ = jax.jit(lambda p, s, x: net(p, s, x))(params, state, x)
    assert logits.shape == (2, 10) and bool(jnp.all(jnp.isfinite(logits)))


def test_readable_key_paths():
    net = models.mnist_convnext(depths=(2, 1), dims=(8, 16))
    params, _ = net.init(jax.random.PRNGKey(0), SPEC)
    paths = set(leaves_with_paths(params))
    assert {
        "stem.conv.weight",
        "stage0.1.dwconv.weight",
        "stage0.1.norm.scale",
        "down1.conv.bias",
        "head.weight",
    } <= paths


def test_identical_layers_get_different_streams():
    net = Sequential([Linear(4), Linear(4), Linear(4)])
    params, _ = net.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, 4), jnp.float32))
    w = [np.asarray(params[str(i)]["weight"]) for i in range(3)]
    assert not np.allclose(w[0], w[1]) and not np.allclose(w[1], w[2])


def test_sequential_residual_flatten_against_numpy_and_gradients():
    net = Sequential({"flat": Flatten(), "res": Residual(Sequential([Linear(12), jnp.tanh])), "out": Linear(3)})
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 3, 4))
    params, state = net.init(jax.random.PRNGKey(1), x)
    y, _ = net(params, state, x)
    p = jax.tree.map(np.asarray, params)
    h = np.asarray(x).reshape(5, 12)
    h = h + np.tanh(h @ p["res"]["0"]["weight"] + p["res"]["0"]["bias"])
    np.testing.assert_allclose(np.asarray(y), h @ p["out"]["weight"] + p["out"]["bias"], rtol=1e-5, atol=1e-5)
    with jax.enable_x64(True):
        x64 = jnp.asarray(np.asarray(x), jnp.float64)
        p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
        check_grads(lambda p, x: net(p, state, x)[0], (p64, x64), order=1, modes=("fwd", "rev"))


def test_summary_counts_every_parameter():
    net = models.mnist_convnext()
    params, state = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0), SPEC))
    rows = summary_rows(net, params, state, SPEC)
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    assert sum(count for _, _, count in rows) == total
    assert rows[0][0] == "stem.conv" and rows[-1] == ("head", (2, 10), 64 * 10 + 10)
    table = summary(net, params, state, SPEC)
    assert f"total parameters: {total:,}" in table


def test_bad_model_arguments_raise_clearly():
    with pytest.raises(ValueError, match="same length"):
        models.mnist_convnext(dims=(8, 16), depths=(1,))


def test_attention_sample_batch_norm_state_and_dropout():
    net = models.mnist_attention(dim=16, num_heads=2)
    x = jax.random.normal(jax.random.PRNGKey(0), SPEC.shape)
    params, state = net.init(jax.random.PRNGKey(1), SPEC)
    _, new_state = net(params, state, x, train=True, key=jax.random.PRNGKey(2))
    assert not np.allclose(new_state["stem"]["bn"]["mean"], state["stem"]["bn"]["mean"])  # running stats moved
    a, _ = net(params, state, x, train=True, key=jax.random.PRNGKey(3))
    b, _ = net(params, state, x, train=True, key=jax.random.PRNGKey(4))
    assert not np.allclose(a, b)  # dropout is on in training
    c, kept = net(params, state, x)
    d, _ = net(params, state, x)
    np.testing.assert_array_equal(c, d)  # and off in evaluation, with state unchanged
    assert jax.tree.all(jax.tree.map(np.array_equal, kept, state))


def test_only_a_model_declares_an_export_example():
    from model.registry import register

    for kind, example in (("loss", ({}, (3,), "normal")), ("model", ((3,), "normal"))):
        with pytest.raises(ValueError, match="only a model declares an example"):
            register(kind, example=example)


def test_mnist_segmenter_shapes_paths_and_receptive_field():
    net = models.mnist_segmenter(channels=(4, 8))
    spec = jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)
    params, state = net.init(jax.random.PRNGKey(0), spec)
    paths = {
        jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    assert {"enc.conv0.weight", "skip.down.weight", "skip.up.weight", "head.weight", "head.bias"} <= paths
    assert params["skip"]["up"]["weight"].shape == (2, 2, 8, 4)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.shape)
    forward = jax.jit(lambda x: net(params, state, x)[0])
    logits = forward(x)
    assert logits.shape == (2, 28, 28, 1) and bool(jnp.all(jnp.isfinite(logits)))
    # row 20 reaches row 14 only through the half-resolution path: the full-resolution convs alone see 3 rows each way
    changed = jnp.abs(forward(x.at[:, 20].add(5.0)) - logits)[:, 14, 14, 0]
    assert bool(jnp.all(changed > 0))
    with pytest.raises(ValueError, match="channels must be"):
        models.mnist_segmenter(channels=(4, 8, 16))
