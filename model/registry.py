"""What a config can name: every kind of component registers its functions here, with the decorator ``register``.

    @register("loss", task="regression")
    def mse(outputs, targets, *, mask=None): ...

A config names a component by its function's name (``{"name": "mse", "args": {...}}``);
``training.config.components.build`` finds it with ``entries(kind)``. What else a component declares lives beside it,
in the decorator:

- ``check``: a function taking the component's config arguments that raises ``ValueError`` for impossible values;
  for what is not built before the data exists (a loss) or whose building reads files (a data loader);
- ``task`` (losses): the kind of problem a run with this loss solves, one of ``TASKS``; it decides what ``test.py``
  reports and how the export judges agreement (``training/tasks.py``). A loss without one is "other".
- ``example`` (models): ``(args, sample shape, input kind)``, a small configuration of the model, the shape of one
  example without the batch (a dict of shapes for named inputs) and ``"normal"`` (float inputs) or ``"ids"`` (int32
  token ids): the export-parity check (tests/inference/test_export_parity.py) runs every export route on it. A model
  without one is not in that check.

The registry sits in the lowest layer (model) so that models, training components and data loaders all register
the same way; it imports a kind's module (``KINDS``) only when that kind is first looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

# Each kind of component and the module that defines (and so registers) it.
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
}
TASKS = ("classification", "sequence", "multilabel", "regression", "other")


@dataclass(frozen=True)
class Entry:
    fn: Callable
    check: Callable | None = None
    task: str | None = None
    example: tuple | None = None


_REGISTERED: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}


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
        _REGISTERED[kind][fn.__name__] = Entry(fn, check, task, example)
        return fn

    return add


def entries(kind: str) -> dict[str, Entry]:
    """Every registered component of ``kind``, by name, in the order they were defined."""
    importlib.import_module(KINDS[kind])
    return dict(_REGISTERED[kind])
