"""What a config can name: every kind of component registers its functions here, with the decorator ``register``.

    @register("loss", task="regression")
    def mse(outputs, targets, *, mask=None): ...

A config names a component by its function's name (``{"name": "mse", "args": {...}}``);
``training.config.components.build`` finds it with ``entries(kind)``. What else a component declares lives beside it,
in the decorator:

- ``check``: a function taking the component's config arguments that raises ``ValueError`` for impossible values;
  for what is not built before the data exists (a loss) or whose building reads files (a data loader);
- ``task`` (losses): the kind of problem a run with this loss solves, one of ``TASKS``; it decides what ``test.py``
  reports and how the export judges agreement (``training/task_kinds.py``). A loss without one is "other".
- ``example`` (models): ``(args, sample shape, input kind)``, a small configuration of the model, the shape of one
  example without the batch (a dict of shapes for named inputs) and ``"normal"`` (float inputs) or ``"ids"`` (int32
  token ids): the export-parity check (tests/inference/test_export_parity.py) runs every export route on it. A model
  without one is not in that check.

The registry sits in the lowest layer (model) so that models, training components and data loaders all register
the same way. Where components are found: when a kind is first looked up, its template module (``KINDS``) is
imported, then every other module of ``PACKAGES`` whose source holds a function decorated ``@register("<kind>"``
(a new file of your own in one of those folders, the samples in tasks/): no file the template ships names it,
so the template's later fixes never meet your additions. Sources are read as text (the decorator at the start of a
line, as a module-level function has it), so a lookup imports no module that registers nothing of that kind (no JAX
before a config's error is reported). A file that fails to import, or a name registered twice, is a
``ComponentError`` naming the file(s).
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Each kind of component and the template's module that defines (and so registers) it; imported first, so the
# template's components come first in --list.
KINDS = {
    "model": "model.model",
    "loss": "training.losses",
    "metrics": "training.metrics",
    "optimizer": "training.optimizers",
    "transforms": "training.optimizers",
    "schedule": "training.schedules",
    "data_loader": "data_loader.data_loaders",
    "augment": "data_loader.augment.pipeline",
    "callbacks": "training.callbacks",
    "step": "training.step",
}
TASKS = ("classification", "sequence", "multilabel", "regression", "other")
# The folders (of the repository's root) searched for components in files of their own: the library's packages and
# `tasks/`, where a task of your own keeps its model, losses, metrics and loader together (tasks/vae/).
PACKAGES = ("model", "data_loader", "training", "tasks")
REPOSITORY = Path(__file__).resolve().parents[1]
ROOT = REPOSITORY  # where PACKAGES are searched
# A module-level function's decorator, at the start of its line: an indented example in a docstring imports nothing.
_DECORATOR = re.compile(r"""^@register\(\s*["'](\w+)["']""", re.MULTILINE)


class ComponentError(Exception):
    """A component file that cannot be imported, or a name registered twice: one line naming the file(s). The config
    resolver reports it as a ConfigError (exit status 2)."""


@dataclass(frozen=True)
class Entry:
    fn: Callable
    check: Callable | None = None
    task: str | None = None
    example: tuple | None = None


_REGISTERED: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
_FOUND: dict[str, list[tuple[str, Path]]] | None = None  # kind -> (module, file) of the files of PACKAGES, once read
_LOADED: set[str] = set()  # the kinds whose modules are all imported


def register(
    kind: str, *, check: Callable | None = None, task: str | None = None, example: tuple | None = None
) -> Callable:
    """Registers the decorated function under its own name as a component of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of component {kind!r}; kinds: {', '.join(KINDS)}")
    if task is not None and (kind != "loss" or task not in TASKS):
        raise ValueError(f"task={task!r}: only a loss declares a task, one of {', '.join(TASKS)}")
    if example is not None and (kind != "model" or not (isinstance(example, tuple) and len(example) == 3)):
        raise ValueError(f"example={example!r}: only a model declares an example, as (args, sample shape, input kind)")

    def add(fn: Callable) -> Callable:
        old = _REGISTERED[kind].get(fn.__name__)
        # the same function defined again (a module reloaded, a notebook's cell run twice) replaces itself
        if old is not None and _identity(old.fn) != _identity(fn):
            raise ComponentError(
                f"{kind} {fn.__name__!r} is registered twice, in {_file_of(old.fn)} and in {_file_of(fn)}: a config "
                "names a component by its function's name, so rename one of them"
            )
        _REGISTERED[kind][fn.__name__] = Entry(fn, check, task, example)
        return fn

    return add


def _identity(fn: Callable) -> tuple:
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)


def _file_of(fn: Callable) -> str:
    """The file a function was written in, relative to the repository where it lies inside it."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return str(getattr(fn, "__module__", "?"))
    path = Path(code.co_filename).resolve()
    for root in (ROOT, REPOSITORY):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return str(path)


def _find() -> dict[str, list[tuple[str, Path]]]:
    """Every module of PACKAGES that registers components, by kind, in the order of their paths (read once)."""
    global _FOUND
    if _FOUND is not None:
        return _FOUND
    found: dict[str, list[tuple[str, Path]]] = {kind: [] for kind in KINDS}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if any(part.startswith((".", "__pycache__")) for part in relative.parts):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ComponentError(f"{relative.as_posix()}: cannot read it for its components ({error})") from None
            kinds = set(_DECORATOR.findall(text))
            if not kinds:
                continue
            module = ".".join(relative.with_suffix("").parts)
            if module.endswith(".__init__"):
                module = module[: -len(".__init__")]
            unknown = sorted(kinds - set(KINDS))
            if unknown:  # never imported for the kind it meant: its components would be missing without a word
                close = difflib.get_close_matches(unknown[0], list(KINDS), n=1)
                raise ComponentError(
                    f"{relative.as_posix()}: @register({unknown[0]!r}): unknown kind of component"
                    + (f". Did you mean {close[0]!r}?" if close else "")
                    + f" Kinds: {', '.join(KINDS)}"
                )
            for kind in kinds:
                found[kind].append((module, relative))
    _FOUND = found
    return found


def _load(kind: str) -> None:
    """Imports the template's module of ``kind``, then every other module that registers one (``_find``)."""
    if kind in _LOADED:
        return
    importlib.import_module(KINDS[kind])
    for module, relative in _find()[kind]:
        try:
            importlib.import_module(module)
        except ComponentError:
            raise
        except Exception as error:  # any failure of a file of your own: its name and the first line of why
            reason = (str(error).strip() or type(error).__name__).splitlines()[0]
            raise ComponentError(
                f"{relative.as_posix()}: cannot import it for its @register({kind!r}) components "
                f"({type(error).__name__}: {reason})"
            ) from None
    _LOADED.add(kind)


def entries(kind: str) -> dict[str, Entry]:
    """Every registered component of ``kind``, by name, in the order they were defined (the template's first)."""
    _load(kind)
    # the template's first, whichever file registered first (a file of your own may register several kinds)
    home = [(n, e) for n, e in _REGISTERED[kind].items() if getattr(e.fn, "__module__", None) == KINDS[kind]]
    return dict(home) | _REGISTERED[kind]
