"""Gradient accumulation (trainer.accumulate_steps) and mixed precision (trainer.precision), in-process on arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from model.modules.activations import Activation
from model.modules.flatten import Flatten
from model.modules.linear import Linear
from model.modules.normalization import BatchNorm
from model.modules.sequential import Sequential
from training import startup
from training.assembly import assemble
from training.config.components import build
from training.config.file import ConfigError
from training.config.validation import validate
from training.step import log_columns, make_train_call
from training.trainer import Trainer


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4, 4, 1)).astype(np.float32)
    y = (x.reshape(n, -1)[:, :5].argmax(1)).astype(np.int32)
    return x, y


def make_trainer(tmp_path, run, batch, accumulate=1, n=160, optimizer=None, precision=None, model=None, epochs=1):
    config = validate(
        {
            "name": "t",
            "seed": 1,
            "model": {"name": "mlp", "args": {"num_classes": 5, "hidden": [16]}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": optimizer or {"name": "sgd", "args": {"lr": 0.5, "momentum": 0.9}},
            "data_loader": {"train": {"name": "mnist"}},
            "trainer": {
                "epochs": epochs,
                "steps_per_call": 2,
                "log_every": 1,
                "save_dir": str(tmp_path),
                "monitor": "min train/loss",
                "accumulate_steps": accumulate,
                "precision": precision,
            },
        }
    )
    x, y = data(n)
    train = DataLoader(ArrayDataset(input=x, target=y), batch, shuffle=False, prefetch=0)
    (tmp_path / run).mkdir()
    assembled = assemble(config)
    assembled.model = model or assembled.model
    assembled.use_data({"train": train})
    trainer = Trainer(assembled, tmp_path / run)
    trainer.begin(startup.from_seed(trainer))
    return trainer


def rows(trainer):
    import json

    return [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "n, optimizer",
    [(160, {"name": "adamw", "args": {"lr": 0.01, "weight_decay": 0.1}}), (248, None)],
    ids=["adamw-160", "sgd-248"],
)
def test_accumulated_steps_equal_one_larger_batch(tmp_path, n, optimizer):
    """4 micro-batches of 32 = one batch of 128, with the rule stated in docs/runs.md: the update is the mean over
    every unmasked example the micro-batches hold. 160 = 5 batches of 32: the epoch's second step has one real
    micro-batch and three inactive ones (the large batch: 32 real examples and 96 padded); 248: a padded last
    micro-batch (24 of 32 real; the large batch: 120 of 128)."""
    small = make_trainer(tmp_path, "small", 32, accumulate=4, n=n, optimizer=optimizer)
    large = make_trainer(tmp_path, "large", 128, n=n, optimizer=optimizer)
    small.train()
    large.train()
    assert int(small.train_state["step"]) == int(large.train_state["step"]) == 2
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(small.train_state), jax.tree.leaves(large.train_state)):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6, err_msg=jax.tree_util.keystr(path)
        )
    (a,), (b,) = rows(small), rows(large)
    assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-6)
    assert a["train/accuracy"] == pytest.approx(b["train/accuracy"], rel=1e-6)


def test_accumulated_gradient_equals_the_large_batch_gradient(tmp_path):
    """The first update with plain SGD (no momentum) is -lr x the gradient: equal within 1e-6 to the large
    batch's, and both equal the gradient of the mean loss over the 160 examples computed directly."""
    sgd = {"name": "sgd", "args": {"lr": 1.0}}
    small = make_trainer(tmp_path, "small", 32, accumulate=5, n=160, optimizer=sgd)
    start = jax.tree.map(np.asarray, small.train_state["params"])
    small.train()
    x, y = data(160)

    def mean_loss(params):
        logits, _ = small.run.model(params, small.train_state["state"], x)
        return small.run.loss_fn(logits, y).mean()

    want = jax.grad(mean_loss)(start)
    got = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), start, small.train_state["params"])
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_batch_norm_statistics_pass_from_micro_batch_to_micro_batch(tmp_path):
    """docs/runs.md's rule: batch norm normalises each micro-batch with its own statistics, and its running averages are
    updated once per micro-batch, in order (so with batch norm, accumulation is not one larger batch)."""
    model = Sequential(
        {"flat": Flatten(), "lin": Linear(8), "bn": BatchNorm(), "act": Activation("relu"), "out": Linear(5)}
    )
    trainer = make_trainer(tmp_path, "bn", 16, accumulate=2, n=32, model=model)
    params, state = jax.tree.map(np.asarray, (trainer.train_state["params"], trainer.train_state["state"]))
    trainer.train()
    x, _ = data(32)
    key = lambda i: jax.random.fold_in(jax.random.fold_in(trainer.train_state["rng"], 0), i)
    _, state = model(params, state, x[:16], train=True, key=key(0))
    _, state = model(params, state, x[16:], train=True, key=key(1))
    for got, want in zip(jax.tree.leaves(trainer.train_state["state"]), jax.tree.leaves(state)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


def test_bfloat16_trains_like_float32_and_keeps_float32_state(tmp_path):
    """bfloat16 compute: parameters, optimizer state and checkpoints stay float32, and 3 epochs end within 0.02 of
    float32's training loss (measured: a difference of ~0.001 on this data)."""
    adam = {"name": "adam", "args": {"lr": 0.01}}
    f32 = make_trainer(tmp_path, "f32", 32, n=256, optimizer=adam, epochs=3)
    bf16 = make_trainer(tmp_path, "bf16", 32, n=256, optimizer=adam, epochs=3, precision={"compute": "bfloat16"})
    f32.train()
    bf16.train()
    floating = [
        a
        for a in jax.tree.leaves((bf16.train_state["params"], bf16.train_state["opt_state"]))
        if jnp.issubdtype(a.dtype, jnp.floating)
    ]
    assert floating and all(a.dtype == jnp.float32 for a in floating)
    first, last = rows(bf16)[0]["train/loss"], rows(bf16)[-1]["train/loss"]
    assert last < 0.8 * first
    assert abs(last - rows(f32)[-1]["train/loss"]) < 0.02
    from training.run import checkpoint

    tree, _ = checkpoint.read(bf16.run_dir / "checkpoint-latest.params")
    assert all(a.dtype != np.dtype("bfloat16") for a in tree.values() if hasattr(a, "dtype"))


def test_float16_loss_scaling_recovers_from_overflow(tmp_path):
    """An initial scale of 2**40 overflows float16's backward pass: those steps are skipped (parameters and optimizer
    state unchanged, no divergence reported) and halve the scale, until the gradients are finite and training goes
    on and learns."""
    adam = {"name": "adam", "args": {"lr": 0.01}}
    trainer = make_trainer(
        tmp_path, "f16", 16, n=640, optimizer=adam, precision={"compute": "float16", "loss_scale": 2.0**40}
    )
    start = jax.tree.map(np.asarray, trainer.train_state["params"])
    first = make_trainer(
        tmp_path, "f16b", 16, n=640, optimizer=adam, precision={"compute": "float16", "loss_scale": 2.0**40}
    )
    # one step by hand: skipped, nothing but the step counter and the scale changes
    batch = next(first.train_loader.batches(1))
    stack = jax.tree.map(lambda a: a[None], batch)
    stack["active"] = np.ones(1, np.float32)
    one = jax.jit(
        make_train_call(
            first.run.model, first.run.loss_fn, first.optimizer, first.run.metrics, None, 1, first.precision
        )
    )
    ts, _, logs = one(first.train_state, first.compiled.empty_stats(), stack)
    assert bool(log_columns(logs)["skipped"][0]) and float(ts["loss_scale"]["scale"]) == 2.0**39
    for a, b in zip(
        jax.tree.leaves((ts["params"], ts["opt_state"])),
        jax.tree.leaves((first.train_state["params"], first.train_state["opt_state"])),
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    trainer.train()  # 40 steps: ~25 skipped while the scale falls to float16's range, then learning
    scale = float(trainer.train_state["loss_scale"]["scale"])
    assert 1.0 <= scale <= 2.0**16
    moved = max(
        float(np.abs(np.asarray(a) - b).max())
        for a, b in zip(jax.tree.leaves(trainer.train_state["params"]), jax.tree.leaves(start))
    )
    assert moved > 1e-3
    assert np.isfinite(rows(trainer)[-1]["train/loss"])


@pytest.mark.parametrize(
    "trainer, message",
    [
        ({"accumulate_steps": 0}, "trainer.accumulate_steps"),
        ({"precision": {"compute": "float8"}}, "compute: expected one of float32, bfloat16, float16"),
        ({"precision": {"params": "bfloat16"}}, "parameters and optimizer state stay"),
        ({"precision": {"compute": "bfloat16", "loss_scale": 8}}, "only float16 scales the loss"),
        ({"precision": {"compute": "float16", "scale": 8}}, "scale: unknown key; keys: params, compute, loss_scale"),
        ({"precision": "bf16"}, "expected null or an object"),
    ],
)
def test_bad_settings_are_config_errors(trainer, message):
    config = {
        "name": "t",
        "model": {"name": "mlp"},
        "loss": {"name": "cross_entropy"},
        "optimizer": {"name": "sgd", "args": {"lr": 0.1}},
        "data_loader": {"train": {"name": "mnist"}},
        "trainer": trainer,
    }
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate(config)


def test_stop_mid_epoch_with_accumulation_resumes_bit_identical(tmp_path, monkeypatch):
    """Dropout on, 2 micro-batches per update, 2 updates per call: a stop asked for at step 6 (epoch 2) saves at the
    next call boundary; the resumed run ends bit-identical to one never stopped. (The loop reads the logs, and calls
    ``on_step``, at every call here: by default it reads them in groups, so a stop asked from ``on_step`` comes up to
    ``READ_EVERY_STEPS`` steps later.)"""
    import signal

    monkeypatch.setattr("training.trainer.READ_EVERY_STEPS", 1)

    from training.callbacks import Callback
    from training.trainer import Stopped

    class StopAt(Callback):
        def on_step(self, trainer, step, values):
            if step == 6:
                trainer.stops.request_stop(signal.SIGTERM)

    dropout = lambda: build({"name": "mlp", "args": {"num_classes": 5, "hidden": [16], "dropout": 0.2}}, "model")
    whole = make_trainer(tmp_path, "whole", 16, accumulate=2, model=dropout(), epochs=3)
    whole.train()
    stopped = make_trainer(tmp_path, "stopped", 16, accumulate=2, model=dropout(), epochs=3)
    stopped.callbacks = [StopAt()]
    with pytest.raises(Stopped):
        stopped.train()
    from training.run import checkpoint

    header = checkpoint.read(stopped.run_dir / "checkpoint-latest.params")[1]
    assert header["epoch"] == 1 and header["position"] in (4, 8) and header["step"] == 5 + header["position"] // 2
    resumed = make_trainer(tmp_path, "resumed", 16, accumulate=2, model=dropout(), epochs=3)
    resumed.begin(startup.from_checkpoint(resumed, stopped.run_dir / "checkpoint-latest.params"))
    resumed.train()
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(whole.train_state), jax.tree.leaves(resumed.train_state)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))
    assert [r["train/loss"] for r in rows(resumed)] == [r["train/loss"] for r in rows(whole)][1:]


@pytest.mark.parametrize(
    "accumulate, precision, line",
    [
        (1, None, "step: 32 examples per optimizer update; precision: float32 throughout"),
        (
            4,
            {"compute": "float16"},
            "step: 128 examples per optimizer update (4 batches of 32 accumulated); precision: the model in float16; "
            "parameters, optimizer state, loss and metrics in float32; dynamic loss scaling from 32768",
        ),
    ],
)
def test_the_start_up_lines_say_the_effective_batch_and_the_precision(tmp_path, accumulate, precision, line):
    trainer = make_trainer(tmp_path, "said", 32, accumulate=accumulate, precision=precision)
    assert line in startup.describe(trainer)
