"""The export's formats and the routes (converters) that write them, and the runtime that loads a file back.

Each module of `inference/formats/` declares what it adds: ``FORMATS`` (a file type: its suffix, whether its batch
is symbolic by default, the quantizations it offers, its rank in the export's order) and ``ROUTES`` (a converter
that writes one format, the packages whose versions the report names). The table here is built from the modules
present, so a format kept in a folder of its own (``inference/formats/tflite/``) is gone with the folder and
nothing else names it. Each converter is imported only when its route is taken.
"""

from __future__ import annotations

import importlib
import pkgutil

from inference.formats import Format, Route
from inference.inputs import Inputs, Outputs

OUTPUT_NAME = "outputs"


def declared() -> tuple[dict[str, Format], dict[str, Route]]:
    """The formats (in rank order) and the routes (in each module's order of preference) of `inference/formats/`."""
    import inference.formats as package

    formats, routes = [], {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        formats += getattr(module, "FORMATS", ())
        routes |= {route.name: route for route in getattr(module, "ROUTES", ())}
    return {f.name: f for f in sorted(formats, key=lambda f: f.rank)}, routes


FORMATS, ROUTES = declared()


def routes_of(fmt: str, preferred: str | None = None) -> list[str]:
    """The routes that write `fmt`, `preferred` first (the others are tried when it fails)."""
    names = [name for name, route in ROUTES.items() if route.format == fmt]
    return sorted(names, key=lambda name: name != preferred)


def export_bytes(
    route: str, fn, inputs: Inputs, dynamic: bool, quantize: str | None = None, outputs: Outputs | None = None
) -> bytes:
    """One artifact's bytes by `route`; fn takes the input tree. `outputs`: the model's named outputs when it has
    several (a dict), each a named output of the file; else its one output is OUTPUT_NAME."""
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; available: {', '.join(ROUTES)}")
    from model.modules.attention import plain_attention

    names = OUTPUT_NAME if outputs is None or outputs.single else outputs.names
    fn = fn if outputs is None else outputs.flat_fn(fn)
    with plain_attention():  # cuDNN's fused attention is no export target, and runs in no other runtime
        return ROUTES[route].export(
            inputs.flat_fn(fn), inputs.specs, inputs.names, dynamic_batch=dynamic, output_name=names, quantize=quantize
        )


def load_runner(path, names: list[str], threads: int | None = None, outputs: Outputs | None = None):
    """The artifact at `path` in its own runtime (a .jax file keeps no names: `outputs` gives those of several)."""
    if path.suffix == ".jax":
        from inference.formats.jax_export import JaxModel

        return JaxModel(path.read_bytes(), names, None if outputs is None or outputs.single else outputs.names)
    from inference.predict import load_model

    return load_model(path, threads)
