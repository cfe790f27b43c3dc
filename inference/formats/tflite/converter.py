"""TFLite: `jax.export` lowers the model to StableHLO, LiteRT's converter (litert-converter) legalises it to TFLite
builtin ops, and LiteRT's quantizer (ai-edge-quantizer) quantizes the weights when asked. No TensorFlow.

The route before JAX 0.12, jax2tf -> `TFLiteConverter`, no longer works there: TensorFlow 2.21 cannot legalise the
symbolic-batch StableHLO that JAX 0.12 writes (none of the parity matrix's cases converted). The batch is fixed by
default: LiteRT runs a fixed-batch model much faster than a dynamic one, whose graph is mostly shape arithmetic.
litert-converter is installed from requirements-litert.txt, without its declared dependencies (the reason is there).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

from inference.inputs import names_of

QUANTIZATIONS = ("float16", "dynamic-int8")
PLATFORM = "cpu"  # one platform: several would add a platform-index input to the module
SIGNATURE = "serving_default"


@contextlib.contextmanager
def native_stderr_silenced():
    """File descriptor 2 to /dev/null for the block: silences what compiled code writes there directly. Python
    exceptions raised in the block still propagate."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def export_tflite(
    fn: Callable,
    specs: list,
    names: list[str],
    *,
    dynamic_batch: bool = False,
    quantize: str | None = None,
    output_name: str | list[str] = "outputs",
) -> bytes:
    """The .tflite bytes of fn(*inputs) for inputs like `specs` (named `names`; their batch axis left open when
    dynamic_batch), each with its own dtype. `output_name`: a list names each output of an fn that returns a tuple.

    quantize: None (float32), "float16" (float16 weights) or "dynamic-int8" (int8 weights, dynamic-range
    quantised activations in the matmuls and convolutions).
    """
    with native_stderr_silenced():  # its library logs "oneDNN custom operations are on" on load, past Python
        from litert_converter.mlir import ir, passmanager
        from litert_converter.mlir._mlir_libs import converter_api_ext as converter

    from inference.formats.jax_export import exported

    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    stablehlo = exported(fn, specs, dynamic_batch=dynamic_batch, platforms=(PLATFORM,)).mlir_module()
    context = ir.Context()
    converter.prepare_mlir_context(context)
    with context, ir.Location.unknown():
        module = ir.Module.parse(stablehlo)
        converter.run_convert_to_tfl_passes(module, passmanager.PassManager(), converter.ConvertToTFLConfig())
        converter.set_signature(module.operation, SIGNATURE, list(names), names_of(output_name))
        model = converter.export_flatbuffer_to_bytes(module.operation)
    model = rename_tensors(model, names, output_name)
    return quantized(model, quantize) if quantize else model


def rename_tensors(model: bytes, names: list[str], output_name: str | list[str]) -> bytes:
    """The model with its input tensors called `names` and its outputs `output_name` (one, or a list in the
    graph's output order): the converter prefixes the signature's name to each ("serving_default_input")."""
    from ai_edge_litert.tools import flatbuffer_utils

    tree = flatbuffer_utils.convert_bytearray_to_object(bytearray(model))
    graph = tree.subgraphs[0]
    for index, name in zip(graph.inputs, names):
        graph.tensors[index].name = name.encode()
    outputs = names_of(output_name)
    if len(outputs) != len(graph.outputs):
        raise ValueError(f"{len(graph.outputs)} outputs in the graph, {len(outputs)} names {outputs}")
    for index, name in zip(graph.outputs, outputs):
        graph.tensors[index].name = name.encode()
    return bytes(flatbuffer_utils.convert_object_to_bytearray(tree))


def quantized(model: bytes, quantize: str) -> bytes:
    """float16: the weights of every op that has them stored as float16, computed in float32 (FLOAT_CASTING).
    dynamic-int8: TFLiteConverter's former default (`dynamic_legacy_wi8_afp32`): int8 weights per channel for
    tensors of 1024 elements or more, activations quantised on the fly."""
    from ai_edge_quantizer import algorithm_manager, qtyping, quantizer, recipe, recipe_manager

    if quantize == "float16":
        manager = recipe_manager.RecipeManager()
        manager.add_weight_only_config(
            regex=".*",
            operation_name=qtyping.TFLOperationName.ALL_SUPPORTED,
            num_bits=16,
            algorithm_key=algorithm_manager.AlgorithmName.FLOAT_CASTING,
        )
        chosen = manager.get_quantization_recipe()
    else:
        chosen = recipe.dynamic_legacy_wi8_afp32()
    result = quantizer.Quantizer(bytearray(model), chosen).quantize(
        enable_progress_bar=False, enable_progress_report=False
    )
    return bytes(result.quantized_model)
