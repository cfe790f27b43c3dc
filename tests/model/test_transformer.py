"""Causal attention and the transformer language model: against flax.linen and numpy, gradients included."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from inference import exporter
from model.model import char_transformer
from model.modules.attention import MultiHeadAttention
from model.modules.module import key_path_str
from model.modules.transformer import TransformerBlock
from tests.inference.test_export_cli import PREDICTABLE


def flax_attention_params(params):
    """Our {query, key, value, out} Linear params as flax's MultiHeadDotProductAttention params."""
    heads = 2
    as_heads = lambda w: w.reshape(w.shape[0], heads, -1)  # noqa: E731
    return {
        "params": {
            "query": {"kernel": as_heads(params["query"]["weight"])},
            "key": {"kernel": as_heads(params["key"]["weight"])},
            "value": {"kernel": as_heads(params["value"]["weight"])},
            "out": {"kernel": params["out"]["weight"].reshape(heads, -1, params["out"]["weight"].shape[1])},
        }
    }


def test_causal_attention_matches_flax_with_a_causal_mask():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 7, 8)), jnp.float32)
    ours = MultiHeadAttention(2, use_bias=False, causal=True)
    params, _ = ours.init(jax.random.PRNGKey(0), x)
    got, _ = ours(params, {}, x)
    reference = nn.MultiHeadDotProductAttention(2, use_bias=False)
    want = reference.apply(flax_attention_params(params), x, x, mask=nn.make_causal_mask(jnp.ones((3, 7))))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    check_grads(lambda x: ours(params, {}, x)[0], (x,), order=1, modes=("rev",), atol=2e-2, rtol=2e-2)


def test_future_tokens_never_change_earlier_outputs():
    model = char_transformer(vocab_size=11, context=9, dim=16, depth=2, num_heads=2)
    params, state = model.init(jax.random.PRNGKey(1), jax.ShapeDtypeStruct((2, 9), jnp.int32))
    ids = np.random.default_rng(1).integers(0, 11, (2, 9)).astype(np.int32)
    changed = ids.copy()
    changed[:, 5:] = (changed[:, 5:] + 3) % 11
    a, _ = model(params, state, ids)
    b, _ = model(params, state, changed)
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[:, 5:], b[:, 5:])
    short, _ = model(params, state, ids[:, :4])  # shorter sequences use the first positions
    np.testing.assert_allclose(short, a[:, :4], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="exceed the model's context of 9"):
        model(params, state, np.zeros((1, 10), np.int32))


def numpy_lm(params, ids, depth, heads):
    """The language model written out in numpy (float64): the reference for the whole forward pass."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

    def norm(x, scale):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * scale

    def gelu(x):
        from scipy.special import erf

        return 0.5 * x * (1 + erf(x / np.sqrt(2)))

    b, t = ids.shape
    x = p["tokens"]["embedding"][ids] + p["positions"]["embedding"][:t]
    for i in range(depth):
        block = p["blocks"][str(i)]
        h = norm(x, block["norm1"]["scale"])
        q, k, v = (h @ block["attn"][n]["weight"] for n in ("query", "key", "value"))
        split = lambda a: a.reshape(b, t, heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
        logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        attended = (w @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        x = x + attended @ block["attn"]["out"]["weight"]
        h = norm(x, block["norm2"]["scale"])
        x = x + gelu(h @ block["fc1"]["weight"]) @ block["fc2"]["weight"]
    return norm(x, p["norm"]["scale"]) @ p["tokens"]["embedding"].T


def test_language_model_matches_numpy_and_has_readable_tied_params():
    model = char_transformer(vocab_size=13, context=8, dim=16, depth=2, num_heads=4)
    params, _ = model.init(jax.random.PRNGKey(2), jax.ShapeDtypeStruct((3, 8), jnp.int32))
    names = {key_path_str(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert {
        "tokens.embedding",
        "positions.embedding",
        "blocks.1.attn.query.weight",
        "blocks.0.fc2.weight",
        "norm.scale",
    } <= names
    assert not any(n.startswith("head") or n.endswith("bias") for n in names)  # tied head, no biases
    ids = np.random.default_rng(2).integers(0, 13, (3, 8)).astype(np.int32)
    got, _ = model(params, {}, ids)
    np.testing.assert_allclose(got, numpy_lm(params, ids, 2, 4), rtol=2e-4, atol=2e-4)
    untied = char_transformer(vocab_size=13, context=8, dim=16, depth=1, num_heads=4, tie_weights=False)
    untied_params, _ = untied.init(jax.random.PRNGKey(2), jax.ShapeDtypeStruct((3, 8), jnp.int32))
    assert untied_params["head"]["weight"].shape == (16, 13)


def test_gpt2_initialisation_scales():
    model = char_transformer(vocab_size=50, context=32, dim=64, depth=8, num_heads=4)
    params, _ = model.init(jax.random.PRNGKey(3), jax.ShapeDtypeStruct((1, 32), jnp.int32))
    assert np.std(params["blocks"]["0"]["fc1"]["weight"]) == pytest.approx(0.02, rel=0.05)
    assert np.std(params["blocks"]["0"]["fc2"]["weight"]) == pytest.approx(0.02 / np.sqrt(16), rel=0.05)
    assert np.std(params["blocks"]["0"]["attn"]["out"]["weight"]) == pytest.approx(0.02 / np.sqrt(16), rel=0.1)


def test_block_gradients_and_dropout():
    block = TransformerBlock(num_heads=2, dropout=0.5)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 5, 8)), jnp.float32)
    params, _ = block.init(jax.random.PRNGKey(4), x)
    evaluated, _ = block(params, {}, x)
    again, _ = block(params, {}, x)
    np.testing.assert_array_equal(evaluated, again)  # no dropout in evaluation
    trained, _ = block(params, {}, x, train=True, key=jax.random.PRNGKey(5))
    assert not np.allclose(trained, evaluated)
    check_grads(lambda x: block(params, {}, x)[0], (x,), order=1, modes=("rev",), atol=2e-2, rtol=2e-2)


def test_language_model_under_jit_matches_eager_and_compiles_once():
    model = char_transformer(vocab_size=11, context=8, dim=16, depth=2, num_heads=2, dropout=0.1)
    params, state = model.init(jax.random.PRNGKey(6), jax.ShapeDtypeStruct((2, 8), jnp.int32))
    traces = []

    @jax.jit
    def forward(params, ids, key):
        traces.append(1)  # runs once per compilation, never per call
        return model(params, state, ids, train=True, key=key)[0], model(params, state, ids)[0]

    ids = np.random.default_rng(6).integers(0, 11, (2, 8)).astype(np.int32)
    trained, evaluated = forward(params, ids, jax.random.PRNGKey(7))
    np.testing.assert_allclose(evaluated, model(params, state, ids)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        trained, model(params, state, ids, train=True, key=jax.random.PRNGKey(7))[0], rtol=1e-5, atol=1e-5
    )  # dropout is a function of the key alone
    forward(params, (ids + 1) % 11, jax.random.PRNGKey(8))
    assert len(traces) == 1


def test_encoder_classifier_logits_ignore_the_padding_exactly():
    """A text classifier (encoder blocks, masked mean pooling) given the batch's mask: padding 60 -> 80 and junk
    in the padded positions leave every logit bit for bit the same."""
    from model.model import text_transformer

    model = text_transformer(vocab_size=30, num_classes=4, context=80, dim=16, depth=2, num_heads=2)
    rng = np.random.default_rng(0)
    lengths = np.array([60, 17, 1, 44])
    ids60 = np.where(np.arange(60) < lengths[:, None], rng.integers(1, 30, (4, 60)), 0).astype(np.int32)
    mask60 = (np.arange(60) < lengths[:, None]).astype(np.float32)
    params, state = model.init(jax.random.key(0), jax.ShapeDtypeStruct((4, 80), jnp.int32))
    forward = jax.jit(lambda ids, mask: model(params, state, ids, mask=mask)[0])
    logits60 = np.asarray(forward(ids60, mask60))
    ids80 = np.pad(ids60, ((0, 0), (0, 20)))
    mask80 = np.pad(mask60, ((0, 0), (0, 20)))
    np.testing.assert_array_equal(np.asarray(forward(ids80, mask80)), logits60)
    junk = np.where(mask80 > 0, ids80, rng.integers(0, 1000, ids80.shape)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(forward(junk, mask80)), logits60)
    # the mask matters: without it the padding is read as tokens
    assert not np.allclose(np.asarray(forward(junk, np.ones_like(mask80))), logits60)
    # the only real token of example 2 decides its logits: the same as that token alone
    alone = np.asarray(forward(ids80[2:3, :1].repeat(4, 0), np.ones((4, 1), np.float32)))[0]
    np.testing.assert_allclose(logits60[2], alone, rtol=1e-5, atol=1e-6)


def test_the_trainer_gives_the_batchs_mask_to_a_model_that_declares_it():
    """make_train_step: the loss of a padded batch classified as a whole uses the model's masked logits, and each
    example with any real token counts once."""
    from model.model import text_transformer
    from training.losses import cross_entropy
    from training.metrics import accuracy
    from training.step import make_train_step

    model = text_transformer(vocab_size=30, num_classes=4, context=12, dim=8, depth=1, num_heads=2)
    rng = np.random.default_rng(1)
    mask = (np.arange(12) < np.array([12, 5, 8, 0])[:, None]).astype(np.float32)  # the last: a padded example
    batch = {
        "input": np.where(mask > 0, rng.integers(0, 30, (4, 12)), 7).astype(np.int32),
        "target": np.array([0, 3, 1, 2], np.int32),
        "mask": mask,
    }
    params, state = model.init(jax.random.key(0), batch["input"])
    ts = {"params": params, "state": state, "opt_state": (), "step": 0, "rng": jax.random.key(1)}
    from training.optimizers import sgd

    optimizer = sgd(0.0)
    ts["opt_state"] = optimizer.init(params)
    _, stats, logs = jax.jit(make_train_step(model, cross_entropy, optimizer, [accuracy()]))(ts, batch)
    logits = model(params, state, batch["input"], mask=batch["mask"])[0]
    want = np.asarray(cross_entropy(logits, batch["target"]))[:3].mean()
    assert float(logs["loss"]) == pytest.approx(want, rel=1e-5)
    assert float(stats["count"]) == 3.0


@pytest.mark.slow
def test_padded_text_classification_trains_from_a_config(tmp_path):
    """train.py end to end: token ids padded to 24 with junk, their mask and a class from the arrays loader; the
    text_transformer takes the batch's mask and learns which of two tokens a sequence holds more of."""
    import json

    from tests.end_to_end.test_train import run

    rng = np.random.default_rng(0)
    n, length = 320, 24
    lengths = rng.integers(3, length + 1, n)
    mask = (np.arange(length) < lengths[:, None]).astype(np.float32)
    ids = np.where(mask > 0, rng.integers(1, 3, (n, length)), rng.integers(0, 50, (n, length))).astype(np.int32)
    label = ((ids == 2) * mask).sum(1) > ((ids == 1) * mask).sum(1)
    np.savez(tmp_path / "text.npz", ids=ids, mask=mask, label=label.astype(np.int32))
    loader = {"path": str(tmp_path / "text.npz"), "input": "ids", "target": "label", "mask": "mask"}
    config = {
        "name": "text",
        "model": {"name": "text_transformer", "args": {"vocab_size": 50, "num_classes": 2, "context": 24, "dim": 16}},
        "loss": {"name": "cross_entropy"},
        "metrics": ["accuracy"],
        "optimizer": {"name": "adam", "args": {"lr": 0.003}},
        "data_loader": {
            "train": {"name": "arrays", "args": {**loader, "split": "train", "batch_size": 32, "shuffle": True}},
            "validation": {"name": "arrays", "args": {**loader, "split": "validation", "batch_size": 32}},
        },
        "trainer": {"epochs": 6, "save_dir": str(tmp_path / "saved"), "monitor": "max val/accuracy"},
    }
    (tmp_path / "c.json").write_text(json.dumps(config))
    result = run("train.py", "-c", tmp_path / "c.json", "--run-id", "r")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "saved/text/r/metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/accuracy"] > 0.8, rows[-1]


@pytest.mark.slow
def test_a_model_that_declares_mask_exports_it_as_a_named_input(tmp_path):
    """The export of text_transformer (its call declares mask): the padding mask is a second named input "mask" of
    every format, checked on the validation data's own masks; predict.py on an .npz of ids and mask gives the class
    load_run gives on the same rows, and without a mask in the file every position is real."""
    import json

    from inference.trained_run import load_run
    from tests.end_to_end.test_train import run

    rng = np.random.default_rng(1)
    n, length = 96, 12
    mask = (np.arange(length) < rng.integers(2, length + 1, n)[:, None]).astype(np.float32)
    ids = np.where(mask > 0, rng.integers(1, 3, (n, length)), rng.integers(0, 20, (n, length))).astype(np.int32)
    label = ((ids == 2) * mask).sum(1) > ((ids == 1) * mask).sum(1)
    np.savez(tmp_path / "text.npz", ids=ids, mask=mask, label=label.astype(np.int32))
    loader = {"path": str(tmp_path / "text.npz"), "input": "ids", "target": "label", "mask": "mask"}
    model = {"vocab_size": 20, "num_classes": 2, "context": length, "dim": 8, "depth": 1, "num_heads": 2}
    config = {
        "name": "text",
        "model": {"name": "text_transformer", "args": model},
        "loss": {"name": "cross_entropy"},
        "metrics": ["accuracy"],
        "optimizer": {"name": "adam", "args": {"lr": 0.003}},
        "data_loader": {
            "train": {"name": "arrays", "args": {**loader, "split": "train", "batch_size": 32, "shuffle": True}},
            "validation": {"name": "arrays", "args": {**loader, "split": "validation", "batch_size": 32}},
        },
        "trainer": {"epochs": 2, "save_dir": str(tmp_path / "saved"), "monitor": "max val/accuracy"},
    }
    (tmp_path / "c.json").write_text(json.dumps(config))
    trained = run("train.py", "-c", tmp_path / "c.json", "--run-id", "r")
    assert trained.returncode == 0, trained.stderr
    run_dir = tmp_path / "saved/text/r"

    out = tmp_path / "exports"
    exported = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "tt", "--output-dir", out, "--formats",
        ",".join(f for f in exporter.FORMATS if f != "jax"), timeout=600,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    folder = out / "tt"
    named = [{"name": "input", "shape": f"[B,{length}]", "dtype": "int32"}]
    named.append({"name": "mask", "shape": f"[B,{length}]", "dtype": "float32"})
    report = json.loads((folder / "report.json").read_text())
    assert report["inputs"] == named and json.loads((folder / "preprocessing.json").read_text())["inputs"] == named
    assert [e["format"] for e in report["formats"]] == [f for f in exporter.FORMATS if f != "jax"]
    for entry in report["formats"]:
        assert entry["validation"]["examples"] > 0 and entry["validation"]["agreement"] == 1.0, entry
        assert entry["validation"]["quality"] == entry["validation"]["jax_quality"], entry

    rows = slice(0, 6)
    loaded = load_run(run_dir)
    want = loaded(ids[rows], mask[rows]).argmax(-1)
    np.savez(tmp_path / "x.npz", input=ids[rows], mask=mask[rows])
    np.savez(tmp_path / "ids.npz", input=ids[rows])
    for suffix in PREDICTABLE:
        for given, expected in (("x.npz", want), ("ids.npz", loaded(ids[rows]).argmax(-1))):
            predicted = run(
                folder / "predict.py", folder / f"tt{suffix}", tmp_path / given, "--out", tmp_path / "p.npy"
            )
            assert predicted.returncode == 0, predicted.stderr
            np.testing.assert_array_equal(np.load(tmp_path / "p.npy").argmax(-1), expected, err_msg=f"{suffix} {given}")
