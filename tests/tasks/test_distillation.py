"""The distillation sample (tasks/distillation/), written only in files of its own, and the route it takes through
the template: named targets ``{"label", "teacher"}`` with the loss's ``"labels": "label"`` make a model of one output
the classifier it is. Its loss against numpy on random logits (gradients included), its loader's targets, the
refusals of a run that does not name its labels, and teacher -> student -> test.py -> export -> predict.py end to
end on tiny MNIST-format files."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

from data_loader.loader import DataLoader, check_values
from tasks.distillation.data import TeacherTargets
from tasks.distillation.losses import distillation
from tests.conftest import make_idx_dataset
from tests.end_to_end.samples import epochs_of, finite
from tests.end_to_end.test_train import ROOT, refused_in_process, run, train_py_in_one_process, write_config
from training.config.components import build, check_component, of_labels
from training.config.file import ConfigError
from training.metrics import accuracy, compute
from training.task_kinds import check_model_fits_data, task_of


def numpy_log_softmax(x):
    x = np.float64(x)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def soft(logits, temperature):
    return jax.nn.softmax(jnp.asarray(logits) / temperature)


def numpy_distillation(student, labels, teacher, temperature, alpha):
    """alpha CE(labels) + (1 - alpha) T^2 KL(p || q), in float64 (Hinton et al., 2015)."""
    log_p, log_q = numpy_log_softmax(teacher / temperature), numpy_log_softmax(student / temperature)
    kl = temperature**2 * (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)
    ce = -numpy_log_softmax(student)[np.arange(len(labels)), labels]
    return alpha * ce + (1 - alpha) * kl


@pytest.mark.parametrize("temperature, alpha", [(1.0, 0.5), (2.0, 0.0), (4.0, 0.1), (10.0, 1.0)])
def test_distillation_matches_numpy(temperature, alpha):
    rng = np.random.default_rng(int(temperature))
    for _ in range(3):
        student = rng.normal(0, 3, (6, 5)).astype(np.float32)
        teacher = rng.normal(0, 3, (6, 5)).astype(np.float32)
        labels = rng.integers(0, 5, 6).astype(np.int32)
        targets = {"label": labels, "teacher": teacher}
        got = distillation(student, targets, temperature=temperature, alpha=alpha)
        want = numpy_distillation(student, labels, teacher, temperature, alpha)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        # and optax's own two terms, an implementation of neither this file nor the sample
        ce = optax.softmax_cross_entropy_with_integer_labels(student, labels)
        kl = optax.losses.kl_divergence(jax.nn.log_softmax(student / temperature), soft(teacher, temperature))
        np.testing.assert_allclose(got, alpha * ce + (1 - alpha) * temperature**2 * kl, rtol=1e-4, atol=1e-5)
        # the student's gradient: alpha (softmax(s) - onehot) + (1 - alpha) T (q - p) (Hinton et al., eq. 2 times T^2)
        grad = jax.grad(lambda s: distillation(s, targets, temperature=temperature, alpha=alpha).sum())(student)
        p, q = np.exp(numpy_log_softmax(teacher / temperature)), np.exp(numpy_log_softmax(student / temperature))
        hard = np.exp(numpy_log_softmax(student)) - np.eye(5)[labels]
        np.testing.assert_allclose(grad, alpha * hard + (1 - alpha) * temperature * (q - p), rtol=1e-4, atol=1e-5)
        check_grads(
            lambda s: distillation(s, {"label": labels, "teacher": jnp.asarray(teacher)}, temperature=temperature,
                                   alpha=alpha).sum(),
            (jnp.asarray(student),),
            order=1,
            modes=("rev",),
            atol=2e-2,
            rtol=2e-2,
        )  # fmt: skip
    # the teacher's logits alone: the KL term; class ids alone: the student's cross-entropy
    np.testing.assert_allclose(
        distillation(student, teacher, temperature=temperature),
        numpy_distillation(student, labels, teacher, temperature, 0.0),
        rtol=1e-4,
        atol=1e-6,
    )
    np.testing.assert_allclose(distillation(teacher, teacher, temperature=temperature), 0.0, atol=1e-5)
    expected = -numpy_log_softmax(student)[np.arange(6), labels]
    np.testing.assert_allclose(distillation(student, labels, temperature=temperature), expected, rtol=1e-5, atol=1e-6)


def test_distillation_refuses_targets_of_another_shape_or_name():
    with pytest.raises(ValueError, match=r"neither class ids nor the teacher's logits"):
        distillation(jnp.zeros((4, 3)), jnp.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"expected the targets 'label' and 'teacher', got \['digit', 'teacher'\]"):
        distillation(jnp.zeros((4, 3)), {"digit": jnp.zeros(4, jnp.int32), "teacher": jnp.zeros((4, 3))})
    with pytest.raises(ConfigError, match=r"loss\.args\.alpha: must be a number in \[0, 1\]"):
        check_component({"name": "distillation", "args": {"alpha": 1.5}}, "loss", "loss")


class Named:
    """Eight examples of three features with targets ``{"label": class ids, "teacher": logits}``, as the loader
    teacher_outputs makes them."""

    preprocessing = {"classes": ["a", "b", "c", "d"]}

    def __init__(self, preprocessing=None):
        self.preprocessing = preprocessing or self.preprocessing

    def __len__(self):
        return 8

    def get_batch(self, indices):
        n = len(indices)
        return {
            "input": np.zeros((n, 3), np.float32),
            "target": {"label": np.asarray(indices, np.int32) % 4, "teacher": np.zeros((n, 4), np.float32)},
        }


def fits(loss: dict, preprocessing=None, classes: int = 4):
    config = {"loss": loss, "model": {"name": "mlp"}, "trainer": {"precision": None}, "metrics": []}
    model = build({"name": "mlp", "args": {"num_classes": classes, "hidden": [5]}}, "model")
    return check_model_fits_data(config, model, DataLoader(Named(preprocessing), 4), None, "config.json")


def test_named_targets_are_a_classifier_where_the_loss_names_its_labels():
    loss = {"name": "distillation", "labels": "label"}
    assert fits(loss) == 4  # the classifier's width, checked against the labels' classes
    with pytest.raises(ConfigError, match=r"model\.args\.num_classes: the model gives 3 outputs per example, but"):
        fits(loss, classes=3)
    spec = DataLoader(Named(), 4).spec
    assert task_of(loss, spec) == "classification" and task_of("distillation", spec) == "other"
    # a data set declaring the task: judged on the labels too
    assert fits(loss, {"task": "classification", "classes": list("abcd")}) == 4


def test_a_classification_loss_of_named_targets_names_the_route_in_one_line():
    with pytest.raises(ConfigError) as error:
        fits({"name": "distillation"})
    (line,) = str(error.value).splitlines()
    assert line == (
        "config.json: loss: distillation takes one target, but the data has named targets label, teacher: a model "
        "of one output whose loss takes them all (labels and a teacher's logits) is a classifier when the loss "
        'names the target of its class ids: "loss": {"name": "distillation", "labels": "<one of label, teacher>"}'
    )
    with pytest.raises(ConfigError, match=r"^config\.json: loss\.labels: the data has no target 'digit'; it has "):
        fits({"name": "distillation", "labels": "digit"})
    with pytest.raises(ConfigError, match=r"declares the task 'classification', but its targets are named .*labels"):
        fits({"name": "kl_divergence_with_logits"}, {"task": "classification"})
    with pytest.raises(ConfigError, match=r"^loss\.labels: expected the name of one of the data's targets"):
        check_component({"name": "distillation", "labels": 3}, "loss", "loss")
    weighted = {"name": "weighted_sum", "args": {"losses": {"a": {"name": "mse"}}}, "labels": "label"}
    with pytest.raises(ConfigError, match=r"^loss\.labels: a loss of one loss per output gives each output its own"):
        check_component(weighted, "loss", "loss")


def test_the_labels_among_named_targets_are_checked_as_class_ids():
    with pytest.raises(ValueError, match=r"^example 0: class label 4 is outside \[0, 4\)$"):
        check_values(Shifted(), 4, labels="target.label")
    check_values(Shifted(), 5, labels="target.label")
    check_values(Shifted(), 4)  # the named targets: no one array of class ids unless the labels are named


class Shifted(Named):
    def get_batch(self, indices):
        batch = super().get_batch(indices)
        batch["target"]["label"] = batch["target"]["label"] + 4 * (np.asarray(indices) == 0)
        return batch


def test_a_metric_of_named_targets_scores_the_labels():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(8, 4)), jnp.float32)
    labels = jnp.asarray([0, 1, 2, 3, 0, 1, 2, 3])
    metric = of_labels(accuracy(), "label")
    assert metric.name == "accuracy"
    named = compute(metric, logits, {"label": labels, "teacher": logits})
    assert float(named) == float(compute(accuracy(), logits, labels))  # one array: as it is
    assert float(compute(metric, logits, labels)) == float(named)


def test_teacher_targets_keep_the_labels_beside_the_teachers_logits():
    class Labelled:
        preprocessing = {"classes": list("abc")}

        def __len__(self):
            return 5

        def get_batch(self, indices):
            return {"input": np.asarray(indices, np.float32)[:, None], "target": np.asarray(indices) % 3}

    logits = np.arange(15, dtype=np.float32).reshape(5, 3)
    batch = TeacherTargets(Labelled(), logits, "t").get_batch(np.array([4, 1]))
    np.testing.assert_array_equal(batch["target"]["label"], [1, 1])
    np.testing.assert_array_equal(batch["target"]["teacher"], logits[[4, 1]])

    class Unlabelled(Labelled):
        def get_batch(self, indices):
            return {"input": np.asarray(indices, np.float32)[:, None]}

    unlabelled = TeacherTargets(Unlabelled(), logits, "t")
    np.testing.assert_array_equal(unlabelled.get_batch(np.array([2]))["target"], logits[[2]])
    assert unlabelled.preprocessing == {"classes": list("abc"), "teacher": "t"}


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
    teacher["data_loader"] = {split: spec["args"]["data"] for split, spec in teacher["data_loader"].items()}
    for spec in teacher["data_loader"].values():
        spec["args"].update(files)
    teacher["data_loader"]["train"]["args"].update(shuffle=True)
    teacher["loss"] = {"name": "cross_entropy"}
    (tmp_path / "teacher").mkdir()
    teacher_config = write_config(tmp_path / "teacher", teacher, {"trainer__epochs": 3, "model__args__hidden": [32]})
    for spec in config["data_loader"].values():
        spec["args"].update(teacher=str(tmp_path / "saved" / "teacher" / "teacher"), batch_size=40)
        spec["args"]["data"]["args"].update(files)
    student = write_config(tmp_path, config, {"trainer__epochs": 2, "model__args__hidden": [16]})
    return teacher_config, student


def test_a_missing_teacher_or_a_bad_inner_loader_is_one_line(tmp_path, capsys, monkeypatch):
    """Refused by train.main in this process (exit status 2, one error line; train.py's own process refusing a
    config: test_config_fuzz.py)."""
    _, student = configs(tmp_path)
    line = refused_in_process(["-c", str(student)], capsys, monkeypatch)
    assert line.startswith(f"error: config.json: data_loader.train.args.teacher: {tmp_path}"), line
    config = json.loads(student.read_text())
    config["data_loader"]["train"]["args"]["data"] = {"name": "mnistt"}
    line = refused_in_process(["-c", str(write_config(tmp_path, config, {}))], capsys, monkeypatch)
    assert line == (
        "error: config.json: data_loader.train.args.data.name: unknown data_loader 'mnistt'; available: "
        + line.split("available: ")[1].strip()
    )
    assert "Did you mean 'mnist'?" in line


@pytest.mark.slow
def test_distillation_sample_end_to_end(tmp_path):
    teacher_config, student_config = configs(tmp_path)
    teacher, student = train_py_in_one_process(  # one after the other in one process: a JAX start fewer
        ["-c", teacher_config, "--run-id", "teacher"], ["-c", student_config, "--run-id", "student"]
    )
    assert teacher.returncode == 0, teacher.stderr
    assert student.returncode == 0, student.stderr
    run_dir = tmp_path / "saved" / "mnist_distillation" / "student"
    rows = epochs_of(run_dir)
    assert len(rows) == 2 and all(finite(row["train/loss"]) and finite(row["val/accuracy"]) for row in rows)
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]

    # the student is reported as the classifier it is, against the test split's labels beside the teacher's logits
    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "task: classification" in tested.stdout and "confusion matrix" in tested.stdout
    rows = (run_dir / "per_class.csv").read_text().splitlines()
    assert len(rows) == 11 and sum(int(row.split(",")[-1]) for row in rows[1:]) == 40  # every example, by its label

    # the export is judged as a classifier's and predict.py names classes, not raw logits
    exported = run(
        "inference/convert_tflite.py", "--run", run_dir, "--name", "s", "--output-dir", tmp_path / "out", "--formats",
        "onnx",
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert json.loads((tmp_path / "out" / "s" / "preprocessing.json").read_text())["task"] == "classification"
    np.save(tmp_path / "x.npy", np.zeros((2, 28, 28, 1), np.float32))
    predicted = run("inference/predict.py", tmp_path / "out" / "s" / "s.onnx", tmp_path / "x.npy", "--top", "2")
    assert predicted.returncode == 0, predicted.stderr
    assert "task classification" in predicted.stdout, predicted.stdout
    assert re.search(r"x\.npy\[1\]: \d \(\d\.\d{3}\), \d \(\d\.\d{3}\)$", predicted.stdout, re.M), predicted.stdout

    # the loader's targets are the labels beside the teacher's outputs, as load_run gives them
    from inference.trained_run import load_run

    spec = json.loads(student_config.read_text())["data_loader"]["train"]
    loader = build(spec, "data_loader", "test", seed=0)
    batch = loader.dataset.get_batch(np.arange(7))
    teacher_run = load_run(tmp_path / "saved" / "teacher" / "teacher")
    np.testing.assert_allclose(batch["target"]["teacher"], teacher_run(batch["input"]), atol=1e-5)
    inner = build(spec["args"]["data"], "data_loader", "test", seed=0)
    np.testing.assert_array_equal(batch["target"]["label"], inner.dataset.get_batch(np.arange(7))["target"])
