"""The loader ``teacher_outputs``: the examples of any loader (``data``, a loader's config), each with the teacher's
outputs beside its labels as its target, ``{"label": the loader's target, "teacher": the teacher's logits}`` (the
teacher's logits alone where ``data`` has no targets), the teacher a trained run loaded with
``inference.trained_run.load_run``. The teacher runs
once over the data when the loader is built (in inference mode, its own preprocessing first, as test.py runs it),
and its logits are kept in memory, (examples, classes) float32: 2.4 MB for MNIST's 60,000 images. The loss
``distillation`` softens them at its temperature.

The teacher sees the inputs as ``data`` gives them: train the teacher on the same loader (random augmentations of
the student's training split are drawn after the target is fixed, so the teacher saw the unaugmented image).
"""

from __future__ import annotations

import numpy as np

from data_loader.loader import DataLoader
from model.registry import register
from training.config.components import build, check_component
from training.config.file import ConfigError

TEACHER_BATCH = 1024  # examples per call of the teacher while its outputs are computed
LABEL, TEACHER = "label", "teacher"  # the names of a batch's targets (the loss distillation takes them so)


class TeacherTargets:
    """A data set's examples with ``target`` ``{"label": its target, "teacher": the teacher's logits of the same
    examples}``, or those logits alone where the data set has no target."""

    def __init__(self, dataset, logits: np.ndarray, teacher: str):
        self.dataset, self.logits = dataset, logits
        self.preprocessing = dict(getattr(dataset, "preprocessing", None) or {})
        self.preprocessing["teacher"] = teacher

    def __len__(self) -> int:
        return len(self.dataset)

    def get_batch(self, indices):
        batch = dict(self.dataset.get_batch(indices))
        teacher = self.logits[indices]
        batch["target"] = {LABEL: batch["target"], TEACHER: teacher} if "target" in batch else teacher
        return batch


def teacher_logits(teacher, dataset) -> np.ndarray:
    """The teacher's outputs on every example of ``dataset``, in order: (examples, classes) float32."""
    outputs = []
    for start in range(0, len(dataset), TEACHER_BATCH):
        batch = dataset.get_batch(np.arange(start, min(start + TEACHER_BATCH, len(dataset))))
        # the loader's inputs, made what the teacher's model takes (its run's evaluation normalisation, if any)
        outputs.append(np.asarray(teacher(teacher.model_input(batch["input"]), batch.get("mask")), np.float32))
    logits = np.concatenate(outputs)
    if logits.ndim != 2:
        raise ValueError(f"teacher: its outputs are {list(logits.shape)}; expected (examples, classes) logits")
    return logits


def _check(teacher=None, data=None, prefetch=2, **_) -> None:
    if not isinstance(teacher, str) or not teacher:
        raise ValueError(f"teacher: expected the path of a trained run (its folder or a checkpoint), got {teacher!r}")
    try:
        check_component(data, "data_loader", "data")
    except ConfigError as error:  # placed at this loader's argument by the resolver: data_loader.train.args.data
        raise ValueError(str(error)) from None
    if data.get("name") == "teacher_outputs":
        raise ValueError("data: the examples of another loader, not of teacher_outputs again")


@register("data_loader", check=_check)
def teacher_outputs(teacher, data, batch_size=128, shuffle=False, drop_last=False, prefetch=2, seed=0):
    """The examples of the loader ``data`` (``{"name": ..., "args": {...}}``, e.g. the teacher's own training
    loader) with the outputs of the trained run ``teacher`` (a run folder or a checkpoint) beside their labels:
    targets ``{"label", "teacher"}`` (the loss's ``"labels": "label"`` names the class ids)."""
    from inference.trained_run import load_run  # JAX and the teacher's run: only once this loader is built
    from training.run.checkpoint import CheckpointError

    inner = build(data, "data_loader", "data", seed=seed)
    try:
        run = load_run(teacher)
    except (ConfigError, CheckpointError) as error:
        raise ValueError(f"teacher: {teacher}: {error}") from None
    logits = teacher_logits(run, inner.dataset)
    dataset = TeacherTargets(inner.dataset, logits, str(teacher))
    return DataLoader(dataset, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, prefetch=prefetch)
