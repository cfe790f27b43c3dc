"""A model of several named outputs: the weighted sum of one loss per output and the metrics of one output against
numpy, the config's one-line errors, the summary of dict outputs, and the export's parity judged output by output."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from data_loader.loader import DataLoader
from inference import exporter
from inference.formats.jax_export import JaxModel, export_jax
from inference.inputs import Inputs, Outputs
from model.modules.branches import Heads
from model.modules.linear import Linear
from model.modules.module import Lambda
from model.modules.sequential import Sequential
from model.summary import summary
from training.config.components import build
from training.config.file import ConfigError
from training.config.validation import validate
from training.metrics import metric_results
from training.step import empty_stats, make_eval_step
from training.task_kinds import check_outputs_named, output_tasks

LOSS = {
    "name": "weighted_sum",
    "args": {
        "losses": {
            "digit": {"name": "cross_entropy", "args": {"label_smoothing": 0.1}, "weight": 1.0},
            "ink": {"name": "mse", "weight": 0.5},
        }
    },
}


def numpy_losses(logits, labels, ink, ink_target, smoothing=0.1, weight=0.5):
    """Per example: smoothed softmax cross-entropy (optax.smooth_labels' target) + weight * mean squared error."""
    logits = logits.astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    target = (1 - smoothing) * np.eye(logits.shape[-1])[labels] + smoothing / logits.shape[-1]
    cross_entropy = -(target * log_probs).sum(-1)
    return cross_entropy + weight * ((ink.astype(np.float64) - ink_target) ** 2).mean(-1)


def random_batch(n=8, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    outputs = {
        "digit": rng.normal(size=(n, classes)).astype(np.float32),
        "ink": rng.normal(size=(n, 1)).astype(np.float32),
    }
    targets = {"digit": rng.integers(0, classes, n).astype(np.int32), "ink": rng.normal(size=(n, 1)).astype(np.float32)}
    return outputs, targets


def test_weighted_sum_is_each_outputs_loss_times_its_weight():
    loss_fn = build(LOSS, "loss")
    outputs, targets = random_batch()
    got = np.asarray(loss_fn(outputs, targets))
    want = numpy_losses(outputs["digit"], targets["digit"], outputs["ink"], targets["ink"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # gradients with respect to every output, against finite differences
    check_grads(lambda o: loss_fn(o, targets).sum(), (jax.tree.map(jnp.asarray, outputs),), order=1, eps=1e-2)


def test_a_weight_defaults_to_one_and_zero_leaves_an_output_out():
    outputs, targets = random_batch(seed=1)
    spec = {"name": "weighted_sum", "args": {"losses": {"digit": {"name": "cross_entropy"}, "ink": {"name": "mse"}}}}
    both = np.asarray(build(spec, "loss")(outputs, targets))
    np.testing.assert_allclose(both, numpy_losses(**_named(outputs, targets), smoothing=0.0, weight=1.0), rtol=1e-5)
    spec["args"]["losses"]["ink"]["weight"] = 0
    alone = np.asarray(build(spec, "loss")(outputs, targets))
    np.testing.assert_allclose(alone, numpy_losses(**_named(outputs, targets), smoothing=0.0, weight=0.0), rtol=1e-5)


def _named(outputs, targets):
    return dict(logits=outputs["digit"], labels=targets["digit"], ink=outputs["ink"], ink_target=targets["ink"])


def heads_model(classes=5):
    return Sequential({"fc": Linear(6), "heads": Heads({"digit": Linear(classes), "ink": Linear(1)})})


def test_eval_step_loss_and_per_output_metrics_against_numpy():
    """The evaluation of a model of two heads over a padded batch: the loss is the weighted mean of the per-example
    weighted sums over the real examples; val/<output>/<metric> are each output's own accuracy and MAE."""
    model = heads_model()
    rng = np.random.default_rng(2)
    n, real = 10, 7
    x = rng.normal(size=(n, 4)).astype(np.float32)
    _, targets = random_batch(n, seed=3)
    mask = (np.arange(n) < real).astype(np.float32)
    params, state = model.init(jax.random.PRNGKey(0), jax.ShapeDtypeStruct(x.shape, jnp.float32))
    loss_fn = build(LOSS, "loss")
    metrics = [
        build({"name": "accuracy", "output": "digit"}, "metrics"),
        build({"name": "mae", "output": "ink"}, "metrics"),
    ]
    assert [m.name for m in metrics] == ["digit/accuracy", "ink/mae"]
    batch = {"input": x, "target": targets, "mask": mask}
    totals = empty_stats(model, loss_fn, metrics, params, state, jax.tree.map(jnp.asarray, batch))
    totals = jax.jit(make_eval_step(model, loss_fn, metrics))(params, state, totals, batch)
    results = metric_results(metrics, totals)

    outputs = jax.tree.map(np.asarray, model(params, state, x)[0])
    keep = slice(0, real)
    per_example = numpy_losses(outputs["digit"], targets["digit"], outputs["ink"], targets["ink"])
    assert results["loss"] == pytest.approx(per_example[keep].mean(), rel=1e-5)
    accuracy = (outputs["digit"].argmax(-1) == targets["digit"])[keep].mean()
    assert results["digit/accuracy"] == pytest.approx(accuracy, abs=1e-7)
    assert results["ink/mae"] == pytest.approx(np.abs(outputs["ink"] - targets["ink"])[keep].mean(), rel=1e-5)


def base_config(**changes) -> dict:
    """A config of two named outputs (written here: a project may leave the multi-task sample out)."""
    loader = {"name": "mnist_multitask", "args": {"batch_size": 8}}
    config = {
        "name": "two_heads",
        "model": {"name": "mnist_multitask", "args": {"channels": [4], "hidden": 8}},
        "loss": json.loads(json.dumps(LOSS)),
        "metrics": [{"name": "accuracy", "output": "digit"}, {"name": "mae", "output": "ink"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.001}},
        "data_loader": {"train": loader, "validation": loader},
        "trainer": {"epochs": 1, "monitor": "max val/digit/accuracy"},
    }
    for dotted, value in changes.items():
        node = config
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return config


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"loss__args__losses": ["digit"]}, "loss.args.losses: expected one loss per output such as"),
        ({"loss__args__losses": {}}, "loss.args.losses: expected one loss per output such as"),
        ({"loss__args__losses__ink__weight": -1}, "loss.args.losses.ink.weight: expected a number >= 0, got -1"),
        ({"loss__args__losses__ink__weight": "x"}, "loss.args.losses.ink.weight: expected a number >= 0"),
        ({"loss__args__losses__ink__name": "mse2"}, "loss.args.losses.ink.name: unknown loss 'mse2'"),
        ({"loss__args__losses__ink": "mse"}, 'loss.args.losses.ink: expected {"name"'),
        ({"loss__args__losses__ink__args": {"delta": 1}}, "loss.args.losses.ink.args.delta: unknown argument"),
        ({"loss__args__losses__ink__name": "weighted_sum"}, "a loss of one output, not another weighted_sum"),
        ({"metrics": [{"name": "accuracy", "output": 3}]}, "metrics.0.output: expected the name of one of the"),
        ({"metrics": [{"name": "accuracy", "output": "a/b"}]}, "metrics.0.output: expected the name of one of"),
    ],
)
def test_config_errors_are_one_line_at_their_place(changes, message):
    validate(base_config())  # as written: valid, its monitor one of the per-output metrics
    with pytest.raises(ConfigError) as error:
        validate(base_config(**changes))
    text = str(error.value)
    assert message in text and "\n" not in text


def test_a_loss_or_metric_of_an_output_the_model_or_data_lacks_is_named():
    config = base_config()
    outputs = {"digit": jax.ShapeDtypeStruct((2, 10), jnp.float32), "ink": jax.ShapeDtypeStruct((2, 1), jnp.float32)}
    targets = {"digit": None, "ink": None}
    check_outputs_named(config, outputs, targets, "cfg.json")  # as shipped: every name is an output
    with pytest.raises(ConfigError, match=r"cfg.json: loss.args.losses.ink: the model has no output 'ink'; it has "):
        check_outputs_named(config, {"digit": outputs["digit"]}, targets, "cfg.json")
    with pytest.raises(ConfigError, match="the model has no output 'digit'; it has one output, not named"):
        check_outputs_named(config, outputs["digit"], targets, "cfg.json")
    with pytest.raises(ConfigError, match="metrics.1.output: the data has no target 'ink'; its targets are digit"):
        check_outputs_named({**config, "loss": {"name": "cross_entropy"}}, outputs, {"digit": None}, "cfg.json")


def test_each_output_has_its_own_task():
    spec = {
        "input": jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32),
        "target": {"digit": jax.ShapeDtypeStruct((2,), jnp.int32), "ink": jax.ShapeDtypeStruct((2, 1), jnp.float32)},
    }
    assert output_tasks(base_config()["loss"], spec) == {"digit": "classification", "ink": "regression"}
    assert output_tasks({"name": "cross_entropy"}, spec) is None


def test_summary_shows_each_output():
    model = heads_model(classes=3)
    spec = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    params, state = model.init(jax.random.PRNGKey(0), spec)
    text = summary(model, params, state, spec)
    assert "heads.digit  (2, 3)" in text and "heads.ink    (2, 1)" in text
    assert "output digit: float32[2, 3]" in text and "output ink: float32[2, 1]" in text
    assert "total parameters: 58 " in text  # 4*6+6 + 6*3+3 + 6*1+1
    # a layer of its own that returns named outputs: one row with each output's shape
    split = Sequential({"fc": Linear(3), "split": Lambda(lambda y: {"a": y[:, :2], "b": y[:, 2:]}, "split")})
    params, state = split.init(jax.random.PRNGKey(0), spec)
    assert "split  a (2, 2), b (2, 1)" in summary(split, params, state, spec)


class _Rows:
    """A tiny data set of images with two named targets."""

    def __init__(self, n=12):
        rng = np.random.default_rng(4)
        self.x = rng.normal(size=(n, 4)).astype(np.float32)
        self.digit = rng.integers(0, 5, n).astype(np.int32)
        self.ink = rng.normal(size=(n, 1)).astype(np.float32)

    def __len__(self):
        return len(self.x)

    def get_batch(self, indices):
        return {"input": self.x[indices], "target": {"digit": self.digit[indices], "ink": self.ink[indices]}}


def test_export_checks_each_named_output_on_dict_targets():
    """collect_validation takes dict targets; the check compares each named output, and a file that differs in one
    output fails naming it (the other still matches)."""
    model = heads_model()
    spec = jax.ShapeDtypeStruct((1, 4), jnp.float32)
    params, state = model.init(jax.random.PRNGKey(0), spec)
    fn = lambda x: model(params, state, x)[0]  # noqa: E731
    forward = jax.jit(fn)
    inputs = Inputs(spec, 1)
    outputs = Outputs(jax.eval_shape(fn, spec), {"digit": "classification", "ink": "regression"}, "outputs")
    assert outputs.names == ["digit", "ink"]
    loader = DataLoader(_Rows(), 5)  # a padded last batch
    validation = exporter.collect_validation(loader, forward, inputs, None)
    assert len(validation) == 12 and sorted(validation.targets) == ["digit", "ink"]
    options = exporter.Options()

    def runner(f):
        return JaxModel(export_jax(outputs.flat_fn(inputs.flat_fn(f)), inputs.specs), inputs.names, outputs.names)

    entry = exporter.check(runner(fn), forward, inputs, validation, "other", options, False, {}, outputs)
    assert [o["name"] for o in entry["outputs"]] == ["digit", "ink"]
    digit = entry["validation"]["outputs"]["digit"]
    accuracy = float((validation.outputs["digit"].argmax(-1) == validation.targets["digit"]).mean())
    assert digit["agreement"] == 1.0 and digit["quality"] == digit["jax_quality"] == pytest.approx(accuracy)
    assert entry["validation"]["outputs"]["ink"]["quality"] is None and entry["validation"]["max_abs_diff"] < 1e-5

    off = lambda x: {**fn(x), "ink": fn(x)["ink"] + 0.5}  # noqa: E731
    with pytest.raises(exporter.ExportError, match="output 'ink', random inputs") as error:
        exporter.check(runner(off), forward, inputs, validation, "other", options, False, {}, outputs)
    assert "'digit'" not in str(error.value)


def test_a_classifier_head_narrower_than_its_targets_classes_is_refused(tmp_path):
    from tests.conftest import make_idx_dataset
    from tests.end_to_end.test_train import run

    make_idx_dataset(tmp_path / "mnist", n_train=60, n_test=20)
    config = base_config(model__args__num_classes=5, trainer__save_dir=str(tmp_path / "saved"))
    for loader in config["data_loader"].values():
        loader["args"] = {**loader["args"], "data_dir": str(tmp_path / "mnist"), "verify": False, "validation_size": 20}
    (tmp_path / "c.json").write_text(json.dumps(config))
    result = run("train.py", "-c", tmp_path / "c.json")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "c.json: model.args.num_classes: the model's output 'digit' gives 5 outputs per example, but the data has "
        "10 classes; set it to 10"
    ) in result.stderr
    assert not (tmp_path / "saved").exists()


def test_a_declared_classification_with_named_targets_is_one_line_not_a_traceback():
    """A data set declaring task classification (preprocessing["task"]) whose targets are named ({label, teacher}: a
    distillation's) cannot be reported as one classifier: one ConfigError, before anything compiles."""
    from training.task_kinds import check_model_fits_data

    class Named:
        preprocessing = {"task": "classification"}

        def __len__(self):
            return 8

        def get_batch(self, indices):
            n = len(indices)
            return {
                "input": np.zeros((n, 3), np.float32),
                "target": {"label": np.zeros(n, np.int32), "teacher": np.zeros((n, 4), np.float32)},
            }

    config = {"loss": {"name": "kl_divergence_with_logits"}, "model": {"name": "mlp"}, "trainer": {"precision": None}}
    model = build({"name": "mlp", "args": {"num_classes": 4, "hidden": [5]}}, "model")
    with pytest.raises(ConfigError, match=r"declares the task 'classification', but its targets are named \(label, "):
        check_model_fits_data(config, model, DataLoader(Named(), 4), None, "config.json")
