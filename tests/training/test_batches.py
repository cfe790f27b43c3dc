"""Batches as pytrees through the real loader and Trainer: dict inputs, integer inputs, per-element masks,
targets of any shape or none, and the specs every shape and dtype comes from."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.loader import ArrayDataset, DataLoader
from model.modules.embedding import Embedding
from model.modules.linear import Linear
from model.modules.module import Module
from training import losses, startup
from training.assembly import assemble
from training.config.components import build_optimizer
from training.config.file import ConfigError
from training.config.validation import validate
from training.run import checkpoint
from training.task_kinds import task_of
from training.trainer import Trainer


class TwoInputs(Module):
    """{"image": (B, 4, 4, 1) float, "features": (B, 3) float} -> (B, classes): a dict input."""

    def __init__(self, classes=3):
        self.head = Linear(classes)

    def init(self, key, x):
        joined = jax.ShapeDtypeStruct((x["image"].shape[0], 16 + x["features"].shape[1]), jnp.float32)
        return {"head": self.head.init_params(key, joined)}, {}

    def __call__(self, params, state, x, *, train=False, key=None):
        joined = jnp.concatenate([x["image"].reshape(x["image"].shape[0], -1), x["features"]], axis=1)
        return self.head.forward(params["head"], joined), state


class TokenTagger(Module):
    """int32 ids (B, T) -> logits (B, T, V): a class per position."""

    def __init__(self, vocab=7, dim=8):
        self.embed, self.head = Embedding(vocab, dim), Linear(vocab)

    def init(self, key, x):
        k1, k2 = jax.random.split(key)
        hidden = jax.ShapeDtypeStruct((*x.shape, self.embed.features), jnp.float32)
        return {"embed": self.embed.init_params(k1, x), "head": self.head.init_params(k2, hidden)}, {}

    def __call__(self, params, state, x, *, train=False, key=None):
        return self.head.forward(params["head"], self.embed.forward(params["embed"], x)), state


class Dense(Module):
    """(B, F) -> (B, out): regression, or an autoencoder when out == F."""

    def __init__(self, out):
        self.layer = Linear(out)

    def init(self, key, x):
        return {"layer": self.layer.init_params(key, x)}, {}

    def __call__(self, params, state, x, *, train=False, key=None):
        return self.layer.forward(params["layer"], x), state


def config_for(tmp_path, loss, metrics=(), monitor="min val/loss", epochs=2, steps_per_call=1):
    return validate(
        {
            "name": "t",
            "seed": 0,
            "model": {"name": "mlp"},
            "loss": {"name": loss},
            "metrics": [{"name": m} for m in metrics],
            "optimizer": {"name": "adam", "args": {"lr": 0.01}},
            "data_loader": {"train": {"name": "mnist"}, "validation": {"name": "mnist"}},
            "trainer": {
                "epochs": epochs,
                "steps_per_call": steps_per_call,
                "log_every": 1,
                "monitor": monitor,
                "save_dir": str(tmp_path),
            },
        }
    )


def fit(tmp_path, config, model, train, valid, run="r"):
    (tmp_path / run).mkdir()
    assembled = assemble(config)
    assembled.model = model
    assembled.use_data({"train": train, "validation": valid} if valid is not None else {"train": train})
    trainer = Trainer(assembled, tmp_path / run)
    trainer.begin(startup.from_seed(trainer))
    trainer.train()
    return trainer


def rows(trainer):
    return [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dict_inputs_stack_place_and_train(tmp_path):
    rng = np.random.default_rng(0)
    n = 50
    inputs = {
        "image": rng.standard_normal((n, 4, 4, 1)).astype(np.float32),
        "features": rng.standard_normal((n, 3)).astype(np.float32),
    }
    target = (inputs["features"].argmax(1)).astype(np.int32)
    train = DataLoader(ArrayDataset(input=inputs, target=target), 8, shuffle=True)
    valid = DataLoader(ArrayDataset(input={k: v[:20] for k, v in inputs.items()}, target=target[:20]), 8)
    spec = train.spec
    assert spec["input"]["image"].shape == (8, 4, 4, 1) and spec["input"]["features"].dtype == np.float32
    _, stack = next(iter(train.stacks(0, 3)))
    assert stack["input"]["features"].shape == (3, 8, 3) and stack["active"].shape == (3,)
    config = config_for(tmp_path, "cross_entropy", ["accuracy"], "max val/accuracy", steps_per_call=3)
    trainer = fit(tmp_path, config, TwoInputs(), train, valid)
    history = rows(trainer)
    assert history[-1]["train/loss"] < history[0]["train/loss"] and np.isfinite(history[-1]["val/accuracy"])
    assert task_of("cross_entropy", spec) == "classification"


def test_int_inputs_and_per_element_mask_give_the_mean_over_real_tokens(tmp_path):
    """Sequences padded with a per-element mask: the epoch loss is the mean over unmasked tokens only, and the
    masked positions (holding garbage ids) change nothing."""
    rng = np.random.default_rng(1)
    n, t, vocab = 30, 6, 7
    ids = rng.integers(0, vocab, (n, t)).astype(np.int32)
    target = np.roll(ids, -1, axis=1)
    lengths = rng.integers(1, t + 1, n)
    mask = (np.arange(t) < lengths[:, None]).astype(np.float32)
    train = DataLoader(ArrayDataset(input=ids, target=target, mask=mask), 8, shuffle=True)
    valid = DataLoader(ArrayDataset(input=ids, target=target, mask=mask), 8)  # 30 = 3 x 8 + 6: padded
    assert train.spec["input"].dtype == np.int32 and train.spec["mask"].shape == (8, t)
    assert task_of("cross_entropy", train.spec) == "sequence"
    config = config_for(tmp_path, "cross_entropy", ["accuracy"])
    trainer = fit(tmp_path, config, TokenTagger(vocab), train, valid)
    results = trainer.evaluate(valid)
    logits, _ = trainer.run.model(trainer.train_state["params"], trainer.train_state["state"], jnp.asarray(ids))
    log_p = np.asarray(jax.nn.log_softmax(logits))
    nll = -np.take_along_axis(log_p, target[..., None], -1)[..., 0]
    keep = mask > 0
    assert results["loss"] == pytest.approx(float(nll[keep].mean()), rel=1e-5)
    assert results["accuracy"] == pytest.approx(float((log_p.argmax(-1) == target)[keep].mean()), abs=1e-6)
    garbage = ids.copy()
    garbage[~keep] = 0  # other ids under the mask: nothing changes
    other = DataLoader(ArrayDataset(input=garbage, target=np.where(keep, target, 3), mask=mask), 8)
    assert trainer.evaluate(other)["loss"] == pytest.approx(results["loss"], rel=1e-6)


def test_regression_targets_and_no_target(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 5)).astype(np.float32)
    y = (x @ rng.standard_normal((5, 1))).astype(np.float32)
    train = DataLoader(ArrayDataset(input=x, target=y), 16, shuffle=True)
    valid = DataLoader(ArrayDataset(input=x, target=y), 16)
    config = config_for(tmp_path, "mse", ["mae", "rmse"], "min val/rmse", epochs=3)
    trainer = fit(tmp_path, config, Dense(1), train, valid, "reg")
    history = rows(trainer)
    assert history[-1]["val/rmse"] < history[0]["val/rmse"]
    assert history[-1]["val/loss"] == pytest.approx(history[-1]["val/rmse"] ** 2, rel=1e-4)
    assert task_of("mse", train.spec) == "regression"
    # an autoencoder: no target, the loss compares the outputs with the input
    train = DataLoader(ArrayDataset(input=x), 16, shuffle=True)
    trainer = fit(
        tmp_path, config_for(tmp_path, "mse", epochs=2), Dense(5), train, DataLoader(ArrayDataset(input=x), 16), "auto"
    )
    assert "target" not in train.spec and np.isfinite(rows(trainer)[-1]["val/loss"])


@pytest.mark.parametrize(
    "batch, message",
    [
        ([1, 2], "must return a dict"),
        ({"target": np.zeros(4)}, 'must return a dict with an "input"'),
        ({"input": np.array(["a"] * 4, object)}, "'input': expected a numeric numpy array"),
        ({"input": {"a": np.zeros((4, 2)), "b": np.zeros((3, 2))}}, "'input.b': shape [3, 2] does not start with"),
    ],
)
def test_bad_batches_are_named(batch, message):
    class Bad:
        def __len__(self):
            return 4

        def get_batch(self, indices):
            return batch

    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        DataLoader(Bad(), 4).spec  # noqa: B018 (reading it checks the first batch)


def test_loss_with_per_element_mask_matches_numpy():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 5, 6)).astype(np.float32)
    labels = rng.integers(0, 6, (4, 5))
    mask = (rng.random((4, 5)) > 0.3).astype(np.float32)
    mask[2] = 0  # an example with no token left
    per_example = np.asarray(losses.cross_entropy(jnp.asarray(logits), jnp.asarray(labels), mask=jnp.asarray(mask)))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
    expected = np.array([nll[i][mask[i] > 0].mean() if mask[i].any() else 0.0 for i in range(4)])
    np.testing.assert_allclose(per_example, expected, rtol=1e-5, atol=1e-6)
    x, y = rng.standard_normal((4, 5, 2)), rng.standard_normal((4, 5, 2))
    got = np.asarray(losses.mse(jnp.asarray(x), jnp.asarray(y), mask=jnp.asarray(mask)))
    expected = [((x[i] - y[i]) ** 2)[mask[i] > 0].mean() if mask[i].any() else 0.0 for i in range(4)]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def base_config(**optimizer):
    return {
        "name": "t",
        "model": {"name": "mlp"},
        "loss": {"name": "cross_entropy"},
        "optimizer": {"name": "adamw", **optimizer},
        "data_loader": {"train": {"name": "mnist"}},
        "trainer": {"epochs": 4, "monitor": "off"},
    }


def test_schedule_in_args_in_epochs_and_all():
    config = validate(
        base_config(args={"lr": {"name": "cosine_decay", "args": {"init_value": 0.1, "decay_steps": "all"}}})
    )
    _, lr = build_optimizer(config, steps_per_epoch=25)
    assert float(lr(0)) == pytest.approx(0.1) and float(lr(100)) == pytest.approx(0.0, abs=1e-9)
    assert float(lr(50)) == pytest.approx(0.05, rel=1e-5)  # halfway through the 4 x 25 steps of the run
    config = validate(
        base_config(
            schedule={
                "name": "warmup_cosine_decay",
                "args": {
                    "init_value": 0.0,
                    "peak_value": 1.0,
                    "warmup_steps": {"epochs": 0.5},
                    "decay_steps": {"epochs": 2},
                },
            }
        )
    )
    _, lr = build_optimizer(config, steps_per_epoch=10)
    assert float(lr(5)) == pytest.approx(1.0) and float(lr(20)) == pytest.approx(0.0, abs=1e-9)
    _, lr = build_optimizer(validate(base_config(args={"lr": 0.003})))
    assert lr(7) == 0.003


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path", ["config.json", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*.json"))]
)
def test_every_shipped_schedule_ends_with_the_run_whatever_its_length(path):
    """`python train.py -c config.json --epochs 1` (a first try) must still anneal its learning rate: a schedule
    length fixed in steps for the config's own epochs never decays in a shorter run (nor ends before a longer one)."""
    import train

    steps_per_epoch = 400
    for epochs in (1, 3):
        config, _ = train.resolve_config(train.parse_args(["-c", str(ROOT / path), "--epochs", str(epochs)]))
        try:
            _, lr = build_optimizer(config, steps_per_epoch=steps_per_epoch)
        except ConfigError as error:  # a warm-up in epochs longer than the run: refused clearly, not silently kept
            assert "must exceed warmup_steps" in str(error)
            continue
        last = steps_per_epoch * epochs - 1
        peak = max(float(lr(step)) for step in range(0, last + 1, 10))
        assert abs(float(lr(last)) - float(lr(100 * last))) <= 0.01 * peak, (
            f"{path} --epochs {epochs}: lr {float(lr(last)):.3g} at the last step, the schedule ends at "
            f'{float(lr(100 * last)):.3g}: give its length as "all" or in epochs'
        )
        halfway = float(lr(last // 2))
        assert halfway > float(lr(last)) or peak == float(lr(last)), f"{path}: decays before the run's middle"


@pytest.mark.parametrize(
    "config, message",
    [
        (
            base_config(args={"lr": {"name": "cosine_decay", "args": {"init_value": 0.1, "decay_steps": "most"}}}),
            'decay_steps: expected a number of steps, {"steps": N}, {"epochs": N} or "all", got "most"',
        ),
        (
            base_config(schedule={"name": "cosine_decay", "args": {"init_value": 1, "decay_steps": {"epoch": 2}}}),
            'decay_steps: expected a number of steps, {"steps": N}, {"epochs": N} or "all"',
        ),
        (
            {**base_config(args={"lr": 0.1}), "optimizer": {"name": "trace", "args": {"momentum": 0.9}}},
            "unknown optimizer 'trace'",
        ),
        ({**base_config(args={"lr": 0.1}), "optimizer": {"name": "chain"}}, "unknown optimizer 'chain'"),
        (base_config(args={"lr": 0.1}, transforms=[{"name": "adam", "args": {"lr": 1}}]), "unknown transforms 'adam'"),
        (
            {**base_config(args={"lr": 0.1}), "loss": {"name": "mse", "schedule": {"name": "constant"}}},
            "loss: unexpected key 'schedule'",
        ),
        (
            {**base_config(args={"lr": 0.1}), "loss": {"name": "mse", "args": {"mask": [1]}}},
            "loss.args.mask: set by the trainer",
        ),
    ],
)
def test_optimizer_names_and_schedule_forms_are_checked(config, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        validate(config)


def test_weights_with_excluded_prefix_keep_fresh_values(tmp_path):
    saved = {"params": {"body": {"w": np.ones((3, 4), np.float32)}, "head": {"w": np.ones((4, 10), np.float32)}}}
    checkpoint.save(tmp_path / "a.params", saved, {"epoch": 1, "step": 1})
    fresh = {"params": {"body": {"w": np.zeros((3, 4), np.float32)}, "head": {"w": np.zeros((4, 5), np.float32)}}}
    with pytest.raises(checkpoint.CheckpointError, match=r"params.head.w: file has float32\[4, 10\]"):
        checkpoint.restore(tmp_path / "a.params", fresh)
    tree, _ = checkpoint.restore(tmp_path / "a.params", fresh, exclude=("params.head",))
    assert np.all(tree["params"]["body"]["w"] == 1) and np.all(tree["params"]["head"]["w"] == 0)
    with pytest.raises(checkpoint.CheckpointError, match="exclude 'params.neck': no such key path"):
        checkpoint.restore(tmp_path / "a.params", fresh, exclude=("params.neck",))
