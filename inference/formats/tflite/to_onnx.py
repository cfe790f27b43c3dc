"""ONNX from a .tflite by tf2onnx (the original template's route), here from the one LiteRT's converter makes
(`converter.py`). tf2onnx lowers Select as `Cast(c) * x + Cast(!c) * y`, so an infinite value in the branch not
taken turns into NaN (inf * 0); here every Select becomes an ONNX `Where`, which takes one branch per element. And a
dynamic-batch .tflite computes reshape targets with UnsortedSegmentProd, whose generic lowering breaks batched
matmuls (attention); see `_segment_prod`.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

from inference.formats.onnx_export import OPSET
from inference.inputs import names_of


def _select_as_where(ctx, node, name, args):
    # Select's own opset-9 handler emits Where when it thinks NaN/inf can occur; tell it they always can.
    from tf2onnx.onnx_opset.controlflow import Select

    node.set_attr("handles_nan", True)
    Select.version_9(ctx, node)


def _segment_prod(ctx, node, name, args):
    # A dynamic-batch .tflite computes reshape targets (e.g. for batched matmuls) with UnsortedSegmentProd over its
    # shape vector, with constant segment ids where -1 means "leave out". tf2onnx's generic lowering gets those
    # negative ids wrong (the Reshape then fails at run time), so with constant ids: Gather + ReduceProd per segment.
    import numpy as np
    from tf2onnx import utils
    from tf2onnx.onnx_opset.reduction import SegmentSum

    data, ids, count = node.inputs
    vectors = ctx.get_rank(node.input[0]) == 1 and ctx.get_rank(node.input[1]) == 1
    if not (ids.is_const() and count.is_const() and vectors):
        return SegmentSum.any_version(ctx.opset, ctx, node)
    segment_ids = ids.get_tensor_value(as_list=True)
    dtype = ctx.get_dtype(node.input[0])
    pieces = []
    for segment in range(int(count.get_tensor_value())):
        members = [i for i, s in enumerate(segment_ids) if s == segment]
        if not members:  # an empty product is 1
            one = np.ones([1], utils.map_onnx_to_numpy_type(dtype))
            pieces.append(ctx.make_const(utils.make_name(f"{name}_one"), one).output[0])
            continue
        index = ctx.make_const(utils.make_name(f"{name}_members"), np.array(members, np.int64)).output[0]
        gathered = ctx.make_node("Gather", [node.input[0], index], attr={"axis": 0}).output[0]
        pieces.append(ctx.make_node("ReduceProd", [gathered], attr={"keepdims": 1}).output[0])
    outputs, shapes = node.output, [ctx.get_shape(node.output[0])]
    ctx.remove_node(node.name)
    ctx.make_node("Concat", pieces, attr={"axis": 0}, outputs=outputs, shapes=shapes, dtypes=[dtype])


def tflite_to_onnx(
    tflite: bytes, names: list[str], *, opset: int = OPSET, output_name: str | list[str] = "outputs"
) -> bytes:
    """The .onnx bytes of a .tflite model via tf2onnx, with Select as Where and the graph's inputs (the .tflite's,
    named `names`) and output renamed."""
    import tf2onnx

    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        # tf2onnx reads the file with TensorFlow's own (deprecated) interpreter; the warning is not ours to act on.
        warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")
        path = Path(folder) / "model.tflite"
        path.write_bytes(tflite)
        model, _ = tf2onnx.convert.from_tflite(
            str(path),
            opset=opset,
            custom_op_handlers={
                "Select": (_select_as_where, []),
                "SelectV2": (_select_as_where, []),
                "UnsortedSegmentProd": (_segment_prod, []),
            },
        )
    rename_io(model, names, output_name)
    return model.SerializeToString()


def rename_io(model, names: list[str], output_name: str | list[str], batch_name: str = "B") -> None:
    """Gives the graph's inputs their names (`names`, in the .tflite's input order; a SavedModel-made .tflite may
    decorate them as "serving_default_input:0"), its outputs `output_name` (one name, or a list in the graph's
    output order), in every node that uses them, and names a symbolic batch axis."""
    graph = model.graph
    outputs = names_of(output_name)
    if len(outputs) != len(graph.output):
        raise ValueError(f"{len(graph.output)} outputs in the graph, {len(outputs)} names {outputs}")
    renames = {out.name: name for out, name in zip(graph.output, outputs)}
    for position, value in enumerate(graph.input):
        # Only an exact (undecorated) match counts: a short name like "e" is a substring of most decorations.
        bare = value.name.removeprefix("serving_default_").split(":")[0]
        renames[value.name] = bare if bare in names else names[position]
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in (*graph.input, *graph.output):
        value.name = renames[value.name]
        batch = value.type.tensor_type.shape.dim[0]
        if batch.HasField("dim_param"):
            batch.dim_param = batch_name
