"""What kind of problem a run solves: the task its loss declares when it registers (``@register("loss",
task=...)``), refined by the shapes and dtypes of its batch. `test.py` chooses what to report from it, and the export
how to judge agreement with the JAX model.

| task | loss | targets | agreement in the export |
| --- | --- | --- | --- |
| classification | cross_entropy | class ids (B,) or one-hot (B, C) | top-1 per example |
| sequence | cross_entropy | ids (B, T, ...) or one-hot (B, T, ..., C): a class per position | top-1 per position |
| multilabel | binary_cross_entropy | 0/1 of the outputs' shape: labels (B, L), masks (B, H, W, 1) | each logit's sign |
| regression | mse, l1, huber | real values of the outputs' shape | tolerance only |
| other | a loss that declares no task (a loss of your own, KL) | - | tolerance only |

A dataset may override the derived task with ``preprocessing["task"]``.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from model.registry import TASKS, entries


def task_of(loss_name: str, batch_spec: dict, preprocessing: dict | None = None) -> str:
    """The task of a run from its loss's config name (the task it registered with) and its loader's ``spec`` (see
    the table above)."""
    declared = (preprocessing or {}).get("task")
    if declared is not None:
        if declared not in TASKS:
            raise ValueError(f"preprocessing task {declared!r}: expected one of {', '.join(TASKS)}")
        return declared
    entry = entries("loss").get(loss_name)
    task = (entry.task if entry else None) or "other"
    if task == "classification":
        target = batch_spec.get("target", batch_spec["input"])
        ids = np.issubdtype(np.dtype(target.dtype), np.integer)
        per_example = len(target.shape) == (1 if ids else 2)
        return "classification" if per_example else "sequence"
    return task


def class_count(preprocessing: dict, targets: Callable[[], np.ndarray]) -> tuple[int, str]:
    """How many outputs a classifier or language model needs, and what says so: the data's class names or
    vocabulary, else the largest id in `targets()` (a batch of them, read only then) plus one."""
    if preprocessing.get("vocabulary"):
        return len(preprocessing["vocabulary"]), "tokens in its vocabulary"
    if preprocessing.get("classes"):
        return len(preprocessing["classes"]), "classes"
    largest = int(targets().max())
    return largest + 1, f"classes (a label {largest} in its first batch)"
