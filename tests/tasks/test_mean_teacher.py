"""The mean-teacher sample (tasks/mean_teacher/), a step of its own in files of its own: its consistency cost against
numpy (gradients included), the teacher the exponential moving average of the student (a numpy recurrence over
steps), its refusal without the ema callback, and train.py -> resume -> test.py -> load_run on tiny MNIST-format files:
two epochs straight and one plus a resumed one end bitwise equal, and the evaluated and exported model is the
teacher."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model.model import mlp
from tasks.mean_teacher.step import consistency_cost, mean_teacher
from tests.conftest import make_idx_dataset
from tests.end_to_end.samples import epochs_of, finite, sample_config
from tests.end_to_end.test_train import ROOT, params_of, run
from training import optimizers
from training.callbacks import ema
from training.losses import cross_entropy
from training.metrics import accuracy
from training.step import Update


def numpy_softmax(x):
    x = np.float64(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_the_consistency_cost_matches_numpy_with_gradients():
    rng = np.random.default_rng(0)
    student, teacher = rng.normal(0, 2, (2, 6, 5)).astype(np.float32)
    expected = np.square(numpy_softmax(student) - numpy_softmax(teacher)).sum(axis=-1)
    np.testing.assert_allclose(consistency_cost(student, teacher), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(consistency_cost(student, student), 0.0, atol=1e-7)
    check_grads(lambda s: consistency_cost(s, jnp.asarray(teacher)).sum(), (jnp.asarray(student),), order=1,
                atol=2e-2, rtol=2e-2)  # fmt: skip


def tiny(decay: float = 0.9, callbacks=None):
    """An MLP on 6 features, plain SGD, the ema callback without warm-up (a fixed decay), one batch of 8."""
    model = mlp(num_classes=3, hidden=(5,), dropout=0.2)
    optimizer = optimizers.sgd(0.5)
    rng = np.random.default_rng(1)
    batch = {
        "input": rng.normal(size=(8, 6)).astype(np.float32),
        "target": rng.integers(0, 3, 8).astype(np.int32),
        "mask": np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32),
    }
    params, state = model.init(jax.random.PRNGKey(0), batch["input"])
    callbacks = [ema(decay=decay, warmup=False)] if callbacks is None else callbacks
    train_state = {
        "params": params,
        "state": state,
        "opt_state": optimizer.init(params),
        "step": jnp.zeros((), jnp.int32),
        "rng": jax.random.PRNGKey(2),
        "callbacks": {c.name: c.init(params) for c in callbacks},
    }
    update = Update(model, cross_entropy, optimizer, [accuracy()], callbacks=callbacks)
    return update, train_state, batch


def test_the_teacher_is_the_exponential_moving_average_of_the_student():
    decay = 0.9
    update, train_state, batch = tiny(decay)
    step = jax.jit(lambda s, b: mean_teacher(consistency=2.0, noise=0.5)(update, s, b))
    teacher = jax.tree.map(np.float64, train_state["params"])  # the average starts at the initial student
    for _ in range(4):
        new, stats, logs = step(train_state, batch)
        # the numpy recurrence: teacher <- decay * teacher + (1 - decay) * student, the student after the step
        teacher = jax.tree.map(lambda t, s: decay * t + (1 - decay) * np.float64(s), teacher, new["params"])
        got = new["callbacks"]["ema"]["params"]
        for t, g in zip(jax.tree.leaves(teacher), jax.tree.leaves(got)):
            np.testing.assert_allclose(g, t, rtol=1e-5, atol=1e-6)
        assert int(new["step"]) == int(train_state["step"]) + 1 and float(stats["count"]) == 7
        assert np.isfinite(logs["loss"]) and float(logs["loss"]) >= float(stats["loss_sum"] / stats["count"]) - 1e-6
        train_state = new
    student, average = (jax.tree.leaves(x) for x in (train_state["params"], got))
    assert any(not np.allclose(s, a) for s, a in zip(student, average))  # the teacher lags: not the student


def test_the_step_without_the_ema_callback_or_with_bad_arguments_is_refused():
    update, train_state, batch = tiny(callbacks=[])
    with pytest.raises(ValueError, match=r'reads its teacher from the ema callback: add \{"name": "ema"'):
        mean_teacher()(update, train_state, batch)
    with pytest.raises(ValueError, match=r"noise: must be a number >= 0, got -1"):
        mean_teacher(noise=-1)


@pytest.mark.slow
def test_mean_teacher_sample_resumes_bitwise_and_exports_the_teacher(tmp_path):
    data_dir = tmp_path / "mnist"
    make_idx_dataset(data_dir, n_train=160, n_test=40)
    config = sample_config(
        ROOT / "tasks" / "mean_teacher" / "config.json",
        tmp_path,
        {"data_dir": str(data_dir), "verify": False, "validation_size": 40, "batch_size": 40},
        trainer__epochs=2,
        trainer__save_period=1,
        model__args__hidden=[16],
        optimizer={"name": "adam", "args": {"lr": 0.003}},  # a schedule over "all" epochs would differ at a resume
    )
    straight = run("train.py", "-c", config, "--run-id", "straight")
    assert straight.returncode == 0, straight.stderr
    assert '"name": "mean_teacher"' in straight.stdout + straight.stderr
    first = run("train.py", "-c", config, "--run-id", "split", "--epochs", "1")
    assert first.returncode == 0, first.stderr
    resumed = run(
        "train.py", "-r", tmp_path / "saved/mnist_mean_teacher/split/checkpoint-latest.params", "--epochs", "2"
    )
    assert resumed.returncode == 0, resumed.stderr
    a, header_a = params_of(tmp_path / "saved/mnist_mean_teacher/straight/checkpoint-latest.params")
    b, header_b = params_of(tmp_path / "saved/mnist_mean_teacher/split/checkpoint-latest.params")
    assert header_a["epoch"] == header_b["epoch"] == 2 and header_a["step"] == header_b["step"] == 6
    assert a.keys() == b.keys() and any(k.startswith("callbacks.ema.params.") for k in a)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    run_dir = tmp_path / "saved" / "mnist_mean_teacher" / "straight"
    rows = epochs_of(run_dir)
    assert len(rows) == 2 and all(finite(row["train/loss"]) and finite(row["val/accuracy"]) for row in rows)

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "task: classification" in tested.stdout and "weights: callbacks.ema.params" in tested.stdout

    # what load_run (and so the export) runs is the teacher, the average, not the student
    from inference.trained_run import load_run

    loaded = load_run(run_dir)
    x = np.random.default_rng(0).random((3, 28, 28, 1)).astype(np.float32)
    arrays, _ = params_of(run_dir / "checkpoint-latest.params")
    teacher = {k[len("callbacks.ema.params.") :]: v for k, v in arrays.items() if k.startswith("callbacks.ema.")}
    student = {k[len("params.") :]: v for k, v in arrays.items() if k.startswith("params.")}
    assert teacher.keys() == student.keys()
    flat = {".".join(str(getattr(p, "key", p)) for p in path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(loaded.params)}  # fmt: skip
    assert flat.keys() == teacher.keys()
    for key in flat:
        np.testing.assert_array_equal(flat[key], teacher[key])
    assert any(not np.array_equal(teacher[k], student[k]) for k in teacher)
    assert json.loads((run_dir / "config.json").read_text())["callbacks"][0]["name"] == "ema"
    assert np.asarray(loaded(x)).shape == (3, 10)
