"""The CIFAR-10 ResNet sample: the model (shapes, parameter count, the projection shortcut against its explicit
computation, gradients), and end to end on generated CIFAR-10 *binary* files with its own config: a run stopped
mid-epoch and resumed ends bit-identical to one never stopped (augmentation on), test.py, the export's parity, and
predict.py on a PNG of another size prepared exactly as training prepared its images."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from model.model import cifar_resnet, resnet_block
from model.modules.activations import Activation
from model.modules.conv import Conv2d
from model.modules.linear import Linear
from model.modules.normalization import BatchNorm
from model.modules.residual import Residual
from model.modules.sequential import Sequential
from training.run.figures import plots

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# ------------------------------------------------------------------------------------------------------ the model
def count(tree) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


def random_init(module, spec, seed=0):
    """Params and state of `module` for `spec`, shaped by an abstract init (compiling the initialisers costs
    seconds) and filled with random numbers; variances stay positive."""
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), spec))
    rng = np.random.default_rng(seed)
    fill = lambda path, leaf: jnp.asarray(  # noqa: E731
        rng.uniform(0.5, 1.5, leaf.shape) if path[-1].key == "var" else 0.3 * rng.standard_normal(leaf.shape),
        leaf.dtype,
    )
    return jax.tree_util.tree_map_with_path(fill, shapes)


def test_cifar_resnet_shapes_parameters_and_shortcuts():
    spec = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    params, state = jax.eval_shape(lambda: cifar_resnet().init(jax.random.PRNGKey(0), spec))
    # ResNet-20: 3 stages of 3 basic blocks, two 1x1 projections; 0.27 M parameters as in the paper
    assert count(params) == 272_474
    assert [len(params[f"stage{i}"]) for i in range(3)] == [3, 3, 3]
    projected = [(i, b) for i in range(3) for b in range(3) if "shortcut" in params[f"stage{i}"][str(b)]["residual"]]
    assert projected == [(1, 0), (2, 0)]
    assert params["stage1"]["0"]["residual"]["shortcut"]["conv"]["weight"].shape == (1, 1, 16, 32)
    assert set(state["stage2"]["0"]["residual"]["shortcut"]["bn"]) == {"mean", "var"}
    net = cifar_resnet(num_classes=7, depth=8, widths=(4, 8))
    spec = jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.float32)
    p, s = random_init(net, spec)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.shape)
    logits, new_state = jax.jit(lambda p, s, x: net(p, s, x, train=True))(p, s, x)
    assert logits.shape == (2, 7) and bool(jnp.all(jnp.isfinite(logits)))
    assert jax.tree.structure(new_state) == jax.tree.structure(s)
    moved = new_state["stage1"]["0"]["residual"]["shortcut"]["bn"]["mean"]
    assert not np.allclose(moved, s["stage1"]["0"]["residual"]["shortcut"]["bn"]["mean"])  # updated in training
    for depth in (9, 21):
        with pytest.raises(ValueError, match=r"depth: must be 6 n \+ 2"):
            cifar_resnet(depth=depth)


def test_residual_shortcut_equals_its_explicit_computation_with_gradients():
    body = Sequential({"conv": Conv2d(6, 3, stride=2, use_bias=False), "bn": BatchNorm(), "act": Activation("relu")})
    shortcut = Sequential({"conv": Conv2d(6, 1, stride=2, use_bias=False), "bn": BatchNorm()})
    block = Residual(body, shortcut)
    spec = jax.ShapeDtypeStruct((2, 4, 4, 2), jnp.float64)
    with jax.enable_x64(True):
        params, state = random_init(block, spec)
        assert set(params) == {"conv", "bn", "act", "shortcut"}
        body_params = {k: v for k, v in params.items() if k != "shortcut"}
        body_state = {k: v for k, v in state.items() if k != "shortcut"}
        x = jax.random.normal(jax.random.PRNGKey(1), spec.shape, jnp.float64)
        for train in (False, True):
            got, new_state = jax.jit(lambda p, s, x: block(p, s, x, train=train))(params, state, x)
            y, want_body_state = body(body_params, body_state, x, train=train)
            s, want_short_state = shortcut(params["shortcut"], state["shortcut"], x, train=train)
            np.testing.assert_allclose(got, y + s, rtol=1e-12)
            np.testing.assert_allclose(new_state["shortcut"]["bn"]["mean"], want_short_state["bn"]["mean"])
            np.testing.assert_allclose(new_state["bn"]["var"], want_body_state["bn"]["var"])
        check_grads(jax.jit(lambda p, x: block(p, state, x, train=True)[0]), (params, x), order=1, modes=("rev",))
    # an identity block keeps the plain Residual's parameter layout
    plain, _ = random_init(resnet_block(4), jax.ShapeDtypeStruct((1, 8, 8, 4), jnp.float32))
    assert set(plain["residual"]) == {"conv1", "bn1", "relu", "conv2", "bn2"}
    with pytest.raises(ValueError, match="child named 'shortcut'"):
        random_init(Residual(Sequential({"shortcut": Linear(3)}), Linear(3)), jax.ShapeDtypeStruct((1, 3), jnp.float32))


# ------------------------------------------------------------------------------------------------- end to end
def write_cifar10(folder: Path, per_file: int = 24, seed: int = 0) -> None:
    """data_batch_1..5.bin and test_batch.bin in the published binary layout (a label byte, then the red, green and
    blue 32x32 planes), and batches.meta.txt. The label is drawn as a bright row band, so there is something to
    learn."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        labels = rng.integers(0, 10, per_file).astype(np.uint8)
        images = rng.integers(0, 90, (per_file, 32, 32, 3)).astype(np.uint8)
        for i, label in enumerate(labels):
            images[i, 3 * label : 3 * label + 3, :, :] = 250
        planes = images.transpose(0, 3, 1, 2).reshape(per_file, -1)
        (folder / name).write_bytes(np.concatenate([labels[:, None], planes], axis=1).tobytes())
    (folder / "batches.meta.txt").write_text("\n".join(CLASSES) + "\n\n")


def sample_config(tmp_path: Path, data_dir: Path) -> Path:
    """configs/cifar10_resnet.json, shrunk: the generated files, a small ResNet, 1 epoch of 6 steps, 2 per call,
    mixup added to the sample's crop + flip + normalize (soft targets through the whole loop)."""
    config = json.loads((ROOT / "configs" / "cifar10_resnet.json").read_text())
    for _split, loader in config["data_loader"].items():
        loader["args"].update(data_dir=str(data_dir), download=False, verify=False, validation_size=24, batch_size=16)
    config["data_loader"]["train"]["augment"].append({"name": "mixup", "args": {"alpha": 0.4, "p": 0.5}})
    config["model"]["args"].update(depth=8, widths=[4, 8])
    config["trainer"].update(epochs=1, save_dir=str(tmp_path / "saved"), log_every=1, steps_per_call=2, save_period=1)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def run(*args, env=None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
    )


@pytest.mark.slow
def test_cifar10_resnet_sample_end_to_end(tmp_path):
    from tests.end_to_end.test_run_faults import FAULTY_TRAIN
    from training.run import checkpoint

    data_dir = tmp_path / "cifar10"
    write_cifar10(data_dir)
    config = sample_config(tmp_path, data_dir)
    reference = run("train.py", "-c", config, "--run-id", "ref")
    assert reference.returncode == 0, reference.stderr
    ref_dir = tmp_path / "saved" / "cifar10_resnet" / "ref"
    # SIGTERM once step 2 is checked (while the call of steps 3-4 runs): the position is saved at the next call
    # boundary (step 4 of 6), then resumed
    stopped = run("-c", FAULTY_TRAIN, "-c", config, "--run-id", "cut", env={"FAULT": "step:2:SIGTERM"})
    assert stopped.returncode == 143, stopped.stderr
    cut_dir = tmp_path / "saved" / "cifar10_resnet" / "cut"
    assert checkpoint.read(cut_dir / "checkpoint-latest.params")[1]["position"] == 4
    resumed = run("train.py", "-r", cut_dir / "checkpoint-latest.params")
    assert resumed.returncode == 0, resumed.stderr
    want, want_header = checkpoint.read(ref_dir / "checkpoint-latest.params")
    got, header = checkpoint.read(cut_dir / "checkpoint-latest.params")
    assert header["step"] == want_header["step"] == 6 and set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    rows_of = lambda run_dir: [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}  # noqa
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    rows = rows_of(ref_dir)
    assert rows == rows_of(cut_dir)
    assert all(math.isfinite(rows[0][k]) for k in ("train/loss", "train/accuracy", "val/loss", "val/accuracy"))

    # the run's preprocessing: the data's class names and size, the augmentation's normalisation folded in
    preprocessing = json.loads((ref_dir / "preprocessing.json").read_text())
    assert preprocessing["classes"] == CLASSES
    assert preprocessing["pixel_scale"] == pytest.approx(1 / 255)
    assert preprocessing["mean"] == [0.4914, 0.4822, 0.4465] and preprocessing["std"] == [0.2470, 0.2435, 0.2616]

    tested = run("test.py", "--run", ref_dir)
    assert tested.returncode == 0, tested.stderr
    assert "accuracy" in tested.stdout and "task: classification" in tested.stdout
    assert "airplane" in tested.stdout  # the per-class table names the classes
    assert plots() is None or (ref_dir / "confusion_matrix.png").is_file()  # training/plots/ draws it

    out = tmp_path / "inference"
    exported = run(
        "inference/convert_tflite.py", "--run", ref_dir, "--name", "cifar", "--output-dir", out, "--formats", "onnx,jax"
    )
    assert exported.returncode == 0, exported.stderr + exported.stdout
    report = json.loads((out / "cifar" / "report.json").read_text())
    assert report["validated_on_real_data"] and report["validation"]["examples"] == 24
    assert all(entry["validation"]["agreement"] == 1.0 for entry in report["formats"])
    assert report["inputs"][0]["dtype"] == "float32"  # the model's input: normalised, not the stored uint8

    # predict.py on a PNG of another size and with an alpha channel: resized and normalised as training did
    from PIL import Image

    from inference.predict import load_image
    from training.config.validation import build_augment, load_config

    rng = np.random.default_rng(3)
    png = tmp_path / "photo.png"
    Image.fromarray(rng.integers(0, 256, (45, 50, 4)).astype(np.uint8), "RGBA").save(png)
    shipped = json.loads((out / "cifar" / "preprocessing.json").read_text())
    got = load_image(png, (32, 32, 3), shipped)
    with Image.open(png) as image:  # what the image-folder loader stores for this file
        pixels = np.asarray(image.convert("RGB").resize((32, 32), Image.BILINEAR), np.uint8)
    augment = build_augment(load_config(config))
    want = augment({"input": pixels[None]}, None, train=False)["input"][0]
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)
    predicted = run(out / "cifar" / "predict.py", out / "cifar" / "cifar.onnx", png)
    assert predicted.returncode == 0, predicted.stderr
    line = predicted.stdout.strip().splitlines()[-1]
    assert line.startswith(f"{png}:") and any(name in line for name in CLASSES)
