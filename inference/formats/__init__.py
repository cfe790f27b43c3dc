"""The export's file formats, a module (or a folder) each. What one adds to the export is declared in it, as
``FORMATS`` and ``ROUTES`` of the types here; `inference/routes.py` gathers them from the modules present."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Format(NamedTuple):
    name: str  # the --formats name
    suffix: str
    dynamic: bool  # a symbolic batch by default
    rank: int  # the export's order of formats (and the report's)
    quantizations: tuple[str, ...] = ()  # what --quantize may ask of it


class Route(NamedTuple):
    name: str  # the --<format>-via name
    format: str
    describes: str  # the report's words for it
    # export(fn, specs, names, *, dynamic_batch, output_name, quantize) -> the file's bytes
    export: Callable[..., bytes]
    packages: tuple[str, ...] = ()  # the converters and runtimes whose versions the report gives, where used
