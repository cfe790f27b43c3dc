"""Components registered in a notebook: a function a notebook's cell decorates with ``@register`` lives in that
kernel's ``__main__``, which no other process has. A run trained with one records their names in its folder
(notebook.json, ``kernel_components``), and test.py, the export and ``load_run`` refuse that run in one line that
says why (``check_kernel_components``) instead of reporting an unknown component.
"""

from __future__ import annotations

from pathlib import Path

from files.reads import read_json
from model.registry import KINDS, entries
from training.config.components import COMPONENT_MODULES, available
from training.config.file import ConfigError

NOTEBOOK = "notebook.json"  # a run folder's components registered in a notebook's kernel, which no other process has


def kernel_components(config: dict) -> dict[str, list[str]]:
    """The config's components registered by code run in this process's ``__main__`` (a notebook's cells), by
    kind: another process (test.py, the export) cannot import them."""
    named = set()

    def walk(value, top=False):
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "name" and isinstance(item, str) and not top:
                    named.add(item)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for key, value in config.items():
        if key != "name":
            walk(value)
    local = {}
    for kind in COMPONENT_MODULES:
        names = [n for n, e in entries(kind).items() if n in named and getattr(e.fn, "__module__", "") == "__main__"]
        if names:
            local[kind] = names
    return local


def check_kernel_components(run_dir: Path, source: str) -> None:
    """A run whose notebook.json names a component this process does not know: one line saying why (it lived in a
    notebook's kernel) and what to do."""
    path = run_dir / NOTEBOOK
    if not path.is_file():
        return
    try:
        local = read_json(path, NOTEBOOK).get("registered_in_notebook") or {}  # bounded as every JSON file
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return  # what it says is a hint; validation names an unknown component anyway
    for kind, names in local.items():
        if kind not in KINDS or not isinstance(names, list):
            continue
        for name in names:
            if isinstance(name, str) and name not in available(kind):
                raise ConfigError(
                    f"{source}: {kind} {name!r} was registered in a notebook ({path.name}), so only that kernel "
                    f"knows it: move its function into a file of your own (tasks/<name>/, found by itself) with "
                    f'@register("{kind}") to use this run here'
                )
