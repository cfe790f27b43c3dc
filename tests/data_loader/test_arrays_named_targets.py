"""Named targets through the arrays loader: ``target`` as a list of names or {output name: array name} gives the
batch a dict of targets, which a model of several outputs trains on with ``weighted_sum``, or a loss of your own that
declares no task takes whole; a loss that declares a task (it takes one array) is refused in one line."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.sources.arrays import ArraysDataset, check_settings
from model import registry
from training.config.file import ConfigError


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    n = 64
    labels = rng.integers(0, 3, n)
    features = rng.standard_normal((n, 6)).astype(np.float32)
    features[np.arange(n), labels] += 3.0  # learnable
    path = tmp_path / "data.npz"
    np.savez(path, features=features, labels=labels, size=features.sum(axis=1, keepdims=True), ids=np.arange(n))
    return path


def test_a_dict_or_a_list_of_targets_gives_named_targets(npz):
    named = ArraysDataset(npz, "features", {"label": "labels", "total": "size"})
    batch = named.get_batch(np.array([3, 1]))
    assert set(batch["target"]) == {"label", "total"}
    assert batch["target"]["label"].dtype == np.int32 and batch["target"]["total"].shape == (2, 1)
    listed = ArraysDataset(npz, "features", ["labels", "size"]).get_batch(np.array([3, 1]))
    np.testing.assert_array_equal(listed["target"]["labels"], batch["target"]["label"])
    for bad in ([], {}, ["labels", "labels"], {"label": ""}, 3):
        with pytest.raises(ValueError, match=r"^target: expected an array name, null \(no target\), a list of names"):
            check_settings("features", bad)


def config_of(npz, tmp_path, loss: dict) -> dict:
    args = {"path": str(npz), "input": "features", "target": {"label": "labels", "total": "size"}, "batch_size": 16}
    return {
        "name": "named",
        "model": {"name": "mlp", "args": {"num_classes": 3, "hidden": [8]}},
        "loss": loss,
        "metrics": [],
        "optimizer": {"name": "adamw", "args": {"lr": 0.01}},
        "data_loader": {
            "train": {"name": "arrays", "args": {**args, "split": "train", "shuffle": True}},
            "validation": {"name": "arrays", "args": {**args, "split": "validation"}},
        },
        "trainer": {"epochs": 2, "save_dir": str(tmp_path / "saved"), "monitor": "min val/loss"},
    }


def label_and_total(logits, targets, *, mask=None):
    """A loss of one output against two named targets: the label's cross-entropy, the total's squared error."""
    log_p = jnp.log(jnp.clip(jnp.exp(logits) / jnp.exp(logits).sum(-1, keepdims=True), 1e-9))
    nll = -jnp.take_along_axis(log_p, targets["label"][:, None], axis=-1)[:, 0]
    return nll + 0.01 * jnp.square(logits.sum(-1, keepdims=True) - targets["total"])[:, 0]


def test_a_loss_of_your_own_takes_named_targets_and_one_that_declares_a_task_is_refused(npz, tmp_path, monkeypatch):
    from utils import fit

    registry.entries("loss")
    monkeypatch.setitem(registry._REGISTERED["loss"], "label_and_total", registry.Entry(label_and_total))
    rows = fit(config_of(npz, tmp_path, {"name": "label_and_total"}), run_dir=tmp_path / "own")
    assert len(rows) == 2 and rows[-1]["train/loss"] < rows[0]["train/loss"]
    with pytest.raises(
        ConfigError, match="cross_entropy takes one target, but the data has named targets label, total"
    ):
        fit(config_of(npz, tmp_path, {"name": "cross_entropy"}), run_dir=tmp_path / "refused")
