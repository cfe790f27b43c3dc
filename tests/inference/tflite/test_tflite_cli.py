"""The TFLite route of inference/convert_tflite.py on the tiny run folder of tests/inference/test_export_cli.py:
the .tflite in LiteRT's own interpreter, ONNX by tf2onnx from it (asked for, and as the fallback), quantization."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from inference import exporter
from tests.inference.test_export_cli import convert, exported, model_fn, run_dir  # noqa: F401 (fixtures)


def test_the_tflite_equals_the_model_in_litert_s_interpreter(exported, run_dir):
    from ai_edge_litert.interpreter import Interpreter

    x = np.random.default_rng(5).standard_normal((3, 28, 28, 1)).astype(np.float32)
    want = np.asarray(model_fn(run_dir)(x))
    interpreter = Interpreter(model_path=str(exported / "tiny_mnist.tflite"))
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    for row in range(len(x)):  # batch 1
        interpreter.set_tensor(inp["index"], x[row : row + 1])
        interpreter.invoke()
        np.testing.assert_allclose(interpreter.get_tensor(out["index"]), want[row : row + 1], atol=1e-4, rtol=1e-4)


def test_onnx_via_tflite_has_a_symbolic_batch(run_dir, tmp_path):
    assert (
        convert(
            "--run",
            run_dir,
            "--name",
            "v",
            "--output-dir",
            tmp_path,
            "--formats",
            "onnx",
            "--onnx-via",
            "tflite",
            "--val-examples",
            8,
        )
        == 0
    )
    (entry,) = json.loads((tmp_path / "v" / "report.json").read_text())["formats"]
    assert entry["route"].startswith("tf2onnx") and entry["inputs"][0]["shape"] == "[B,28,28,1]"
    assert (entry["inputs"][0]["name"], entry["output"]["name"]) == ("input", "outputs")


def test_quantized_tflite_reports_drift(exported, run_dir, tmp_path):
    assert (
        convert(
            "--run",
            run_dir,
            "--name",
            "q",
            "--output-dir",
            tmp_path,
            "--formats",
            "tflite",
            "--quantize",
            "dynamic-int8",
            "--max-accuracy-drop",
            100,
        )
        == 0
    )
    (entry,) = json.loads((tmp_path / "q" / "report.json").read_text())["formats"]
    float_entry = json.loads((exported / "report.json").read_text())["formats"][0]
    assert entry["quantize"] == "dynamic-int8" and entry["bytes"] < float_entry["bytes"]
    assert entry["validation"]["max_abs_diff"] > 0 and entry["validation"]["quality"] is not None


def test_onnx_falls_back_to_the_other_route(run_dir, tmp_path, monkeypatch, capsys):
    original = exporter.export_bytes

    def no_jax2onnx(route, *args, **kwargs):
        if route == "jax2onnx":
            raise RuntimeError("unsupported primitive")
        return original(route, *args, **kwargs)

    monkeypatch.setattr(exporter, "export_bytes", no_jax2onnx)
    assert (
        convert("--run", run_dir, "--name", "f", "--output-dir", tmp_path, "--formats", "onnx", "--val-examples", 4)
        == 0
    )
    assert "trying tf2onnx" in capsys.readouterr().out
    (entry,) = json.loads((tmp_path / "f" / "report.json").read_text())["formats"]
    assert entry["route"].startswith("tf2onnx") and "unsupported primitive" in entry["failed_routes"][0]


def test_onnx_from_tflite_keeps_short_input_names_apart():
    """Two inputs through tf2onnx, one of them int32 and named by a prefix of the other: each keeps its name, dtype
    and place."""
    import onnxruntime as ort

    from inference.formats.tflite import export_tflite, tflite_to_onnx

    def fn(e, ef):
        return e * 2.0 + ef.astype(jnp.float32)

    specs = [jax.ShapeDtypeStruct((1, 3), jnp.float32), jax.ShapeDtypeStruct((1, 3), jnp.int32)]
    names = ["e", "ef"]
    session = ort.InferenceSession(
        tflite_to_onnx(export_tflite(fn, specs, names), names), providers=["CPUExecutionProvider"]
    )
    assert [(i.name, i.type) for i in session.get_inputs()] == [("e", "tensor(float)"), ("ef", "tensor(int32)")]
    e, ef = np.ones((1, 3), np.float32), np.array([[1, 2, 3]], np.int32)
    np.testing.assert_array_equal(session.run(["outputs"], {"e": e, "ef": ef})[0], [[3.0, 4.0, 5.0]])
