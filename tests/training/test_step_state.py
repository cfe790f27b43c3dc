"""A step that keeps state of its own (its ``init``, ``train_state["step_state"]``): made with the fresh state,
checkpointed, and resumed bit for bit by train.py; the default step keeps none."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import pytest

from tests.end_to_end.test_train import data_dir, make_config, params_of, run  # noqa: F401 (data_dir: a fixture)
from training.step import supervised, train_step


@dataclass(frozen=True)
class Centring:
    """The supervised update, plus a running centre of the model's outputs (DINO's teacher centre) and the count of
    real examples the step has seen: state of the step's own, not of the model or the optimizer."""

    momentum: float

    def init(self, model, train_state, inputs):
        def forward(params, model_state, x):
            return model(params, model_state, x, train=False)[0]

        outputs = jax.eval_shape(forward, train_state["params"], train_state["state"], inputs)
        return {"centre": jnp.zeros(outputs.shape[1:], jnp.float32), "seen": jnp.zeros((), jnp.float32)}

    def __call__(self, update, train_state, batch):
        updated, stats, logs = train_step(update, train_state, batch)
        outputs, _ = update.model(train_state["params"], train_state["state"], batch["input"], train=False)
        weights = batch["mask"]
        mean = jnp.sum(outputs * weights[:, None], axis=0) / jnp.maximum(weights.sum(), 1.0)
        own = train_state["step_state"]
        centre = self.momentum * own["centre"] + (1 - self.momentum) * mean
        return {**updated, "step_state": {"centre": centre, "seen": own["seen"] + weights.sum()}}, stats, logs


def centring(momentum: float = 0.9):
    """The supervised step keeping a running centre of the outputs (a test's step with state of its own)."""
    return Centring(momentum)


# train.py with this file's step registered in its process alone (the template's folders are where train.py looks
# for components; registered in the test's process, it would be one more for every other test there)
WITH_CENTRING = textwrap.dedent("""
    import sys
    from model.registry import register
    from tests.training.test_step_state import centring
    register("step")(centring)
    import train
    sys.exit(train.main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_a_steps_own_state_is_saved_and_resumed(tmp_path, data_dir):  # noqa: F811
    """One epoch, then a resume for the second: the step's own state is in every checkpoint, and the count of examples
    it holds at the end is two epochs' (a resume that started it afresh would hold one). The default step keeps
    none."""
    config = make_config(tmp_path, data_dir, step={"name": "centring", "args": {"momentum": 0.8}})
    trained = run("-c", WITH_CENTRING, "-c", config, "--run-id", "split", "--epochs", "1")
    assert trained.returncode == 0, trained.stderr
    latest = tmp_path / "saved/tiny/split/checkpoint-latest.params"
    first, _ = params_of(latest)
    assert {key for key in first if key.startswith("step_state")} == {"step_state.centre", "step_state.seen"}
    assert first["step_state.seen"] == 270  # the train split's real examples
    assert first["step_state.centre"].shape == (10,) and first["step_state.centre"].any()
    resumed = run("-c", WITH_CENTRING, "-r", latest, "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert params_of(latest)[0]["step_state.seen"] == 2 * 270
    assert not hasattr(supervised(), "init")
