"""The VAE sample (tasks/vae/), written only in files of its own: its loss and metrics against numpy on random
inputs (gradients included), its sampling in training, and train.py -> test.py -> the export on tiny MNIST-format
files, as real subprocesses, then its decoder written as a run of its own and exported alone."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime
import pytest
from jax.test_util import check_grads

from inference.trained_run import load_run
from tasks.vae import decoder as decoder_command
from tasks.vae import losses
from tasks.vae.model import decoder_params, vae, vae_decoder
from tests.conftest import make_idx_dataset
from tests.end_to_end.samples import epochs_of, finite, sample_config
from tests.end_to_end.test_train import ROOT, run
from training.metrics import compute


def numpy_kl(mean, log_var):
    mean, log_var = np.float64(mean), np.float64(log_var)
    return 0.5 * np.sum(np.exp(log_var) + mean**2 - 1.0 - log_var, axis=-1)


def numpy_reconstruction(logits, images, likelihood):
    logits, images = np.float64(logits), np.float64(images)
    if likelihood == "bernoulli":
        p = 1.0 / (1.0 + np.exp(-logits))
        terms = -(images * np.log(p) + (1.0 - images) * np.log(1.0 - p))
    else:
        terms = 0.5 * (logits - images) ** 2
    return terms.reshape(len(terms), -1).sum(axis=1)


def random_outputs(seed: int, batch: int = 5, latent: int = 3, shape=(4, 4, 1)):
    rng = np.random.default_rng(seed)
    outputs = {
        "reconstruction": rng.normal(0, 2, (batch, *shape)).astype(np.float32),
        "mean": rng.normal(0, 1, (batch, latent)).astype(np.float32),
        "log_var": rng.normal(0, 0.5, (batch, latent)).astype(np.float32),
    }
    return outputs, rng.uniform(0, 1, (batch, *shape)).astype(np.float32)


@pytest.mark.parametrize("likelihood", losses.LIKELIHOODS)
@pytest.mark.parametrize("beta", [1.0, 4.0])
def test_vae_loss_and_its_terms_match_numpy(likelihood, beta):
    for seed in range(3):
        outputs, images = random_outputs(seed)
        kl = numpy_kl(outputs["mean"], outputs["log_var"])
        rec = numpy_reconstruction(outputs["reconstruction"], images, likelihood)
        got = losses.vae_loss(outputs, images, beta=beta, likelihood=likelihood)
        np.testing.assert_allclose(got, rec + beta * kl, rtol=1e-5)
        # the metrics: means over the examples, a masked (padding) example counting for nothing
        mask = np.array([1, 1, 0, 1, 1], np.float32)
        np.testing.assert_allclose(compute(losses.kl(), outputs, images, mask), kl[mask > 0].mean(), rtol=1e-5)
        np.testing.assert_allclose(
            compute(losses.reconstruction(likelihood), outputs, images, mask), rec[mask > 0].mean(), rtol=1e-5
        )


@pytest.mark.parametrize("likelihood", losses.LIKELIHOODS)
def test_vae_loss_gradients(likelihood):
    outputs, images = random_outputs(7)
    args = tuple(jnp.asarray(outputs[k]) for k in ("reconstruction", "mean", "log_var"))

    def loss(reconstruction, mean, log_var):
        parts = {"reconstruction": reconstruction, "mean": mean, "log_var": log_var}
        return losses.vae_loss(parts, images, beta=2.0, likelihood=likelihood).sum()

    check_grads(loss, args, order=1, modes=("rev",), atol=2e-2, rtol=2e-2)
    # and the analytic gradient of the KL term: d/dmean = mean, d/dlog_var = (exp(log_var) - 1) / 2
    grad_mean, grad_log_var = jax.grad(lambda m, v: losses.kl_per_example(m, v).sum(), argnums=(0, 1))(
        outputs["mean"], outputs["log_var"]
    )
    np.testing.assert_allclose(grad_mean, outputs["mean"], rtol=1e-5)
    np.testing.assert_allclose(grad_log_var, (np.exp(outputs["log_var"]) - 1) / 2, rtol=1e-5, atol=1e-6)


def test_the_vae_samples_with_the_training_key_and_its_decoder_stands_alone():
    model = vae(latent=3, hidden=(16,))
    x = jax.random.uniform(jax.random.PRNGKey(0), (4, 8, 8, 1))
    params, state = model.init(jax.random.PRNGKey(1), x)
    a, _ = model(params, state, x, train=True, key=jax.random.PRNGKey(2))
    b, _ = model(params, state, x, train=True, key=jax.random.PRNGKey(3))
    assert not np.allclose(a["reconstruction"], b["reconstruction"])  # z is drawn, each key its own
    np.testing.assert_array_equal(a["mean"], b["mean"])  # the encoder is not
    with pytest.raises(ValueError, match="sampling in training needs a PRNG key"):
        model(params, state, x, train=True)
    c, _ = model(params, state, x)  # evaluation: z is the mean, deterministic
    decoder = vae_decoder(latent=3, hidden=(16,), image_shape=(8, 8, 1))
    d_params, d_state = decoder.init(jax.random.PRNGKey(4), jax.ShapeDtypeStruct((4, 3), jnp.float32))
    assert jax.tree.structure(d_params) == jax.tree.structure(decoder_params(params))
    y, _ = decoder(decoder_params(params), d_state, c["mean"])
    np.testing.assert_allclose(y, c["reconstruction"], rtol=1e-6)


@pytest.mark.slow
def test_vae_sample_end_to_end(tmp_path, capsys):
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=200, n_test=40)
    config = sample_config(
        ROOT / "tasks" / "vae" / "config.json",
        tmp_path,
        {"data_dir": str(data_dir), "verify": False, "validation_size": 40, "batch_size": 40},
        trainer__epochs=3,
        trainer__save_period=3,
        model__args__latent=4,
        model__args__hidden=[32],
    )
    trained = run("train.py", "-c", config, "--run-id", "v")
    assert trained.returncode == 0, trained.stderr
    run_dir = tmp_path / "saved" / "mnist_vae" / "v"
    # the code of the weights travels with them: model/, and the VAE's own folder, where its model is written
    assert (run_dir / "model" / "model.py").is_file() and (run_dir / "tasks" / "vae" / "model.py").is_file()
    rows = epochs_of(run_dir)
    assert len(rows) == 3
    for key in ("train/loss", "train/kl", "train/reconstruction", "val/loss", "val/kl", "val/reconstruction"):
        assert all(finite(row[key]) for row in rows), key
    # the loss is its two terms (beta 1), each logged on its own
    assert rows[-1]["val/loss"] == pytest.approx(rows[-1]["val/kl"] + rows[-1]["val/reconstruction"], rel=1e-4)
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "kl " in tested.stdout and "reconstruction " in tested.stdout
    assert (run_dir / "images_reconstruction.png").is_file()  # beside their inputs, the mean and log_var not drawn
    assert not (run_dir / "images_mean.png").exists()

    out = tmp_path / "exports"
    exported = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "vae", "--output-dir", out, "--formats", "jax,onnx"
    )
    assert exported.returncode == 0, exported.stderr
    assert (out / "vae" / "tasks" / "vae" / "model.py").is_file()
    report = json.loads((out / "vae" / "report.json").read_text())
    for entry in report["formats"]:
        assert {o["name"] for o in entry["outputs"]} == {"reconstruction", "mean", "log_var"}

    # the decoder on its own: a run folder of its own, exported like any run, the VAE's reconstruction from the mean
    decoder_run = tmp_path / "saved" / "mnist_vae" / "v-decoder"
    written = run("-m", "tasks.vae.decoder", "--run", run_dir)
    assert written.returncode == 0 and written.stdout.strip() == f"wrote {decoder_run}", written.stderr
    with pytest.raises(SystemExit) as again:  # a second time, refused (in this process: a JAX start fewer)
        decoder_command.main(["--run", str(run_dir)])
    assert again.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"error: {decoder_run}: exists already; remove it or give another --out"
    ]
    exported = run(
        "inference/convert_tflite.py", "--run", decoder_run, "--name", "dec", "--output-dir", out, "--formats", "onnx"
    )
    assert exported.returncode == 0, exported.stderr
    vae_run = load_run(run_dir)
    images = np.random.default_rng(0).uniform(0, 1, (3, 28, 28, 1)).astype(np.float32)
    outputs = vae_run(images)  # a dict of numpy arrays, one per named output
    session = onnxruntime.InferenceSession(str(out / "dec" / "dec.onnx"))
    (decoded,) = session.run(None, {session.get_inputs()[0].name: outputs["mean"]})
    np.testing.assert_allclose(decoded, outputs["reconstruction"], atol=1e-4)


def test_a_linked_tasks_folder_in_a_run_folder_is_refused_not_written_through(tmp_path):
    """A run folder from elsewhere (a requeued -r auto run) may hold a planted link where the VAE's code is copied."""
    import os

    from training.run.folder import write_run_files

    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, run_dir / "tasks")
    with pytest.raises(OSError, match="a symbolic link .* stands where the run copies its model's code into a folder"):
        write_run_files(run_dir, {"model": {"name": "vae"}}, None)
    assert list(elsewhere.iterdir()) == []
