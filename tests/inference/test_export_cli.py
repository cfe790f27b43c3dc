"""inference/convert_tflite.py end to end on a tiny run folder, and inference/predict.py on what it wrote.

The run folder (config, checkpoint) and its MNIST-format data are built here in a temporary folder. The exported
files are checked with the runtimes' own APIs, independently of the converter's runner classes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_loader.sources.idx import write_idx
from data_loader.sources.mnist import SOURCES
from inference import convert_tflite, exporter
from inference.routes import ROUTES
from model.modules.linear import Linear
from model.modules.module import Module
from training.config.components import build
from training.config.validation import load_config
from training.run import checkpoint

REPO = Path(__file__).resolve().parents[2]
N_VAL = 40
PREDICTABLE = [exporter.SUFFIX[f] for f in exporter.FORMATS if f != "jax"]  # the files predict.py runs


def write_config(folder: Path, data_dir: Path, model: dict, loader: str = "mnist", loss: str = "cross_entropy") -> Path:
    loader = {
        "name": loader,
        "args": {"data_dir": str(data_dir), "verify": False, "validation_size": N_VAL, "batch_size": 16},
    }
    config = {
        "name": "tiny",
        "seed": 0,
        "model": model,
        "loss": {"name": loss},
        "metrics": [{"name": "accuracy"}],
        "optimizer": {"name": "adamw", "args": {"lr": 1e-3}},
        "data_loader": {
            "train": {**loader, "args": {**loader["args"], "split": "train"}},
            "validation": {**loader, "args": {**loader["args"], "split": "validation"}},
        },
        "trainer": {"epochs": 1, "save_dir": str(folder)},
    }
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """saved/<name>/<run_id>-like folder: config.json and model_best.params of a small CNN (random weights)."""
    root = tmp_path_factory.mktemp("run")
    rng = np.random.default_rng(0)
    data = root / "data"
    data.mkdir()
    for prefix, n in (("train", 100), ("t10k", 20)):
        write_idx(data / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)).astype(np.uint8))
        write_idx(data / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n).astype(np.uint8))
    config_path = write_config(root, data, {"name": "mnist_cnn", "args": {"channels": [4, 8], "hidden": 16}})
    model = build(load_config(config_path)["model"], "model")
    params, state = model.init(jax.random.PRNGKey(1), jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    checkpoint.save(root / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 7})
    return root


def model_fn(run: Path):
    """The JAX model of a run folder, rebuilt from its files (what the export must equal)."""
    model = build(load_config(run / "config.json")["model"], "model")
    spec = jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32)
    template = jax.eval_shape(lambda: dict(zip(("params", "state"), model.init(jax.random.PRNGKey(0), spec))))
    tree, _ = checkpoint.restore(run / "model_best.params", template, only=("params", "state"))
    return jax.jit(lambda x: model(tree["params"], tree["state"], x)[0])


def convert(*args) -> int:
    return convert_tflite.main([str(a) for a in args])


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("inference")
    assert convert("--run", run_dir, "--name", "tiny_mnist", "--output-dir", out) == 0
    return out / "tiny_mnist"


def test_writes_every_format_and_report(exported, run_dir):
    files = {p.name for p in exported.iterdir()}
    assert {
        *(f"tiny_mnist{exporter.SUFFIX[f]}" for f in exporter.FORMATS),
        "config.json",
        "model",
        "report.json",
        "predict.py",
        "csv_cells.py",
        "preprocessing.json",
    } <= files
    assert (exported / "model" / "model.py").is_file()
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    report = json.loads((exported / "report.json").read_text())
    entries = {e["format"]: e for e in report["formats"]}
    assert list(entries) == list(exporter.FORMATS)
    for fmt, entry in entries.items():  # each format's own default batch (TFLite's fixed at --input's, 1)
        assert entry["inputs"][0]["shape"] == ("[B,28,28,1]" if exporter.Options().dynamic[fmt] else "[1,28,28,1]")
    assert entries["onnx"]["inputs"][0]["shape"] == entries["jax"]["inputs"][0]["shape"] == "[B,28,28,1]"
    for fmt in set(entries) - {"jax"}:
        assert (entries[fmt]["inputs"][0]["name"], entries[fmt]["output"]["name"]) == ("input", "outputs")
    assert report["task"] == "classification" and report["validated_on_real_data"] is True
    assert report["validation"] == {"split": "validation", "examples": N_VAL} and "validation_skipped" not in report
    assert report["fixed_axes"] == {"input": [28, 28, 1]}
    text = (exported / "report.md").read_text()
    assert text.startswith("| format |") and "top-1 agreement | accuracy (JAX) |" in text
    assert f"Checked on {N_VAL} real examples of the validation split" in text
    for e in entries.values():
        assert e["bytes"] == (exported / e["file"]).stat().st_size
        assert e["validation"]["examples"] == N_VAL and e["validation"]["agreement"] == 1.0
        assert e["validation"]["quality"] == e["validation"]["jax_quality"]
        assert max(e["random"]["max_abs_diff"], e["validation"]["max_abs_diff"]) <= 1e-4
    assert entries["jax"]["random"]["batch_sizes"] == [1, 16]
    prep = json.loads((exported / "preprocessing.json").read_text())
    assert (prep["mean"], prep["std"]) == (SOURCES["mnist"]["mean"], SOURCES["mnist"]["std"])
    assert prep["classes"] == [str(d) for d in range(10)] and prep["task"] == "classification"
    assert prep["inputs"] == [{"name": "input", "shape": "[B,28,28,1]", "dtype": "float32"}]


def test_artifacts_equal_the_model_in_their_own_runtimes(exported, run_dir):
    import onnxruntime as ort

    forward = model_fn(run_dir)
    x = np.random.default_rng(5).standard_normal((3, 28, 28, 1)).astype(np.float32)
    want = np.asarray(forward(x))

    session = ort.InferenceSession(str(exported / "tiny_mnist.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["outputs"], {"input": x})[0], want, atol=1e-4, rtol=1e-4)

    exp = jax.export.deserialize(bytearray((exported / "tiny_mnist.jax").read_bytes()))
    np.testing.assert_array_equal(np.asarray(exp.call(x)), want)


def test_existing_folder_needs_force(exported, run_dir):
    marker = exported / "marker"
    marker.write_text("keep")
    with pytest.raises(SystemExit) as exit_info:
        convert("--run", run_dir, "--name", "tiny_mnist", "--output-dir", exported.parent, "--formats", "jax")
    assert exit_info.value.code == 2 and marker.read_text() == "keep"
    marker.unlink()


def test_force_replaces_and_config_weights_input_interface(run_dir, tmp_path):
    args = [
        "-c",
        run_dir / "config.json",
        "-w",
        run_dir / "model_best.params",
        "--input",
        1,
        28,
        28,
        1,
        "--name",
        "m",
        "--output-dir",
        tmp_path,
        "--val-examples",
        8,
    ]
    assert convert(*args, "--formats", "jax") == 0
    first = exporter.FORMATS[0]  # TFLite where the project has it: fixed by default, symbolic by --dynamic-batch
    assert convert(*args, "--formats", first, "--dynamic-batch", "--force") == 0
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert f"m{exporter.SUFFIX[first]}" in files and "m.jax" not in files
    (entry,) = json.loads((tmp_path / "m" / "report.json").read_text())["formats"]
    assert entry["inputs"][0]["shape"] == "[B,28,28,1]" and entry["random"]["batch_sizes"] == [1, 16]


def test_batch_fixes_every_format(run_dir, tmp_path):
    assert (
        convert(
            "--run",
            run_dir,
            "--name",
            "b",
            "--output-dir",
            tmp_path,
            "--batch",
            4,
            "--formats",
            "onnx,jax",
            "--val-examples",
            10,
        )
        == 0
    )
    entries = json.loads((tmp_path / "b" / "report.json").read_text())["formats"]
    assert [e["inputs"][0]["shape"] for e in entries] == ["[4,28,28,1]", "[4,28,28,1]"]
    assert all(e["validation"]["examples"] == 10 for e in entries)  # 10 examples in batches of 4: padding dropped


def test_mismatch_fails_names_the_place_and_writes_nothing(run_dir, tmp_path, monkeypatch, capsys):
    original = exporter.export_bytes

    def off_by_a_bit(route, fn, *args, **kwargs):  # every ONNX route gets the model slightly wrong
        wrong = ROUTES[route].format == "onnx"
        return original(route, (lambda x: fn(x) + 1e-2) if wrong else fn, *args, **kwargs)

    monkeypatch.setattr(exporter, "export_bytes", off_by_a_bit)
    assert (
        convert(
            "--run", run_dir, "--name", "bad", "--output-dir", tmp_path, "--formats", "jax,onnx", "--val-examples", 4
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "onnx: FAILED" in err and "output 'outputs'" in err and "worst at example" in err
    assert "--formats jax" in err  # the format that did pass
    assert list(tmp_path.iterdir()) == []


def test_usage_errors(run_dir, tmp_path):
    for args in (
        ["--name", "x"],
        ["--run", run_dir, "--name", "x", "--formats", "tflite,pt"],
        ["--run", run_dir, "--name", "x", "--formats", "onnx", "--quantize", "float16"],
        ["--run", tmp_path / "nothing", "--name", "x"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            convert(*args, "--output-dir", tmp_path)
        assert exit_info.value.code == 2


def bn_attention_net(num_classes: int = 10):
    """BatchNorm, exact GELU, attention and Dropout in one model (registered as a sample model by the test)."""
    from model.modules.activations import Activation
    from model.modules.attention import MultiHeadAttention
    from model.modules.conv import Conv2d
    from model.modules.dropout import Dropout
    from model.modules.flatten import Flatten
    from model.modules.linear import Linear
    from model.modules.module import Lambda
    from model.modules.normalization import BatchNorm, LayerNorm
    from model.modules.pooling import MaxPool2d
    from model.modules.residual import Residual
    from model.modules.sequential import Sequential

    return Sequential(
        {
            "conv": Conv2d(8, 3, stride=2),
            "bn": BatchNorm(),
            "act": Activation("gelu"),
            "pool": MaxPool2d(2),
            "tokens": Lambda(lambda x: x.reshape(x.shape[0], -1, x.shape[-1]), "tokens"),
            "attn": Residual(MultiHeadAttention(2)),
            "norm": LayerNorm(),
            "drop": Dropout(0.3),
            "flatten": Flatten(),
            "head": Linear(num_classes),
        }
    )


def test_command_on_a_batchnorm_attention_gelu_dropout_model(run_dir, tmp_path, monkeypatch):
    from model import model as samples
    from model import registry

    monkeypatch.setattr(samples, "bn_attention_net", bn_attention_net, raising=False)
    monkeypatch.setitem(registry._REGISTERED["model"], "bn_attention_net", registry.Entry(bn_attention_net))
    run = tmp_path / "run"
    run.mkdir()
    data_dir = load_config(run_dir / "config.json")["data_loader"]["validation"]["args"]["data_dir"]
    config_path = write_config(run, Path(data_dir), {"name": "bn_attention_net", "args": {}})
    model = build(load_config(config_path)["model"], "model")
    params, state = model.init(jax.random.PRNGKey(2), jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    # Running statistics away from (0, 1), so that evaluation-mode BatchNorm is really exercised.
    state = {**state, "bn": {"mean": jnp.linspace(-1.0, 1.0, 8), "var": jnp.linspace(0.5, 2.0, 8)}}
    checkpoint.save(run / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 1})

    assert convert("--run", run, "--name", "bn", "--output-dir", tmp_path / "out", "--val-examples", 16) == 0
    entries = json.loads((tmp_path / "out" / "bn" / "report.json").read_text())["formats"]
    assert [e["format"] for e in entries] == list(exporter.FORMATS)
    assert all(e["validation"]["agreement"] == 1.0 and "failed_routes" not in e for e in entries)


def run_predict(*args) -> str:
    """predict.py in a fresh interpreter in which importing JAX or TensorFlow fails."""
    code = (
        "import runpy, sys\n"
        "for name in ('jax', 'tensorflow', 'tf2onnx', 'jax2onnx', 'litert_converter'): sys.modules[name] = None\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "inference" / "predict.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("suffix", PREDICTABLE)
def test_predict_on_images_and_npy(exported, run_dir, tmp_path, suffix):
    from PIL import Image

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (56, 40)).astype(np.uint8)  # resized to 28x28 by predict.py
    Image.fromarray(pixels).save(tmp_path / "digit.png")
    batch = rng.standard_normal((3, 28, 28, 1)).astype(np.float32)
    np.save(tmp_path / "batch.npy", batch)

    # The expected probabilities: the same resize, MNIST's normalisation, the JAX model, a softmax.
    resized = np.asarray(Image.fromarray(pixels).resize((28, 28), Image.BILINEAR), np.float32)
    image = ((resized / 255.0 - SOURCES["mnist"]["mean"]) / SOURCES["mnist"]["std"])[None, :, :, None]
    probabilities = np.asarray(jax.nn.softmax(model_fn(run_dir)(np.concatenate([image, batch]))))

    out = run_predict(exported / f"tiny_mnist{suffix}", tmp_path / "digit.png", tmp_path / "batch.npy", "--top", 2)
    lines = [line for line in out.splitlines() if line.startswith(str(tmp_path))]
    assert len(lines) == 4
    for line, p in zip(lines, probabilities):
        printed = [
            (int(item.split(" (")[0]), float(item.split(" (")[1].rstrip(")")))
            for item in line.split(": ", 1)[1].split(", ")
        ]
        assert [c for c, _ in printed] == list(np.argsort(-p)[:2])
        np.testing.assert_allclose([q for _, q in printed], p[np.argsort(-p)[:2]], atol=2e-3)


def test_without_real_data_the_report_says_so(run_dir, tmp_path, capsys):
    assert (
        convert("--run", run_dir, "--name", "r", "--output-dir", tmp_path, "--formats", "jax", "--val-examples", 0) == 0
    )
    assert "validation: not checked (--val-examples 0); random inputs only" in capsys.readouterr().out
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["validated_on_real_data"] is False and report["validation"] is None
    assert report["validation_skipped"] == "--val-examples 0" and report["formats"][0]["validation"] is None
    text = (tmp_path / "r" / "report.md").read_text()
    assert "Not checked on real data (--val-examples 0)" in text and "(random inputs)" in text


def test_segmentation_is_judged_by_logit_signs_and_predict_summarises_masks(run_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    data_dir = load_config(run_dir / "config.json")["data_loader"]["validation"]["args"]["data_dir"]
    config_path = write_config(
        run,
        Path(data_dir),
        {"name": "mnist_segmenter", "args": {"channels": [4, 8]}},
        loader="mnist_segmentation",
        loss="binary_cross_entropy",
    )
    model = build(load_config(config_path)["model"], "model")
    params, state = model.init(jax.random.PRNGKey(4), jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32))
    checkpoint.save(run / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 1})

    assert convert("--run", run, "--name", "seg", "--output-dir", tmp_path / "out", "--val-examples", 12) == 0
    out = tmp_path / "out" / "seg"
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == "multilabel"
    for entry in report["formats"]:
        assert entry["output"]["shape"].endswith(",28,28,1]") and entry["validation"]["agreement"] == 1.0
        assert entry["validation"]["quality"] == entry["validation"]["jax_quality"]
    assert "| sign agreement | element accuracy (JAX) |" in (out / "report.md").read_text()

    x = np.random.default_rng(6).standard_normal((2, 28, 28, 1)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    logits = np.asarray(model(params, state, x)[0])
    lines = [line for line in run_predict(out / "seg.onnx", tmp_path / "x.npy").splitlines() if "x.npy[" in line]
    assert len(lines) == 2
    for line, want in zip(lines, logits):
        positive = int(line.split(": ", 1)[1].split(" of ")[0])
        assert abs(positive - int((want > 0).sum())) <= 1 and "of 784 elements positive" in line


class PairNet(Module):
    """{"features": (B, 3), "image": (B, 4, 4, 1)} -> (B, 2) logits: a model of named inputs."""

    def __init__(self):
        self.head = Linear(2)

    def init(self, key, x):
        joined = jax.ShapeDtypeStruct((x["image"].shape[0], 19), jnp.float32)
        return {"head": self.head.init_params(key, joined)}, {}

    def __call__(self, params, state, x, *, train=False, key=None):
        flat = x["image"].reshape(x["image"].shape[0], -1)
        joined = jnp.concatenate([flat * 2.0, jnp.tanh(x["features"])], axis=1)
        return self.head.forward(params["head"], joined), state


def pair_data(split="train", batch_size=8, seed=0):
    """24 examples of named inputs, as a data set of the config's could return them."""
    from data_loader.loader import ArrayDataset, DataLoader

    rng = np.random.default_rng(0 if split == "train" else 1)
    inputs = {
        "image": rng.standard_normal((24, 4, 4, 1)).astype(np.float32),
        "features": rng.standard_normal((24, 3)).astype(np.float32),
    }
    dataset = ArrayDataset(
        input=inputs, target=rng.integers(0, 2, 24).astype(np.int32), preprocessing={"classes": ["no", "yes"]}
    )
    return DataLoader(dataset, batch_size, seed=seed)


def register_run(folder: Path, monkeypatch, loader, model, spec, loss: str = "cross_entropy"):
    """A run folder (config.json, model_best.params of random weights) of a loader and a model of the test's own,
    registered as names a config may use (in this process only)."""
    from data_loader import data_loaders
    from model import model as samples
    from model import registry

    for module, function, kind in ((data_loaders, loader, "data_loader"), (samples, model, "model")):
        monkeypatch.setattr(module, function.__name__, function, raising=False)
        monkeypatch.setitem(registry._REGISTERED[kind], function.__name__, registry.Entry(function))
    folder.mkdir()
    args = {"batch_size": 8}
    config = {
        "name": folder.name,
        "seed": 0,
        "model": {"name": model.__name__, "args": {}},
        "loss": {"name": loss},
        "optimizer": {"name": "adam", "args": {"lr": 1e-3}},
        "trainer": {"monitor": "off"},
        "data_loader": {s: {"name": loader.__name__, "args": {**args, "split": s}} for s in ("train", "validation")},
    }
    (folder / "config.json").write_text(json.dumps(config))
    net = model()
    params, state = net.init(jax.random.PRNGKey(0), spec)
    checkpoint.save(folder / "model_best.params", {"params": params, "state": state}, {"epoch": 1, "step": 1})
    return lambda x: net(params, state, x)[0]


def pair_net():
    return PairNet()


def test_named_inputs_end_to_end_and_predict_reads_npz(tmp_path, monkeypatch):
    run = tmp_path / "pair_run"
    model = register_run(run, monkeypatch, pair_data, pair_net, pair_data().spec["input"])
    assert convert("--run", run, "--name", "pair", "--output-dir", tmp_path / "out") == 0
    out = tmp_path / "out" / "pair"
    report = json.loads((out / "report.json").read_text())
    for entry in report["formats"]:
        assert [(i["name"], i["dtype"]) for i in entry["inputs"]] == [("features", "float32"), ("image", "float32")]
        assert entry["validation"]["examples"] == 24 and entry["validation"]["agreement"] == 1.0
    assert report["fixed_axes"] == {"features": [3], "image": [4, 4, 1]}
    prep = json.loads((out / "preprocessing.json").read_text())
    assert [i["name"] for i in prep["inputs"]] == ["features", "image"] and prep["classes"] == ["no", "yes"]

    data = pair_data("validation").dataset.arrays["input"]
    np.savez(tmp_path / "pair.npz", image=data["image"][:3], features=data["features"][:3])
    want = np.asarray(jax.nn.softmax(model({k: v[:3] for k, v in data.items()})))
    for suffix in PREDICTABLE:
        lines = [
            line
            for line in run_predict(out / f"pair{suffix}", tmp_path / "pair.npz", "--top", 1).splitlines()
            if "pair.npz[" in line
        ]
        assert [line.split(": ", 1)[1].split(" (")[0] for line in lines] == [["no", "yes"][c] for c in want.argmax(1)]


MEAN, STD = [0.2, 0.5, 0.7], [0.3, 0.2, 0.25]  # per channel, on pixels scaled to [0, 1]


def rgb_data(split="train", batch_size=8, seed=0):
    """Colour images normalised per channel, whose preprocessing says how (what predict.py must repeat)."""
    from data_loader.loader import ArrayDataset, DataLoader

    rng = np.random.default_rng(0 if split == "train" else 1)
    pixels = rng.integers(0, 256, (20, 6, 5, 3)) / 255.0
    images = ((pixels - MEAN) / STD).astype(np.float32)
    preprocessing = {"classes": ["red", "green", "blue"], "pixel_scale": 1 / 255, "mean": MEAN, "std": STD}
    dataset = ArrayDataset(input=images, target=rng.integers(0, 3, 20).astype(np.int32), preprocessing=preprocessing)
    return DataLoader(dataset, batch_size, seed=seed)


def rgb_mlp():
    from model.model import mlp

    return mlp(num_classes=3, hidden=(8,))


def test_per_channel_normalisation_end_to_end(tmp_path, monkeypatch):
    from PIL import Image

    model = register_run(
        tmp_path / "rgb_run", monkeypatch, rgb_data, rgb_mlp, jax.ShapeDtypeStruct((1, 6, 5, 3), jnp.float32)
    )
    assert (
        convert("--run", tmp_path / "rgb_run", "--name", "rgb", "--output-dir", tmp_path / "out", "--formats", "onnx")
        == 0
    )
    out = tmp_path / "out" / "rgb"
    prep = json.loads((out / "preprocessing.json").read_text())
    assert (prep["mean"], prep["std"], prep["task"]) == (MEAN, STD, "classification")

    pixels = np.random.default_rng(7).integers(0, 256, (12, 10, 3)).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "colour.png")  # twice the model's size: predict.py resizes it
    resized = np.asarray(Image.fromarray(pixels).resize((5, 6), Image.BILINEAR), np.float32)
    want = np.asarray(jax.nn.softmax(model(((resized / 255.0 - MEAN) / STD)[None].astype(np.float32))))[0]
    (line,) = [
        x
        for x in run_predict(out / "rgb.onnx", tmp_path / "colour.png", "--top", 3).splitlines()
        if x.startswith(str(tmp_path))
    ]
    printed = [item.split(" (") for item in line.split(": ", 1)[1].split(", ")]
    assert [name for name, _ in printed] == [["red", "green", "blue"][c] for c in np.argsort(-want)]
    np.testing.assert_allclose([float(p.rstrip(")")) for _, p in printed], np.sort(want)[::-1], atol=2e-3)
