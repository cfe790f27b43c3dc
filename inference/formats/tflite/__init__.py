"""The TFLite route, an optional part: a .tflite by `jax.export` and LiteRT's converter (`converter.py`, with LiteRT's
quantizer), and ONNX by tf2onnx from that .tflite (`to_onnx.py`). `inference/routes.py` finds the format and its
routes here; a project without this folder exports ONNX (by jax2onnx) and the JAX artifact. LiteRT's packages come
from requirements-litert.txt. `inference/predict.py`, which ships alone in an export, runs a .tflite with LiteRT's
interpreter where it is installed.
"""

from __future__ import annotations

from inference.formats import Format, Route
from inference.formats.tflite.converter import QUANTIZATIONS, export_tflite
from inference.formats.tflite.to_onnx import tflite_to_onnx

PACKAGES = ("litert_converter", "ai_edge_quantizer", "ai_edge_litert")


def _tflite(fn, specs, names, *, dynamic_batch, output_name, quantize):
    return export_tflite(fn, specs, names, dynamic_batch=dynamic_batch, quantize=quantize, output_name=output_name)


def _onnx(fn, specs, names, *, dynamic_batch, output_name, quantize):
    float_tflite = export_tflite(fn, specs, names, dynamic_batch=dynamic_batch, output_name=output_name)
    return tflite_to_onnx(float_tflite, names, output_name=output_name)


# Fixed batch by default: LiteRT runs a fixed-batch model much faster than a dynamic one (docs/export.md).
FORMATS = (Format("tflite", ".tflite", dynamic=False, rank=0, quantizations=QUANTIZATIONS),)
ROUTES = (
    Route("litert", "tflite", "jax.export -> LiteRT converter (builtin ops)", _tflite, PACKAGES),
    Route(
        "tflite",
        "onnx",
        "tf2onnx from the .tflite (Select as Where)",
        _onnx,
        (*PACKAGES, "tensorflow", "tf2onnx", "onnxruntime"),
    ),
)
