"""ONNX by jax2onnx: `export_onnx` traces the JAX function straight to ONNX, with a symbolic batch axis "B". Opset
18 at least: at 13 and 17 the normalisation and global-pooling graphs it emits are invalid. (The other route, tf2onnx
from a .tflite, is the TFLite folder's: `inference/formats/tflite/`.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import jax

from inference.formats import Format, Route
from inference.inputs import names_of
from model.modules import cpu_forms

OPSET = 18


def export_onnx(
    fn: Callable,
    specs: list,
    names: list[str],
    *,
    dynamic_batch: bool = True,
    opset: int = OPSET,
    output_name: str | list[str] = "outputs",
) -> bytes:
    """The .onnx bytes of fn(*inputs) for inputs like `specs` (named `names`), via jax2onnx; the batch axis is "B"
    when dynamic_batch. `output_name`: a list names each output of an fn that returns a tuple of them."""
    import jax2onnx

    if opset < 18:
        raise ValueError(f"opset {opset}: jax2onnx needs 18 or later for valid normalisation and pooling graphs")
    shapes = [jax.ShapeDtypeStruct(("B", *s.shape[1:]) if dynamic_batch else tuple(s.shape), s.dtype) for s in specs]
    # Traced with jit off, so that nested jits (jax.nn's functions, the layers' own) are inlined: jax2onnx 0.17.1's
    # handler for a jit in the graph names jax._src.core.ClosedJaxpr, which JAX 0.12 merged into Jaxpr.
    # onnx_ir warns about each shape constant jax2onnx leaves untyped; the file's outputs are checked in onnxruntime.
    serde = logging.getLogger("onnx_ir.serde")
    level = serde.level
    serde.setLevel(logging.ERROR)
    try:
        # the plain math: jax2onnx has no handler for the layers' platform switch (model/kernels' XLA:CPU forms)
        with jax.disable_jit(), cpu_forms.cpu_kernels(False):
            model = jax2onnx.to_onnx(
                fn, shapes, model_name="model", opset=opset, input_names=list(names), output_names=names_of(output_name)
            )
        return model.SerializeToString()
    finally:
        serde.setLevel(level)


def _route(fn, specs, names, *, dynamic_batch, output_name, quantize):
    return export_onnx(fn, specs, names, dynamic_batch=dynamic_batch, output_name=output_name)


FORMATS = (Format("onnx", ".onnx", dynamic=True, rank=10),)
ROUTES = (Route("jax2onnx", "onnx", f"jax2onnx (opset {OPSET})", _route, ("onnxruntime", "jax2onnx")),)
