"""The distillation sample (tasks/distillation/), written only in files of its own: its loss against numpy on
random logits (gradients included), its loader's targets against the teacher loaded with load_run, its refusals in
one line, and teacher -> student -> test.py end to end on tiny MNIST-format files."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from tasks.distillation.losses import distillation
from tests.conftest import make_idx_dataset
from tests.end_to_end.samples import epochs_of, finite
from tests.end_to_end.test_train import ROOT, run, write_config


def numpy_log_softmax(x):
    x = np.float64(x)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def numpy_distillation(student, teacher, temperature):
    log_p, log_q = numpy_log_softmax(teacher / temperature), numpy_log_softmax(student / temperature)
    return temperature**2 * (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0, 10.0])
def test_distillation_matches_numpy(temperature):
    rng = np.random.default_rng(int(temperature))
    for _ in range(3):
        student = rng.normal(0, 3, (6, 5)).astype(np.float32)
        teacher = rng.normal(0, 3, (6, 5)).astype(np.float32)
        got = distillation(student, teacher, temperature=temperature)
        np.testing.assert_allclose(got, numpy_distillation(student, teacher, temperature), rtol=1e-4, atol=1e-6)
        # the student's gradient is T (q - p) (Hinton et al., 2015, eq. 2 times T^2)
        grad = jax.grad(lambda s: distillation(s, teacher, temperature=temperature).sum())(student)
        p, q = np.exp(numpy_log_softmax(teacher / temperature)), np.exp(numpy_log_softmax(student / temperature))
        np.testing.assert_allclose(grad, temperature * (q - p), rtol=1e-4, atol=1e-6)
        check_grads(
            lambda s: distillation(s, jnp.asarray(teacher), temperature=temperature).sum(),
            (jnp.asarray(student),),
            order=1,
            modes=("rev",),
            atol=2e-2,
            rtol=2e-2,
        )
    # zero when the student matches the teacher; the true labels give the student's cross-entropy
    np.testing.assert_allclose(distillation(teacher, teacher, temperature=temperature), 0.0, atol=1e-5)
    labels = rng.integers(0, 5, 6)
    expected = -numpy_log_softmax(student)[np.arange(6), labels]
    np.testing.assert_allclose(distillation(student, labels, temperature=temperature), expected, rtol=1e-5)


def test_distillation_refuses_targets_of_another_shape():
    with pytest.raises(ValueError, match=r"neither class ids nor the teacher's logits"):
        distillation(jnp.zeros((4, 3)), jnp.zeros((4, 5)))


def configs(tmp_path):
    """A teacher (a small MLP trained on the labels, as the MNIST sample would be) and the distillation sample as
    the student, both on tiny MNIST-format files; built from the sample's own config, so a project made with any
    samples (whatever its config.json) runs this test."""
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=200, n_test=40)
    files = {"data_dir": str(data_dir), "verify": False, "validation_size": 40, "batch_size": 40}
    config = json.loads((ROOT / "tasks" / "distillation" / "config.json").read_text())
    config["trainer"].update(save_dir=str(tmp_path / "saved"), log_every=1)
    teacher = json.loads(json.dumps(config))
    teacher["name"] = "teacher"
    teacher["data_loader"]["train"] = teacher["data_loader"]["train"]["args"]["data"]
    teacher["data_loader"]["train"]["args"].update(shuffle=True)
    for spec in teacher["data_loader"].values():
        spec["args"].update(files)
    teacher["loss"] = {"name": "cross_entropy"}
    (tmp_path / "teacher").mkdir()
    teacher_config = write_config(tmp_path / "teacher", teacher, {"trainer__epochs": 3, "model__args__hidden": [32]})
    train = config["data_loader"]["train"]["args"]
    train.update(teacher=str(tmp_path / "saved" / "teacher" / "teacher"), batch_size=40)
    train["data"]["args"].update(files)
    for split in ("validation", "test"):
        config["data_loader"][split]["args"].update(files)
    student = write_config(tmp_path, config, {"trainer__epochs": 3, "model__args__hidden": [16]})
    return teacher_config, student


def test_a_missing_teacher_or_a_bad_inner_loader_is_one_line(tmp_path):
    _, student = configs(tmp_path)
    missing = run("train.py", "-c", student)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert missing.stderr.startswith(f"error: config.json: data_loader.train.args.teacher: {tmp_path}")
    config = json.loads(student.read_text())
    config["data_loader"]["train"]["args"]["data"] = {"name": "mnistt"}
    bad = run("train.py", "-c", write_config(tmp_path, config, {}))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: config.json: data_loader.train.args.data.name: unknown data_loader 'mnistt'; available: "
        + bad.stderr.split("available: ")[1].strip()
    ]
    assert "Did you mean 'mnist'?" in bad.stderr


@pytest.mark.slow
def test_distillation_sample_end_to_end(tmp_path):
    teacher_config, student_config = configs(tmp_path)
    teacher = run("train.py", "-c", teacher_config, "--run-id", "teacher")
    assert teacher.returncode == 0, teacher.stderr
    student = run("train.py", "-c", student_config, "--run-id", "student")
    assert student.returncode == 0, student.stderr
    run_dir = tmp_path / "saved" / "mnist_distillation" / "student"
    rows = epochs_of(run_dir)
    assert len(rows) == 3 and all(finite(row["train/loss"]) and finite(row["val/accuracy"]) for row in rows)
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]

    # the student is reported as the classifier it is, against the test split's true labels
    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "task: classification" in tested.stdout and "confusion matrix" in tested.stdout

    # the loader's targets are the teacher's outputs, as load_run gives them
    from inference.trained_run import load_run
    from training.config.components import build

    spec = json.loads(student_config.read_text())["data_loader"]["train"]
    loader = build(spec, "data_loader", "test", seed=0)
    batch = loader.dataset.get_batch(np.arange(7))
    np.testing.assert_allclose(
        batch["target"], load_run(tmp_path / "saved" / "teacher" / "teacher")(batch["input"]), atol=1e-5
    )
