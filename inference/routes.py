"""One artifact by one route (the converter that writes it), and the runtime that loads it back: jax.export then
LiteRT's converter (TFLite), jax2onnx, tf2onnx from the .tflite, and jax.export alone. Each converter is imported only
when its route is taken.
"""

from __future__ import annotations

from inference.inputs import Inputs, Outputs

ROUTES = {
    "litert": "jax.export -> LiteRT converter (builtin ops)",
    "jax2onnx": "jax2onnx (opset 18)",
    "tflite": "tf2onnx from the .tflite (Select as Where)",
    "jax.export": "jax.export (StableHLO)",
}
OUTPUT_NAME = "outputs"


def export_bytes(
    route: str,
    fn,
    inputs: Inputs,
    dynamic: bool,
    quantize: str | None = None,
    float_tflite=None,
    outputs: Outputs | None = None,
) -> bytes:
    """One artifact's bytes by `route`; fn takes the input tree; float_tflite() gives the float32 .tflite that route
    "tflite" converts. `outputs`: the model's named outputs when it has several (a dict), each a named output of
    the file; else its one output is OUTPUT_NAME."""
    names = OUTPUT_NAME if outputs is None or outputs.single else outputs.names
    fn = fn if outputs is None else outputs.flat_fn(fn)
    if route == "litert":
        from inference.formats.tflite_export import export_tflite

        return export_tflite(
            inputs.flat_fn(fn), inputs.specs, inputs.names, dynamic_batch=dynamic, quantize=quantize, output_name=names
        )
    if route == "jax2onnx":
        from inference.formats.onnx_export import export_onnx

        return export_onnx(inputs.flat_fn(fn), inputs.specs, inputs.names, dynamic_batch=dynamic, output_name=names)
    if route == "tflite":
        from inference.formats.onnx_export import tflite_to_onnx

        return tflite_to_onnx(float_tflite(), inputs.names, output_name=names)
    if route == "jax.export":
        from inference.formats.jax_export import export_jax

        return export_jax(inputs.flat_fn(fn), inputs.specs, dynamic_batch=dynamic)
    raise ValueError(f"unknown route {route!r}")


def load_runner(path, names: list[str], threads: int | None = None, outputs: Outputs | None = None):
    """The artifact at `path` in its own runtime (a .jax file keeps no names: `outputs` gives those of several)."""
    if path.suffix == ".jax":
        from inference.formats.jax_export import JaxModel

        return JaxModel(path.read_bytes(), names, None if outputs is None or outputs.single else outputs.names)
    from inference.predict import load_model

    return load_model(path, threads)
