"""The GAN sample (tasks/gan/), a step of its own in files of its own: its losses against numpy (gradients included),
the alternation of its updates (which player's parameters and optimizer state change at which step, each with its
own learning rate and betas), and train.py -> test.py -> the export on tiny MNIST-format files."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime
import pytest
from jax.test_util import check_grads

from inference.trained_run import load_run
from tasks.gan import losses
from tasks.gan.model import gan
from tasks.gan.step import gan_step
from tests.conftest import make_idx_dataset
from tests.end_to_end.samples import epochs_of, finite, sample_config
from tests.end_to_end.test_train import ROOT, refused_in_process, run
from training import optimizers
from training.metrics import compute
from training.step import Update


def softplus(x):
    return np.logaddexp(0.0, np.float64(x))


def test_the_two_losses_and_fooled_match_numpy_with_gradients():
    rng = np.random.default_rng(0)
    real, fake = rng.normal(0, 3, (2, 6)).astype(np.float32)
    np.testing.assert_allclose(losses.discriminator_loss(real, fake), softplus(-real) + softplus(fake), rtol=1e-6)
    outputs = {"image": np.zeros((6, 2, 2, 1), np.float32), "score": fake}
    np.testing.assert_allclose(losses.gan_generator_loss(outputs, None), softplus(-fake), rtol=1e-6)
    mask = np.array([1, 1, 0, 1, 1, 1], np.float32)
    np.testing.assert_allclose(compute(losses.fooled(), outputs, None, mask), np.mean((fake > 0)[mask > 0]))
    check_grads(lambda r, f: losses.discriminator_loss(r, f).sum(), (real, fake), order=1, atol=2e-2, rtol=2e-2)
    check_grads(lambda f: losses.gan_generator_loss({"score": f}, None).sum(), (fake,), order=1, atol=2e-2, rtol=2e-2)


def changed(a, b) -> bool:
    return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("d_steps", [1, 2])
def test_the_players_take_turns_each_with_its_own_optimizer(d_steps):
    """d_steps discriminator updates, then one generator update: the other player's parameters and optimizer state
    stay bit for bit; Adam's first update moves every parameter by its group's own lr, and its moments hold its own
    b1 (mu / sqrt(nu) = (1 - b1) / sqrt(1 - b2) in sign after one update)."""
    model = gan(hidden=(8,), image_shape=(4, 4, 1))
    lrs, b1s = {"discriminator": 0.01, "generator": 0.002}, {"discriminator": 0.5, "generator": 0.9}
    optimizer = optimizers.partition(
        {
            name: ([f"params.{name}"], optimizers.adam(lrs[name], b1=b1s[name]))
            for name in ("discriminator", "generator")
        }
    )
    rng = np.random.default_rng(1)
    batch = {
        "input": rng.normal(size=(6, 3)).astype(np.float32),
        "target": rng.uniform(size=(6, 4, 4, 1)).astype(np.float32),
        "mask": np.ones(6, np.float32),
    }
    params, state = model.init(jax.random.PRNGKey(0), batch["input"])
    train_state = {
        "params": params,
        "state": state,
        "opt_state": optimizer.init(params),
        "step": jnp.zeros((), jnp.int32),
        "rng": jax.random.PRNGKey(2),
    }
    update = Update(model, losses.gan_generator_loss, optimizer, [losses.fooled()])
    step = jax.jit(lambda s, b: gan_step(update, s, b, d_steps=d_steps))
    turns = []
    for _ in range(2 * (d_steps + 1)):
        new, stats, logs = step(train_state, batch)
        moved = [p for p in ("discriminator", "generator") if changed(new["params"][p], train_state["params"][p])]
        stepped = [
            p for p in ("discriminator", "generator") if changed(new["opt_state"][p], train_state["opt_state"][p])
        ]
        assert moved == stepped and len(moved) == 1, (moved, stepped)
        (player,) = moved
        if player not in turns:  # its first update: Adam's step is lr in size, its moments hold its b1
            delta = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b), new["params"][player], params[player]))
            np.testing.assert_allclose(np.median(np.concatenate([d.ravel() for d in delta])), lrs[player], rtol=0.05)
            adam = new["opt_state"][player][0]
            ratio = [
                np.abs(m) / np.sqrt(v)
                for m, v in zip(jax.tree.leaves(adam.mu[player]), jax.tree.leaves(adam.nu[player]))
            ]
            expected = (1 - b1s[player]) / np.sqrt(1 - 0.999)
            np.testing.assert_allclose(np.median(np.concatenate([r.ravel() for r in ratio])), expected, rtol=1e-3)
        turns.append(player)
        assert np.isfinite(logs["loss"]) and float(stats["count"]) == 6
        train_state = new
    assert turns == (["discriminator"] * d_steps + ["generator"]) * 2


@pytest.mark.slow
def test_gan_sample_end_to_end(tmp_path):
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=200, n_test=40)
    config = sample_config(
        ROOT / "tasks" / "gan" / "config.json",
        tmp_path,
        {"data_dir": str(data_dir), "verify": False, "validation_size": 40, "batch_size": 40, "latent": 8},
        trainer__epochs=2,
        trainer__save_period=2,
        model__args__hidden=[16, 32],
    )
    trained = run("train.py", "-c", config, "--run-id", "g")
    assert trained.returncode == 0, trained.stderr
    assert 'the update: {"name": "gan", "args": {"d_steps": 1}}' in trained.stdout + trained.stderr
    run_dir = tmp_path / "saved" / "mnist_gan" / "g"
    rows = epochs_of(run_dir)
    assert len(rows) == 2 and all(finite(row[k]) for row in rows for k in ("train/loss", "val/loss", "val/fooled"))

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "fooled" in tested.stdout
    assert f"wrote {run_dir / 'images_image.png'} (image of the first 8 examples)" in tested.stdout
    assert "images_score" not in tested.stdout  # one logit per example: not an image

    out = tmp_path / "exports"
    exported = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "gan", "--output-dir", out, "--formats", "onnx"
    )
    assert exported.returncode == 0, exported.stderr
    report = json.loads((out / "gan" / "report.json").read_text())
    assert {o["name"] for o in report["formats"][0]["outputs"]} == {"image", "score"}
    z = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(out / "gan" / "gan.onnx"))
    names = [o.name for o in session.get_outputs()]
    image = session.run(None, {session.get_inputs()[0].name: z})[names.index("image")]
    np.testing.assert_allclose(image, load_run(run_dir)(z)["image"], atol=1e-5)

    # the generator alone: the discriminator's score, and its weights, left out of the export
    exported = run(
        "inference/convert_tflite.py",
        "--run",
        run_dir,
        "--name",
        "g",
        "--output-dir",
        out,
        "--formats",
        "onnx",
        "--outputs",
        "image",
    )
    assert exported.returncode == 0, exported.stderr
    report = json.loads((out / "g" / "report.json").read_text())
    assert all([o["name"] for o in entry["outputs"]] == ["image"] for entry in report["formats"])
    session = onnxruntime.InferenceSession(str(out / "g" / "g.onnx"))
    (alone,) = session.run(None, {session.get_inputs()[0].name: z})
    np.testing.assert_allclose(alone, image, atol=1e-5)
    assert (out / "g" / "g.onnx").stat().st_size < 0.7 * (out / "gan" / "gan.onnx").stat().st_size
    refused = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "h", "--output-dir", out, "--outputs", "images"
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: --outputs images: expected names of the model's outputs: image, score"
    ]
    assert not (out / "h").exists()


def test_the_gan_step_without_its_optimizer_groups_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """Refused by train.main in this process (exit status 2, one error line; train.py's own process refusing a
    config: test_config_fuzz.py)."""
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=100, n_test=20)
    config = sample_config(
        ROOT / "tasks" / "gan" / "config.json",
        tmp_path,
        {"data_dir": str(data_dir), "verify": False, "validation_size": 20, "batch_size": 20, "latent": 4},
        model__args__hidden=[8],
        optimizer={"name": "adam", "args": {"lr": 0.001}},
    )
    assert refused_in_process(["-c", str(config)], capsys, monkeypatch) == (
        "error: config.json: step: gan: the gan step updates the optimizer's groups discriminator, generator: give "
        "them in optimizer.groups"
    )
    assert not (tmp_path / "saved").exists()
