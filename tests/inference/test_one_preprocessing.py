"""One preprocessing everywhere (issue 49, item 4): the same raw array (uint8 pixels as MNIST's files hold them)
through ``load_run(...)(x, raw=True)``, predict.py ``--raw`` on the ONNX and TFLite files and the jax.export artifact
gives the same outputs; without the flag each takes the array as the model takes it, and the same prepared array
gives the same outputs again."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from data_loader.sources.mnist import SOURCES
from inference.trained_run import load_run
from tests.inference.test_export_cli import PREDICTABLE, exported, run_dir, run_predict, write_config  # noqa: F401
from training.config.file import ConfigError

TOLERANCE = {".onnx": 1e-5, ".tflite": 1e-4}  # LiteRT's kernels round differently from XLA's


def test_one_raw_array_gives_one_answer_everywhere(exported, run_dir, tmp_path):  # noqa: F811
    pixels = np.random.default_rng(5).integers(0, 256, (4, 28, 28, 1)).astype(np.uint8)
    np.save(tmp_path / "raw.npy", pixels)
    # what the mnist loader makes of them, by its own published statistics: what the model takes
    prepared = ((pixels / 255.0 - SOURCES["mnist"]["mean"]) / SOURCES["mnist"]["std"]).astype(np.float32)
    np.save(tmp_path / "prepared.npy", prepared)

    loaded = load_run(run_dir)
    expected = loaded(pixels, raw=True)
    np.testing.assert_allclose(loaded(prepared), expected, atol=1e-5)

    for suffix in PREDICTABLE:
        model = exported / f"tiny_mnist{suffix}"
        run_predict(model, tmp_path / "raw.npy", "--raw", "--out", tmp_path / "raw_out.npy")
        run_predict(model, tmp_path / "prepared.npy", "--out", tmp_path / "prepared_out.npy")
        np.testing.assert_allclose(np.load(tmp_path / "raw_out.npy"), expected, atol=TOLERANCE[suffix])
        np.testing.assert_allclose(np.load(tmp_path / "prepared_out.npy"), expected, atol=TOLERANCE[suffix])

    artifact = jax.export.deserialize(bytearray((exported / "tiny_mnist.jax").read_bytes()))
    np.testing.assert_allclose(np.asarray(artifact.call(prepared)), expected, atol=1e-5)


def test_raw_pixels_without_the_flag_are_one_line(run_dir):  # noqa: F811
    with pytest.raises(ConfigError, match=r"inputs of dtype uint8, where the model takes float32: .* need raw=True"):
        load_run(run_dir)(np.zeros((1, 28, 28, 1), np.uint8))


@pytest.mark.parametrize("shape", [(2, 28, 28), (2, 14, 14, 1), (28, 28, 1)])
def test_raw_inputs_of_another_shape_are_one_line(run_dir, shape):  # noqa: F811
    """Before: a TypeError from deep inside the first layer (convolution, dot_general)."""
    message = f"raw=True: inputs of shape {list(shape)}; the model takes a batch of shape [N, 28, 28, 1]"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_run(run_dir)(np.zeros(shape, np.uint8), raw=True)
