"""TFLite: jax2tf -> `tf.function` -> `TFLiteConverter.from_concrete_functions`, TFLite builtin ops only.

jax2tf embeds the model as one StableHLO `XlaCallModule` op, which the converter legalises to builtin ops. The batch
is fixed by default: LiteRT runs a fixed-batch model much faster than a dynamic one, whose graph is mostly shape
arithmetic. TensorFlow is imported here and in the converter only, never on the training path.
"""

from __future__ import annotations

import os
from collections.abc import Callable

QUANTIZATIONS = ("float16", "dynamic-int8")


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def export_tflite(
    fn: Callable,
    specs: list,
    names: list[str],
    *,
    dynamic_batch: bool = False,
    quantize: str | None = None,
    output_name: str = "outputs",
) -> bytes:
    """The .tflite bytes of fn(*inputs) for inputs like `specs` (named `names`; their batch axis left open when
    dynamic_batch), each with its own dtype.

    quantize: None (float32), "float16" (float16 weights) or "dynamic-int8" (int8 weights, dynamic-range
    quantised activations in the matmuls and convolutions).
    """
    from jax.experimental import jax2tf

    tf = _tf()
    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    signature = [
        tf.TensorSpec([None if dynamic_batch else s.shape[0], *s.shape[1:]], tf.as_dtype(s.dtype), name=n)
        for s, n in zip(specs, names)
    ]
    polymorphic = ["(b, ...)"] * len(specs) if dynamic_batch else None
    converted = jax2tf.convert(fn, polymorphic_shapes=polymorphic, with_gradient=False)
    tf_fn = tf.function(converted, autograph=False, input_signature=signature)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([tf_fn.get_concrete_function()], tf_fn)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    return rename_output(converter.convert(), output_name)


def rename_output(model: bytes, name: str) -> bytes:
    """The model with its output tensor called `name`: a concrete function's output is always "Identity"."""
    from tensorflow.lite.tools import flatbuffer_utils

    tree = flatbuffer_utils.convert_bytearray_to_object(bytearray(model))
    graph = tree.subgraphs[0]
    (output,) = graph.outputs
    graph.tensors[output].name = name.encode()
    return bytes(flatbuffer_utils.convert_object_to_bytearray(tree))
