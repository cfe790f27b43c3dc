"""How attention is computed: cuDNN's fused kernel where it can run on a GPU, the plain math everywhere else.

A CPU cannot run cuDNN, so the GPU cases are the choice itself (``fused_obstacle`` for each condition) and the
layer's dispatch with the device it sees replaced; on a GPU, benchmarks/gpu_step_benchmark.py compares the two.
"""

import json
import logging
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.modules import attention
from model.modules.attention import FusedAttentionUnavailable, MultiHeadAttention
from model.modules.transformer import TransformerLM

H100 = dict(platform="gpu", compute_capability="9.0")
OK = dict(masked=False, dropout=False, causal_offset=False)


@pytest.mark.parametrize(
    "dtype, head_dim, device, conditions, reason",
    [
        (jnp.bfloat16, 64, H100, OK, None),
        (jnp.float16, 128, dict(platform="gpu", compute_capability="8.0"), OK, None),
        (jnp.bfloat16, 256, H100, OK, None),  # Hopper takes heads up to 256
        (jnp.bfloat16, 64, dict(platform="cpu", compute_capability=None), OK, "the platform is cpu"),
        (jnp.bfloat16, 64, dict(platform="tpu", compute_capability=None), OK, "the platform is tpu"),
        (jnp.bfloat16, 64, dict(platform="gpu", compute_capability="7.5"), OK, "compute capability is 7.5"),
        (jnp.float32, 64, H100, OK, "it computes in float32"),
        (jnp.bfloat16, 60, H100, OK, "the head size is 60"),
        (jnp.bfloat16, 256, dict(platform="gpu", compute_capability="8.0"), OK, "up to 128"),
        (jnp.bfloat16, 264, H100, OK, "up to 256"),
        (jnp.bfloat16, 64, H100, {**OK, "masked": True}, "a mask other than the causal one"),
        (jnp.bfloat16, 64, H100, {**OK, "causal_offset": True}, "different lengths"),
        (jnp.bfloat16, 64, H100, {**OK, "dropout": True}, "dropout"),
    ],
)
def test_the_fused_kernel_only_where_cudnn_can_run_it(dtype, head_dim, device, conditions, reason):
    obstacle = attention.fused_obstacle(dtype, head_dim, **device, **conditions)
    if reason is None:
        assert obstacle is None
    else:
        assert reason in obstacle


def test_auto_falls_back_and_says_why_once_fused_refuses_plain_never_fuses(caplog):
    attention._said.clear()
    with caplog.at_level(logging.INFO, logger="model.modules.attention"):
        assert attention.implementation("auto", None) == "fused"
        for _ in range(3):
            assert attention.implementation("auto", "the platform is cpu, not a GPU") == "plain"
    said = [r.getMessage() for r in caplog.records]
    assert said == ["attention: cuDNN's fused kernel", "attention: the plain math (the platform is cpu, not a GPU)"]
    assert attention.implementation("plain", None) == "plain"
    with pytest.raises(FusedAttentionUnavailable, match='attention "fused": .*: the platform is cpu'):
        attention.implementation("fused", "the platform is cpu")
    with attention.plain_attention():  # an export: the plain math whatever was asked, nothing refused
        assert attention.implementation("fused", None) == "plain"
        assert attention.implementation("fused", "the platform is cpu") == "plain"
    assert attention.implementation("fused", None) == "fused"


def _layer_output(layer, x, **kwargs):
    params, state = layer.init(jax.random.PRNGKey(0), x)
    return layer(params, state, x, **kwargs)[0]


def test_on_a_cpu_auto_is_the_plain_math_and_fused_is_refused():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 32), jnp.bfloat16)
    auto = _layer_output(MultiHeadAttention(4, causal=True), x)
    plain = _layer_output(MultiHeadAttention(4, causal=True, attention="plain"), x)
    np.testing.assert_array_equal(np.asarray(auto, np.float32), np.asarray(plain, np.float32))
    with pytest.raises(FusedAttentionUnavailable, match="the platform is cpu"):
        _layer_output(MultiHeadAttention(4, causal=True, attention="fused"), x)


def test_bad_settings_are_refused_when_built():
    with pytest.raises(ValueError, match="attention: expected one of auto, fused, plain, got 'flash'"):
        MultiHeadAttention(4, attention="flash")
    with pytest.raises(ValueError, match="takes no dropout"):
        TransformerLM(11, 8, dim=16, depth=1, num_heads=2, dropout=0.1, attention="fused")


@pytest.fixture
def a_gpu(monkeypatch):
    """The layer sees a Hopper GPU, and the fused kernel (which a CPU cannot run) is recorded and stood in for by
    jax.nn's own XLA implementation of the same function."""
    calls = []

    def fused(q, k, v, *, causal):
        calls.append((q.shape, q.dtype, causal))
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")

    monkeypatch.setattr(attention, "default_device", lambda: SimpleNamespace(**H100))
    monkeypatch.setattr(attention, "fused_attention", fused)
    return calls


def test_on_a_gpu_the_layer_takes_the_fused_kernel_where_it_can(a_gpu):
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 16, 32), jnp.bfloat16)
    plain = _layer_output(MultiHeadAttention(4, causal=True, attention="plain"), x)
    fused = _layer_output(MultiHeadAttention(4, causal=True), x)
    assert a_gpu == [((2, 16, 4, 8), jnp.bfloat16, True)]
    np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(plain, np.float32), atol=2e-2)
    # float32, a padding mask, dropout in training, or an export: the plain math, the kernel never called
    _layer_output(MultiHeadAttention(4, causal=True), x.astype(jnp.float32))
    _layer_output(MultiHeadAttention(4), x, key_mask=jnp.ones((2, 16)))
    layer = MultiHeadAttention(4, causal=True, dropout_rate=0.1)
    _layer_output(layer, x, train=True, key=jax.random.PRNGKey(3))
    with attention.plain_attention():
        _layer_output(MultiHeadAttention(4, causal=True, attention="fused"), x)
    assert len(a_gpu) == 1
    with pytest.raises(FusedAttentionUnavailable, match="float32"):
        _layer_output(MultiHeadAttention(4, causal=True, attention="fused"), x.astype(jnp.float32))


def test_an_export_of_a_model_that_asks_for_the_fused_kernel_traces_the_plain_math(a_gpu):
    from inference.formats.jax_export import JaxModel
    from inference.inputs import Inputs
    from inference.routes import export_bytes

    model = TransformerLM(11, 8, dim=16, depth=1, num_heads=2, attention="fused")
    ids = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    params, state = model.init(jax.random.PRNGKey(0), ids)
    blob = export_bytes("jax.export", lambda x: model(params, state, x)[0], Inputs(ids, 2), dynamic=False)
    assert a_gpu == []
    assert b"custom_call" not in blob
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8) % 11
    expected = TransformerLM(11, 8, dim=16, depth=1, num_heads=2, attention="plain")(params, state, tokens)[0]
    np.testing.assert_allclose(JaxModel(blob)(tokens), expected, rtol=1e-5, atol=1e-5)


def test_train_py_refuses_a_fused_attention_it_cannot_run_in_one_line(tmp_path, capsys, monkeypatch):
    from tests.end_to_end.test_data_faults import train_error

    text = tmp_path / "input.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    loader = {"name": "shakespeare_char", "args": {"path": str(text), "verify": False, "context": 8, "batch_size": 4}}
    config = {
        "name": "fused",
        "model": {
            "name": "char_transformer",
            "args": {"vocab_size": 30, "context": 8, "dim": 16, "depth": 1, "num_heads": 2, "attention": "fused"},
        },
        "loss": {"name": "cross_entropy"},
        "optimizer": {"name": "adamw", "args": {"lr": 1e-3}},
        "data_loader": {"train": loader},
        "trainer": {
            "epochs": 1,
            "monitor": "off",
            "save_dir": str(tmp_path / "saved"),
            "precision": {"compute": "bfloat16"},
        },
    }
    line = train_error(tmp_path, capsys, monkeypatch, config)
    assert 'model: attention "fused": cuDNN\'s fused attention cannot run here: the platform is cpu' in line, line
    assert not (tmp_path / "saved").exists()
    json.dumps(config)  # the config as a user writes it
