"""ONNX, by two routes.

- `export_onnx`: jax2onnx traces the JAX function straight to ONNX, with a symbolic batch axis "B". Opset 18 at
  least: at 13 and 17 the normalisation and global-pooling graphs it emits are invalid.
- `tflite_to_onnx`: tf2onnx reads a .tflite file (the original template's route; tf2onnx cannot read jax2tf's
  `XlaCallModule` op, so it never sees the TensorFlow graph). tf2onnx lowers Select as
  `Cast(c) * x + Cast(!c) * y`, so an infinite value in the branch not taken turns into NaN (inf * 0); here every
  Select becomes an ONNX `Where`, which takes one branch per element.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import jax

OPSET = 18


def export_onnx(fn: Callable, spec: jax.ShapeDtypeStruct, *, dynamic_batch: bool = True, opset: int = OPSET,
                input_name: str = "input", output_name: str = "logits") -> bytes:
    """The .onnx bytes of fn(x) for inputs like spec, via jax2onnx; the batch axis is "B" when dynamic_batch."""
    import jax2onnx

    if opset < 18:
        raise ValueError(f"opset {opset}: jax2onnx needs 18 or later for valid normalisation and pooling graphs")
    shape = ("B", *spec.shape[1:]) if dynamic_batch else tuple(spec.shape)
    model = jax2onnx.to_onnx(fn, [jax.ShapeDtypeStruct(shape, spec.dtype)], model_name="model", opset=opset,
                             input_names=[input_name], output_names=[output_name])
    return model.SerializeToString()


def _select_as_where(ctx, node, name, args):
    # Select's own opset-9 handler emits Where when it thinks NaN/inf can occur; tell it they always can.
    from tf2onnx.onnx_opset.controlflow import Select

    node.set_attr("handles_nan", True)
    Select.version_9(ctx, node)


def tflite_to_onnx(tflite: bytes, *, opset: int = OPSET, input_name: str = "input",
                   output_name: str = "logits") -> bytes:
    """The .onnx bytes of a .tflite model via tf2onnx, with Select as Where and the graph's input/output renamed."""
    import tf2onnx

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.tflite"
        path.write_bytes(tflite)
        model, _ = tf2onnx.convert.from_tflite(
            str(path), opset=opset,
            custom_op_handlers={"Select": (_select_as_where, []), "SelectV2": (_select_as_where, [])})
    rename_io(model, input_name, output_name)
    return model.SerializeToString()


def rename_io(model, input_name: str, output_name: str, batch_name: str = "B") -> None:
    """Renames the graph's single input and output (in every node that uses them) and a symbolic batch axis."""
    graph = model.graph
    (inp,), (out,) = graph.input, graph.output
    renames = {inp.name: input_name, out.name: output_name}
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in (inp, out):
        value.name = renames[value.name]
        batch = value.type.tensor_type.shape.dim[0]
        if batch.HasField("dim_param"):
            batch.dim_param = batch_name
