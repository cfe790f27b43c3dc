"""The TFLite routes of the export-parity matrix (tests/inference/test_export_parity.py holds the cases and the
check): a .tflite with a fixed and with a dynamic batch (run in LiteRT), and ONNX by tf2onnx from each (run in
onnxruntime); and the quantized .tflite held to its bounds."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from inference.formats.tflite import export_tflite, tflite_to_onnx
from inference.predict import OnnxModel, TFLiteModel
from tests.inference.test_export_parity import FIXED, check_matches, flat_fn, output_name, params_for_matrix, setup

ROUTES = ("tflite", "tflite_dynamic", "onnx_via_tflite", "onnx_via_tflite_dynamic")


@functools.cache
def tflite_bytes(case, dynamic):
    _, inputs, _ = setup(case)
    return export_tflite(
        flat_fn(case), inputs.specs, inputs.names, dynamic_batch=dynamic, output_name=output_name(case)
    )


def load(case, route):
    _, inputs, _ = setup(case)
    model = tflite_bytes(case, route.endswith("dynamic"))
    if route.startswith("tflite"):
        return TFLiteModel(model)
    return OnnxModel(tflite_to_onnx(model, inputs.names, output_name=output_name(case)))


@pytest.mark.parametrize("case, route", list(params_for_matrix(ROUTES)))
def test_tflite_matches_jax(case, route):
    check_matches(case, route, load(case, route), dynamic=route.endswith("dynamic"))


# Quantized weights change the outputs by design: each is held to its own bound on max |diff| / max |JAX output|.
QUANTIZED_BOUNDS = {"float16": 1e-2, "dynamic-int8": 1e-1}


@pytest.mark.parametrize("quantize", QUANTIZED_BOUNDS)
def test_quantized_tflite_is_smaller_and_close(quantize):
    fn, named, inputs = setup("mnist_cnn")
    model = export_tflite(named.flat_fn(fn), named.specs, named.names, quantize=quantize, output_name="output")
    runner = TFLiteModel(model)
    assert len(model) < len(tflite_bytes("mnist_cnn", False))
    assert runner.names() == named.names and runner.output_name == "output"
    x = inputs(FIXED, seed=0)
    want, got = np.asarray(jax.jit(fn)(x)), runner(x)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= QUANTIZED_BOUNDS[quantize] * np.abs(want).max()
