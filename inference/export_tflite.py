"""TFLite: jax2tf -> `tf.function` -> `TFLiteConverter.from_concrete_functions`, TFLite builtin ops only.

jax2tf embeds the model as one StableHLO `XlaCallModule` op, which the converter legalises to builtin ops. The batch
is fixed by default: LiteRT runs a fixed-batch model much faster than a dynamic one, whose graph is mostly shape
arithmetic. TensorFlow is imported here and in the converter only, never on the training path.
"""
from __future__ import annotations

import os
from typing import Callable

import jax

QUANTIZATIONS = ("float16", "dynamic-int8")


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def export_tflite(fn: Callable, spec: jax.ShapeDtypeStruct, *, dynamic_batch: bool = False,
                  quantize: str | None = None, input_name: str = "input", output_name: str = "logits") -> bytes:
    """The .tflite bytes of fn(x) for inputs like spec (its batch axis left open when dynamic_batch).

    quantize: None (float32), "float16" (float16 weights) or "dynamic-int8" (int8 weights, dynamic-range
    quantised activations in the matmuls and convolutions).
    """
    from jax.experimental import jax2tf

    tf = _tf()
    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    shape = [None if dynamic_batch else spec.shape[0], *spec.shape[1:]]
    converted = jax2tf.convert(fn, polymorphic_shapes=["(b, ...)"] if dynamic_batch else None, with_gradient=False)
    tf_fn = tf.function(converted, autograph=False,
                        input_signature=[tf.TensorSpec(shape, tf.as_dtype(spec.dtype), name=input_name)])
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
