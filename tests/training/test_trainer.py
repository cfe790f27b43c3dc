"""The training loop in-process on in-memory arrays: compilation count, K steps per call, metrics exactness."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from training import startup
from training.assembly import assemble
from training.config.validation import validate
from training.trainer import Trainer


def make_trainer(tmp_path, steps_per_call=1, epochs=2, n=150, batch=32, model=None, run="r"):
    config = validate(
        {
            "name": "t",
            "seed": 3,
            "model": model or {"name": "mlp", "args": {"hidden": [16], "dropout": 0.1}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}, {"name": "confusion_matrix"}],
            "optimizer": {"name": "adam", "args": {"lr": 0.01}},
            "data_loader": {"train": {"name": "mnist"}, "validation": {"name": "mnist"}},
            "trainer": {"epochs": epochs, "steps_per_call": steps_per_call, "log_every": 1, "save_dir": str(tmp_path)},
        }
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8, 8, 1)).astype(np.float32)
    y = (x.reshape(n, -1)[:, :10].argmax(1)).astype(np.int32)
    train = DataLoader(ArrayDataset(input=x, target=y), batch, shuffle=True, seed=3, prefetch=2)
    valid = DataLoader(ArrayDataset(input=x[:70], target=y[:70]), 32)  # 70 = 32 + 32 + 6: a padded last batch
    (tmp_path / run).mkdir()
    assembled = assemble(config)
    assembled.use_data({"train": train, "validation": valid})
    trainer = Trainer(assembled, tmp_path / run)
    trainer.begin(startup.from_seed(trainer))
    return trainer


def test_no_recompilation_after_the_first_epoch(tmp_path):
    """Counts XLA compilations: once the first epoch has run (the steps, plus the small eager ops of metric
    results), two more epochs with a padded last batch (150 = 4 full batches of 32 + 22) and validation compile
    nothing, with one or several steps per call."""
    for k in (1, 3):
        trainer = make_trainer(tmp_path, steps_per_call=k, epochs=1, run=f"k{k}")
        trainer.train()
        compiles = []
        listener = lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None
        jax.monitoring.register_event_duration_secs_listener(listener)
        try:
            trainer.settings = dataclasses.replace(trainer.settings, epochs=3)
            trainer.train()
        finally:
            jax.monitoring.unregister_event_duration_listener(listener)
        assert compiles == [], f"{len(compiles)} compilations after the first epoch with {k} step(s) per call"
        assert trainer.epoch == 3


@pytest.mark.parametrize("k", [2, 3])
def test_k_steps_per_call_equal_one_step_per_call(tmp_path, k):
    one = make_trainer(tmp_path, steps_per_call=1, run="one")
    many = make_trainer(tmp_path, steps_per_call=k, run="many")
    one.train()
    many.train()
    assert (
        int(one.train_state["step"]) == int(many.train_state["step"]) == 2 * 5
    )  # inactive padding steps are not counted
    for a, b in zip(jax.tree.leaves(one.train_state), jax.tree.leaves(many.train_state)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    rows = lambda t: [l for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    import json

    for ra, rb in zip(rows(one), rows(many)):
        ra, rb = json.loads(ra), json.loads(rb)
        assert abs(ra["train/loss"] - rb["train/loss"]) < 1e-6 and ra["val/accuracy"] == rb["val/accuracy"]


def test_epoch_metrics_are_exact_over_padded_batches(tmp_path):
    trainer = make_trainer(tmp_path, epochs=1)
    trainer.train()
    params, state = trainer.train_state["params"], trainer.train_state["state"]
    results = trainer.evaluate(trainer.valid_loader)
    x = trainer.valid_loader.dataset.arrays["input"]
    y = trainer.valid_loader.dataset.arrays["target"]
    logits, _ = trainer.run.model(params, state, x)
    predicted = np.asarray(logits).argmax(1)
    assert results["accuracy"] == pytest.approx(float(np.mean(predicted == y)), abs=1e-7)
    matrix = np.zeros((10, 10))
    np.add.at(matrix, (y, predicted), 1)
    np.testing.assert_array_equal(np.asarray(results["confusion_matrix"]), matrix)
    log_p = np.asarray(jax.nn.log_softmax(logits))
    assert results["loss"] == pytest.approx(float(-log_p[np.arange(70), y].mean()), rel=1e-5)


def test_the_logs_of_quick_calls_are_read_together_and_every_step_keeps_its_line(tmp_path, monkeypatch, caplog):
    """log_every 1 at one step per call: the loop reads the calls' logs in groups (every READ_EVERY_STEPS steps
    here, the clock never due), not at each call; each step still has its line, in order, with its own loss and
    learning rate; trackers see every step. The first call is read on its own (the start-up line)."""
    import logging

    from training import trainer as loop

    monkeypatch.setattr(loop, "READ_EVERY_S", 1e9)
    monkeypatch.setattr(loop, "READ_EVERY_STEPS", 3)
    trainer = make_trainer(tmp_path, epochs=1, n=32 * 9)
    reads, check = [], loop.Progress.check
    monkeypatch.setattr(loop.Progress, "check", lambda self, calls: (reads.append(len(calls)), check(self, calls)))
    seen = []
    steps = type("Steps", (), {"log_step": lambda self, step, values: seen.append(step), "log_epoch": lambda *a: None})
    trainer.trackers = [steps()]
    with caplog.at_level(logging.DEBUG, logger="train"):
        trainer.train()
    # 9 calls: the first alone, then 3 at a time (each read after the next call is dispatched), the last at the end
    assert reads == [1, 3, 3, 2], reads
    lines = [line for r in caplog.records for line in r.getMessage().splitlines() if line.startswith("epoch 1 step ")]
    assert [int(line.split(" step ")[1].split(":")[0]) for line in lines] == list(range(1, 10))
    assert seen == list(range(1, 10))
    assert all("loss " in line and "lr 0.01" in line for line in lines)


def test_a_record_of_several_lines_is_written_as_that_many_lines(tmp_path):
    """train.log's format (run.cli.EachLine): every line of a multi-line record gets the prefix; a traceback stays as
    Python writes it."""
    import logging

    from training.run.cli import EachLine

    formatter = EachLine("%(levelname)s %(name)s: %(message)s [end]")
    record = logging.LogRecord("train", logging.INFO, __file__, 1, "a %s\nb\nc", ("x",), None)
    assert formatter.format(record) == "INFO train: a x [end]\nINFO train: b [end]\nINFO train: c [end]"
    try:
        raise ValueError("bad")
    except ValueError:
        import sys

        failed = logging.LogRecord("train", logging.ERROR, __file__, 1, "one\ntwo", None, sys.exc_info())
    text = formatter.format(failed)
    assert text.startswith("ERROR train: one\ntwo [end]\nTraceback") and "ValueError: bad" in text
