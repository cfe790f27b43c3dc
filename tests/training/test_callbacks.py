"""Callbacks: the parameter average (against a numpy recursion, evaluated, exported, resumed exactly), the learning-rate
finder, text generation, and their config errors."""

from __future__ import annotations

import csv
import json

import jax
import numpy as np
import pytest

from data_loader.data_loaders import char_text
from data_loader.loader import ArrayDataset, DataLoader
from training import startup
from training.assembly import assemble
from training.callbacks import ema
from training.config.components import available, build
from training.config.file import ConfigError
from training.config.validation import validate
from training.run import checkpoint
from training.run.figures import plots
from training.trainer import Trainer


def make_trainer(tmp_path, run, callbacks=(), epochs=2, steps_per_call=2, train=None, model=None):
    config = validate(
        {
            "name": "t",
            "seed": 2,
            "model": model or {"name": "mlp", "args": {"num_classes": 5, "hidden": [16], "dropout": 0.1}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": {"name": "adam", "args": {"lr": 0.01}},
            "data_loader": {"train": {"name": "mnist"}, "validation": {"name": "mnist"}},
            "callbacks": list(callbacks),
            "trainer": {
                "epochs": epochs,
                "steps_per_call": steps_per_call,
                "log_every": 1,
                "save_dir": str(tmp_path),
                "monitor": "min val/loss",
            },
        }
    )
    if train is None:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((100, 4, 4, 1)).astype(np.float32)
        y = (x.reshape(100, -1)[:, :5].argmax(1)).astype(np.int32)
        train = DataLoader(ArrayDataset(input=x, target=y), 16, shuffle=True, seed=2, prefetch=0)
    (tmp_path / run).mkdir()
    assembled = assemble(config)
    assembled.use_data({"train": train, "validation": train})
    trainer = Trainer(assembled, tmp_path / run)
    return trainer


def test_ema_update_matches_the_numpy_recursion():
    rng = np.random.default_rng(1)
    tree = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": {"c": rng.standard_normal(5).astype(np.float32)}}
    for warmup in (False, True):
        callback = ema(decay=0.9, warmup=warmup)
        state = callback.init(tree)
        want = jax.tree.map(np.copy, tree)
        for step in range(1, 6):
            params = jax.tree.map(lambda a: a + rng.standard_normal(a.shape).astype(np.float32), tree)
            state = jax.jit(callback.update)(state, params, np.int32(step))
            d = min(0.9, (1 + step) / (10 + step)) if warmup else 0.9
            want = jax.tree.map(lambda w, p: d * w + (1 - d) * p, want, params)
        for got, expected in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-6)


def test_ema_follows_every_step_is_evaluated_exported_and_resumed_exactly(tmp_path):
    """The average after 2 epochs equals the recursion over the parameters after each of the 14 steps (taken from
    a run without the callback, one step per call); validation, model_best and what test.py/the export restore
    are the average; a run stopped after epoch 1 and resumed ends bit-identical."""
    spec = {"name": "ema", "args": {"decay": 0.8}}
    trainer = make_trainer(tmp_path, "ema", [spec])
    trainer.begin(startup.from_seed(trainer))
    trainer.train()

    plain = make_trainer(tmp_path, "plain", steps_per_call=1)
    plain.begin(startup.from_seed(plain))
    step = plain.compiled.train_call(1)
    ts, average = plain.train_state, jax.tree.map(np.asarray, plain.train_state["params"])
    for epoch in (1, 2):
        totals = plain.compiled.empty_stats()
        for _, stack in plain.train_loader.stacks(epoch, 1, plain.placement.put_stack):
            ts, totals, _ = step(ts, totals, stack)
            t = float(ts["step"])
            d = min(0.8, (1 + t) / (10 + t))
            average = jax.tree.map(lambda a, p: d * a + (1 - d) * np.asarray(p), average, ts["params"])
    assert int(ts["step"]) == int(trainer.train_state["step"]) == 14
    for got, want in zip(jax.tree.leaves(trainer.train_state["callbacks"]["ema"]["params"]), jax.tree.leaves(average)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)

    row = json.loads((trainer.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["val/loss"] == pytest.approx(trainer.evaluate(trainer.valid_loader, 2)["loss"], rel=1e-6)
    ema_params = trainer.train_state["callbacks"]["ema"]["params"]
    template = {"params": ema_params, "state": trainer.train_state["state"]}
    for name in ("checkpoint-latest.params", "model_best.params"):
        tree, header = checkpoint.restore(trainer.run_dir / name, template, only=("params", "state"))
        assert header["eval_params"] == "callbacks.ema.params"
        if name == "checkpoint-latest.params":
            for a, b in zip(jax.tree.leaves(tree["params"]), jax.tree.leaves(ema_params)):
                np.testing.assert_array_equal(a, np.asarray(b))

    first = make_trainer(tmp_path, "first", [spec], epochs=1)
    first.begin(startup.from_seed(first))
    first.train()
    resumed = make_trainer(tmp_path, "resumed", [spec])
    resumed.begin(startup.from_checkpoint(resumed, first.run_dir / "checkpoint-latest.params"))
    resumed.train()
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(trainer.train_state), jax.tree.leaves(resumed.train_state)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_lr_finder_sweeps_writes_and_leaves_the_state_untouched(tmp_path):
    """stop: the run ends after the range test (no epoch, the state as initialised); not stop: training goes on from
    the untouched initial state and ends exactly where a run without the finder ends."""
    finder = {"name": "lr_finder", "args": {"min_lr": 1e-5, "max_lr": 1.0, "steps": 12}}
    stopped = make_trainer(tmp_path, "stop", [finder])
    stopped.begin(startup.from_seed(stopped))
    start = jax.tree.map(np.asarray, stopped.train_state)
    stopped.train()
    assert stopped.epoch == 0 and not (stopped.run_dir / "metrics.jsonl").exists()
    for a, b in zip(jax.tree.leaves(stopped.train_state), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(a), b)
    with open(stopped.run_dir / "lr_finder.csv") as file:
        rows = list(csv.DictReader(file))
    rates = np.array([float(r["lr"]) for r in rows])
    assert 3 <= len(rows) <= 12 and rates[0] == pytest.approx(1e-5)
    np.testing.assert_allclose(rates[1:] / rates[:-1], (1.0 / 1e-5) ** (1 / 11), rtol=1e-9)
    assert plots() is None or (stopped.run_dir / "lr_finder.png").stat().st_size > 0  # training/plots/ draws it
    assert stopped.callbacks[0].suggestion is None or 1e-5 <= stopped.callbacks[0].suggestion <= 1.0

    goes_on = make_trainer(tmp_path, "on", [{**finder, "args": {**finder["args"], "stop": False}}])
    goes_on.begin(startup.from_seed(goes_on))
    goes_on.train()
    plain = make_trainer(tmp_path, "plain")
    plain.begin(startup.from_seed(plain))
    plain.train()
    for a, b in zip(jax.tree.leaves(goes_on.train_state), jax.tree.leaves(plain.train_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_generate_text_writes_a_sample_each_epoch(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 20)
    train = char_text(text, context=16, batch_size=8, stride=16, prefetch=0)
    model = {
        "name": "char_transformer",
        "args": {"vocab_size": len(set(text.read_text())), "context": 16, "dim": 16, "depth": 1, "num_heads": 2},
    }
    spec = {"name": "generate_text", "args": {"prompt": "to ", "tokens": 12, "temperature": 0}}
    trainer = make_trainer(tmp_path, "lm", [spec], epochs=2, train=train, model=model)
    trainer.callbacks[0].check(train)
    trainer.begin(startup.from_seed(trainer))
    trainer.train()
    samples = (trainer.run_dir / "samples.txt").read_text().split("--- epoch ")[1:]
    assert [s.split(",")[0] for s in samples] == ["1", "2"]
    generated = samples[-1].split("\n", 1)[1].rstrip("\n")
    assert generated.startswith("to ") and len(generated) == 15 and set(generated) <= set(text.read_text())


@pytest.mark.parametrize(
    "callbacks, message",
    [
        (
            [{"name": "emma"}],
            # whatever callbacks a project adds
            f"callbacks.0.name: unknown callbacks 'emma'; available: {', '.join(sorted(available('callbacks')))}. "
            "Did you mean 'ema'",
        ),
        ([{"name": "ema", "args": {"decay": 1.0}}], r"decay: expected a number in \[0, 1\)"),
        ([{"name": "ema", "args": {"rate": 0.9}}], r"callbacks.0.args.rate: unknown argument\. Accepted: ema\(decay"),
        ([{"name": "ema"}, {"name": "ema"}], "callbacks.1: ema is listed twice"),
        ([{"name": "lr_finder", "args": {"min_lr": 1.0, "max_lr": 0.1}}], "must be above min_lr"),
        ({"name": "ema"}, "callbacks: expected a list"),
    ],
)
def test_bad_callbacks_are_config_errors(callbacks, message):
    config = {
        "name": "t",
        "model": {"name": "mlp"},
        "loss": {"name": "cross_entropy"},
        "optimizer": {"name": "sgd", "args": {"lr": 0.1}},
        "data_loader": {"train": {"name": "mnist"}},
        "callbacks": callbacks,
    }
    with pytest.raises(ConfigError, match=message):
        validate(config)


def test_generate_text_needs_a_vocabulary():
    rng = np.random.default_rng(0)
    loader = DataLoader(
        ArrayDataset(input=rng.standard_normal((8, 3)).astype(np.float32), target=np.zeros(8, np.int32)), 4
    )
    with pytest.raises(ValueError, match="needs a language model's data"):
        build({"name": "generate_text"}, "callbacks").check(loader)
