"""training/startup.py: each start hands the trainer its state and says where it came from; the loop goes on from
a resumed position once, and from the epoch's start afterwards."""

from __future__ import annotations

import jax
import numpy as np

from tests.training.test_resume_changes import make_trainer, trained  # noqa: F401 (a fixture)
from training import startup
from training.run import checkpoint


def test_a_checkpoint_saved_inside_an_epoch_starts_at_its_position(tmp_path, trained):  # noqa: F811
    path = trained / "checkpoint-step_8.params"
    resumed = make_trainer(tmp_path, "resumed", epochs=2)
    start = startup.from_checkpoint(resumed, path)
    assert (start.epoch, start.position, start.header["position"], int(start.train_state["step"])) == (0, 8, 8, 8)
    assert start.totals is not None and start.notes[0].startswith("config changed since the checkpoint: ")
    assert start.origin.startswith(f"resumed from {path}: epoch 0, step 8 (8 step(s) into epoch 1)")
    resumed.begin(start)
    resumed.train()  # the first epoch from batch 8 of 10: one more call; the second whole
    assert resumed.epoch == 2 and int(resumed.train_state["step"]) == 20


def test_fine_tuning_takes_the_weights_but_keeps_what_it_excludes_fresh(tmp_path, trained):  # noqa: F811
    tuned = make_trainer(tmp_path, "tuned")
    fresh = startup.from_seed(tuned)
    assert fresh.origin.startswith("fresh state from seed 1")  # then where its program came from, if cached
    assert (fresh.epoch, fresh.position, fresh.header) == (0, 0, None)
    start = startup.from_weights(tuned, trained / "checkpoint-latest.params", exclude=("params.head",))
    assert start.origin == (
        f"params and model state from {trained / 'checkpoint-latest.params'} (kept fresh: params.head), optimizer fresh"
    )
    saved, _ = checkpoint.read(trained / "checkpoint-latest.params")
    params = start.train_state["params"]
    np.testing.assert_array_equal(np.asarray(params["fc0"]["weight"]), saved["params.fc0.weight"])
    for a, b in zip(jax.tree.leaves(params["head"]), jax.tree.leaves(fresh.train_state["params"]["head"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(start.train_state["step"]) == 0
