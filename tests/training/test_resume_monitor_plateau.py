"""A resume that changes trainer.monitor (max accuracy -> min loss) under a reduce_on_plateau schedule: the schedule's
best value, kept in the optimizer state, was of the old metric too; compared with the new one every epoch would count
as bad and the rate would fall without a word. It starts afresh, as the checkpoints' best does, saying so in one line,
and its learning-rate scale so far is kept (issue 48, item 9)."""

from __future__ import annotations

import math

import numpy as np

from data_loader.loader import ArrayDataset, DataLoader
from training import optimizers
from training.assembly import assemble
from training.config.validation import validate
from training.trainer import Trainer

PLATEAU = {"name": "reduce_on_plateau", "args": {"init_value": 0.1, "factor": 0.5, "patience": 0}}


def make_trainer(tmp_path, name, monitor, epochs):
    config = validate(
        {
            "name": "t",
            "seed": 1,
            "model": {"name": "mlp", "args": {"num_classes": 5, "hidden": [8]}},
            "loss": {"name": "cross_entropy"},
            "metrics": [{"name": "accuracy"}],
            "optimizer": {"name": "sgd", "schedule": PLATEAU},
            "data_loader": {"train": {"name": "mnist", "args": {"batch_size": 16}}},
            "trainer": {"epochs": epochs, "save_dir": str(tmp_path), "monitor": monitor},
        }
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 6)).astype(np.float32), rng.integers(0, 5, 64).astype(np.int32)
    assembled = assemble(config)
    assembled.use_data({"train": DataLoader(ArrayDataset(input=x, target=y), 16, shuffle=True, prefetch=0)})
    (tmp_path / name).mkdir()
    return Trainer(assembled, tmp_path / name)


def test_a_changed_monitor_starts_reduce_on_plateaus_best_afresh_saying_so(tmp_path):
    first = make_trainer(tmp_path, "first", "max train/accuracy", epochs=1)
    first.init_state()
    first.train()
    saved = optimizers.plateau_state(first.train_state["opt_state"])
    assert float(saved.best) < 0  # an accuracy, stored negated ("max": lower is better inside)

    resumed = make_trainer(tmp_path, "resumed", "min train/loss", epochs=2)
    resumed.restore(first.run_dir / "checkpoint-latest.params")
    fresh = optimizers.plateau_state(resumed.train_state["opt_state"])
    assert math.isinf(float(fresh.best)) and int(fresh.bad_epochs) == 0
    assert float(fresh.scale) == float(saved.scale)  # the rate reached so far is kept
    said = [n for n in resumed.resume_notes if "reduce_on_plateau" in n]
    assert len(said) == 1 and "start afresh" in said[0], resumed.resume_notes
    resumed.train()  # the new metric's first value is its best: no reduction for it
    after = optimizers.plateau_state(resumed.train_state["opt_state"])
    assert float(after.scale) == float(saved.scale) and float(after.best) > 0


def test_the_same_monitor_keeps_reduce_on_plateaus_state(tmp_path):
    first = make_trainer(tmp_path, "first", "min train/loss", epochs=1)
    first.init_state()
    first.train()
    saved = optimizers.plateau_state(first.train_state["opt_state"])
    resumed = make_trainer(tmp_path, "resumed", "min train/loss", epochs=2)
    resumed.restore(first.run_dir / "checkpoint-latest.params")
    kept = optimizers.plateau_state(resumed.train_state["opt_state"])
    assert float(kept.best) == float(saved.best) and not any("reduce_on_plateau" in n for n in resumed.resume_notes)
