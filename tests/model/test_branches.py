"""Models of named inputs: the Branches combinator against the same layers applied by hand, and a dict batch end to
end through train.py, test.py, the export and predict.py, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.modules.activations import Activation
from model.modules.branches import Branches
from model.modules.linear import Linear
from model.modules.sequential import Sequential
from model.summary import summary
from tests.end_to_end.test_train import run
from training.config.components import build
from training.config.validation import load_config
from training.run import checkpoint

SPEC = {"image": jax.ShapeDtypeStruct((4, 6, 6, 2), jnp.float32), "features": jax.ShapeDtypeStruct((4, 3), jnp.float32)}


def test_branches_apply_one_module_per_input_and_join_them():
    image = Sequential({"fc": Linear(5), "act": Activation("relu")})
    features = Linear(2)
    model = Branches({"image": image, "features": features})
    params, state = model.init(jax.random.PRNGKey(0), SPEC)
    assert set(params) == {"image", "features"}
    rng = np.random.default_rng(0)
    x = {k: rng.standard_normal(s.shape).astype(np.float32) for k, s in SPEC.items()}
    y, _ = model(params, state, x)
    by_hand = [
        image(params["image"], state["image"], x["image"])[0].reshape(4, -1),
        features(params["features"], state["features"], x["features"])[0],
    ]
    np.testing.assert_array_equal(np.asarray(y), np.concatenate([np.asarray(a) for a in by_hand], axis=1))
    assert y.shape == (4, 6 * 6 * 5 + 2)
    # each branch has its own random stream: the same layer in two branches starts from other weights
    twins = Branches({"image": Linear(3), "features": Linear(3)})
    p, _ = twins.init(jax.random.PRNGKey(0), {"image": SPEC["features"], "features": SPEC["features"]})
    assert not np.array_equal(p["image"]["weight"], p["features"]["weight"])


def test_branches_name_a_missing_input():
    model = Branches({"image": Linear(3), "side": Linear(3)})
    with pytest.raises(ValueError, match=r"Branches: no input 'side'; the inputs are \['features', 'image'\]"):
        model.init(jax.random.PRNGKey(0), SPEC)
    with pytest.raises(ValueError, match="expected named inputs"):
        model.init(jax.random.PRNGKey(0), SPEC["features"])


def test_summary_of_a_model_of_named_inputs_lists_each_branch():
    model = build({"name": "image_and_features", "args": {"num_classes": 3, "channels": [4], "hidden": 8}}, "model")
    params, state = model.init(jax.random.PRNGKey(0), SPEC)
    text = summary(model, params, state, SPEC)
    assert "branches.image.conv0" in text and "branches.features.fc" in text
    assert "head" in text.splitlines()[-3] and "(4, 3)" in text.splitlines()[-3]


def write_pair_data(folder):
    """Named inputs a model can learn from: the class shifts both the image and the features."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 96)
    np.savez(
        folder / "pair.npz",
        label=labels,
        pixels=(rng.standard_normal((96, 8, 8, 1)) + labels[:, None, None, None]).astype(np.float32),
        side=(rng.standard_normal((96, 3)) + labels[:, None]).astype(np.float32),
    )
    return folder / "pair.npz"


def pair_config(tmp_path, **trainer) -> Path:
    path = write_pair_data(tmp_path)
    split = {
        "path": str(path),
        "input": {"image": "pixels", "features": "side"},
        "target": "label",
        "validation_fraction": 0.25,
        "test_fraction": 0.25,
        "classes": ["a", "b", "c"],
    }
    config = {
        "name": "pair",
        "seed": 0,
        "model": {"name": "image_and_features", "args": {"num_classes": 3, "channels": [4], "hidden": 8, "width": 16}},
        "loss": {"name": "cross_entropy"},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "data_loader": {
            s: {"name": "arrays", "args": {**split, "split": s, "batch_size": 16, "shuffle": s == "train"}}
            for s in ("train", "validation", "test")
        },
        "trainer": {"epochs": 3, "save_dir": str(tmp_path / "saved"), "monitor": "max val/accuracy", **trainer},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "config.json"


@pytest.mark.slow
def test_named_inputs_through_train_test_export_and_predict(tmp_path):
    config = pair_config(tmp_path)
    trained = run("train.py", "-c", config, "--run-id", "r")
    assert trained.returncode == 0, trained.stderr
    run_dir = tmp_path / "saved" / "pair" / "r"
    log = (run_dir / "train.log").read_text()
    assert "input.features float32[16, 3], input.image float32[16, 8, 8, 1]" in log and "branches.image.conv0" in log

    tested = run("test.py", "--run", run_dir)
    assert tested.returncode == 0, tested.stderr
    assert "test split, 24 examples, task: classification" in tested.stdout and "confusion matrix" in tested.stdout

    exported = run(
        "inference/convert_tflite.py",
        "--run",
        run_dir,
        "--name",
        "pair",
        "--output-dir",
        tmp_path / "out",
        "--formats",
        "onnx,jax",
    )
    assert exported.returncode == 0, exported.stderr
    report = json.loads((tmp_path / "out/pair/report.json").read_text())
    assert [i["name"] for i in report["inputs"]] == ["features", "image"]
    assert all(entry["validation"]["agreement"] == 1.0 for entry in report["formats"])

    # predict.py on an .npz of named inputs says what the trained JAX model says
    data = np.load(tmp_path / "pair.npz")
    x = {"image": data["pixels"][:5], "features": data["side"][:5]}
    np.savez(tmp_path / "five.npz", **x)
    model = build(load_config(run_dir / "config.json")["model"], "model")
    template = jax.eval_shape(lambda: dict(zip(("params", "state"), model.init(jax.random.PRNGKey(0), x))))
    tree, _ = checkpoint.restore(run_dir / "model_best.params", template, only=("params", "state"))
    want = np.asarray(model(tree["params"], tree["state"], x)[0]).argmax(1)
    predicted = run("inference/predict.py", tmp_path / "out/pair/pair.onnx", tmp_path / "five.npz", "--top", 1)
    assert predicted.returncode == 0, predicted.stderr
    lines = [line for line in predicted.stdout.splitlines() if "five.npz[" in line]
    assert [line.split(": ", 1)[1].split(" (")[0] for line in lines] == [["a", "b", "c"][c] for c in want]
